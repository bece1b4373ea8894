"""The sandbox attack suite, on Docker and on bubblewrap: each attack ends in a clear
observation (within the timeout where one applies), the sandbox stays usable, and the host is
untouched. Skips with the reason when a backend cannot run here. (Reading the hidden tests and
mining ``git log`` for the fix are SWE-env attacks: see ``test_swe_attacks.py``.)"""

from __future__ import annotations

import shutil
import socket
import threading
import uuid
from pathlib import Path

import pytest

from test_sandbox import open_sandbox
from turngym.tools.sandbox import SandboxConfig

CONFIG = SandboxConfig(memory_mb=512, pids_limit=128, workdir_size_mb=64, tmp_size_mb=16, timeout_s=10)


@pytest.fixture(scope="module", params=[pytest.param("docker", marks=pytest.mark.docker), "bwrap"])
def sb(request):
    box = open_sandbox(request.param, CONFIG)
    yield box
    box.close()


def assert_alive(sb):
    res = sb.exec("echo alive; ps -e --no-headers | wc -l", timeout=10)
    assert res.ok and res.stdout.startswith("alive"), res.observation()
    assert int(res.stdout.split()[1]) < 10, "leftover processes survived the attack"


def _host_ips() -> list[str]:
    ips = {"172.17.0.1", "127.0.0.1"}  # docker0 gateway; loopback (the sandbox's own, not the host's)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("1.1.1.1", 53))  # UDP connect sends nothing; it just picks the route's source
            ips.add(s.getsockname()[0])
    except OSError:
        pass
    return sorted(ips)


def test_network_is_unreachable(sb):
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", 0))
    listener.listen()
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    accepted, done = [], threading.Event()

    def accept():
        while not done.is_set():
            try:
                accepted.append(listener.accept())
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    targets = [("1.1.1.1", 80), ("1.1.1.1", 53)] + [(ip, port) for ip in _host_ips()]
    script = (
        "import socket, sys\n"
        "for host, port in %r:\n"
        "    s = socket.socket(); s.settimeout(3)\n"
        "    try:\n"
        "        s.connect((host, port)); print('CONNECTED', host, port)\n"
        "    except OSError as e:\n"
        "        print('blocked', host, port, e)\n"
        "try:\n"
        "    socket.getaddrinfo('example.com', 80); print('DNS resolved')\n"
        "except OSError as e:\n"
        "    print('dns blocked', e)\n" % targets
    )
    res = sb.exec(["python3", "-c", script], timeout=30)
    assert not res.timed_out
    assert "CONNECTED" not in res.stdout and "DNS resolved" not in res.stdout, res.stdout
    assert res.stdout.count("blocked") == len(targets) + 1
    assert "Network is unreachable" in res.stdout or "Connection refused" in res.stdout
    done.set()
    t.join()
    listener.close()
    assert not accepted, "the host listener was reached from the sandbox"


def test_fork_bomb_is_contained(sb):
    res = sb.exec(["bash", "-c", ":(){ :|:& };:; sleep 2; echo survived"], timeout=5)
    assert "fork: retry" in res.stderr or "Resource temporarily unavailable" in res.stderr, res.observation()
    res = sb.exec(["python3", "-c", "import os\nwhile True:\n    os.fork()"], timeout=5)
    assert "Resource temporarily unavailable" in res.stderr or res.timed_out, res.observation()
    assert_alive(sb)


def test_ten_gigabyte_allocation_fails_cleanly(sb):
    res = sb.exec(["python3", "-c", "x = bytearray(10 * 1024**3); print('allocated')"], timeout=30)
    assert not res.timed_out
    assert "allocated" not in res.stdout and res.exit_code != 0
    obs = res.observation()
    assert "MemoryError" in obs or "killed by SIGKILL" in obs, obs
    assert_alive(sb)


def test_disk_fill_stops_at_the_workdir_limit(sb):
    free_before = shutil.disk_usage("/").free
    res = sb.exec("dd if=/dev/zero of=big bs=1M count=2048; for i in 1 2 3; do head -c 50000000 /dev/zero > f$i; done",
                  timeout=60)
    obs = res.observation()
    assert "No space left on device" in obs or "File too large" in obs, obs
    used = sb.exec(f"du -sm {sb.workdir} | cut -f1").stdout.strip()
    assert int(used) <= CONFIG.workdir_size_mb
    tmp = sb.exec("head -c 100000000 /dev/zero > /tmp/big").observation()
    assert "No space left on device" in tmp or "File too large" in tmp, tmp
    # the host did not absorb the 2 GB (other processes share this disk, so allow some noise)
    assert free_before - shutil.disk_usage("/").free < 1024 * 2**20
    sb.exec("rm -f big f1 f2 f3 /tmp/big")
    assert_alive(sb)


def test_infinite_loop_is_killed_at_the_timeout(sb):
    res = sb.exec("while :; do :; done", timeout=2)
    assert res.timed_out and res.exit_code == 137
    assert "timed out" in res.observation(2)
    assert_alive(sb)


def test_writing_outside_the_workdir_fails(sb):
    marker = f"turngym-escape-{uuid.uuid4().hex[:8]}"
    targets = ["/", "/etc/", "/usr/bin/", "/root/", "/var/", "/home/"]
    res = sb.exec("; ".join(f"touch {d}{marker}" for d in targets) + f"; touch /tmp/{marker}; echo done")
    err = res.stderr
    assert err.count("Read-only file system") + err.count("Permission denied") + err.count("No such file") >= len(targets)
    assert sb.exec(f"ls /tmp/{marker}").ok  # the sandbox's own /tmp is writable ...
    for d in targets + ["/tmp/"]:  # ... but nothing reached the host
        assert not Path(d, marker).exists()
    assert sb.exec(f"ls {'  '.join(d + marker for d in targets)}").exit_code != 0
    assert_alive(sb)


def test_dev_shm_is_the_sandboxs_own_and_capped(sb):
    res = sb.exec("for i in $(seq 1 8); do dd if=/dev/zero of=/dev/shm/f$i bs=1M count=64 status=none || break; done; "
                  "du -sm /dev/shm | cut -f1", timeout=60)
    assert int(res.stdout.split()[-1]) <= CONFIG.shm_size_mb, res.observation()
    assert "No space left on device" in res.stderr, res.observation()
    sb.exec("rm -f /dev/shm/f*")
    assert_alive(sb)


# Each process reports only after holding its 300 MB for 8 s, so every two survivors held their memory
# at the same time (they all start within a few seconds), even when the OOM killer picks a process
# that had already allocated: "held" printed before the hold made this test flaky under load.
HOLD = ("for i in 1 2 3 4; do python3 -c 'import time; b = bytearray(300 * 2**20); b[::4096] = b\"x\" * len(b[::4096]); "
        "time.sleep(8); print(\"held\", flush=True)' & done; wait")


def test_memory_is_capped_for_the_whole_sandbox(sb):
    """Four processes of 300 MB each cannot all live under memory_mb=512: the cap is on the sum."""
    if getattr(sb, "cgroup", True) is None:
        pytest.skip(f"no cgroup here: {sb.memory_enforcement}")
    res = sb.exec(HOLD, timeout=60)
    assert res.stdout.count("held") * 300 <= CONFIG.memory_mb, res.observation()
    assert_alive(sb)


def test_pid1_cannot_be_ptraced_or_killed(sb):
    """PID 1 outlives every kill-all; if a command could ptrace it, code could hide there."""
    attach = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
              "libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]\n"
              "r = libc.ptrace(16, 1, None, None)\nprint(r, os.strerror(ctypes.get_errno()))\n")
    res = sb.exec(["python3", "-c", attach])
    assert res.stdout.strip() == "-1 Operation not permitted", res.observation()
    sb.exec("kill -9 1")
    assert sb.exec("echo alive").stdout == "alive\n"


def test_dev_is_read_only_and_holds_no_files(sb):
    """Files go in the capped /dev/shm; /dev itself (bwrap's is a tmpfs of no size limit) takes none."""
    res = sb.exec("dd if=/dev/zero of=/dev/fill bs=1M count=16 status=none; echo x > /dev/null && echo null-ok; "
                  "ls /dev/fill 2>&1", timeout=30)
    assert "null-ok" in res.stdout and "No such file" in res.stdout, res.observation()
    assert "Read-only file system" in res.stderr or "Permission denied" in res.stderr, res.observation()
    assert_alive(sb)


def test_output_is_capped_inside_the_sandbox(sb):
    """100 MB on stdout: the sandbox counts it all, and the host reads a few KB."""
    before = sb.bytes_received
    res = sb.exec("yes | head -c 100000000; yes err | head -c 50000000 >&2", max_output=4096, timeout=60)
    assert res.stdout_bytes == 100_000_000 and res.stderr_bytes == 50_000_000
    assert len(res.stdout) < 4200 and "bytes of output truncated" in res.stdout
    assert sb.bytes_received - before < 64 * 1024
    assert_alive(sb)


SUPERVISOR = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
              "libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]\n"
              "sup = os.getppid()\n"  # the command's parent: the supervisor that holds the answer channel
              "print('ptrace', libc.ptrace(16, sup, None, None), os.strerror(ctypes.get_errno()))\n"
              "for fd in (0, 1, 2):\n"
              "    try:\n"
              "        os.open(f'/proc/{sup}/fd/{fd}', os.O_WRONLY)\n"
              "        print('opened', fd)\n"
              "    except OSError as e:\n"
              "        print('refused', fd, e.strerror)\n")


def test_the_command_supervisor_is_out_of_reach(sb):
    """The process that holds the channel to the host cannot be ptraced, nor its fds opened."""
    res = sb.exec(["python3", "-c", SUPERVISOR])
    assert "ptrace -1 Operation not permitted" in res.stdout and "opened" not in res.stdout, res.observation()
    assert res.stdout.count("refused") == 3
    sb.exec("kill -9 $PPID")  # a supervisor the command killed is replaced (Docker); PID 1 ignores it (bwrap)
    assert sb.exec("echo alive").stdout == "alive\n"
    assert_alive(sb)
