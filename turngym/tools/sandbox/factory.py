"""Pick a backend and make sandboxes: ``make_sandbox`` for one, ``SandboxProvider`` for many."""

from __future__ import annotations

from turngym.tools.sandbox.base import Sandbox, SandboxConfig, SandboxError

BACKENDS = ("docker", "bwrap", "local")


def resolve_backend(backend: str = "auto") -> str:
    """The backend ``backend`` stands for here.

    ``"auto"`` is Docker when an engine answers, else bubblewrap when it can run; never the
    unsafe local backend, which must be asked for by name.

    Raises:
        ValueError: Unknown backend name.
        SandboxError: ``"auto"`` and neither Docker nor bubblewrap can run (the reasons say why).
    """
    if backend in BACKENDS:
        return backend
    if backend != "auto":
        raise ValueError(f"unknown sandbox backend {backend!r}; choose from auto, {', '.join(BACKENDS)}")
    from turngym.tools.sandbox.bwrap_backend import bwrap_available
    from turngym.tools.sandbox.docker_backend import docker_available

    why_docker = docker_available()
    if why_docker is None:
        return "docker"
    why_bwrap = bwrap_available()
    if why_bwrap is None:
        return "bwrap"
    raise SandboxError(
        f"no sandbox can run here -- docker: {why_docker}; bwrap: {why_bwrap}. Install docker.io or "
        "bubblewrap and build the image (`python -m turngym.tools.sandbox.image`); backend='local' "
        "runs commands unsandboxed (unit tests only)."
    )


def make_sandbox(backend: str = "auto", config: SandboxConfig | None = None, **kwargs) -> Sandbox:
    """One sandbox on ``backend`` (see ``resolve_backend``).

    Args:
        backend: ``"auto"``, ``"docker"``, ``"bwrap"`` or ``"local"`` (unsafe).
        config: Limits (defaults are the safe ones).
        **kwargs: Backend-specific (``image=`` / ``pool=`` for Docker, ``rootfs=`` for bwrap).

    Raises:
        SandboxError: The backend cannot run here.
    """
    name = resolve_backend(backend)
    if name == "docker":
        from turngym.tools.sandbox.docker_backend import DockerBackend

        return DockerBackend(config, **kwargs)
    if name == "bwrap":
        from turngym.tools.sandbox.bwrap_backend import BwrapBackend

        return BwrapBackend(config, **kwargs)
    from turngym.tools.sandbox.local_backend import LocalBackend

    return LocalBackend(config, **kwargs)


class SandboxProvider:
    """Fresh sandboxes on demand (one per episode), with a warm container pool on Docker.

    Args:
        backend: As for ``make_sandbox``; resolved once, when the first sandbox is made.
        config: Limits for every sandbox.
        pool_size: Warm Docker containers kept ready (0 disables the pool).
    """

    def __init__(self, backend: str = "auto", config: SandboxConfig | None = None, pool_size: int = 1) -> None:
        if backend != "auto" and backend not in BACKENDS:
            raise ValueError(f"unknown sandbox backend {backend!r}; choose from auto, {', '.join(BACKENDS)}")
        self.requested = backend
        self.config = config or SandboxConfig()
        self.pool_size = pool_size
        self.backend: str | None = None
        self._pool = None

    def new(self) -> Sandbox:
        """A fresh sandbox (the caller closes it).

        Raises:
            SandboxError: No backend can run, or the chosen one failed to start.
        """
        if self.backend is None:
            self.backend = resolve_backend(self.requested)
        if self.backend == "docker" and self.pool_size > 0:
            if self._pool is None:
                from turngym.tools.sandbox.docker_backend import DockerPool

                self._pool = DockerPool(self.config, size=self.pool_size)
            return self._pool.sandbox()
        return make_sandbox(self.backend, self.config)

    def close(self) -> None:
        """Remove the pool's warm containers (sandboxes already handed out close themselves)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None
