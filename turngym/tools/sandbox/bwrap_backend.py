"""``BwrapBackend``: the sandbox rootfs under bubblewrap, for machines without a Docker engine.

One long-lived ``bwrap`` process per sandbox, with every namespace unshared (no network but
loopback, own PIDs, own mounts, own user namespace and no nested ones), the Debian rootfs
mounted read-only, tmpfs for the workdir, ``/tmp`` and ``/dev/shm`` (its own, not the host's)
each limited in size and in file count (``max_files``: a million empty files once pinned 2 GB of
host kernel memory), a read-only ``/dev`` (its device nodes work; no file can be made there),
and uid 1000 inside. bwrap's own tmpfs takes no file count, so the three are mounted in a user
and mount namespace of their own just before bwrap starts (``unshare``); where that cannot be
done, bwrap's tmpfs are used and ``file_limit_enforcement`` says why. Where a cgroup can be made (``cgroup.py``: root, or a delegated
subtree) the whole sandbox lives in one, which caps its total memory (tmpfs files included) and
process count; without one, only the per-process rlimits below apply. Its PID 1 is a small
Python server (``_runner.serve``) that runs each command with rlimits (address space,
processes, file size, open files), a SIGKILL deadline on the whole process group and capped
output. PID 1 of a PID namespace cannot be killed from inside it, and the server marks
itself non-dumpable, so a command cannot take the server down or ptrace it. When run as root,
bwrap itself runs as ``nobody``, so even an escape lands on an unprivileged host user.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from turngym.tools.sandbox import _runner
from turngym.tools.sandbox.base import RawResult, Sandbox, SandboxConfig, SandboxError
from turngym.tools.sandbox.cgroup import SandboxCgroup
from turngym.tools.sandbox.wire import MAX_HEAD_BYTES, MalformedAnswer, parse_head

NOBODY = 65534
SANDBOX_UID = 1000
# The server enforces each command's deadline itself; the host waits this much longer before
# deciding the sandbox is wedged and tearing it down.
_HOST_GRACE_S = 10.0
SERVER_PATH = "/tmp/.turngym-sandbox-server.py"
# Joins the cgroup (``$1`` procs files follow), then becomes bwrap: every process of the sandbox
# starts inside it, with no window in which bwrap has forked outside.
_JOIN = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 97; shift; n=$((n-1)); done; exec "$@"'
# bwrap's --tmpfs takes a size but no file count. So, in a user and mount namespace of its own
# (``unshare``, as that namespace's root), this mounts the three writable tmpfs with both limits
# on the mount points under ``$1`` and becomes bwrap, which binds them in. The mounts exist only
# in that namespace, and go with it.
_MOUNTS = ('d=$1; shift; for m in w t s; do mount -t tmpfs -o "$1" turngym-sandbox "$d/$m" || exit 96; shift; done; '
           'exec "$@"')
_UNSHARE = ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private"]
_MOUNT_POINTS = {"w": "0755", "t": "1777", "s": "1777"}  # workdir, /tmp, /dev/shm: their modes


def bwrap_available() -> str | None:
    """Why bwrap cannot run here, or ``None`` if it can (binary present and user namespaces allowed)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    try:
        r = subprocess.run(["bwrap", "--unshare-user", "--ro-bind", "/", "/", "true"], capture_output=True,
                           text=True, timeout=10, **_drop_kwargs())
    except (OSError, subprocess.SubprocessError) as e:
        return f"bwrap failed to start: {e}"
    if r.returncode != 0:
        return f"bwrap cannot create namespaces here: {r.stderr.strip()[:200]}"
    return None


_mounts_checked: list[str | None] = []  # memo of file_limits_unavailable(): one probe per process


def file_limits_unavailable() -> str | None:
    """Why the writable mounts cannot get a file-count limit here (``unshare`` or ``mount``
    missing, or user namespaces refused to it), or ``None`` if they can. Probed once per process."""
    if not _mounts_checked:
        _mounts_checked.append(_probe_mounts())
    return _mounts_checked[0]


def _probe_mounts() -> str | None:
    for tool in ("unshare", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} (util-linux) is not installed"
    with tempfile.TemporaryDirectory(prefix="turngym-bwrap-probe-") as d:
        os.chmod(d, 0o755)
        for m in _MOUNT_POINTS:
            os.mkdir(os.path.join(d, m), 0o755)
        opts = ["size=1m,nr_inodes=16"] * 3
        try:
            r = subprocess.run([*_UNSHARE, "sh", "-c", _MOUNTS, "sh", d, *opts, "true"], capture_output=True,
                               text=True, timeout=10, **_drop_kwargs())
        except (OSError, subprocess.SubprocessError) as e:
            return f"unshare failed to start: {e}"
    if r.returncode != 0:
        return f"cannot mount a tmpfs in a user namespace here: {r.stderr.strip()[:200]}"
    return None


def _drop_kwargs() -> dict:
    """As root, run bwrap as nobody (an escape then lands on an unprivileged user)."""
    if os.geteuid() == 0:
        return {"user": NOBODY, "group": NOBODY, "extra_groups": []}
    return {}


class BwrapBackend(Sandbox):
    """A bubblewrap sandbox on the Debian rootfs built by ``turngym.tools.sandbox.image``.

    Args:
        config: Limits. ``memory_mb`` caps the whole sandbox when a cgroup can be made (see
            ``memory_enforcement``), and every process's address space in any case; ``pids_limit``
            caps processes (cgroup, and RLIMIT_NPROC).
        rootfs: The unpacked rootfs (default: the cached one; see ``ensure_rootfs_dir``).

    Raises:
        SandboxError: bwrap or the rootfs is missing, or the sandbox did not come up.
    """

    backend = "bwrap"

    def __init__(self, config: SandboxConfig | None = None, *, rootfs: str | Path | None = None) -> None:
        super().__init__(config)
        if rootfs is None:
            from turngym.tools.sandbox.image import SandboxImageError, ensure_rootfs_dir

            try:
                rootfs = ensure_rootfs_dir(build=False)
            except SandboxImageError as e:
                raise SandboxError(str(e)) from e
        self.rootfs = Path(rootfs)
        if not (self.rootfs / "usr" / "bin" / "python3").exists():
            raise SandboxError(f"{self.rootfs} is not a sandbox rootfs (no usr/bin/python3)")
        if shutil.which("bwrap") is None:
            raise SandboxError("bubblewrap (bwrap) is not installed")
        self._lock = threading.Lock()
        self._buf = bytearray()
        self._errlog = tempfile.TemporaryFile()
        c = self.config
        self.cgroup, why = SandboxCgroup.create(c.memory_mb * 2**20, c.pids_limit,
                                                _drop_kwargs().get("user"))
        #: What caps the sandbox's total memory (``cgroup v1``/``cgroup v2``), or why nothing does.
        self.memory_enforcement = (f"cgroup v{self.cgroup.version}" if self.cgroup else
                                   f"RLIMIT_AS per process only ({why})")
        join = ["sh", "-c", _JOIN, "sh", str(len(self.cgroup.procs_files)), *self.cgroup.procs_files] if self.cgroup else []
        why_not = file_limits_unavailable()
        #: What caps the number of files on each writable mount, or why nothing does.
        self.file_limit_enforcement = f"none ({why_not})" if why_not else f"tmpfs nr_inodes={c.max_files}"
        self._mount_dir = None if why_not else self._mount_points()
        mounts = [] if why_not else [*_UNSHARE, "sh", "-c", _MOUNTS, "sh", self._mount_dir, *self._mount_options()]
        # The server's source goes in through a memfd, read-only at SERVER_PATH inside.
        src = os.memfd_create("turngym-sandbox-server")
        try:
            os.write(src, Path(_runner.__file__).read_bytes())
            os.lseek(src, 0, os.SEEK_SET)
            self._proc = subprocess.Popen([*join, *mounts, *self._command(src)], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=self._errlog, pass_fds=[src], **_drop_kwargs())
        except BaseException:
            self._remove_cgroup()
            self._remove_mount_points()
            raise
        finally:
            os.close(src)
        res = self._run(["true"], 20.0, None, 1024, self.workdir)
        if res.exit_code != 0:
            self._close()
            self._closed = True
            raise SandboxError(f"the bwrap sandbox did not start: {res.stderr.decode('utf-8', 'replace')}")

    def _mount_points(self) -> str:
        d = tempfile.mkdtemp(prefix="turngym-bwrap-mounts-")
        os.chmod(d, 0o755)  # bwrap may run as nobody: it must reach the mount points
        for m in _MOUNT_POINTS:
            os.mkdir(os.path.join(d, m), 0o755)
        return d

    def _mount_options(self) -> list[str]:
        c = self.config
        sizes = {"w": c.workdir_size_mb, "t": c.tmp_size_mb, "s": c.shm_size_mb}
        return [f"size={sizes[m] * 2**20},nr_inodes={c.max_files},mode={mode},nosuid,nodev" + (",noexec" if m == "s" else "")
                for m, mode in _MOUNT_POINTS.items()]

    def _writable_mounts(self) -> list[str]:
        c, d = self.config, self._mount_dir
        if d is None:  # bwrap's own tmpfs: sizes, but no file-count limit (see file_limit_enforcement)
            return ["--perms", "1777", "--size", str(c.shm_size_mb * 2**20), "--tmpfs", "/dev/shm",
                    "--remount-ro", "/dev",  # bwrap's /dev is a tmpfs with no size limit: files go in /dev/shm
                    "--perms", "0755", "--size", str(c.workdir_size_mb * 2**20), "--tmpfs", c.workdir,
                    "--perms", "1777", "--size", str(c.tmp_size_mb * 2**20), "--tmpfs", "/tmp"]
        return ["--bind", f"{d}/s", "/dev/shm", "--remount-ro", "/dev",
                "--bind", f"{d}/w", c.workdir, "--bind", f"{d}/t", "/tmp"]

    def _command(self, server_fd: int) -> list[str]:
        c = self.config
        limits = {"RLIMIT_AS": c.memory_mb * 2**20, "RLIMIT_NPROC": c.pids_limit, "RLIMIT_CORE": 0,
                  "RLIMIT_FSIZE": c.workdir_size_mb * 2**20, "RLIMIT_NOFILE": c.nofile}
        return [
            "bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
            "--new-session", "--as-pid-1", "--cap-drop", "ALL",
            "--ro-bind", str(self.rootfs), "/", "--proc", "/proc", "--dev", "/dev",
            *self._writable_mounts(),
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox",
            "--chdir", c.workdir, "--clearenv", "--setenv", "PATH", "/usr/bin:/bin",
            "--ro-bind-data", str(server_fd), SERVER_PATH,
            "--", "/usr/bin/python3", "-I", "-S", SERVER_PATH, json.dumps(limits),
        ]

    def _env(self) -> dict[str, str]:
        return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8",
                "PYTHONDONTWRITEBYTECODE": "1", "GIT_CONFIG_NOSYSTEM": "1", **self.config.env}

    def _run(self, argv, timeout, stdin, max_output, cwd) -> RawResult:
        req = {"argv": argv, "cwd": cwd, "env": self._env(), "timeout": timeout, "max_output": max_output,
               "stdin_len": -1 if stdin is None else len(stdin)}
        return self._request(req, stdin or b"", timeout + _HOST_GRACE_S)

    def _kill_all(self) -> None:
        self._request({"op": "killall"}, b"", _HOST_GRACE_S)

    def _request(self, req: dict, payload: bytes, wait_s: float) -> RawResult:
        # The server is PID 1, out of the commands' reach; its answers are still checked like any
        # sandbox data (``wire``), and one that is not its shape ends the sandbox.
        with self._lock:
            try:
                self._proc.stdin.write(json.dumps(req).encode() + b"\n" + payload)
                self._proc.stdin.flush()
                deadline = time.monotonic() + wait_s
                head = parse_head(self._read_line(deadline, MAX_HEAD_BYTES), req.get("max_output", 0))
                out = self._read_n(head["stdout_len"], deadline)
                err = self._read_n(head["stderr_len"], deadline)
                if self._buf:
                    raise MalformedAnswer(f"{len(self._buf)} bytes after the answer")
            except (OSError, ValueError, EOFError, TimeoutError) as e:  # MalformedAnswer is a ValueError
                said = self._stderr_tail()  # before _fail closes the log
                self._fail()
                raise SandboxError(f"the bwrap sandbox failed ({type(e).__name__}: {e}); bwrap said: {said}") from e
        return RawResult(head["exit_code"], out, err, head["timed_out"], head["elapsed_s"],
                         head["stdout_total"], head["stderr_total"])

    def _fill(self, deadline: float) -> None:
        fd = self._proc.stdout.fileno()
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError("no answer from the sandbox server")
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            raise EOFError("the sandbox server exited")
        self.bytes_received += len(chunk)
        self._buf += chunk

    def _read_line(self, deadline: float, limit: int) -> bytes:
        while b"\n" not in self._buf[:limit + 1]:
            if len(self._buf) > limit:
                raise MalformedAnswer(f"an answer head of more than {limit} bytes")
            self._fill(deadline)
        i = self._buf.index(b"\n")
        line = bytes(self._buf[:i])
        del self._buf[:i + 1]
        return line

    def _read_n(self, n: int, deadline: float) -> bytes:
        while len(self._buf) < n:
            self._fill(deadline)
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data

    def _stderr_tail(self) -> str:
        try:
            self._errlog.seek(0)
            return self._errlog.read()[-500:].decode("utf-8", "replace").strip() or "(nothing)"
        except (OSError, ValueError):
            return "(no log)"

    def _fail(self) -> None:
        self._closed = True
        self._close()

    def _close(self) -> None:
        proc = self._proc
        try:
            proc.stdin.close()  # EOF: the server returns, and PID 1 exiting ends the whole namespace
        except OSError:
            pass
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        self._errlog.close()
        self._remove_cgroup()
        self._remove_mount_points()

    def _remove_cgroup(self) -> None:
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None

    def _remove_mount_points(self) -> None:
        # Only the empty mount points are here: the tmpfs went with the sandbox's namespace.
        if getattr(self, "_mount_dir", None) is not None:
            shutil.rmtree(self._mount_dir, ignore_errors=True)
            self._mount_dir = None

    def __del__(self) -> None:
        if not getattr(self, "_closed", True) and hasattr(self, "_proc"):
            try:
                self._proc.kill()
                self._proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass
            if getattr(self, "cgroup", None) is not None:
                self._remove_cgroup()
            self._remove_mount_points()
