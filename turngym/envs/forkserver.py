"""Engine children forked from a warm process: starting an engine costs a fork, not an interpreter.

An ``EngineProcess`` child is a fresh interpreter that imports its engine's library on the first
call: TextWorld's import alone takes about 0.8 s of CPU, and a quickstart starts about 100 engines
(the held-out split's envs, the training split's, the demonstrations'). A fork server imports the
library once; each engine child is then forked from it and is ready in milliseconds.

The server keeps the fresh child's guarantees (``engine.py``): it is itself a fresh interpreter
started by this process (no threads when it forks, so a fork cannot deadlock on a lock another
thread held), its children inherit its ``/dev/null`` stdout and stderr and this process's group, and
a child exits when the server does, which exits when this process dies or closes its socket. The
parent gets the child's pid and its end of a socket pair (``socket.send_fds``), and watches and
kills the child through a pidfd (Linux 5.3+), since the child is the server's, not ours. Where any
of that is missing, ``spawn`` returns ``None`` and the caller starts a fresh interpreter as before.

    child = spawn_engine_child("turngym.envs.engine:_serve", ("textworld",), deadline_s=120)
    # (ForkedChild, Connection): the child runs _serve(connection); or None
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


class ForkedChild:
    """What ``EngineProcess`` needs of a ``Popen``, for a child of the fork server: its ``pid``,
    ``poll``, ``kill`` and ``wait``, through a pidfd. Its exit code is the server's to reap, so a
    finished child reports ``returncode`` -1."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._fd: int | None = os.pidfd_open(pid)

    def _exited(self, timeout: float) -> bool:
        if self._fd is None:
            return True
        if select.select([self._fd], [], [], max(0.0, timeout))[0]:
            os.close(self._fd)
            self._fd, self.returncode = None, -1
            return True
        return False

    def poll(self) -> int | None:
        return self.returncode if self._exited(0.0) else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited(1e9 if timeout is None else timeout):
            raise subprocess.TimeoutExpired(f"engine child {self.pid}", timeout)
        return -1

    def kill(self) -> None:
        if self._fd is not None:
            try:
                signal.pidfd_send_signal(self._fd, signal.SIGKILL)
            except ProcessLookupError:
                pass


class ForkServer:
    """A warm interpreter that has imported ``preload`` and forks children on request; each child
    runs ``serve`` (``"module:function"``, called with its ``Connection``) and exits.

    Raises:
        OSError: the server could not be started.
    """

    def __init__(self, serve: str, preload: tuple[str, ...], setup_deadline_s: float) -> None:
        ours, theirs = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))}
        with theirs:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "turngym.envs.forkserver", str(theirs.fileno()), serve, json.dumps(list(preload))],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, env=env)
        self._sock = ours
        self._lock = threading.Lock()  # envs on threads may start engines at once
        self._sock.settimeout(setup_deadline_s)
        got = b""
        while len(got) < 5 and (part := self._sock.recv(5 - len(got))):
            got += part
        if got != b"ready":  # the imports are done (or failed, or started a thread: then no server)
            self.close()
            raise OSError("the engine fork server did not start")

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def spawn(self, deadline_s: float) -> tuple[ForkedChild, Connection]:
        """Fork one engine child; returns its handle and our end of its connection.

        Raises:
            OSError: the server is gone or did not answer in time (it is then closed).
        """
        with self._lock:
            try:
                self._sock.settimeout(deadline_s)
                self._sock.sendall(b"f")
                msg, fds, _, _ = socket.recv_fds(self._sock, 32, 1)
                if not msg or len(fds) != 1:
                    raise OSError("the engine fork server sent no child")
                return ForkedChild(int(msg)), Connection(fds[0])
            except OSError:
                self.close()
                raise

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._sock.close()


_SERVERS: dict[tuple, ForkServer] = {}
_SERVERS_LOCK = threading.Lock()


@atexit.register
def _close_servers() -> None:
    """Stop this process's servers at exit (their children then exit by themselves)."""
    for key, server in list(_SERVERS.items()):
        if key[0] == os.getpid():  # a forked worker does not own its parent's servers
            server.close()


def spawn_engine_child(serve: str, preload: tuple[str, ...], deadline_s: float) -> tuple[ForkedChild, Connection] | None:
    """A child running ``serve`` forked from this process's server for ``preload`` (started on first
    use), or ``None`` where forking is not available (no pidfds) or the server failed; the caller
    then starts a fresh interpreter."""
    if not preload or not hasattr(os, "pidfd_open") or not hasattr(socket, "send_fds"):
        return None
    key = (os.getpid(), serve, tuple(preload))  # a forked worker process needs a server of its own
    try:
        with _SERVERS_LOCK:
            server = _SERVERS.get(key)
            if server is None or not server.alive:
                server = _SERVERS[key] = ForkServer(serve, tuple(preload), deadline_s)
        return server.spawn(deadline_s)
    except OSError:
        with _SERVERS_LOCK:
            _SERVERS.pop(key, None)
        return None


# ----- the server side ------------------------------------------------------------------------------
def _reap(*_: Any) -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def _serve_forks(sock: socket.socket, parent: int, serve: Any) -> None:
    """Fork a child per request byte until the parent closes the socket or dies. No threads here."""
    sock.settimeout(0.5)
    while True:
        try:
            request = sock.recv(1)
        except socket.timeout:
            if os.getppid() != parent:
                return
            continue
        except OSError:
            return
        if not request:
            return
        mine, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:  # the engine child: serve calls on its end until the parent (or we) go away
            sock.close()
            theirs.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                serve(Connection(mine.detach()))
            finally:
                os._exit(0)
        mine.close()
        try:
            socket.send_fds(sock, [str(pid).encode()], [theirs.fileno()])
        finally:
            theirs.close()


def _main(fd: int, serve: str, preload: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes us
    signal.signal(signal.SIGCHLD, _reap)
    parent = os.getppid()
    sock = socket.socket(fileno=fd)
    try:
        for name in preload:
            importlib.import_module(name)
        module, _, name = serve.partition(":")
        fn = getattr(importlib.import_module(module), name)
    except Exception:
        return  # no "ready": the parent falls back to fresh interpreters
    if threading.active_count() > 1:  # an import started a thread: forking could deadlock a child
        return
    sock.sendall(b"ready")
    _serve_forks(sock, parent, fn)


if __name__ == "__main__":
    _main(int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]))
