"""One cgroup per bubblewrap sandbox: a cap on the total memory and process count of everything
in it (rlimits cap one process at a time, so four processes could hold four times the limit).

Made below this process's own cgroup, on cgroup v1 (the ``memory`` and ``pids`` hierarchies) or
v2 (one unified directory, when its parent delegates ``memory`` and ``pids``). Creating one needs
write access there (root, or a delegated subtree); where that is missing, ``SandboxCgroup.create``
says why and the sandbox falls back to per-process rlimits. Memory charged to the cgroup includes
the pages of its tmpfs files (workdir, /tmp, /dev/shm), so it caps those too.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def _own_paths() -> dict[str, str]:
    """Controller (or ``""`` for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    out = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        for c in ctrls.split(","):
            out[c] = path
    return out


class SandboxCgroup:
    """A cgroup (one directory per hierarchy) with memory and pids limits.

    Use ``create``; ``procs_files`` are the ``cgroup.procs`` files a process writes its pid to,
    to join; ``remove`` kills anything left in it and deletes it.
    """

    def __init__(self, dirs: list[Path], version: int) -> None:
        self.dirs, self.version = dirs, version

    @classmethod
    def create(cls, memory_bytes: int, pids: int, owner_uid: int | None = None) -> tuple[SandboxCgroup | None, str]:
        """A new cgroup with the limits, or ``(None, why not)``.

        Args:
            owner_uid: Give this uid write access to ``cgroup.procs`` (the unprivileged process
                that joins it).
        """
        name = f"turngym-sandbox-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            own = _own_paths()
        except OSError as e:
            return None, f"cannot read /proc/self/cgroup: {e}"
        made: list[Path] = []
        try:
            if (ROOT / "memory" / "memory.limit_in_bytes").exists() and (ROOT / "pids").is_dir():
                for ctrl, files in (("memory", {"memory.limit_in_bytes": memory_bytes,
                                                 "memory.memsw.limit_in_bytes": memory_bytes}),
                                    ("pids", {"pids.max": pids})):
                    d = ROOT / ctrl / own.get(ctrl, "/").lstrip("/") / name
                    d.mkdir()
                    made.append(d)
                    for f, v in files.items():
                        if (d / f).exists():
                            (d / f).write_text(str(v))
                group = cls(made, 1)
            elif (ROOT / "cgroup.controllers").exists():
                d = ROOT / own.get("", "/").lstrip("/") / name
                d.mkdir()
                made.append(d)
                (d / "memory.max").write_text(str(memory_bytes))
                (d / "memory.swap.max").write_text("0")
                (d / "pids.max").write_text(str(pids))
                group = cls(made, 2)
            else:
                return None, "no cgroup memory controller is mounted"
            if owner_uid is not None:
                for p in group.procs_files:
                    os.chown(p, owner_uid, -1)
            return group, ""
        except OSError as e:
            cls(made, 0).remove()
            return None, f"cannot make a cgroup ({type(e).__name__}: {e})"

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def memory_peak(self) -> int | None:
        """Highest memory use so far, in bytes (None if the kernel does not say)."""
        for d in self.dirs:
            for f in ("memory.max_usage_in_bytes", "memory.peak"):
                try:
                    return int((d / f).read_text())
                except (OSError, ValueError):
                    continue
        return None

    def remove(self) -> None:
        """Kill whatever is still in the cgroup and delete it (best effort, a few retries)."""
        for _ in range(50):
            left = []
            for d in self.dirs:
                if not d.exists():
                    continue
                try:
                    pids = [int(p) for p in (d / "cgroup.procs").read_text().split()]
                except (OSError, ValueError):
                    pids = []
                for pid in pids:  # only the sandbox's own processes are in here
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                try:
                    d.rmdir()
                except OSError:
                    left.append(d)
            if not left:
                return
            time.sleep(0.02)
