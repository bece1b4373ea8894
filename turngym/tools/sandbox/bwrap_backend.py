"""``BwrapBackend``: the sandbox rootfs under bubblewrap, for machines without a Docker engine.

One long-lived ``bwrap`` process per sandbox, with every namespace unshared (no network but
loopback, own PIDs, own mounts, own user namespace and no nested ones), the Debian rootfs
mounted read-only, size-limited tmpfs for the workdir, ``/tmp`` and ``/dev/shm`` (its own, not
the host's), a read-only ``/dev`` (its device nodes work; no file can be made there), and uid
1000 inside. Where a cgroup can be made (``cgroup.py``: root, or a delegated
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

NOBODY = 65534
SANDBOX_UID = 1000
# The server enforces each command's deadline itself; the host waits this much longer before
# deciding the sandbox is wedged and tearing it down.
_HOST_GRACE_S = 10.0
SERVER_PATH = "/tmp/.turngym-sandbox-server.py"
# Joins the cgroup (``$1`` procs files follow), then becomes bwrap: every process of the sandbox
# starts inside it, with no window in which bwrap has forked outside.
_JOIN = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 97; shift; n=$((n-1)); done; exec "$@"'


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
        self._buf = b""
        self._errlog = tempfile.TemporaryFile()
        c = self.config
        self.cgroup, why = SandboxCgroup.create(c.memory_mb * 2**20, c.pids_limit,
                                                _drop_kwargs().get("user"))
        #: What caps the sandbox's total memory (``cgroup v1``/``cgroup v2``), or why nothing does.
        self.memory_enforcement = (f"cgroup v{self.cgroup.version}" if self.cgroup else
                                   f"RLIMIT_AS per process only ({why})")
        join = ["sh", "-c", _JOIN, "sh", str(len(self.cgroup.procs_files)), *self.cgroup.procs_files] if self.cgroup else []
        # The server's source goes in through a memfd, read-only at SERVER_PATH inside.
        src = os.memfd_create("turngym-sandbox-server")
        try:
            os.write(src, Path(_runner.__file__).read_bytes())
            os.lseek(src, 0, os.SEEK_SET)
            self._proc = subprocess.Popen([*join, *self._command(src)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=self._errlog, pass_fds=[src], **_drop_kwargs())
        except BaseException:
            self._remove_cgroup()
            raise
        finally:
            os.close(src)
        res = self._run(["true"], 20.0, None, 1024, self.workdir)
        if res.exit_code != 0:
            self._close()
            self._closed = True
            raise SandboxError(f"the bwrap sandbox did not start: {res.stderr.decode('utf-8', 'replace')}")

    def _command(self, server_fd: int) -> list[str]:
        c = self.config
        limits = {"RLIMIT_AS": c.memory_mb * 2**20, "RLIMIT_NPROC": c.pids_limit, "RLIMIT_CORE": 0,
                  "RLIMIT_FSIZE": c.workdir_size_mb * 2**20, "RLIMIT_NOFILE": c.nofile}
        return [
            "bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
            "--new-session", "--as-pid-1", "--cap-drop", "ALL",
            "--ro-bind", str(self.rootfs), "/", "--proc", "/proc", "--dev", "/dev",
            "--perms", "1777", "--size", str(c.shm_size_mb * 2**20), "--tmpfs", "/dev/shm",
            "--remount-ro", "/dev",  # bwrap's /dev is a tmpfs with no size limit: files go in /dev/shm
            "--perms", "0755", "--size", str(c.workdir_size_mb * 2**20), "--tmpfs", c.workdir,
            "--perms", "1777", "--size", str(c.tmp_size_mb * 2**20), "--tmpfs", "/tmp",
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
        with self._lock:
            try:
                self._proc.stdin.write(json.dumps(req).encode() + b"\n" + payload)
                self._proc.stdin.flush()
                deadline = time.monotonic() + wait_s
                head = json.loads(self._read_line(deadline))
                out = self._read_n(head["stdout_len"], deadline)
                err = self._read_n(head["stderr_len"], deadline)
            except (OSError, ValueError, EOFError, TimeoutError) as e:
                self._fail()
                raise SandboxError(f"the bwrap sandbox failed ({type(e).__name__}: {e}); "
                                   f"bwrap said: {self._stderr_tail()}") from e
        return RawResult(head["exit_code"], out, err, head["timed_out"], head["elapsed_s"],
                         head["stdout_total"], head["stderr_total"])

    def _fill(self, deadline: float) -> None:
        fd = self._proc.stdout.fileno()
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError("no answer from the sandbox server")
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            raise EOFError("the sandbox server exited")
        self.bytes_received += len(chunk)
        self._buf += chunk

    def _read_line(self, deadline: float) -> bytes:
        while b"\n" not in self._buf:
            self._fill(deadline)
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def _read_n(self, n: int, deadline: float) -> bytes:
        while len(self._buf) < n:
            self._fill(deadline)
        data, self._buf = self._buf[:n], self._buf[n:]
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

    def _remove_cgroup(self) -> None:
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None

    def __del__(self) -> None:
        if not getattr(self, "_closed", True) and hasattr(self, "_proc"):
            try:
                self._proc.kill()
                self._proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass
            if getattr(self, "cgroup", None) is not None:
                self._remove_cgroup()
