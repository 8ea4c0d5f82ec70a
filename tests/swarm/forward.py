"""Reach a port inside a simulated node's network namespace from this machine's loopback,
so that tests (and Chromium) talk to a stack on the Swarm as a member's browser talks to
a lab's hub: ``with Forward(node.netns, (node.address, 8000)) as f: f.url``.

Each connection is dialled from a short-lived thread that first joins the node's network
namespace with setns(2), which moves only the calling thread; the socket it opens stays
in that namespace, and this process's other threads never leave theirs.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def connect_in(netns: str, address: tuple[str, int], timeout: float = 10) -> socket.socket:
    """A TCP connection to *address*, opened inside the network namespace *netns*
    (a name under /run/netns)."""
    result: dict = {}

    def dial() -> None:
        try:
            fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns into {netns}: {os.strerror(err)}")
            finally:
                os.close(fd)
            result["socket"] = socket.create_connection(address, timeout=timeout)
        except BaseException as e:  # handed to the caller's thread
            result["error"] = e

    thread = threading.Thread(target=dial, name=f"dial-{netns}", daemon=True)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    sock = result["socket"]
    sock.settimeout(None)
    return sock


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


class Forward:
    """127.0.0.1:<port> here -> *address* inside *netns*, until closed."""

    def __init__(self, netns: str, address: tuple[str, int]):
        self.netns, self.address = netns, address
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name="forward-accept", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = connect_in(self.netns, self.address)
            except OSError:
                client.close()  # the client sees a closed connection, as with a refusal
                continue
            self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for s in self._sockets:
            try:
                s.close()
            except OSError:
                pass

    def __enter__(self) -> Forward:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
