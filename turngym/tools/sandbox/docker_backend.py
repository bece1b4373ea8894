"""``DockerBackend``: one locked-down container per sandbox, and a warm pool for fast resets.

Every container runs the locally built image (``turngym.tools.sandbox.image``) with no network,
memory / CPU / pids limits, every capability dropped but root's CAP_KILL, no-new-privileges, a read-only root, a
tmpfs workdir, ``/tmp`` and ``/dev/shm`` limited in size and file count, and commands run as uid 1000. PID 1 is
root's (with CAP_KILL alone) and non-dumpable: a command cannot ptrace or signal it, so nothing
the agent runs can hide in it from ``kill_all``. Each command runs under a small supervisor in
the container: ``_runner.serve``, one long-lived, non-dumpable process per container that the
host talks to over one exec's stdin/stdout. It kills the command's whole process group at the
deadline or when the command ends, so background jobs do not outlive it, and caps the output
there, so the host reads at most ``max_output`` bytes per stream (and checks that it did:
``wire.py``). A command that kills or stops it costs one restart, and every restart first ends
every process of the sandbox user (``kill -1`` as root, which they cannot signal or ptrace): a new supervisor is dumpable for the
moments before it calls ``prctl``, and a survivor that opened its stdout then could answer in its
place. ``exec_direct`` runs a trusted program with no supervisor at all, after the same sweep:
nothing of the sandbox user sits between it and the host (its parent is outside the container). Containers carry a ``turngym.sandbox`` label and their owner's host:pid; the
janitor (``cleanup_containers``) removes those whose owner is gone, and an ``atexit`` hook
removes this process's own.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import threading
import time
from collections import deque
from pathlib import Path

from turngym.tools.sandbox import _runner
from turngym.tools.sandbox.base import RawResult, Sandbox, SandboxConfig, SandboxError
from turngym.tools.sandbox._runner import Capture
from turngym.tools.sandbox.docker_stream import Server, close_hijacked, read_frames
from turngym.tools.sandbox.wire import MAX_HEAD_BYTES, MalformedAnswer, parse_head

LABEL = "turngym.sandbox"
OWNER_LABEL = "turngym.owner"
SANDBOX_USER = "1000:1000"
_HOST_GRACE_S = 10.0
# The in-container supervisor of every command: _runner's source, handed over in the environment
# (the command line stays short in `ps`; the supervisor drops it before any command starts).
_SUPERVISOR = Path(_runner.__file__).read_text()
_BOOT = "import os; exec(os.environ.pop('TURNGYM_SUPERVISOR'))"

# PID 1: reap orphans (SIGCHLD ignored: the kernel reaps them, so zombies do not pile up against
# the pids limit), refuse ptrace (non-dumpable; it is root's anyway), and wait forever.
_INIT = ("import signal\ntry:\n    import ctypes\n    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)\n"
         "except Exception:\n    pass\nsignal.signal(signal.SIGCHLD, signal.SIG_IGN)\nwhile True:\n    signal.pause()\n")
INIT_USER = "0:0"
# SIGKILL to every process in the container but PID 1 and this shell, again until none is left
# (bounded: 2 s at most), so no fork outruns it.
_KILL_EVERYTHING = ("kill -s KILL -- -1 2>/dev/null; i=0; while [ $i -lt 200 ] && kill -s 0 -- -1 2>/dev/null; "
                    "do kill -s KILL -- -1 2>/dev/null; sleep 0.01; i=$((i+1)); done; true")

_local = threading.local()
_live: set[str] = set()  # containers this process created and has not removed
_live_lock = threading.Lock()


def docker_client():
    """A per-thread, per-process ``docker.DockerClient``.

    The SDK's HTTP session is not shared across threads, nor across a fork: a forked env worker
    that kept its parent's client would write requests into the parent's open socket, and the
    engine would answer both with garbage (400s, "invalid character" 500s, read timeouts).
    """
    client = getattr(_local, "client", None)
    if client is None:
        import docker

        client = _local.client = docker.from_env(timeout=120)
    return client


def _forget_the_parent() -> None:
    # A forked child makes its own clients, and owns none of its parent's containers (its atexit
    # hook must not remove them). It has one thread; the lock is new in case another held it.
    global _local, _live_lock
    _local, _live_lock = threading.local(), threading.Lock()
    _live.clear()


os.register_at_fork(after_in_child=_forget_the_parent)


def docker_available() -> str | None:
    """Why no Docker engine can be used here, or ``None`` if one answers."""
    try:
        import docker  # noqa: F401
    except ImportError:
        return "the docker SDK is not installed (pip install 'turngym[docker]')"
    try:
        docker_client().ping()
    except Exception as e:
        _local.client = None
        return f"no Docker engine answers ({type(e).__name__}: {str(e)[:150]})"
    return None


def ensure_image(client=None) -> str:
    """The sandbox image tag, built from the cached rootfs tarball if the image is missing.

    Raises:
        SandboxError: Neither the image nor the tarball exists (build them first).
    """
    from turngym.tools.sandbox import image as img

    client = client or docker_client()
    tag = img.image_tag()
    if img._image_exists(client, tag):
        return tag
    if not img.rootfs_tar_path().exists():
        raise SandboxError(f"the sandbox image {tag} is not built; run `python -m turngym.tools.sandbox.image` (as root)")
    try:
        return img.build_docker_image(client, log=lambda *_: None)
    except img.SandboxImageError as e:
        raise SandboxError(str(e)) from e


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def container_kwargs(config: SandboxConfig, image: str) -> dict:
    """The locked-down ``containers.create`` arguments for one sandbox."""
    from docker.types import Ulimit

    c = config
    mem = f"{c.memory_mb}m"
    return dict(
        image=image, detach=True, labels={LABEL: "1", OWNER_LABEL: owner_id()},
        command=["python3", "-I", "-S", "-c", _INIT], user=INIT_USER,
        network_mode="none", mem_limit=mem, memswap_limit=mem, nano_cpus=int(c.cpus * 1e9),
        pids_limit=c.pids_limit, security_opt=["no-new-privileges"], read_only=True,
        # CAP_KILL is the one capability left, and only root's processes hold it (PID 1 and the
        # sweep that ends the sandbox user's processes): uid 1000 starts with none and, with
        # no-new-privileges, cannot gain one.
        cap_drop=["ALL"], cap_add=["KILL"],
        # Every writable mount is a tmpfs with a size and a file-count limit. /dev/shm is one of
        # them (Docker's own takes only a size), so the container gets no IPC mount of Docker's.
        ipc_mode="none",
        tmpfs={c.workdir: f"rw,exec,nosuid,nodev,size={c.workdir_size_mb}m,nr_inodes={c.max_files},uid=1000,gid=1000,mode=0755",
               "/tmp": f"rw,exec,nosuid,nodev,size={c.tmp_size_mb}m,nr_inodes={c.max_files},mode=1777",
               "/dev/shm": f"rw,nosuid,nodev,noexec,size={c.shm_size_mb}m,nr_inodes={c.max_files},mode=1777"},
        working_dir=c.workdir, hostname="sandbox", environment=dict(c.env),
        ulimits=[Ulimit(name="nofile", soft=c.nofile, hard=c.nofile), Ulimit(name="core", soft=0, hard=0),
                 Ulimit(name="fsize", soft=c.workdir_size_mb * 2**20, hard=c.workdir_size_mb * 2**20)],
    )


def start_container(config: SandboxConfig, image: str, client=None) -> str:
    """Create and start one sandbox container; returns its id."""
    client = client or docker_client()
    cont = client.containers.run(**container_kwargs(config, image))
    with _live_lock:
        _live.add(cont.id)
    return cont.id


def remove_container(cid: str, client=None) -> None:
    import docker

    client = client or docker_client()
    try:
        client.api.remove_container(cid, force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as e:  # another janitor got there first: as good as removed
        if e.status_code != 409 or "already in progress" not in str(e):
            raise
    with _live_lock:
        _live.discard(cid)


def cleanup_containers(client=None, *, everything: bool = False) -> int:
    """The janitor: remove labelled sandbox containers whose owner process is gone.

    Args:
        everything: Remove all turngym sandbox containers on this engine, live owners or not.

    Returns:
        How many containers were removed.
    """
    client = client or docker_client()
    host = socket.gethostname()
    removed = 0
    for c in client.api.containers(all=True, filters={"label": f"{LABEL}=1"}):
        owner = c.get("Labels", {}).get(OWNER_LABEL, "")
        h, _, pid = owner.rpartition(":")
        if everything or (h == host and pid.isdigit() and not _pid_alive(int(pid))):
            remove_container(c["Id"], client)
            removed += 1
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@atexit.register
def _remove_own_containers() -> None:
    with _live_lock:
        ids = list(_live)
    if not ids:
        return
    try:
        client = docker_client()
        for cid in ids:
            remove_container(cid, client)
    except Exception:
        pass  # the engine is gone; the janitor removes them next time


class DockerBackend(Sandbox):
    """A sandbox in its own locked-down container.

    Args:
        config: Limits (memory, CPU, pids, workdir size, per-command timeout, output cap).
        image: Image tag (default: the locally built sandbox image; built from the cached
            rootfs tarball if needed).
        pool: Take a warm container from this ``DockerPool`` instead of starting one.

    Raises:
        SandboxError: No engine answers, or the image is missing.
    """

    backend = "docker"

    def __init__(self, config: SandboxConfig | None = None, *, image: str | None = None,
                 pool: DockerPool | None = None) -> None:
        self._server: Server | None = None
        self._dirty = False  # a process of the sandbox user may be running (none has in a new container)
        if pool is not None:
            super().__init__(pool.config)
            self._pool, self.image = pool, pool.image
            self.container_id = pool.take()
            return
        super().__init__(config)
        reason = docker_available()
        if reason:
            raise SandboxError(reason)
        self._pool = None
        self.image = image or ensure_image()
        self.container_id = start_container(self.config, self.image)

    def _run(self, argv, timeout, stdin, max_output, cwd) -> RawResult:
        req = {"argv": argv, "cwd": cwd, "timeout": timeout, "max_output": max_output,
               "stdin_len": -1 if stdin is None else len(stdin)}
        return self._request(req, stdin or b"", timeout + _HOST_GRACE_S)

    def _run_direct(self, argv, timeout, stdin, max_output, cwd) -> RawResult:
        self._end_survivors()  # nothing left over may race to open the new process's descriptors
        t0 = time.monotonic()
        self._dirty = True
        out, err, code, timed_out = self._exec(argv, stdin, t0 + timeout, max_output, cwd)
        return RawResult(code, out.value(), err.value(), timed_out, time.monotonic() - t0, out.total, err.total)

    def _kill_all(self) -> None:
        # The supervisor's kill(-1) reaches every process of the sandbox user but itself (PID 1
        # is root's); when the supervisor does not answer, a fresh exec does the same, and the
        # supervisor goes with the rest.
        if self._request({"op": "killall"}, b"", _HOST_GRACE_S).exit_code != 0:
            self._kill_everything()

    def _kill_everything(self) -> None:
        """End every process of the sandbox user, the supervisor included (it goes with the rest)."""
        import docker

        self._drop_server()
        api = docker_client().api
        try:
            # As root, with the container's one capability (CAP_KILL): a shell of the sandbox user
            # could be stopped (SIGSTOP) or ptraced by the very processes it is there to end.
            ex = api.exec_create(self.container_id, ["sh", "-c", _KILL_EVERYTHING], user=INIT_USER)
            api.exec_start(ex["Id"])  # waits for it to finish; only root's shell writes there
        except docker.errors.APIError as e:
            raise SandboxError(f"cannot end the sandbox's processes: {e.explanation or e}") from e
        self._dirty = False

    def _end_survivors(self) -> None:
        """Before a new process of the sandbox user starts with a channel to the host: end every
        process of that user, if any ever ran. A survivor could otherwise open the new process's
        stdout through ``/proc/<pid>/fd/1`` in the moment before it makes itself non-dumpable,
        and answer in its place."""
        if self._dirty:
            self._kill_everything()

    # ----- the supervisor: one long-lived exec per container (``_runner.serve``) ----------------
    def _request(self, req: dict, payload: bytes, wait_s: float) -> RawResult:
        deadline = time.monotonic() + wait_s
        if self._server is not None and self._server.pid != os.getpid():
            self._server = None  # a forked process: the supervisor's socket is the parent's
        if self._server is not None and not self._server.alive():
            self._drop_server()  # killed between commands (by an escaped process): start another
        server = self._server or self._start_server()
        try:
            if server.unasked():
                raise MalformedAnswer("bytes before the request")
            server.raw.sendall(json.dumps(req).encode() + b"\n" + payload)
            head = parse_head(server.read_line(deadline, MAX_HEAD_BYTES), req.get("max_output", 0))
            out = server.read_n(head["stdout_len"], deadline)
            err = server.read_n(head["stderr_len"], deadline)
            if server.pending():
                raise MalformedAnswer(f"{server.pending()} bytes after the answer")
        except TimeoutError:  # stopped or wedged: nothing of the sandbox user survives this
            self._kill_everything()
            why = b"[the command's supervisor did not answer within the deadline; every process was killed]"
            return RawResult(137, b"", why, True, wait_s, 0, len(why))
        except MalformedAnswer as e:  # not the supervisor talking: whatever did, it ends here
            self._kill_everything()
            why = f"[the sandbox's answer was malformed ({e}); every process in the sandbox was killed]".encode()
            return RawResult(125, b"", why, False, 0.0, 0, len(why))
        except (OSError, EOFError) as e:  # the command killed its supervisor
            self._drop_server()
            why = f"[the sandbox's command supervisor died during the command ({type(e).__name__}); its output is lost]"
            return RawResult(137, b"", why.encode(), False, 0.0, 0, len(why))
        finally:
            self.bytes_received += server.take_count()
        return RawResult(head["exit_code"], out, err, head["timed_out"], head["elapsed_s"],
                         head["stdout_total"], head["stderr_total"])

    def _start_server(self) -> Server:
        import docker

        self._end_survivors()
        self._dirty = True
        api = docker_client().api
        try:
            ex = api.exec_create(self.container_id, ["python3", "-I", "-S", "-c", _BOOT, "{}"], stdin=True,
                                 user=SANDBOX_USER, workdir=self.workdir, environment={"TURNGYM_SUPERVISOR": _SUPERVISOR})
            sock = api.exec_start(ex["Id"], socket=True)
        except docker.errors.APIError as e:
            raise SandboxError(f"docker exec failed: {e.explanation or e}") from e
        self._server = Server(sock)
        return self._server

    def _drop_server(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def _exec(self, cmd: list[str], stdin: bytes | None, deadline: float, max_output: int,
              cwd: str | None = None) -> tuple[Capture, Capture, int, bool]:
        """One ``docker exec`` of ``cmd`` as the sandbox user, nothing in between: (stdout, stderr,
        exit code, missed the deadline). Past ``deadline`` every process of the sandbox user is killed."""
        import docker

        api = docker_client().api
        try:
            ex = api.exec_create(self.container_id, cmd, stdin=stdin is not None, user=SANDBOX_USER,
                                 workdir=cwd or self.workdir)
            sock = api.exec_start(ex["Id"], socket=True)
        except docker.errors.APIError as e:
            raise SandboxError(f"docker exec failed: {e.explanation or e}") from e
        raw = getattr(sock, "_sock", sock)
        try:
            if stdin is not None:
                raw.sendall(stdin)
                raw.shutdown(socket.SHUT_WR)
            out, err, late, n = read_frames(raw, deadline, max_output)
            self.bytes_received += n
        finally:
            close_hijacked(sock, raw)
        if late:
            self._kill_everything()
        code = api.exec_inspect(ex["Id"]).get("ExitCode")
        return out, err, 137 if code is None else int(code), late

    def _close(self) -> None:
        self._drop_server()
        if self._pool is not None:
            self._pool.discard(self.container_id)
        else:
            remove_container(self.container_id)


class DockerPool:
    """Keeps ``size`` started sandbox containers ready, so an episode reset does not wait for one.

    A background thread refills the pool and removes discarded containers. ``take()`` hands out
    a ready container (starting one on the spot if the pool is empty).

    Args:
        config: Limits for every container of the pool.
        size: Warm containers kept ready.
        image: Image tag (default: the locally built sandbox image).

    Raises:
        SandboxError: No engine answers, or the image is missing.
    """

    def __init__(self, config: SandboxConfig | None = None, *, size: int = 1, image: str | None = None) -> None:
        reason = docker_available()
        if reason:
            raise SandboxError(reason)
        self.config = config or SandboxConfig()
        self.size = max(0, int(size))
        self.image = image or ensure_image()
        cleanup_containers()
        self._ready: deque[str] = deque()
        self._trash: deque[str] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._error: str | None = None
        self._thread = threading.Thread(target=self._work, name="turngym-docker-pool", daemon=True)
        self._thread.start()

    def take(self) -> str:
        """A started container id, ready to use (the caller owns it until ``discard``)."""
        with self._cv:
            if self._closed:
                raise SandboxError("the Docker pool is closed")
            if self._ready:
                cid = self._ready.popleft()
                self._cv.notify_all()
                return cid
            self._cv.notify_all()
        return start_container(self.config, self.image)

    def discard(self, cid: str) -> None:
        """Hand a used container back; it is removed in the background (never reused)."""
        with self._cv:
            self._trash.append(cid)
            self._cv.notify_all()

    def sandbox(self) -> DockerBackend:
        """A ``DockerBackend`` on a warm container from this pool."""
        return DockerBackend(pool=self)

    def close(self) -> None:
        """Stop refilling and remove every container of the pool (ready or discarded)."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=60)
        for cid in list(self._ready) + list(self._trash):
            remove_container(cid)
        self._ready.clear()
        self._trash.clear()

    def __enter__(self) -> DockerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not self._trash and len(self._ready) >= self.size:
                    self._cv.wait()
                if self._closed:
                    return
                # Refill first: a reset waiting on a container matters more than removing one.
                trash = self._trash.popleft() if len(self._ready) >= self.size else None
            if trash is not None:
                remove_container(trash)
                continue
            try:
                cid = start_container(self.config, self.image)
            except Exception as e:  # surfaced by take(), which then starts one itself
                self._error = f"{type(e).__name__}: {e}"
                time.sleep(1.0)
                continue
            with self._cv:
                if self._closed:
                    self._trash.append(cid)
                else:
                    self._ready.append(cid)
