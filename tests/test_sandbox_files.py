"""File-count limits on every writable mount, on Docker and on bubblewrap with and without a
cgroup: a million empty files once pinned 1-2 GB of host kernel memory (every inode costs ~1 KB,
however small its file) and made every later step slow. Here the limit is set low, so the test
makes a few thousand files instead of a million. Skips with the reason when a backend cannot run."""

from __future__ import annotations

import pytest

from test_sandbox import open_sandbox, skip_reason
from turngym.tools.sandbox import SandboxConfig, make_sandbox

LIMIT = 2000
MOUNTS = ("/workspace", "/tmp", "/dev/shm")
# In each mount: one directory of LIMIT + 1000 empty files, then how many there are.
FLOOD = ("for d in " + " ".join(MOUNTS) + "; do mkdir -p $d/many && (cd $d/many && seq 1 %d | xargs touch); "
         "ls $d/many | wc -l; done" % (LIMIT + 1000))


def _sandbox(kind: str, monkeypatch):
    config = SandboxConfig(max_files=LIMIT, timeout_s=60)
    if kind != "bwrap-without-cgroup":
        return open_sandbox(kind.split("-")[0], config)
    reason = skip_reason("bwrap")
    if reason:
        pytest.skip(reason)
    from turngym.tools.sandbox import cgroup

    monkeypatch.setattr(cgroup.SandboxCgroup, "create", classmethod(lambda cls, *a, **k: (None, "not delegated")))
    return make_sandbox("bwrap", config)


@pytest.mark.parametrize("kind", [pytest.param("docker", marks=pytest.mark.docker), "bwrap", "bwrap-without-cgroup"])
def test_each_writable_mount_holds_at_most_max_files(kind, monkeypatch):
    box = _sandbox(kind, monkeypatch)
    try:
        if kind.startswith("bwrap"):
            assert box.file_limit_enforcement == f"tmpfs nr_inodes={LIMIT}", box.file_limit_enforcement
            assert (box.cgroup is None) == (kind == "bwrap-without-cgroup")
        res = box.exec(FLOOD, timeout=120)
        counts = [int(n) for n in res.stdout.split()]
        assert len(counts) == 3 and all(LIMIT - 10 <= n < LIMIT for n in counts), res.observation()
        assert "No space left on device" in res.stderr, res.observation()
        # the sandbox goes on: a removed file frees its inode for the next one
        res = box.exec("rm -rf " + " ".join(f"{d}/many" for d in MOUNTS) + " && touch a b && ls | wc -l")
        assert res.ok and res.stdout.strip() == "2", res.observation()
    finally:
        box.close()


def test_max_files_is_validated():
    with pytest.raises(ValueError, match="max_files"):
        SandboxConfig(max_files=0)
    assert SandboxConfig().max_files == 32_768
