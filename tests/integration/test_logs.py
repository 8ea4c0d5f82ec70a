"""The Docker host's disk is not filled by logs, and the hub's log says who did what
without a secret in it.

Every container gpulab starts keeps at most 3 files of 10 MB of log (Docker's json-file
driver, gpulab.contract.LOG_MAX_SIZE): a member's server, whose log her own code can
write (its processes are hers), and the stack's, whose request logs grow with use. The
disk they would fill is the one homes and the hub's database live on.
"""

from __future__ import annotations

import json
import os
import re
import secrets

import requests

from gpulab.contract import LOG_MAX_FILES, LOG_MAX_SIZE

from .stack import HUB_URL, container_logs, docker, wait_for

LIMIT = LOG_MAX_FILES * int(LOG_MAX_SIZE.rstrip("m")) * 1024**2
# her code writes this much to her server's log, past the limit
WRITTEN = LIMIT + 5 * 1024**2


def log_files(container: str) -> dict[str, int]:
    """The json-file driver's files of *container* on the host, with their sizes."""
    path = json.loads(docker("inspect", container))[0]["LogPath"]
    folder = os.path.dirname(path)
    return {name: os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder)
            if name.startswith(os.path.basename(path))}


def test_a_members_server_cannot_fill_the_disk_with_its_log(hub, lab_user):
    """Her code writes 35 MB to her server's own log (its PID 1's stdout, which is hers):
    the host keeps at most 30 MB of it, and the newest lines still read."""
    user = lab_user("chatty")
    user.start_server()
    line = "x" * 1023 + "\n"
    out = user.run_code(
        "import os\n"
        "fd = os.open('/proc/1/fd/1', os.O_WRONLY)\n"
        f"block = {line!r} * 1024\n"
        f"for _ in range({WRITTEN // (1024 * 1024)}):\n"
        "    os.write(fd, block.encode())\n"
        "os.write(fd, b'the last line\\n')\n"
        "print('written')\n", timeout=300)
    assert out.strip() == "written"
    files = log_files(user.container)
    print(f"{user.container}'s log on the host: {files}")
    assert len(files) <= LOG_MAX_FILES, files
    assert sum(files.values()) <= LIMIT + 64 * 1024, files  # a line over, at most
    assert "the last line" in container_logs(user.container, 5)


def test_the_hubs_request_log_says_who_what_and_how_without_the_token(hub, lab_user):
    """A token in a request's header or URL never reaches the hub's log (one in the URL
    is refused too); each line still says which request, its answer, and who asked."""
    user = lab_user("logged")
    marker = secrets.token_hex(4)
    r = requests.get(f"{HUB_URL}/hub/api/users/{user.name}?marker={marker}",
                     headers={"Authorization": f"token {user.token}"}, timeout=30)
    assert r.status_code == 200, r.text
    r = requests.get(f"{HUB_URL}/hub/api/users/{user.name}?marker={marker}&token={user.token}",
                     timeout=30)
    assert r.status_code == 403, r.text  # tokens never travel in URLs

    # JupyterHub's request log; tornado's warning about the 403 is scrubbed too. (The hub
    # logs a request after its answer has gone, and Docker's log reaches `docker logs` a
    # moment later: once the 403's line was not there yet.)
    def request_lines():
        logs = container_logs("gpulab-hub", 200)
        return logs, [ln for ln in logs.splitlines() if marker in ln and ln.endswith("ms")]

    wait_for(lambda: len(request_lines()[1]) == 2, 30,
             what=lambda: f"both requests in the hub's log: {request_lines()[1]}")
    logs, lines = request_lines()
    assert user.token not in logs
    warned = [ln for ln in logs.splitlines() if marker in ln and "Missing or invalid" in ln]
    assert len(warned) == 1 and "&token=[secret] (" in warned[0], warned
    assert re.search(rf"\b200 GET /hub/api/users/{user.name}\?marker={marker} "
                     rf"\({user.name}@[0-9.]+\) [0-9.]+ms", lines[0]), lines[0]
    assert re.search(rf"\b403 GET /hub/api/users/{user.name}\?marker={marker}"
                     rf"&token=\[secret\] \(@[0-9.]+\) [0-9.]+ms", lines[1]), lines[1]
