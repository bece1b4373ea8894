"""``LocalBackend``: plain subprocesses in a temp dir. NO ISOLATION -- unit tests only.

Commands run as you, on your machine, with your network and your files. The only limits are
the per-command timeout and output cap. Code the agent writes can read and change your files,
reach the network, outlive its command (a ``setsid`` daemon), and ptrace or signal this very
process, graders included. It exists so that env logic can be tested where no Docker engine and
no bubblewrap are available; it is never picked automatically, and it refuses to start outside
a test run (pytest) unless forced: ``allow_unsafe=True``, or ``TURNGYM_ALLOW_UNSAFE_SANDBOX=1``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import warnings

from turngym.tools.sandbox import _runner
from turngym.tools.sandbox.base import RawResult, Sandbox, SandboxConfig, SandboxError

FORCE_ENV = "TURNGYM_ALLOW_UNSAFE_SANDBOX"


class UnsafeSandboxWarning(UserWarning):
    """A sandbox without isolation was created."""


class LocalBackend(Sandbox):
    """Run commands as host subprocesses in a temporary directory (unsafe, opt-in).

    Args:
        config: Limits; only ``timeout_s``, ``max_output_bytes`` and ``env`` apply here. The
            workdir is a fresh temp dir, whatever ``config.workdir`` says.
        allow_unsafe: Start outside a test run anyway (also ``TURNGYM_ALLOW_UNSAFE_SANDBOX=1``).

    Raises:
        SandboxError: Outside a test run, and not forced.
    """

    backend = "local"

    def __init__(self, config: SandboxConfig | None = None, *, allow_unsafe: bool = False) -> None:
        if not (allow_unsafe or os.environ.get(FORCE_ENV) == "1" or "PYTEST_CURRENT_TEST" in os.environ):
            raise SandboxError(
                "the local sandbox backend runs the agent's code as you, with no isolation; it is for unit "
                f"tests only. Use Docker or bubblewrap, or force it with allow_unsafe=True or {FORCE_ENV}=1.")
        warnings.warn(
            "LocalBackend runs commands directly on this machine with NO isolation (no network, memory "
            "or filesystem limits). Use it for unit tests only; use Docker or bubblewrap for agents.",
            UnsafeSandboxWarning, stacklevel=2,
        )
        self._dir = tempfile.mkdtemp(prefix="turngym-local-")
        self._tmp = os.path.join(self._dir, "tmp")
        os.makedirs(os.path.join(self._dir, "workspace"))
        os.makedirs(self._tmp)
        cfg = config or SandboxConfig()
        super().__init__(SandboxConfig(**{**cfg.__dict__, "workdir": os.path.join(self._dir, "workspace")}))
        # This interpreter's bin dir first, so `python3` is the one with turngym's test deps.
        path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "/usr/bin:/bin")])
        self._env = {"PATH": path, "HOME": self._tmp, "TMPDIR": self._tmp, "LANG": "C.UTF-8",
                     "PYTHONDONTWRITEBYTECODE": "1", **self.config.env}

    @property
    def scratch_dir(self) -> str:
        return self._tmp

    def _run(self, argv, timeout, stdin, max_output, cwd) -> RawResult:
        r = _runner.run_capped(argv, cwd=cwd if os.path.isdir(cwd) else self.workdir, env=self._env,
                               stdin=stdin, timeout=timeout, max_output=max_output)
        self.bytes_received += len(r["stdout"]) + len(r["stderr"])
        return RawResult(r["exit_code"], r["stdout"], r["stderr"], r["timed_out"], r["elapsed_s"],
                         r["stdout_total"], r["stderr_total"])

    def _kill_all(self) -> None:
        # run_capped kills each command's process group when the command ends. A process that
        # escaped with setsid() cannot be found without isolation -- one more reason this is unsafe.
        return

    def _close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)
