"""A member's e-mail address, as gpulab takes it: one plain address that SMTP takes as is.
Pure; :mod:`gpulab.mail` sends to it, :mod:`gpulab.settings` checks ``mail.from`` with it."""

from __future__ import annotations

import re

__all__ = ["check_address", "is_address"]

MAX_ADDRESS = 254  # RFC 5321's limit on a path
# What SMTP takes as an address as is: a local part and a domain, nothing that could end
# a header line or add a second address (no display name, no spaces, commas or brackets).
_ADDRESS = re.compile(r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}"
                      r"@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
                      r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)+")


def is_address(value: object) -> bool:
    """Is *value* one plain address that SMTP takes as is (ASCII; no display name, no
    line break, no second address)?"""
    return (isinstance(value, str) and len(value) <= MAX_ADDRESS
            and _ADDRESS.fullmatch(value) is not None)


def check_address(value: object) -> str:
    """The address a member gave (spaces around it dropped), or ValueError saying what
    an address looks like (not repeating what she gave: it goes to the hub's log)."""
    address = value.strip() if isinstance(value, str) else value
    if not is_address(address):
        raise ValueError("\"email\" must be one e-mail address such as ann@lab.example, "
                         "and nothing else.")
    return address
