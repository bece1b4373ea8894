"""Build the sandbox's base system locally, with no image registry.

``debootstrap`` installs a minimal Debian (python3, pytest, git, procps) into a temp dir; we trim
it, add the unprivileged ``sandbox`` user (uid 1000) and the ``/workspace`` mount point, and
cache it as a tarball outside git (``~/.cache/turngym/sandbox/rootfs-<recipe>.tar``). From that
one tarball:

- Docker: ``docker import`` makes the base image, and ``docker build`` adds the non-root user,
  the workdir and the environment on top (``turngym/sandbox:<recipe>``).
- bubblewrap: the tarball is unpacked once into ``rootfs-<recipe>/`` and mounted read-only.

``<recipe>`` is a hash of everything that shapes the result (suite, packages; the image tag also
covers the Dockerfile), so a change to the recipe builds anew instead of reusing a stale one.

Run ``python -m turngym.tools.sandbox.image`` to build (needs root for debootstrap).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUITE = "bookworm"
PACKAGES = ("python3", "python3-pytest", "python3-pytest-timeout", "git", "procps")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
SANDBOX_UID = 1000
SYSTEM_CACHE = Path("/var/cache/turngym/sandbox")
WORKDIR = "/workspace"
# Trimmed after install: caches and docs are dead weight in a sandbox nobody reads man pages in.
_TRIM = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man",
         "usr/share/info", "usr/share/locale")

DOCKERFILE = f"""\
FROM {{base}}
RUN python3 -m pytest --version && python3 -c "import pytest_timeout" && git --version && id -u sandbox
USER {SANDBOX_UID}:{SANDBOX_UID}
WORKDIR {WORKDIR}
ENV HOME=/tmp PYTHONDONTWRITEBYTECODE=1 LANG=C.UTF-8 \\
    PATH=/usr/local/bin:/usr/bin:/bin GIT_CONFIG_NOSYSTEM=1
LABEL turngym.sandbox.recipe={{recipe}}
CMD ["python3", "-c", "import os, signal; signal.signal(signal.SIGCHLD, signal.SIG_IGN); os.execvp('sleep', ['sleep', 'infinity'])"]
"""
# PID 1 ignores SIGCHLD, so the kernel reaps orphans (a fork bomb's leftovers) instead of
# letting zombies pile up against the pids limit; SIG_IGN survives the exec into sleep.
# (dash's `trap '' CHLD` does not set SIG_IGN, hence python.)


class SandboxImageError(RuntimeError):
    """The base system or image could not be built (mirror down, no root, no engine)."""


def recipe_hash() -> str:
    """Short hash of the rootfs recipe: the cache key of the tarball and the unpacked rootfs."""
    text = "\n".join([SUITE, *PACKAGES, str(SANDBOX_UID), WORKDIR, *_TRIM])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def image_hash() -> str:
    """Short hash of the rootfs recipe plus the Dockerfile: the image's tag."""
    return hashlib.sha256(f"{recipe_hash()}\n{DOCKERFILE}".encode()).hexdigest()[:12]


def cache_dir() -> Path:
    """``$TURNGYM_CACHE/sandbox``, else ``~/.cache/turngym/sandbox`` (never inside the repo).

    As root the default is ``/var/cache/turngym/sandbox``: bubblewrap then runs as ``nobody``,
    which must be able to reach the rootfs, and ``/root`` is closed to it.
    """
    root = os.environ.get("TURNGYM_CACHE")
    if not root and os.geteuid() == 0:
        return SYSTEM_CACHE
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "turngym")
    return Path(root) / "sandbox"


def rootfs_tar_path() -> Path:
    return cache_dir() / f"rootfs-{recipe_hash()}.tar"


def rootfs_dir_path() -> Path:
    return cache_dir() / f"rootfs-{recipe_hash()}"


def image_tag() -> str:
    """The Docker tag of the finished sandbox image."""
    return f"turngym/sandbox:{image_hash()}"


def debian_mirror(files: list[Path] | None = None) -> str:
    """The Debian mirror apt is configured with (so debootstrap goes where apt can), else the default.

    Args:
        files: apt source files to read (default: ``/etc/apt/sources.list`` and ``sources.list.d``),
            one-line (``deb URL suite ...``) or deb822 (``URIs: URL``) format.
    """
    if files is None:
        files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        for m in re.finditer(r"^(?:URIs:\s*|deb\s+(?:\[[^\]]*\]\s+)?)(\S+)", text, re.MULTILINE):
            uri = m.group(1).rstrip("/")
            if uri.startswith("http") and "security" not in uri and uri.endswith("/debian"):
                return uri
    return DEFAULT_MIRROR


def build_rootfs_tar(*, force: bool = False, mirror: str | None = None, retries: int = 1, log=print) -> Path:
    """Debootstrap the base system and cache it as a tarball.

    Args:
        force: Rebuild even if the cached tarball exists.
        mirror: Debian mirror URL (default: the one apt uses).
        retries: Extra debootstrap attempts after a failure (mirrors hiccup).
        log: Progress printer.

    Returns:
        Path of the tarball.

    Raises:
        SandboxImageError: Not root, no ``debootstrap``, or the mirror failed on every attempt.
    """
    tar = rootfs_tar_path()
    if tar.exists() and not force:
        return tar
    if os.geteuid() != 0:
        raise SandboxImageError("debootstrap needs root; run `sudo python -m turngym.tools.sandbox.image`")
    if shutil.which("debootstrap") is None:
        raise SandboxImageError("debootstrap is not installed (apt-get install debootstrap)")
    tar.parent.mkdir(parents=True, exist_ok=True)
    tar.parent.chmod(0o755)
    mirror = mirror or debian_mirror()
    with tempfile.TemporaryDirectory(dir=tar.parent, prefix="debootstrap-") as tmp:
        target = Path(tmp) / "root"
        _debootstrap(target, mirror, retries, log)
        _post_process(target)
        partial = tar.with_suffix(".tar.partial")
        subprocess.run(["tar", "--numeric-owner", "--exclude=./dev/*", "--exclude=./proc/*",
                        "--exclude=./sys/*", "-C", str(target), "-cf", str(partial), "."], check=True)
        partial.replace(tar)  # atomic: a crash never leaves a half-written tarball in the cache
    log(f"rootfs tarball: {tar} ({tar.stat().st_size / 2**20:.0f} MiB)")
    return tar


def _debootstrap(target: Path, mirror: str, retries: int, log) -> None:
    cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(target), mirror]
    for attempt in range(retries + 1):
        log(f"debootstrap {SUITE} from {mirror} (attempt {attempt + 1}/{retries + 1}) ...")
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode == 0:
            log(f"debootstrap done in {time.time() - t0:.0f}s")
            return
        shutil.rmtree(target, ignore_errors=True)
        tail = (proc.stdout + proc.stderr)[-1500:]
        log(f"debootstrap failed (exit {proc.returncode}):\n{tail}")
        if attempt < retries:
            time.sleep(5)
    raise SandboxImageError(f"debootstrap from {mirror} failed {retries + 1} times; see the log above")


def _post_process(root: Path) -> None:
    for rel in _TRIM:
        d = root / rel
        if d.is_dir():
            for child in d.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                elif child.name != "lock":
                    child.unlink()
    subprocess.run(["chroot", str(root), "useradd", "-u", str(SANDBOX_UID), "-U", "-M", "-d", "/tmp",
                    "-s", "/bin/sh", "sandbox"], check=True)
    ws = root / WORKDIR.lstrip("/")
    ws.mkdir(exist_ok=True)
    os.chown(ws, SANDBOX_UID, SANDBOX_UID)


def ensure_rootfs_dir(*, build: bool = True, log=print) -> Path:
    """The unpacked rootfs for the bubblewrap backend (unpacked from the tarball on first use).

    Raises:
        SandboxImageError: No tarball and ``build`` is False or building failed.
    """
    d = rootfs_dir_path()
    if (d / ".turngym-complete").exists():
        return d
    shared = SYSTEM_CACHE / d.name  # built by root (e.g. .ci/setup_sandbox.sh) for everyone
    if (shared / ".turngym-complete").exists():
        return shared
    tar = rootfs_tar_path()
    if not tar.exists():
        if not build:
            raise SandboxImageError(f"no sandbox rootfs at {tar}; build it with `python -m turngym.tools.sandbox.image`")
        build_rootfs_tar(log=log)
    tmp = Path(tempfile.mkdtemp(dir=tar.parent, prefix="rootfs-unpack-"))
    # Unpacking as non-root cannot restore ownership; the rootfs is only ever mounted read-only.
    flags = ["--numeric-owner"] if os.geteuid() == 0 else ["--no-same-owner"]
    subprocess.run(["tar", *flags, "-C", str(tmp), "-xf", str(tar)], check=True)
    for mp in ("dev", "proc", "sys", "tmp", WORKDIR.lstrip("/")):
        (tmp / mp).mkdir(exist_ok=True)
    tmp.chmod(0o755)  # mkdtemp makes it 0700; the sandbox user must be able to enter its own /
    (tmp / ".turngym-complete").write_text(recipe_hash())
    if d.exists():
        shutil.rmtree(d)
    tmp.rename(d)
    log(f"rootfs unpacked at {d}")
    return d


def build_docker_image(client=None, *, force: bool = False, log=print) -> str:
    """``docker import`` the rootfs tarball and ``docker build`` the sandbox image on top.

    Args:
        client: A ``docker.DockerClient`` (default: ``docker.from_env()``).
        force: Rebuild even if the image exists.

    Returns:
        The image tag.

    Raises:
        SandboxImageError: No engine, or the tarball could not be built.
    """
    import docker

    try:
        client = client or docker.from_env()
        client.ping()
    except Exception as e:
        raise SandboxImageError(f"no Docker engine answers: {e}") from e
    tag = image_tag()
    if not force and _image_exists(client, tag):
        return tag
    base = f"turngym/sandbox-base:{recipe_hash()}"
    if force or not _image_exists(client, base):
        tar = build_rootfs_tar(log=log)
        log(f"docker import {tar.name} -> {base}")
        client.api.import_image_from_file(str(tar), repository=base.split(":")[0], tag=recipe_hash())
    dockerfile = DOCKERFILE.format(base=base, recipe=image_hash())
    log(f"docker build -> {tag}")
    # pull=False: the base is local and there is no registry to ask.
    client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, pull=False, rm=True, forcerm=True)
    return tag


def _image_exists(client, tag: str) -> bool:
    import docker

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Build turngym's sandbox rootfs (and Docker image).")
    p.add_argument("--force", action="store_true", help="rebuild even if cached")
    p.add_argument("--mirror", default=None, help="Debian mirror (default: apt's)")
    p.add_argument("--no-docker", action="store_true", help="only build the rootfs tarball and bwrap dir")
    p.add_argument("--no-bwrap", action="store_true", help="do not unpack the rootfs for bubblewrap")
    args = p.parse_args(argv)
    try:
        build_rootfs_tar(force=args.force, mirror=args.mirror)
        if not args.no_bwrap:
            ensure_rootfs_dir()
        if not args.no_docker:
            print(build_docker_image(force=args.force))
    except SandboxImageError as e:
        print(f"sandbox image: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
