"""``ssh -t alice@lab CMD`` on a Jupyter terminal: the typed line and its output parser.

A Jupyter terminal is an interactive shell on a pseudo-terminal: it echoes what is
typed, prints prompts and never reports an exit status. To run one command there and
hand back only its output and status, the gateway types one line (:func:`command_line`):

    printf '\\036B<nonce>\\036'; "$SHELL" -c "$(printf %s <base64> | base64 -d)";
    printf '\\036E<nonce>:%s\\036' "$?"; exit

The command travels base64-encoded, so no quoting of the member's command can break
out of it. The markers are printed with octal escapes, so the echo of the typed line
never contains them; only printf's output does. :class:`ExecOutput` drops everything
before the begin marker (echo, prompts, motd), passes on what comes after it, holds back
a possible partial marker at the end of a chunk, and ends at the end marker with the
command's exit status. The member's stdin is held back until the begin marker is seen,
so it reaches the command, never the shell.

The command runs with the terminal's echo and CRLF newlines, as in any terminal;
stdout and stderr arrive together (a terminal has one output). Sessions without a
terminal (``ssh host CMD``, sftp, scp) do not come here: they run with plain pipes
(:mod:`gpulab.ssh.channels`).
"""

from __future__ import annotations

import base64
import secrets

BEGIN, END, MARK = "B", "E", "\x1e"  # ASCII record separator: never in a shell prompt
# The typed line must fit the terminal's line buffer (4095 bytes in Linux's canonical
# mode) even if the shell were not yet reading it in raw mode.
MAX_COMMAND_BYTES = 2800


class CommandTooLong(ValueError):
    pass


def new_nonce() -> str:
    return secrets.token_hex(8)


def command_line(command: str, nonce: str) -> str:
    """The line typed into the terminal (ending in CR, as a keyboard sends it)."""
    encoded = base64.b64encode(command.encode()).decode()
    if len(command.encode()) > MAX_COMMAND_BYTES:
        raise CommandTooLong(
            f"The command is {len(command.encode())} bytes long; over SSH this gateway runs "
            f"commands of up to {MAX_COMMAND_BYTES} bytes. Put a longer one in a script "
            "in your home and run that.")
    return (f"printf '\\036{BEGIN}{nonce}\\036'; "
            f"\"${{SHELL:-/bin/sh}}\" -c \"$(printf %s {encoded} | base64 -d)\"; "
            f"printf '\\036{END}{nonce}:%s\\036' \"$?\"; exit\r")


class ExecOutput:
    """Feed terminal output in; get the command's output and, at the end, its status."""

    def __init__(self, nonce: str):
        self.begin = f"{MARK}{BEGIN}{nonce}{MARK}"
        self.end = f"{MARK}{END}{nonce}:"
        self.started = False
        self.status: int | None = None  # set once the end marker has been read
        self._buf = ""

    @property
    def done(self) -> bool:
        return self.status is not None

    def feed(self, data: str) -> str:
        """What of *data* (and what was held back before) is the command's output."""
        if self.done:
            return ""
        self._buf += data
        if not self.started:
            at = self._buf.find(self.begin)
            if at < 0:
                # keep only what could still be the start of the begin marker
                self._buf = self._buf[-(len(self.begin) - 1):]
                return ""
            self.started = True
            self._buf = self._buf[at + len(self.begin):]
        at = self._buf.find(self.end)
        if at >= 0:
            close = self._buf.find(MARK, at + len(self.end))
            if close < 0:
                out, self._buf = self._buf[:at], self._buf[at:]
                return out
            text = self._buf[at + len(self.end):close]
            self.status = int(text) if text.isdigit() else 255
            out, self._buf = self._buf[:at], ""
            return out
        # hold back a tail that could be the start of the end marker
        hold = 0
        for n in range(min(len(self.end) - 1, len(self._buf)), 0, -1):
            if self.end.startswith(self._buf[-n:]):
                hold = n
                break
        out = self._buf[:len(self._buf) - hold]
        self._buf = self._buf[len(self._buf) - hold:]
        return out
