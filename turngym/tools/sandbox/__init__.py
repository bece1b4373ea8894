"""Sandboxes for untrusted commands: one interface, three backends.

- ``DockerBackend`` (default where an engine answers): a locked-down container per sandbox,
  with ``DockerPool`` keeping warm containers for fast episode resets.
- ``BwrapBackend``: the same Debian rootfs under bubblewrap, where no engine runs.
- ``LocalBackend``: plain subprocesses in a temp dir -- unsafe, opt-in, unit tests only.

``make_sandbox("auto")`` picks Docker, else bubblewrap, and never the local backend unless
asked by name. Build the image once with ``python -m turngym.tools.sandbox.image``.
Backends import their dependencies (the docker SDK) only when used.
"""

from turngym.tools.sandbox.base import ExecResult, Sandbox, SandboxConfig, SandboxError
from turngym.tools.sandbox.factory import SandboxProvider, make_sandbox, resolve_backend

__all__ = [
    "ExecResult", "Sandbox", "SandboxConfig", "SandboxError", "SandboxProvider", "make_sandbox",
    "resolve_backend", "DockerBackend", "DockerPool", "BwrapBackend", "LocalBackend",
]


def __getattr__(name):  # the backends load lazily: importing this package stays cheap
    if name in ("DockerBackend", "DockerPool"):
        from turngym.tools.sandbox import docker_backend

        return getattr(docker_backend, name)
    if name == "BwrapBackend":
        from turngym.tools.sandbox.bwrap_backend import BwrapBackend

        return BwrapBackend
    if name == "LocalBackend":
        from turngym.tools.sandbox.local_backend import LocalBackend

        return LocalBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
