"""The host believes nothing a sandbox answers until it has checked it: the head line is bounded,
its shape checked, and no stream longer than asked for is read. Each malformed answer shape is fed
to the Docker and bubblewrap read paths over a socket or pipe (no engine needed); on Docker, a
daemon that races the restart of its supervisor must not be able to answer in its place."""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time

import pytest

from test_sandbox import open_sandbox, skip_reason
from turngym.tools.sandbox import SandboxConfig, SandboxError
from turngym.tools.sandbox.base import RawResult

GOOD = {"exit_code": 0, "timed_out": False, "elapsed_s": 0.01, "stdout_len": 6, "stderr_len": 0,
        "stdout_total": 6, "stderr_total": 0}


def head(**over) -> bytes:
    return json.dumps({**GOOD, **over}).encode() + b"\n"


# Each shape a process that took over the answer channel might write, and what the host reads of it.
MALFORMED = {
    "a JSON list": b"[]\n",
    "JSON that is not an object": b'"hello"\n',
    "not JSON": b"AAAA\n",
    "a head line with no end": b"A" * (8 * 2**20),
    "nested 5,000 deep": b"[" * 5000 + b"]" * 5000 + b"\n",
    "a missing field": json.dumps({k: v for k, v in GOOD.items() if k != "stderr_len"}).encode() + b"\n",
    "a string for a length": head(stdout_len="6") + b"hello\n",
    "a boolean for the exit code": head(exit_code=True) + b"hello\n",
    "a negative length": head(stderr_len=-1) + b"hello\n",
    "NaN seconds": head(elapsed_s=float("nan")) + b"hello\n",
    "a forged 64 MiB stdout": head(stdout_len=64 * 2**20, stdout_total=64 * 2**20) + b"A" * (64 * 2**20),
    "bytes after the answer": head() + b"hello\nEXTRA",
}


# ----- the checks themselves, by hand ------------------------------------------------------------
def test_parse_head_by_hand():
    from turngym.tools.sandbox.wire import MAX_HEAD_BYTES, MalformedAnswer, max_stream_bytes, parse_head

    assert max_stream_bytes(1000) == 1064  # max_output + the 64 bytes of Capture's truncation marker
    got = parse_head(head(stdout_len=1064, stdout_total=5000)[:-1], 1000)
    assert got == {**GOOD, "stdout_len": 1064, "stdout_total": 5000}
    with pytest.raises(MalformedAnswer, match="stdout_len is 1065"):
        parse_head(head(stdout_len=1065)[:-1], 1000)
    assert parse_head(head(stdout_len=0, stdout_total=0)[:-1], 0)["stdout_len"] == 0  # killall: no output asked
    with pytest.raises(MalformedAnswer, match="stderr_len is 65"):
        parse_head(head(stderr_len=65)[:-1], 0)
    line = head()[:-1]
    padded = line[:-1] + b" " * (MAX_HEAD_BYTES - len(line)) + b"}"
    assert len(padded) == MAX_HEAD_BYTES and parse_head(padded, 6)["exit_code"] == 0
    with pytest.raises(MalformedAnswer, match="more than 1024 bytes"):
        parse_head(padded + b" ", 6)
    for bad in ([b"[]", "a JSON list"], [b"[" * 500 + b"]" * 500, "a JSON list"], [b"{", "not JSON"],
                [head(exit_code=True)[:-1], "exit_code is True"], [head(exit_code=2000)[:-1], "exit_code is 2000"],
                [head(elapsed_s=1e308 * 10)[:-1], "elapsed_s is inf"], [head(timed_out=0)[:-1], "timed_out is 0"]):
        with pytest.raises(MalformedAnswer, match=bad[1]):
            parse_head(bad[0], 6)


def test_docker_frames_are_parsed_as_they_arrive():
    from turngym.tools.sandbox.docker_stream import Demux

    frames = b"".join(struct.pack(">BxxxI", s, len(p)) + p for s, p in ((1, b"out1"), (2, b"err"), (1, b""), (1, b"out2")))
    for step in (1, 3, 7, len(frames)):  # however the bytes are split, the same payloads come out
        got = []
        d = Demux(lambda s, b: got.append((s, b)))
        for i in range(0, len(frames), step):
            d.feed(frames[i:i + step])
        assert b"".join(b for s, b in got if s == 1) == b"out1out2" and b"".join(b for s, b in got if s == 2) == b"err"
    # a header that claims 4 GiB: what arrives is passed on as it comes, and nothing waits for the rest
    got = []
    d = Demux(lambda s, b: got.append(len(b)))
    d.feed(struct.pack(">BxxxI", 1, 2**32 - 1) + b"x" * 100_000)
    assert sum(got) == 100_000 and d.left == 2**32 - 1 - 100_000 and not d.header


# ----- every malformed shape, through each backend's read path -----------------------------------
class _FakeDocker:
    """A DockerBackend whose supervisor is one end of a socketpair: ``forge`` writes its answer."""

    def __init__(self, monkeypatch):
        from turngym.tools.sandbox import docker_backend
        from turngym.tools.sandbox.docker_stream import Server

        self.box = docker_backend.DockerBackend.__new__(docker_backend.DockerBackend)
        self.box.config, self.box._closed, self.box.bytes_received = SandboxConfig(), False, 0
        self.box._dirty, self.killed = True, 0
        host, self.sandbox_end = socket.socketpair()
        self.box._server = Server(host)

        def kill_everything():
            self.killed += 1
            self.box._drop_server()

        monkeypatch.setattr(self.box, "_kill_everything", kill_everything)

    def forge(self, data: bytes, before_the_request: bool = False) -> None:
        def write():
            try:
                if not before_the_request:
                    self.sandbox_end.recv(1 << 16)  # answer once asked, as the supervisor would
                for i in range(0, len(data), 1 << 20):  # as Docker frames it: stream 1, at most 1 MiB a frame
                    chunk = data[i:i + (1 << 20)]
                    self.sandbox_end.sendall(struct.pack(">BxxxI", 1, len(chunk)) + chunk)
            except OSError:
                pass  # the host hung up on the forger: what it should do

        threading.Thread(target=write, daemon=True).start()


@pytest.mark.parametrize("shape", list(MALFORMED))
def test_docker_host_refuses_each_malformed_answer(shape, monkeypatch):
    fake = _FakeDocker(monkeypatch)
    fake.forge(MALFORMED[shape])
    res = fake.box._request({"argv": ["echo", "hello"], "max_output": 1000, "stdin_len": -1}, b"", 10.0)
    assert isinstance(res, RawResult) and res.exit_code == 125 and b"answer was malformed" in res.stderr, res
    assert fake.killed == 1 and fake.box._server is None  # whoever answered, nothing of the sandbox user is left
    assert fake.box.bytes_received < 2 * 2**20, "the host read on past what it had asked for"


def test_docker_host_refuses_an_answer_that_came_before_the_request(monkeypatch):
    fake = _FakeDocker(monkeypatch)
    fake.forge(head() + b"hello\n", before_the_request=True)
    time.sleep(0.2)  # the forged answer is waiting when the host sends its request
    res = fake.box._request({"argv": ["true"], "max_output": 1000, "stdin_len": -1}, b"", 10.0)
    assert res.exit_code == 125 and b"bytes before the request" in res.stderr and fake.killed == 1


def test_docker_host_reads_a_good_answer(monkeypatch):
    fake = _FakeDocker(monkeypatch)
    fake.forge(head() + b"hello\n")
    res = fake.box._request({"argv": ["echo", "hello"], "max_output": 1000, "stdin_len": -1}, b"", 10.0)
    assert res.decode().stdout == "hello\n" and res.exit_code == 0 and fake.killed == 0


class _FakeBwrap:
    """A BwrapBackend whose server is the far end of two pipes."""

    def __init__(self):
        import tempfile

        from turngym.tools.sandbox.bwrap_backend import BwrapBackend

        class Proc:
            pass

        self.box = BwrapBackend.__new__(BwrapBackend)
        self.box.config, self.box._closed, self.box.bytes_received = SandboxConfig(), False, 0
        self.box._lock, self.box._buf, self.box._errlog = threading.Lock(), bytearray(), tempfile.TemporaryFile()
        self.box.cgroup, self.box._mount_dir = None, None
        r_req, w_req = os.pipe()
        self.r_ans, w_ans = os.pipe()
        self.box._proc = Proc()
        self.box._proc.stdin = os.fdopen(w_req, "wb")
        self.box._proc.stdout = os.fdopen(self.r_ans, "rb")
        self.w_ans, self.r_req = w_ans, r_req
        self.failed = 0

        def fail():
            self.failed += 1
            self.box._closed = True

        self.box._fail = fail

    def forge(self, data: bytes) -> None:
        def write():
            try:
                os.read(self.r_req, 1 << 16)
                view = memoryview(data)
                while view:
                    view = view[os.write(self.w_ans, view[:1 << 20]):]
            except OSError:
                pass

        threading.Thread(target=write, daemon=True).start()


@pytest.mark.parametrize("shape", list(MALFORMED))
def test_bwrap_host_refuses_each_malformed_answer(shape):
    fake = _FakeBwrap()
    fake.forge(MALFORMED[shape])
    with pytest.raises(SandboxError, match="the bwrap sandbox failed"):
        fake.box._request({"argv": ["echo", "hello"], "max_output": 1000, "stdin_len": -1}, b"", 10.0)
    assert fake.failed == 1  # the sandbox is closed: its PID 1 server is the one that answers
    assert fake.box.bytes_received < 2 * 2**20, "the host read on past what it had asked for"
    os.close(fake.w_ans)


# ----- Docker: a daemon races the restart of its command supervisor -------------------------------
# Escapes its command's process group (setsid, double fork), kills the supervisor it ran under, then
# watches /proc for the host's next supervisor and opens its stdout before it turns non-dumpable.
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
payload = b"A" * (8 * 2**20)
answer = json.dumps({"exit_code": 0, "timed_out": False, "elapsed_s": 0.0, "stdout_len": len(payload),
                     "stderr_len": 0, "stdout_total": len(payload), "stderr_total": 0}).encode() + b"\n" + payload
time.sleep(0.3)
os.kill(sup, signal.SIGKILL)
seen = {sup, os.getpid()}
end = time.time() + 30
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
            os.write(fd, answer)
            open("/tmp/.raced", "a").write(p + "\n")
        except OSError:
            pass
'''


@pytest.mark.docker
def test_a_daemon_cannot_answer_for_a_restarted_supervisor():
    reason = skip_reason("docker")
    if reason:
        pytest.skip(reason)
    box = open_sandbox("docker", SandboxConfig(timeout_s=20))
    try:
        assert box.exec(["python3", "-c", RACER]).exit_code == 0
        time.sleep(1.0)  # the daemon has killed the supervisor and is watching for the next one
        before = box.bytes_received
        res = box.exec("echo hello")
        assert res.stdout == "hello\n" and res.exit_code == 0, res.observation()
        assert box.bytes_received - before < 64 * 1024
        after = box.exec("ls -a /tmp; ps -eo uid=,comm= | grep -c '^ *1000 python3'").stdout.split()
        assert ".raced" not in after, "the daemon opened a supervisor's stdout"
        assert after[-1] == "1", "the daemon outlived the restart (only the new supervisor may run python3)"
    finally:
        box.close()
