"""The sandbox interface every backend implements, its limits, and what one command returns.

A ``Sandbox`` is a place to run untrusted shell commands: a writable working directory with a
size limit and a file-count limit, no network, memory / process / time limits, and a non-root user. Backends only
implement ``_run`` (one command with a deadline and capped output), ``_kill_all`` and
``_close``; files, snapshots and the context-manager behaviour are built on top of ``_run``
here, so every backend behaves the same at the edges.

Output is capped inside the sandbox, before the host reads it: a command's stdout and stderr
each come back as at most ``max_output`` bytes (head and tail), however much it writes, and
``bytes_received`` counts what the host did read. File reads take a byte limit of their own. The
host does not take the cap on trust: it checks every answer's lengths and shape before it reads
the bytes (``wire.py``), so an answer forged in the sandbox costs it no more than a real one.
"""

from __future__ import annotations

import posixpath
import signal
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar


@dataclass
class SandboxConfig:
    """Limits and layout shared by all backends (the defaults are the safe ones)."""

    workdir: str = field(default="/workspace", metadata={"help": "writable working dir (inside the sandbox)"})
    memory_mb: int = field(default=1024, metadata={
        "help": "memory limit of the whole sandbox, tmpfs files included (a cgroup; bwrap without one: RLIMIT_AS per process)"})
    cpus: float = field(default=1.0, metadata={"help": "CPU share (Docker only)"})
    pids_limit: int = field(default=256, metadata={"help": "max processes (Docker pids cgroup; bwrap RLIMIT_NPROC)"})
    workdir_size_mb: int = field(default=256, metadata={"help": "size of the writable workdir (tmpfs)"})
    tmp_size_mb: int = field(default=64, metadata={"help": "size of /tmp (tmpfs)"})
    shm_size_mb: int = field(default=64, metadata={"help": "size of /dev/shm (tmpfs, one per sandbox)"})
    max_files: int = field(default=32_768, metadata={
        "help": "files and directories each writable mount (workdir, /tmp, /dev/shm) may hold: tmpfs nr_inodes. "
                "Every one pins ~1 KB of kernel memory, however small the file"})
    nofile: int = field(default=1024, metadata={"help": "max open files per process"})
    timeout_s: float = field(default=30.0, metadata={"help": "default per-command wall-clock limit"})
    max_output_bytes: int = field(default=32_768, metadata={"help": "stdout/stderr kept per command (head + tail)"})
    env: dict[str, str] = field(default_factory=dict, metadata={"help": "extra environment for every command"})

    def __post_init__(self) -> None:
        if not self.workdir.startswith("/") or self.workdir == "/":
            raise ValueError(f"workdir must be an absolute path below /, got {self.workdir!r}")
        for name in ("memory_mb", "pids_limit", "workdir_size_mb", "tmp_size_mb", "shm_size_mb", "max_files", "nofile",
                     "max_output_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.timeout_s <= 0 or self.cpus <= 0:
            raise ValueError("timeout_s and cpus must be positive")


@dataclass
class ExecResult:
    """What one command returned. Unpacks as ``exit_code, stdout, stderr``.

    ``exit_code`` is 128 + signal when the command was killed (137 = SIGKILL: timeout or a limit).
    ``stdout_bytes`` / ``stderr_bytes`` count everything produced, before truncation.
    """

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    elapsed_s: float = 0.0
    stdout_bytes: int = 0
    stderr_bytes: int = 0

    def __iter__(self):
        return iter((self.exit_code, self.stdout, self.stderr))

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def truncated(self) -> bool:
        return self.stdout_bytes > len(self.stdout.encode()) or self.stderr_bytes > len(self.stderr.encode())

    def observation(self, timeout_s: float | None = None) -> str:
        """The result as the agent reads it: exit status with its cause, then the output."""
        if self.timed_out:
            limit = f" of {timeout_s:g}s" if timeout_s else ""
            head = f"[command timed out after {self.elapsed_s:.1f}s (limit{limit}) and was killed]"
        elif self.exit_code == 137:
            head = "[exit code 137: killed by SIGKILL -- the command hit a sandbox limit (memory or processes)]"
        elif self.exit_code == 128 + 25:
            head = f"[exit code {self.exit_code}: killed by SIGXFSZ -- a file hit the sandbox's size limit]"
        elif self.exit_code > 128:
            head = f"[exit code {self.exit_code}: killed by signal {_signal_name(self.exit_code - 128)}]"
        else:
            head = f"[exit code {self.exit_code}]"
        parts = [head]
        if self.stdout:
            parts.append(self.stdout.rstrip("\n"))
        if self.stderr:
            parts.append("[stderr]\n" + self.stderr.rstrip("\n"))
        return "\n".join(parts)


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return str(n)


@dataclass
class RawResult:
    """A backend's answer before decoding (bytes, so tar streams survive)."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    elapsed_s: float = 0.0
    stdout_total: int = 0
    stderr_total: int = 0

    def decode(self) -> ExecResult:
        return ExecResult(self.exit_code, self.stdout.decode("utf-8", "replace"), self.stderr.decode("utf-8", "replace"),
                          self.timed_out, self.elapsed_s, self.stdout_total, self.stderr_total)


class SandboxError(RuntimeError):
    """The sandbox itself failed (engine gone, sandbox closed), not the command in it."""


# Files are moved in and out in one piece; this cap keeps a runaway file from filling host memory.
MAX_FILE_BYTES = 64 * 2**20


class Sandbox(ABC):
    """A sandboxed shell with a writable ``workdir``.

    Use it as a context manager, or call ``close()``; either way it is gone afterwards.

    Subclasses implement ``_run(argv, timeout, stdin, max_output, cwd)``, ``_kill_all()`` and
    ``_close()``.
    """

    backend: ClassVar[str] = "base"

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self._closed = False
        #: Bytes of command output this process has read from the sandbox so far.
        self.bytes_received = 0

    # ----- what a backend implements --------------------------------------------------------
    @abstractmethod
    def _run(self, argv: list[str], timeout: float, stdin: bytes | None, max_output: int, cwd: str) -> RawResult:
        """Run ``argv`` (no shell added) as the sandbox user; kill its process group at the deadline."""

    @abstractmethod
    def _kill_all(self) -> None:
        """Kill every process the sandbox user runs (leftover background jobs)."""

    @abstractmethod
    def _close(self) -> None: ...

    def _run_direct(self, argv: list[str], timeout: float, stdin: bytes | None, max_output: int, cwd: str) -> RawResult:
        """``_run`` with no process of the sandbox user between ``argv`` and the host. A backend
        whose ``_run`` already has none (its supervisor is out of the user's reach) keeps this."""
        return self._run(argv, timeout, stdin, max_output, cwd)

    # ----- the interface --------------------------------------------------------------------
    @property
    def workdir(self) -> str:
        """The writable working directory, as commands inside the sandbox see it."""
        return self.config.workdir

    @property
    def scratch_dir(self) -> str:
        """A writable scratch directory outside the workdir (the sandbox's private ``/tmp``)."""
        return "/tmp"

    @property
    def closed(self) -> bool:
        return self._closed

    def exec(self, cmd: str | list[str], timeout: float | None = None, *, stdin: bytes | str | None = None,
             cwd: str | None = None, max_output: int | None = None) -> ExecResult:
        """Run a shell command in the workdir.

        Args:
            cmd: A shell command line (run by ``sh -c``), or an argv list (quoted for you).
            timeout: Wall-clock limit in seconds (default ``config.timeout_s``); the command and
                everything it started are killed with SIGKILL at the limit.
            stdin: Bytes (or text) fed to the command's stdin.
            cwd: Working directory inside the sandbox (default: the workdir).
            max_output: Bytes kept per stream (head and tail; default ``config.max_output_bytes``).

        Returns:
            An ``ExecResult`` (unpacks as ``exit_code, stdout, stderr``).

        Raises:
            SandboxError: The sandbox is closed or its engine failed.
        """
        return self._checked_run(cmd, timeout, stdin, cwd, max_output).decode()

    def exec_direct(self, argv: list[str], timeout: float, *, stdin: bytes | None = None,
                    max_output: int | None = None) -> ExecResult:
        """Run a trusted supervisor (the grader's case runner) in the workdir with nothing the
        sandbox user can signal, ptrace or write to between it and the host.

        ``exec`` may wrap a command in helpers that run as the sandbox user (Docker's timeout
        wrapper); a program whose children run untrusted code must not have such helpers above
        it, or the children could write into its output channel through ``/proc``. The program
        enforces its own limits and output bounds; at ``timeout`` every process of the sandbox
        user is killed.

        Raises:
            SandboxError: The sandbox is closed or its engine failed.
        """
        if self._closed:
            raise SandboxError("the sandbox is closed")
        if float(timeout) <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        raw = self._run_direct([str(a) for a in argv], float(timeout), stdin,
                               int(max_output or self.config.max_output_bytes), self.workdir)
        return raw.decode()

    def write_file(self, path: str, content: str | bytes) -> None:
        """Create or overwrite ``path`` (relative paths are under the workdir), making parent dirs.

        Raises:
            SandboxError: The file could not be written (read-only location, disk full, ...).
        """
        data = content.encode() if isinstance(content, str) else bytes(content)
        p = self.resolve(path)
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        res = self._checked_run(["sh", "-c", script, "sh", p], 60.0, data, None, 4096)
        if res.exit_code != 0:
            raise SandboxError(f"cannot write {p}: {res.stderr.decode('utf-8', 'replace').strip()}")

    def read_file(self, path: str, *, binary: bool = False, max_bytes: int = MAX_FILE_BYTES) -> str | bytes:
        """The content of ``path`` (relative paths are under the workdir).

        Args:
            max_bytes: Refuse a larger file (only ``max_bytes + 1`` bytes ever leave the sandbox).

        Raises:
            FileNotFoundError: No such file (or it cannot be read as the sandbox user).
            SandboxError: The file is larger than ``max_bytes`` (default 64 MiB).
        """
        p = self.resolve(path)
        # The size is checked in the sandbox first, so a large file is refused without being read.
        script = ('n=$(stat -L -c %s -- "$1") || exit 2; [ "$n" -le "$2" ] || { echo "larger than $2 bytes" >&2; exit 3; }; '
                  'head -c "$(($2 + 1))" -- "$1"')
        res = self._checked_run(["sh", "-c", script, "sh", p, str(max_bytes)], 60.0, None, None, max_bytes + 1)
        if res.exit_code == 3 or len(res.stdout) > max_bytes:
            raise SandboxError(f"{p} is larger than {max_bytes} bytes")
        if res.exit_code != 0:
            raise FileNotFoundError(f"{p}: {res.stderr.decode('utf-8', 'replace').strip()}")
        return res.stdout if binary else res.stdout.decode("utf-8", "replace")

    def read_files(self, paths: list[str], max_bytes: int = MAX_FILE_BYTES) -> dict[str, str]:
        """Several text files in one exec (relative paths are under the workdir). Missing files,
        symbolic links and files larger than ``max_bytes`` are left out (inside the sandbox)."""
        import io
        import tarfile

        if not paths:
            return {}
        script = ('n=$1; shift; for f in "$@"; do [ -f "$f" ] && [ ! -L "$f" ] && '
                  '[ "$(stat -c %s -- "$f")" -le "$n" ] && printf "%s\\n" "$f"; done | tar -cf - -T -')
        cap = min(MAX_FILE_BYTES, len(paths) * (max_bytes + 1024) + 10240)
        res = self._checked_run(["sh", "-c", script, "sh", str(max_bytes), *paths], 60.0, None, None, cap)
        out = {}
        with tarfile.open(fileobj=io.BytesIO(res.stdout), mode="r") as tar:
            for m in tar.getmembers():
                f = tar.extractfile(m) if m.isreg() else None
                if f is not None:
                    out[m.name] = f.read().decode("utf-8", "replace")
        return out

    def put_files(self, files: dict[str, str | bytes], dest: str | None = None) -> None:
        """Write many files at once (one tar stream) under ``dest`` (default: the workdir)."""
        import io
        import tarfile

        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, content in sorted(files.items()):
                data = content.encode() if isinstance(content, str) else bytes(content)
                info = tarfile.TarInfo(name.lstrip("/"))
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
        self._untar(buf.getvalue(), self.resolve(dest or self.workdir))

    def snapshot(self) -> bytes:
        """A tar of the workdir's current content (restore it with ``restore``)."""
        res = self._checked_run(["tar", "-C", self.workdir, "-cf", "-", "."], 120.0, None, None,
                                self.config.workdir_size_mb * 2**20 * 2)
        if res.exit_code != 0:
            raise SandboxError(f"snapshot failed: {res.stderr.decode('utf-8', 'replace')[-500:]}")
        return res.stdout

    def restore(self, snapshot: bytes) -> None:
        """Make the workdir exactly what it was at ``snapshot`` (leftover processes are killed)."""
        self.kill_all()
        res = self._checked_run(["find", self.workdir, "-mindepth", "1", "-delete"], 60.0, None, None, 4096)
        if res.exit_code != 0:
            raise SandboxError(f"restore could not clear {self.workdir}: {res.stderr.decode('utf-8', 'replace')}")
        self._untar(snapshot, self.workdir)

    def kill_all(self) -> None:
        """Kill every process left running in the sandbox (e.g. before grading)."""
        if self._closed:
            raise SandboxError("the sandbox is closed")
        self._kill_all()

    def resolve(self, path: str) -> str:
        """``path`` as an absolute, normalised path inside the sandbox (relative = under the workdir)."""
        return posixpath.normpath(posixpath.join(self.workdir, path))

    def close(self) -> None:
        """Stop the sandbox and free what it holds; calling it twice is harmless."""
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<{type(self).__name__} {state} workdir={self.workdir}>"

    # ----- helpers --------------------------------------------------------------------------
    def _checked_run(self, cmd, timeout, stdin, cwd, max_output) -> RawResult:
        if self._closed:
            raise SandboxError("the sandbox is closed")
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else [str(a) for a in cmd]
        if isinstance(stdin, str):
            stdin = stdin.encode()
        t = float(timeout if timeout is not None else self.config.timeout_s)
        if t <= 0:
            raise ValueError(f"timeout must be positive, got {t}")
        return self._run(argv, t, stdin, int(max_output or self.config.max_output_bytes), cwd or self.workdir)

    def _untar(self, data: bytes, dest: str) -> None:
        script = 'mkdir -p -- "$1" && tar --no-same-owner -C "$1" -xf -'
        res = self._checked_run(["sh", "-c", script, "sh", dest], 120.0, data, None, 4096)
        if res.exit_code != 0:
            raise SandboxError(f"cannot unpack files into {dest}: {res.stderr.decode('utf-8', 'replace').strip()}")
