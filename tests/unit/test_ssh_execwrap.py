"""A command typed into a Jupyter terminal, and its output found again (gpulab.ssh.execwrap).

The typed line is run by a real bash on a real pseudo-terminal here, as in a member's
server, so the parser is tested against what a terminal really prints."""

from __future__ import annotations

import base64
import os
import pty
import select
import shutil
import time

import pytest

from gpulab.ssh.execwrap import MAX_COMMAND_BYTES, CommandTooLong, ExecOutput, command_line

NONCE = "0123456789abcdef"


def feed_all(parser: ExecOutput, chunks) -> str:
    return "".join(parser.feed(c) for c in chunks)


def test_parser_drops_echo_and_prompt_and_reads_the_status():
    p = ExecOutput(NONCE)
    out = feed_all(p, ["$ stty -echo; printf '\\036BNONCE'\r\n",
                       f"\x1eB{NONCE}\x1e", "hello\n", f"world\x1eE{NONCE}:3\x1e", "$ exit"])
    assert out == "hello\nworld" and p.status == 3 and p.done


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7])
def test_parser_holds_back_markers_split_across_chunks(size):
    text = f"motd\r\n$ \x1eB{NONCE}\x1eout\x1e1\n\x1eE{NONCE}:0\x1etrailing"
    p = ExecOutput(NONCE)
    out = feed_all(p, [text[i:i + size] for i in range(0, len(text), size)])
    assert out == "out\x1e1\n" and p.status == 0


def test_another_nonce_is_output_not_a_marker():
    p = ExecOutput(NONCE)
    out = feed_all(p, [f"\x1eB{NONCE}\x1e", "\x1eEffff:1\x1e", f"\x1eE{NONCE}:0\x1e"])
    assert out == "\x1eEffff:1\x1e" and p.status == 0


def test_command_travels_base64_encoded_and_long_ones_are_refused():
    cmd = "python -c 'print(1+1)'; echo \"$HOME\" `id`"
    line = command_line(cmd, NONCE)
    assert base64.b64encode(cmd.encode()).decode() in line
    assert cmd not in line and line.endswith("\r") and "\n" not in line
    with pytest.raises(CommandTooLong, match="script"):
        command_line("x" * (MAX_COMMAND_BYTES + 1), NONCE)


def run_in_pty(line: str, stdin: str = "", timeout: float = 10) -> str:
    """Type *line* into an interactive bash on a pseudo-terminal, as terminado does."""
    pid, fd = pty.fork()
    if pid == 0:
        os.execvpe("bash", ["bash", "--norc", "-i"], {**os.environ, "SHELL": "/bin/bash",
                                                      "PS1": "$ "})
    out, typed, deadline = b"", False, time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                out += chunk
            if not typed and out:
                os.write(fd, line.encode())
                typed = True
            if typed and stdin and b"\x1eB" in out:
                os.write(fd, stdin.encode())
                stdin = ""
    finally:
        os.waitpid(pid, 0)
        os.close(fd)
    return out.decode()


@pytest.mark.skipif(not shutil.which("bash") or not shutil.which("base64"),
                    reason="needs bash and base64")
@pytest.mark.parametrize("command, stdin, output, status", [
    ("python3 -c 'print(1+1)'", "", "2\r\n", 0),
    ("echo out; echo err >&2; exit 7", "", "out\r\nerr\r\n", 7),
    ("printf 'a\\nb'", "", "a\r\nb", 0),
    ("head -n 1 | tr a-z A-Z", "hello\n", "hello\r\nHELLO\r\n", 0),  # input is echoed
    ("echo \"$0\" | grep -c sh; test -t 0", "", "1\r\n", 0),  # runs in $SHELL, on a terminal
])
def test_the_typed_line_runs_the_command_on_a_real_terminal(command, stdin, output, status):
    p = ExecOutput(NONCE)
    got = p.feed(run_in_pty(command_line(command, NONCE), stdin))
    assert (got, p.status) == (output, status)


def test_a_real_terminal_echoes_the_typed_line_without_the_markers():
    raw = run_in_pty(command_line("true", NONCE))
    assert "\\036B" + NONCE in raw  # the echo shows the escapes, not the marker bytes
    assert raw.count(f"\x1eB{NONCE}\x1e") == 1


@pytest.mark.skipif(not shutil.which("bash") or not shutil.which("base64"),
                    reason="needs bash and base64")
def test_the_command_gets_echo_and_crlf_as_in_any_terminal():
    p = ExecOutput(NONCE)
    got = p.feed(run_in_pty(command_line("stty -a | grep -o -w -- -*echo; echo hi", NONCE)))
    assert (got, p.status) == ("echo\r\nhi\r\n", 0)
