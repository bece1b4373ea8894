"""Run one shell command with a deadline and capped output (standard library only).

The local backend calls ``run_capped`` in-process. The bubblewrap backend ships this file's
source into the sandbox and runs ``serve()`` there as PID 1 of the sandbox's PID namespace; the
Docker backend runs ``serve()`` in each container, as the sandbox user. Either way the deadline,
the process-group kill and the output cap apply inside the sandbox, so the host never reads more
than the capped bytes, and the server is non-dumpable: a command running as the same uid cannot
ptrace it or open its descriptors (the answer channel) through ``/proc``.

Wire format (``serve``): the host writes one JSON line per request, followed by ``stdin_len``
raw bytes; the server answers one JSON line followed by ``stdout_len`` then ``stderr_len`` bytes.
"""

import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time

# After the command exits we kill its process group; a process that escaped with setsid() may
# still hold the pipes open, so we read on for at most this long before closing them.
_DRAIN_GRACE_S = 0.2


class Capture:
    """Keeps the first and last ``limit // 2`` bytes of a stream and counts the rest."""

    def __init__(self, limit):
        self.limit = max(0, int(limit))
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk):
        self.total += len(chunk)
        room = self.limit // 2 - len(self.head) if self.limit else 0
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self.limit:
            self.tail += chunk
            keep = self.limit - self.limit // 2
            if len(self.tail) > 2 * keep:  # trim rarely, not on every chunk
                del self.tail[:-keep]

    def value(self):
        keep = self.limit - self.limit // 2
        tail = bytes(self.tail[-keep:]) if keep else b""
        dropped = self.total - len(self.head) - len(tail)
        if dropped <= 0:
            return bytes(self.head) + tail
        marker = b"\n...[%d bytes of output truncated]...\n" % dropped
        return bytes(self.head) + marker + tail


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _feed(pipe, data):
    try:
        pipe.write(data)
    except (BrokenPipeError, OSError):
        pass  # the command stopped reading; that is its business
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def run_capped(argv, cwd=None, env=None, stdin=None, timeout=30.0, max_output=32768):
    """Run ``argv`` in a new session; kill the whole group at the deadline or when it exits.

    Returns a dict: exit_code (128+signal when killed), timed_out, elapsed_s, stdout, stderr
    (bytes, capped to ``max_output`` each), stdout_total, stderr_total (bytes produced).
    """
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, start_new_session=True,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
    except OSError as e:
        msg = ("cannot start command: %s" % e).encode()
        return {"exit_code": 127, "timed_out": False, "elapsed_s": 0.0, "stdout": b"", "stderr": msg,
                "stdout_total": 0, "stderr_total": len(msg)}
    if stdin is not None:
        threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
    caps = {proc.stdout.fileno(): Capture(max_output), proc.stderr.fileno(): Capture(max_output)}
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    sel = selectors.DefaultSelector()
    for f in (proc.stdout, proc.stderr):
        sel.register(f, selectors.EVENT_READ)
    deadline = t0 + timeout
    timed_out, exited_at = False, None
    while sel.get_map():
        now = time.monotonic()
        if exited_at is None and proc.poll() is not None:
            exited_at = now
            _kill_group(proc.pid)  # background jobs die with the command, as in a fresh shell
        if exited_at is None and now >= deadline:
            timed_out = True
            _kill_group(proc.pid)
            exited_at = now
        if exited_at is not None and now - exited_at > _DRAIN_GRACE_S:
            break
        wait = _DRAIN_GRACE_S if exited_at is not None else min(0.05, max(0.0, deadline - now))
        for key, _ in sel.select(timeout=wait):
            chunk = os.read(key.fd, 65536)
            if chunk:
                caps[key.fd].add(chunk)
            else:
                sel.unregister(key.fileobj)
    sel.close()
    for f in (proc.stdout, proc.stderr):
        f.close()
    if proc.poll() is None:  # pipes closed early but the command lives on: the deadline still holds
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    _kill_group(proc.pid)
    proc.wait()
    code = proc.returncode
    return {
        "exit_code": 128 - code if code < 0 else code, "timed_out": timed_out,
        "elapsed_s": time.monotonic() - t0,
        "stdout": caps[out_fd].value(), "stderr": caps[err_fd].value(),
        "stdout_total": caps[out_fd].total, "stderr_total": caps[err_fd].total,
    }


def _reap():
    """PID 1 adopts every orphan; reap the dead so they do not hold pids."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _read_exact(f, n):
    buf = b""
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def _handle(req, data):
    if req.get("op") == "killall":
        try:
            os.kill(-1, signal.SIGKILL)  # everything the server may signal (the sandbox) but itself
        except ProcessLookupError:
            pass
        time.sleep(0.05)
        _reap()
        return {"exit_code": 0, "timed_out": False, "elapsed_s": 0.0, "stdout": b"", "stderr": b"",
                "stdout_total": 0, "stderr_total": 0}
    _reap()
    res = run_capped(req["argv"], cwd=req.get("cwd"), env=req.get("env"), stdin=data,
                     timeout=float(req.get("timeout", 30.0)), max_output=int(req.get("max_output", 32768)))
    _reap()
    return res


def serve(limits):
    """Answer requests on stdin/stdout until EOF (runs inside the sandbox: bwrap's PID 1, Docker's supervisor)."""
    import resource
    import ctypes

    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value))
    try:  # non-dumpable: a command running as the same uid cannot ptrace the server
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    while True:
        line = inp.readline()
        if not line:
            return
        try:
            req = json.loads(line)
            n = int(req.get("stdin_len", -1))
            data = _read_exact(inp, n) if n >= 0 else None
            res = _handle(req, data)
        except EOFError:
            return
        except Exception as e:  # never die: the server is the sandbox's init
            msg = ("sandbox server error: %s: %s" % (type(e).__name__, e)).encode()
            res = {"exit_code": 125, "timed_out": False, "elapsed_s": 0.0, "stdout": b"", "stderr": msg,
                   "stdout_total": 0, "stderr_total": len(msg)}
        so, se = res.pop("stdout"), res.pop("stderr")
        res["stdout_len"], res["stderr_len"] = len(so), len(se)
        out.write(json.dumps(res).encode() + b"\n" + so + se)
        out.flush()


if __name__ == "__main__":
    serve(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})
