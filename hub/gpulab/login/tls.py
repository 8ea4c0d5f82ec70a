"""Certificates for serving the hub over HTTPS (`make up GPULAB_HOSTNAME=...`).

configurable-http-proxy terminates TLS with the files this module puts in one folder
(`secrets/tls/` on the host): ``server.crt`` (the chain, leaf first) and ``server.key``.
They come, in order, from:

1. the lab's own certificate and key (``--cert``/``--key``, from GPULAB_TLS_CERT and
   GPULAB_TLS_KEY): checked (the key matches, the name is covered, not expired) and
   copied;
2. otherwise a local CA, generated once and kept (``ca.crt``: members import it into
   their browser, once), which signs a server certificate for the host name and its
   subdomains (``*.NAME``, for members' servers); the server certificate is made again
   when the name changes or it nears its end.

The local CA carries critical X.509 name constraints: it can vouch only for the host name
and names under it (or, for an IP address, that one address), never for another web site,
even in the hands of whoever reads ``ca.key``. A CA that cannot stay (one from an earlier
gpulab, with no constraints, or one whose constraints do not permit a new host name) is
refused with what to do, or replaced when ``ensure`` is told to (``replace_ca``): members
must import the new one and remove the old one either way.

`certificate_plan` is pure (what to do with what is there); `ensure` does the file work.
Run as ``gpulab tls --hostname NAME --dir DIR`` (the Makefile does, in the hub image).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT, CA_KEY = "ca.crt", "ca.key"
SERVER_CERT, SERVER_KEY = "server.crt", "server.key"
SUPPLIED = "supplied-by-the-lab"  # marker: the server files are the lab's, never replaced
CA_DAYS, SERVER_DAYS, RENEW_DAYS = 3650, 397, 30


class TlsError(ValueError):
    """A certificate or key that cannot be used, with what to do about it."""


@dataclass(frozen=True)
class CertificatePlan:
    new_ca: bool
    new_server: bool
    reason: str
    replaces_ca: bool = False  # the kept CA cannot stay: members must swap it in browsers


def covers(cert: x509.Certificate, hostname: str) -> bool:
    """True when the certificate's subjectAltName names *hostname* (or its IP address)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    try:
        return ipaddress.ip_address(hostname) in san.get_values_for_type(x509.IPAddress)
    except ValueError:
        pass
    name = hostname.lower().rstrip(".")
    for pattern in san.get_values_for_type(x509.DNSName):
        pattern = pattern.lower().rstrip(".")
        if pattern == name:
            return True
        if pattern.startswith("*.") and name.count(".") >= 2 and \
                name.split(".", 1)[1] == pattern[2:]:
            return True
    return False


def _ip(hostname: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(hostname)
    except ValueError:
        return None


def alt_names(hostname: str) -> list[x509.GeneralName]:
    """The server certificate's subjectAltName: an IP address as itself; a DNS name and,
    when it has a dot (a wildcard needs two labels after it, see `covers`), ``*.NAME``
    for members' servers at USER.NAME."""
    ip = _ip(hostname)
    if ip is not None:
        return [x509.IPAddress(ip)]
    name = hostname.lower().rstrip(".")
    return [x509.DNSName(name)] + ([x509.DNSName(f"*.{name}")] if "." in name else [])


# RFC 6761 reserves .invalid: names under it never resolve. A CA for an IP address
# permits only these DNS names (with no dNSName subtree at all it would permit every one).
NO_DNS_NAME = "invalid"
ALL_IPS = [x509.IPAddress(ipaddress.ip_network("0.0.0.0/0")),
           x509.IPAddress(ipaddress.ip_network("::/0"))]


def name_constraints(hostname: str) -> x509.NameConstraints:
    """What the local CA may vouch for: *hostname* and the names under it, and no IP
    address; or, for an IP address, that address (/32, /128) and no DNS name. The hub's
    certificate (`alt_names`) is the only one the CA is for, and it fits exactly."""
    ip = _ip(hostname)
    if ip is not None:
        return x509.NameConstraints(
            permitted_subtrees=[x509.IPAddress(ipaddress.ip_network(ip)),
                                x509.DNSName(NO_DNS_NAME)], excluded_subtrees=None)
    return x509.NameConstraints(permitted_subtrees=[x509.DNSName(hostname.lower().rstrip("."))],
                                excluded_subtrees=ALL_IPS)


def scope(hostname: str) -> str:
    """`name_constraints(hostname)` in words, for messages."""
    if _ip(hostname) is not None:
        return f"{hostname} alone"
    return f"{hostname.lower().rstrip('.')} and the names under it"


def _within(subtree: x509.GeneralName, name: x509.GeneralName) -> bool:
    """RFC 5280 4.2.1.10 for the two kinds the hub's certificate carries."""
    if type(subtree) is not type(name):
        return False
    if isinstance(name, x509.IPAddress):
        return isinstance(subtree.value, ipaddress.IPv4Network | ipaddress.IPv6Network) \
            and name.value in subtree.value
    base = subtree.value.lower().strip(".")
    value = name.value.lower().rstrip(".")
    return not base or value == base or value.endswith("." + base)


def permits(constraints: x509.NameConstraints, name: x509.GeneralName) -> bool:
    """True when a CA with *constraints* may vouch for *name* (a DNSName or IPAddress)."""
    permitted = [s for s in constraints.permitted_subtrees or () if type(s) is type(name)]
    if permitted and not any(_within(s, name) for s in permitted):
        return False
    return not any(_within(s, name) for s in constraints.excluded_subtrees or ())


def _subtrees(constraints: x509.NameConstraints) -> str:
    """The permitted subtrees, as an admin reads them: "gpu.lab.example", "10.1.2.3/32"."""
    return ", ".join(str(s.value) for s in constraints.permitted_subtrees or ()
                     if s.value != NO_DNS_NAME) or "nothing"


def ca_problem(ca: x509.Certificate, hostname: str) -> str | None:
    """Why the local CA *ca* may not sign the hub's certificate for *hostname*, or None.
    Without critical name constraints it could vouch for any web site."""
    try:
        ext = ca.extensions.get_extension_for_class(x509.NameConstraints)
    except x509.ExtensionNotFound:
        return "has no name constraints: it can vouch for any web site"
    if not ext.critical:
        return "has no critical name constraints: it can vouch for any web site"
    if not all(permits(ext.value, name) for name in alt_names(hostname)):
        return f"is limited to {_subtrees(ext.value)}, which does not include {hostname}"
    return None


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    """By this CA's key, not only a CA of the same name (two made on one day share it)."""
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def certificate_plan(hostname: str, now: dt.datetime, ca: x509.Certificate | None,
                     server: x509.Certificate | None) -> CertificatePlan:
    """What a local CA setup needs: a CA when there is none, it expired, or it cannot
    vouch for *hostname* alone (`ca_problem`: then ``replaces_ca``); and a server
    certificate when there is none, it was not signed by this CA, it does not name
    *hostname* (and ``*.hostname``), or it ends within RENEW_DAYS."""
    if ca is None or ca.not_valid_after_utc <= now:
        return CertificatePlan(True, True,
                               "no local CA yet" if ca is None else "the local CA expired")
    problem = ca_problem(ca, hostname)
    if problem:
        return CertificatePlan(True, True, f"the local CA {problem}", replaces_ca=True)
    if server is None:
        return CertificatePlan(False, True, f"no certificate for {hostname} yet")
    if not _signed_by(server, ca):
        return CertificatePlan(False, True, "the certificate was not signed by the local CA")
    for name in alt_names(hostname):
        if not covers(server, str(name.value)):
            return CertificatePlan(False, True, f"the certificate does not name {name.value}")
    if server.not_valid_after_utc - now < dt.timedelta(days=RENEW_DAYS):
        return CertificatePlan(False, True, f"the certificate ends within {RENEW_DAYS} days")
    return CertificatePlan(False, False, f"valid, and it names {hostname}")


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpulab"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_ca(hostname: str, now: dt.datetime
            ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A CA that may vouch for *hostname* only (`name_constraints`). Its name carries the
    date, so that members can tell it from an earlier one in their browser's list."""
    key = _key()
    name = _name(f"gpulab local CA ({hostname}, {now:%Y-%m-%d})")
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(name_constraints(hostname), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def make_server(hostname: str, now: dt.datetime, ca: x509.Certificate,
                ca_key: ec.EllipticCurvePrivateKey
                ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    # With no DNS name in subjectAltName, OpenSSL checks a commonName that looks like one
    # ("10.1.2.3" does) against the CA's DNS constraints, and refuses it: an IP address's
    # certificate gets a commonName that is no host name.
    common = hostname if _ip(hostname) is None else f"gpulab hub at {hostname}"
    cert = (x509.CertificateBuilder().subject_name(_name(common)).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=SERVER_DAYS))
            .add_extension(x509.SubjectAlternativeName(alt_names(hostname)), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert, key


def fingerprint(cert: x509.Certificate) -> str:
    return cert.fingerprint(hashes.SHA256()).hex(":").upper()


def _refuse_ca(directory: Path, hostname: str, ca: x509.Certificate, problem: str) -> TlsError:
    """Why the local CA in *directory* is not used, and how a lab replaces it."""
    old = f"{directory}.replaced"
    why = (f"whoever reads {directory / CA_KEY} can use it against every member who "
           f"imported it, so gpulab no longer signs with it" if problem.startswith("has no")
           else "a new CA is needed (a mistyped GPULAB_HOSTNAME? then fix that instead)")
    return TlsError(
        f"{directory / CA_CERT}: the local CA {problem}; {why}. To replace it: move the "
        f"folder away (mv {directory} {old}) and run `make up` again (or run `make up "
        f"GPULAB_TLS_REPLACE_CA=yes`, which keeps the old certificate beside the new one and "
        f"deletes its key), which makes a new CA "
        f"limited to {scope(hostname)}; give members the new {directory / CA_CERT} to "
        f"import, and have them remove the old one, '{ca.subject.rfc4514_string()}' "
        f"(SHA-256 {fingerprint(ca)}), from their browsers (Chromium: Settings, Manage "
        f"certificates, Authorities; Firefox: Settings, Certificates, Authorities); then "
        f"delete {old}.")


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.chmod(tmp, mode)
    tmp.replace(path)


def _load_cert(path: Path) -> x509.Certificate | None:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise TlsError(f"{path}: not a PEM certificate ({e})") from None


def check_supplied(cert_path: Path, key_path: Path, hostname: str, now: dt.datetime,
                   subdomains: bool = False) -> list[x509.Certificate]:
    """The lab's chain, refused with a clear reason when it cannot serve *hostname* (and,
    with *subdomains*, members' servers at NAME.*hostname*)."""
    try:
        chain = x509.load_pem_x509_certificates(cert_path.read_bytes())
    except (OSError, ValueError) as e:
        raise TlsError(f"GPULAB_TLS_CERT={cert_path}: cannot read a PEM certificate: {e}") \
            from None
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as e:
        raise TlsError(f"GPULAB_TLS_KEY={key_path}: cannot read an unencrypted PEM private "
                       f"key: {e}") from None
    leaf = chain[0]
    if leaf.public_key().public_numbers() != key.public_key().public_numbers():
        raise TlsError(f"GPULAB_TLS_KEY={key_path} is not the key of the first certificate "
                       f"in GPULAB_TLS_CERT={cert_path}")
    if not covers(leaf, hostname):
        raise TlsError(f"GPULAB_TLS_CERT={cert_path} does not name {hostname} "
                       f"(subjectAltName); set GPULAB_HOSTNAME to a name it covers")
    if subdomains and not covers(leaf, f"gpulab-member.{hostname}"):
        raise TlsError(f"GPULAB_TLS_CERT={cert_path} names {hostname} but not *.{hostname}, "
                       f"where members' servers are (each has a host name of its own, "
                       f"NAME.{hostname}): get a certificate that names both, or set "
                       f"GPULAB_SUBDOMAINS=no to keep every server under {hostname} (then a "
                       f"page a member serves runs with the session of whoever opens it)")
    if leaf.not_valid_after_utc <= now:
        raise TlsError(f"GPULAB_TLS_CERT={cert_path} expired on "
                       f"{leaf.not_valid_after_utc:%Y-%m-%d}")
    return chain


def ensure(directory: Path, hostname: str, cert: Path | None = None, key: Path | None = None,
           now: dt.datetime | None = None, replace_ca: bool = False,
           subdomains: bool = False) -> str:
    """Put usable server.crt/server.key in *directory*; a line saying what was done.

    A local CA that cannot stay (`certificate_plan`: ``replaces_ca``) is refused with what
    to do, unless *replace_ca*: then its certificate is kept beside as ``ca.crt.replaced-DATE``
    (members need its fingerprint to remove it), its key is deleted, and a new CA made."""
    now = now or dt.datetime.now(dt.UTC)
    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / SUPPLIED
    if cert or key:
        if not (cert and key):
            raise TlsError("set both GPULAB_TLS_CERT and GPULAB_TLS_KEY, or neither")
        check_supplied(cert, key, hostname, now, subdomains)
        # The proxy runs as nobody: the key is readable in the folder it mounts, which
        # sits in the host's secrets/ (0700, root's).
        shutil.copyfile(cert, directory / SERVER_CERT)
        _write(directory / SERVER_KEY, key.read_bytes(), 0o644)
        os.chmod(directory / SERVER_CERT, 0o644)
        marker.write_text(f"{cert}\n")
        return f"HTTPS for {hostname} with the lab's certificate {cert}"
    if marker.exists():
        marker.unlink()  # the lab's files go; a local CA's take their place
        (directory / SERVER_CERT).unlink(missing_ok=True)
    ca = _load_cert(directory / CA_CERT)
    server = _load_cert(directory / SERVER_CERT)
    plan = certificate_plan(hostname, now, ca, server)
    replaced = ""
    if plan.replaces_ca:
        if not replace_ca:
            raise _refuse_ca(directory, hostname, ca, plan.reason.removeprefix("the local CA "))
        kept = directory / f"{CA_CERT}.replaced-{now:%Y%m%d%H%M%S}"
        (directory / CA_CERT).replace(kept)
        (directory / CA_KEY).unlink(missing_ok=True)
        replaced = (f"; the old CA is replaced (its key deleted): members remove "
                    f"'{ca.subject.rfc4514_string()}' (SHA-256 {fingerprint(ca)}, kept as "
                    f"{kept}) from their browsers")
    if plan.new_ca:
        ca, ca_key = make_ca(hostname, now)
        _write(directory / CA_KEY, _key_pem(ca_key), 0o600)
        _write(directory / CA_CERT, _pem(ca), 0o644)
    else:
        ca_key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), None)
    if plan.new_server:
        server, server_key = make_server(hostname, now, ca, ca_key)
        _write(directory / SERVER_KEY, _key_pem(server_key), 0o644)
        _write(directory / SERVER_CERT, _pem(server), 0o644)
    done = "made" if plan.new_server else "kept"
    return (f"HTTPS for {hostname}: certificate {done} ({plan.reason}), signed by the local "
            f"CA {directory / CA_CERT} (SHA-256 {fingerprint(ca)}, limited to "
            f"{scope(hostname)}); members import that file into their browser "
            f"once{replaced}")
