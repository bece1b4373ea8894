"""What hostile sandbox output costs the host: memory and step time, one case per process.

    python benchmarks/sandbox_host_cost.py forged-wire --mib 1024          # no engine needed (--early: before the request)
    python benchmarks/sandbox_host_cost.py forged-race --backend docker --mib 1024
    python benchmarks/sandbox_host_cost.py files --backend bwrap --files 1000000
    python benchmarks/sandbox_host_cost.py files --backend bwrap-without-cgroup --files 1000000

- ``forged-wire``: a supervisor answer that claims and sends ``--mib`` MiB of stdout, written
  into the Docker backend's read path over a socket (the host's cost of believing it, or not).
- ``forged-race``: the same answer from inside a real container: a ``setsid`` daemon kills the
  command supervisor and, when the host starts the next one, opens its stdout through
  ``/proc/<pid>/fd/1`` and writes the answer; the host then runs ``echo hello``.
- ``files``: an SWE episode's ``bash`` makes ``--files`` empty files; then three ``bash true``
  steps (each hashes the repo). Host kernel memory is the system's ``Slab`` growth.

Each run prints one JSON line: the host process's peak RSS growth (MB), the step time (s), the
slab growth (MB) and the head of what the step returned. Run it against any checkout (it uses
only interfaces older versions have too); one case per process, so peaks do not mix.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import struct
import sys
import threading
import time
import warnings


def status_mb(field: str) -> float:
    """``VmRSS`` / ``VmHWM`` of this process, in MB."""
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def slab_mb() -> float:
    for line in open("/proc/meminfo"):
        if line.startswith("Slab:"):
            return int(line.split()[1]) / 1024
    return 0.0


def answer(mib: int) -> tuple[bytes, int]:
    n = mib * 2**20
    head = {"exit_code": 0, "timed_out": False, "elapsed_s": 0.0, "stdout_len": n, "stderr_len": 0,
            "stdout_total": n, "stderr_total": 0}
    return json.dumps(head).encode() + b"\n", n


def forged_wire(mib: int, early: bool = False) -> dict:
    from turngym.tools.sandbox import SandboxConfig
    from turngym.tools.sandbox.docker_backend import DockerBackend
    from turngym.tools.sandbox.docker_stream import Server

    box = DockerBackend.__new__(DockerBackend)
    box.config, box._closed, box.bytes_received, box._dirty = SandboxConfig(), False, 0, True
    host, far = socket.socketpair()
    box._server = Server(host)
    box._kill_everything = box._drop_server  # no container: ending its processes is dropping the channel
    head, n = answer(mib)

    def write():
        frame = b"A" * 2**20
        try:
            if not early:
                far.recv(1)  # answer after the request, as a supervisor does: the length check is what refuses it
            far.sendall(struct.pack(">BxxxI", 1, len(head)) + head)
            for _ in range(n // len(frame)):
                far.sendall(struct.pack(">BxxxI", 1, len(frame)) + frame)
        except OSError:
            pass  # the host hung up

    threading.Thread(target=write, daemon=True).start()
    t0 = time.perf_counter()
    res = box._request({"argv": ["echo", "hello"], "max_output": 32768, "stdin_len": -1}, b"", 120.0).decode()
    return {"step_s": time.perf_counter() - t0, "bytes_read": box.bytes_received, "returned": res.observation()[:120]}


RACER = r'''
import json, os, signal, sys, time
sup = os.getppid()
if os.fork():
    sys.exit(0)
os.setsid()
if os.fork():
    os._exit(0)
for fd in (0, 1, 2):
    os.dup2(os.open("/dev/null", os.O_RDWR), fd)
n = %d
head = json.dumps({"exit_code": 0, "timed_out": False, "elapsed_s": 0.0, "stdout_len": n, "stderr_len": 0,
                   "stdout_total": n, "stderr_total": 0}).encode() + b"\n"
time.sleep(0.3)
os.kill(sup, signal.SIGKILL)
seen = {sup, os.getpid()}
end = time.time() + 60
while time.time() < end:
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) in seen:
            continue
        try:
            fd = os.open(f"/proc/{p}/fd/1", os.O_WRONLY)
        except OSError:
            continue
        seen.add(int(p))
        try:
            os.write(fd, head)
            block = b"A" * 2**20
            for _ in range(n // len(block)):
                os.write(fd, block)
        except OSError:
            pass
'''


def forged_race(backend: str, mib: int) -> dict:
    from turngym.tools.sandbox import SandboxConfig, make_sandbox

    box = make_sandbox(backend, SandboxConfig(timeout_s=60))
    try:
        box.exec(["python3", "-c", RACER % (mib * 2**20)])
        time.sleep(1.0)
        before = box.bytes_received
        t0 = time.perf_counter()
        res = box.exec("echo hello")
        step = time.perf_counter() - t0
        return {"step_s": step, "bytes_read": box.bytes_received - before, "returned": res.observation()[:120]}
    finally:
        box.close()


def files(backend: str, n: int) -> dict:
    import turngym

    kw = {}
    if backend == "bwrap-without-cgroup":
        from turngym.tools.sandbox import cgroup

        cgroup.SandboxCgroup.create = classmethod(lambda cls, *a, **k: (None, "not delegated"))
        backend = "bwrap"
    env = turngym.make("turngym/SWE-synthetic-v0", split="test", sandbox=backend, pool_size=0,
                       command_timeout_s=300.0, **kw)
    fmt = env.unwrapped.format
    from turngym.types import ToolCall

    def bash(cmd: str):
        return env.step(fmt.render_call(ToolCall("c", "bash", {"command": cmd})))

    try:
        env.reset(seed=0, options={"task_id": "synthetic-test-002"})
        slab0 = slab_mb()
        t0 = time.perf_counter()
        obs, *_ = bash(f"mkdir many && python3 -c \"import os\nfor i in range({n}):\n    open(f'many/{{i}}', 'w').close()\" "
                       "2>&1 | tail -2; ls many | wc -l")
        make_s = time.perf_counter() - t0
        slab1 = slab_mb()
        steps = []
        for _ in range(3):
            t0 = time.perf_counter()
            last, _, _, truncated, _ = bash("true")
            steps.append(time.perf_counter() - t0)
        return {"make_step_s": make_s, "step_s": statistics.median(steps), "slab_growth_mb": slab1 - slab0,
                "made": obs[0].content[-160:], "returned": last[-1].content[:160], "truncated": truncated}
    finally:
        env.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("case", choices=["forged-wire", "forged-race", "files"])
    p.add_argument("--backend", default="docker", choices=["docker", "bwrap", "bwrap-without-cgroup"])
    p.add_argument("--mib", type=int, default=1024, help="size of the forged stdout")
    p.add_argument("--early", action="store_true", help="forged-wire: the bytes arrive before the request")
    p.add_argument("--files", type=int, default=1_000_000, help="empty files the episode makes")
    a = p.parse_args()
    warnings.simplefilter("ignore")
    import turngym

    rss0 = status_mb("VmRSS")
    if a.case == "forged-wire":
        out = forged_wire(a.mib, a.early)
    elif a.case == "forged-race":
        out = forged_race(a.backend, a.mib)
    else:
        out = files(a.backend, a.files)
    out = {"case": a.case, "backend": a.backend if a.case != "forged-wire" else "-", "turngym": os.path.dirname(turngym.__file__),
           "rss_before_mb": round(rss0), "rss_peak_mb": round(status_mb("VmHWM")), **out}
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}))
    sys.stdout.flush()
    os._exit(0)  # a daemon thread may still be writing into a socket nobody reads


if __name__ == "__main__":
    main()
