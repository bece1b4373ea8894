"""The sandbox interface, on every backend that can run here (local always; Docker and bwrap
skip with the reason when they cannot run)."""

from __future__ import annotations

import os
import warnings

import pytest

from turngym.tools.sandbox import SandboxConfig, SandboxError, make_sandbox, resolve_backend
from turngym.tools.sandbox._runner import Capture
from turngym.tools.sandbox.base import ExecResult


def skip_reason(backend: str) -> str | None:
    """Why ``backend`` cannot run here (engine, binary, image or rootfs missing), else None."""
    if backend == "docker":
        from turngym.tools.sandbox.docker_backend import docker_available, ensure_image

        reason = docker_available()
        if reason:
            return f"Docker: {reason}"
        try:
            ensure_image()
        except SandboxError as e:
            return f"Docker: {e}"
    if backend == "bwrap":
        from turngym.tools.sandbox.bwrap_backend import bwrap_available
        from turngym.tools.sandbox.image import SandboxImageError, ensure_rootfs_dir

        reason = bwrap_available()
        if reason:
            return f"bwrap: {reason}"
        try:
            ensure_rootfs_dir(build=False)
        except SandboxImageError as e:
            return f"bwrap: {e}"
    return None


def open_sandbox(backend: str, config: SandboxConfig | None = None):
    """A sandbox on ``backend``, or skip the test with the reason it cannot run here."""
    reason = skip_reason(backend)
    if reason:
        pytest.skip(reason)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # LocalBackend's (deliberate) unsafe warning
        return make_sandbox(backend, config)


@pytest.fixture(scope="module", params=["local", pytest.param("docker", marks=pytest.mark.docker), "bwrap"])
def sb(request):
    box = open_sandbox(request.param, SandboxConfig(timeout_s=20, max_output_bytes=1000))
    yield box
    box.close()


def test_exec_unpacks_and_reports_exit_code(sb):
    code, out, err = sb.exec("echo out; echo err >&2; exit 3")
    assert (code, out, err) == (3, "out\n", "err\n")
    res = sb.exec(["printf", "%s|", "a b", "c;d"])  # argv lists are not re-parsed by a shell
    assert res.ok and res.stdout == "a b|c;d|"


def test_commands_run_in_workdir_as_non_root(sb):
    assert sb.exec("pwd").stdout.strip() == sb.workdir
    if sb.backend != "local":
        assert sb.exec("id -u").stdout.strip() == "1000"


def test_output_is_truncated_head_and_tail(sb):
    res = sb.exec("seq 1 100000")
    assert res.stdout_bytes == len("".join(f"{i}\n" for i in range(1, 100001)))
    assert res.truncated and len(res.stdout) < 1100
    assert res.stdout.startswith("1\n2\n") and res.stdout.endswith("99999\n100000\n")
    assert "bytes of output truncated" in res.stdout


def test_timeout_kills_the_command_and_its_children(sb):
    # An odd duration, so that no other process matches: ps on the local backend sees the whole host.
    res = sb.exec("sleep 30.0417 & sleep 30.0417; echo never", timeout=1)
    assert res.timed_out and res.exit_code == 137 and "never" not in res.stdout
    assert "timed out" in res.observation(1)
    assert "sleep 30.0417" not in sb.exec("ps -eo args").stdout


def test_background_jobs_do_not_hold_the_command(sb):
    res = sb.exec("sleep 20 & echo started", timeout=10)  # returns at once, not after the 20 s job
    assert res.ok and not res.timed_out and res.stdout == "started\n"


def test_stdin_and_files_round_trip(sb):
    assert sb.exec("wc -c", stdin=b"12345").stdout.strip() == "5"
    sb.write_file("pkg/deep/f.txt", "héllo\n")
    assert sb.read_file("pkg/deep/f.txt") == "héllo\n"
    assert sb.read_file(f"{sb.workdir}/pkg/deep/f.txt") == "héllo\n"
    sb.put_files({"a.py": "x = 1\n", "b/c.py": "y = 2\n"})
    assert sb.exec("cat a.py b/c.py").stdout == "x = 1\ny = 2\n"
    with pytest.raises(FileNotFoundError):
        sb.read_file("missing.txt")


def test_snapshot_restore(sb):
    sb.write_file("state.txt", "before")
    snap = sb.snapshot()
    sb.write_file("state.txt", "after")
    sb.write_file("new.txt", "junk")
    sb.restore(snap)
    assert sb.read_file("state.txt") == "before"
    assert sb.exec("test -e new.txt").exit_code == 1


def test_closed_sandbox_raises_and_close_is_idempotent():
    box = open_sandbox("local")
    with box:
        assert box.exec("true").ok
    assert box.closed
    box.close()
    with pytest.raises(SandboxError, match="closed"):
        box.exec("true")


def test_local_backend_warns_loudly():
    from turngym.tools.sandbox import LocalBackend

    with pytest.warns(UserWarning, match="NO isolation"):
        LocalBackend().close()


def test_auto_never_picks_local():
    try:
        assert resolve_backend("auto") in ("docker", "bwrap")
    except SandboxError as e:
        assert "backend='local'" in str(e)
    with pytest.raises(ValueError, match="unknown sandbox backend"):
        resolve_backend("chroot")


def test_config_validation():
    with pytest.raises(ValueError, match="workdir"):
        SandboxConfig(workdir="relative")
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxConfig(memory_mb=0)


def test_capture_keeps_head_and_tail_and_counts():
    c = Capture(10)
    for chunk in (b"abc", b"defghij", b"klmnopqrstu", b"vwxyz"):
        c.add(chunk)
    assert c.total == 26
    v = c.value()
    assert v.startswith(b"abcde") and v.endswith(b"vwxyz") and b"16 bytes of output truncated" in v
    small = Capture(100)
    small.add(b"hello")
    assert small.value() == b"hello"


def test_exec_result_observation_names_the_cause():
    assert ExecResult(137, "", "Killed").observation().startswith("[exit code 137: killed by SIGKILL")
    assert ExecResult(0, "hi\n", "").observation() == "[exit code 0]\nhi"
    assert ExecResult(1, "", "boom").observation() == "[exit code 1]\n[stderr]\nboom"


@pytest.mark.docker
def test_docker_janitor_removes_orphans_and_pool_never_reuses():
    reason = skip_reason("docker")
    if reason:
        pytest.skip(reason)
    from turngym.tools.sandbox.docker_backend import (
        LABEL, OWNER_LABEL, DockerPool, cleanup_containers, container_kwargs, docker_client, ensure_image,
    )

    client = docker_client()
    kw = container_kwargs(SandboxConfig(), ensure_image())
    kw["labels"] = {LABEL: "1", OWNER_LABEL: f"{os.uname().nodename}:999999999"}  # an owner that is gone
    orphan = client.containers.create(**{k: v for k, v in kw.items() if k != "detach"})
    assert cleanup_containers(client) >= 1
    assert not client.api.containers(all=True, filters={"id": orphan.id})
    with DockerPool(SandboxConfig(), size=1) as pool:
        a = pool.sandbox()
        a.write_file("mark.txt", "episode 1")
        first = a.container_id
        a.close()
        b = pool.sandbox()
        assert b.container_id != first and b.exec("test -e mark.txt").exit_code == 1
        b.close()
    for cid in (first, b.container_id):  # closing the pool removed the used containers too
        assert not client.api.containers(all=True, filters={"id": cid})


@pytest.mark.docker
def test_a_forked_env_worker_gets_its_own_docker_connection():
    """Env workers are forked. One that kept its parent's client wrote into the parent's socket:
    `turngym bench --suite swe --workers 4` lost 18 of 40 resets to garbled replies (400s,
    BadStatusLine, read timeouts) before this."""
    reason = skip_reason("docker")
    if reason:
        pytest.skip(reason)
    import multiprocessing

    from turngym.tools.sandbox.docker_backend import _live, docker_client

    parent = docker_client()
    _live.add("a-container-of-the-parent")
    ctx = multiprocessing.get_context("fork")
    answers = ctx.Queue()

    def child():
        client = docker_client()
        answers.put((client is not parent, client is docker_client(), client.ping(), sorted(_live)))

    proc = ctx.Process(target=child)
    proc.start()
    proc.join(60)
    _live.discard("a-container-of-the-parent")
    # its own client, kept for later calls, working, and it owns none of the parent's containers
    assert answers.get(timeout=5) == (True, True, True, [])
    assert docker_client() is parent


def test_debian_mirror_comes_from_apt_sources(tmp_path):
    from turngym.tools.sandbox.image import DEFAULT_MIRROR, debian_mirror

    deb822 = tmp_path / "debian.sources"
    deb822.write_text("Types: deb\nURIs: http://mirror.example/debian-security\n\n"
                      "Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm\n")
    one_line = tmp_path / "sources.list"
    one_line.write_text("# comment\ndeb [arch=amd64] http://other.example/debian bookworm main\n")
    assert debian_mirror([deb822]) == "http://mirror.example/debian"
    assert debian_mirror([one_line, deb822]) == "http://other.example/debian"
    assert debian_mirror([tmp_path / "missing"]) == DEFAULT_MIRROR


def test_recipe_hash_names_cache_and_image():
    from turngym.tools.sandbox import image

    assert len(image.recipe_hash()) == 12 and image.recipe_hash() == image.recipe_hash()
    assert image.rootfs_tar_path().name == f"rootfs-{image.recipe_hash()}.tar"
    assert image.image_tag() == f"turngym/sandbox:{image.image_hash()}" and image.image_hash() != image.recipe_hash()
    assert "python3-pytest" in image.PACKAGES and image.DOCKERFILE.count("USER 1000:1000") == 1


def test_cgroup_is_made_with_its_limits_and_removed():
    from turngym.tools.sandbox.cgroup import SandboxCgroup

    group, why = SandboxCgroup.create(256 * 2**20, 64)
    if group is None:
        pytest.skip(f"no cgroup can be made here: {why}")
    limits = {"memory.limit_in_bytes": 256 * 2**20, "memory.max": 256 * 2**20, "pids.max": 64}
    seen = {f: int(open(d / f).read()) for d in group.dirs for f in limits if (d / f).exists()}
    assert seen and all(limits[f] == v for f, v in seen.items()) and "pids.max" in seen
    group.remove()
    assert not any(d.exists() for d in group.dirs)


def test_bwrap_without_a_cgroup_says_what_caps_memory(monkeypatch):
    from turngym.tools.sandbox import cgroup

    reason = skip_reason("bwrap")
    if reason:
        pytest.skip(reason)
    monkeypatch.setattr(cgroup.SandboxCgroup, "create", classmethod(lambda cls, *a, **k: (None, "not delegated")))
    box = make_sandbox("bwrap", SandboxConfig(memory_mb=256))
    try:
        assert box.memory_enforcement == "RLIMIT_AS per process only (not delegated)"
        res = box.exec(["python3", "-c", "x = bytearray(512 * 2**20)"])
        assert "MemoryError" in res.stderr, res.observation()  # the per-process cap still holds
    finally:
        box.close()


def test_local_backend_refuses_outside_tests_unless_forced():
    import subprocess
    import sys

    script = ("from turngym.tools.sandbox import make_sandbox, SandboxError\n"
              "try:\n    make_sandbox('local').close(); print('started')\n"
              "except SandboxError as e:\n    print('refused:', e)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_CURRENT_TEST", "TURNGYM_ALLOW_UNSAFE_SANDBOX")}
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.startswith("refused:") and "no isolation" in out.stdout, out.stdout + out.stderr
    forced = subprocess.run([sys.executable, "-W", "ignore", "-c", script], capture_output=True, text=True,
                            env={**env, "TURNGYM_ALLOW_UNSAFE_SANDBOX": "1"}, timeout=60)
    assert forced.stdout.strip() == "started", forced.stdout + forced.stderr
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        make_sandbox("local", allow_unsafe=True).close()


def test_cgroup_v2_path_writes_its_limits(tmp_path, monkeypatch):
    """The v2 branch against a directory laid out like a delegated v2 subtree (the files the
    kernel would hold); the kernel's enforcement is the next test's."""
    from turngym.tools.sandbox import cgroup

    root = tmp_path / "cg"
    (root / "user.slice").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("memory pids\n")
    monkeypatch.setattr(cgroup, "ROOT", root)
    monkeypatch.setattr(cgroup, "_own_paths", lambda: {"": "/user.slice"})
    group, why = cgroup.SandboxCgroup.create(256 * 2**20, 64)
    assert group is not None and group.version == 2, why
    (d,) = group.dirs
    assert d.parent == root / "user.slice"
    assert {f: (d / f).read_text() for f in ("memory.max", "memory.swap.max", "pids.max")} == {
        "memory.max": str(256 * 2**20), "memory.swap.max": "0", "pids.max": "64"}
    assert group.procs_files == [str(d / "cgroup.procs")]


def test_bwrap_memory_is_capped_by_a_cgroup_v2_where_the_host_has_one():
    from turngym.tools.sandbox.cgroup import ROOT

    reason = skip_reason("bwrap")
    if reason:
        pytest.skip(reason)
    if (ROOT / "memory" / "memory.limit_in_bytes").exists() or not (ROOT / "cgroup.controllers").exists():
        pytest.skip(f"this host's memory controller is on cgroup v1 ({ROOT}/memory); the v2 path runs on a v2 host")
    box = make_sandbox("bwrap", SandboxConfig(memory_mb=256))
    try:
        if box.cgroup is None:
            pytest.skip(f"cgroup v2 is here but not delegated to this process: {box.memory_enforcement}")
        assert box.memory_enforcement == "cgroup v2"
        hold = ("for i in 1 2; do python3 -c 'import time; b = bytearray(200 * 2**20); "
                "b[::4096] = b\"x\" * len(b[::4096]); time.sleep(4); print(\"held\", flush=True)' & done; wait")
        assert box.exec(hold, timeout=60).stdout.count("held") <= 1  # 2 x 200 MB > 256 MB together
    finally:
        box.close()
