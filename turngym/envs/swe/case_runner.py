"""Run a task's hidden cases against the agent's code; report what it returned, as data.

This file runs inside the grading sandbox as ``python3 -I -S -c <this source>`` (standard library
only; no turngym import). It decides nothing: it never sees expected values, only inputs. The host
(``grading.py``) compares what it reports with the expected values it alone holds, so forging this
output, patching a test framework, or returning objects that equal anything gains nothing.

The runner itself never imports the agent's code. For each case it forks a child that imports the
case module (which imports the agent's code), calls the case function, and sends back every value
the target functions returned, encoded as plain JSON. The parent waits with a deadline, kills the
child's process group, and writes one line per case to its stdout, prefixed with the request's
nonce. The child's stdout and stderr go to ``/dev/null``: nothing the agent's code prints leaves
the sandbox, and no descriptor of the result channel is open in it. The runner is non-dumpable,
so the agent's code (same uid) cannot ptrace it or open its descriptors through ``/proc``; the
backends start it with no process of the sandbox user between it and the host.
Each case has a CPU-time limit (RLIMIT_CPU, so a loaded machine does not fail a correct fix) and
a wall-clock deadline of twice that plus a second, which catches code that sleeps.

Request (JSON on stdin): ``nonce``, ``root`` (the directory holding the code), ``module`` (the
case module's source), ``cases`` (case function names, run in order), ``targets`` (names in the
module whose calls are recorded), ``limits`` (CPU seconds per case), ``max_bytes`` (per case).
Line per case: ``{"case": i, "status": "ok" | "error" | "timeout", "cpu_s": ..., "result" |
"error": ...}``; the runner stops at the first case that is not ok (a failed case fails the
task) unless the request says ``keep_going`` (a count of the cases that pass needs them all);
last line ``{"done": true}``.
"""

import json
import math
import os
import resource
import select
import signal
import sys
import time
import types

MAX_ITEMS = 200_000  # encoded values per case; past it the result is "truncated" (a fail)
MAX_DEPTH = 200
WALL_FACTOR, WALL_SLACK_S = 2.0, 1.0  # wall-clock deadline = 2 x the CPU limit + 1 s


class Encoder:
    """Plain-JSON encoding of a returned value that keeps the distinctions ``==`` makes.

    None, bool, int and str are JSON scalars; a float is ``{"float": repr}``; list, tuple, set,
    frozenset, dict and exhausted iterators are tagged (``{"list": [...]}``, ``{"dict": [[k, v],
    ...]}``, ...). Any other object is ``{"ref": k}``, with its class name and attributes in
    ``objs[k]`` (numbered by first encounter, so shared and cyclic structures keep their shape).
    A builtin's subclass (``defaultdict``, a named tuple, an ``int`` subclass) is encoded as the
    builtin value it holds, read with the builtin's own methods: the host compares data, so the
    subclass's ``__eq__`` or ``__iter__`` decides nothing. Values with no ``__dict__`` that are
    none of these are ``{"other": type name}`` (equal to nothing on the host).
    """

    def __init__(self):
        self.objs = []
        self._ids = {}
        self._keep = []  # holds encoded objects so their ids are not reused during the case
        self.items = 0

    def encode(self, x, depth=0):
        self.items += 1
        if self.items > MAX_ITEMS or depth > MAX_DEPTH:
            return {"truncated": True}
        t = type(x)
        if x is None or t is bool or t is str or t is int:
            return x
        if t is float:
            return {"float": repr(x)}
        if t in (list, tuple, set, frozenset):
            items = sorted(x, key=repr) if t in (set, frozenset) else x
            return {t.__name__: [self.encode(v, depth + 1) for v in items]}
        if t is dict:
            return {"dict": [[self.encode(k, depth + 1), self.encode(v, depth + 1)] for k, v in x.items()]}
        if t is bytes:
            return {"bytes": x.hex()}
        base = next((b for b in _PLAIN if isinstance(x, b)), None)
        if base is not None:
            return self.encode(_as_plain(x, base), depth)
        d = getattr(x, "__dict__", None)
        if type(d) is not dict:
            return {"other": t.__name__}
        k = self._ids.get(id(x))
        if k is None:
            k = self._ids[id(x)] = len(self.objs)
            self._keep.append(x)
            self.objs.append(None)
            attrs = [[str(a), self.encode(v, depth + 1)] for a, v in list(d.items())]
            self.objs[k] = {"cls": t.__name__, "attrs": attrs}
        return {"ref": k}


# A builtin's subclass is read through the builtin's own methods (its overrides are never called).
_PLAIN = (int, float, str, bytes, dict, list, tuple, frozenset, set)


def _as_plain(x, base):
    if base is dict:
        return dict(dict.items(x))
    if base in (list, tuple, set, frozenset):
        return base(base.__iter__(x))
    if base is int:
        return int.__int__(x)
    if base is float:
        return float.__float__(x)
    if base is str:
        return str.__str__(x)
    return bytes.__bytes__(x)


def recorder(fn, enc, calls):
    """``fn`` with every return value encoded into ``calls`` (iterators are drained first)."""

    def wrapped(*args, **kwargs):
        out = fn(*args, **kwargs)
        if hasattr(out, "__next__") and type(out) not in (list, tuple, dict, set, str):
            items = []
            for v in out:
                items.append(v)
                if len(items) > MAX_ITEMS:
                    break
            calls.append({"iter": [enc.encode(v) for v in items]})
            return iter(items)
        calls.append(enc.encode(out))
        return out

    return wrapped


def run_case(req, i):
    """In the child: import the case module, run case ``i``, return its encoded calls."""
    root = req["root"]
    sys.path.append(root)  # after the stdlib: nothing in the repo shadows it
    os.chdir(root)
    mod = types.ModuleType("turngym_cases")
    mod.__file__ = os.path.join(root, "turngym_cases.py")
    sys.modules["turngym_cases"] = mod
    exec(compile(req["module"], mod.__file__, "exec"), mod.__dict__)
    enc, calls = Encoder(), []
    for name in req["targets"]:
        setattr(mod, name, recorder(getattr(mod, name), enc, calls))
    getattr(mod, req["cases"][i])()
    return {"calls": calls, "objs": enc.objs}


def cpu_limit(req, i):
    """Case ``i``'s CPU limit in whole seconds (RLIMIT_CPU counts whole seconds)."""
    return max(1, math.ceil(float(req["limits"][i])))


def child(req, i, w):
    os.setpgid(0, 0)
    cpu = cpu_limit(req, i)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at the limit, SIGKILL a second later
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the agent's prints leave no trace, and it holds no fd of the channel
        os.dup2(null, fd)
    os.close(null)
    try:
        data = json.dumps(run_case(req, i)).encode()
    except BaseException as e:  # noqa: BLE001 -- any failure of the agent's code is a failed case
        data = json.dumps({"error": "%s: %s" % (type(e).__name__, str(e)[:300])}).encode()
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(w, view):]
    finally:
        os._exit(0)


def wait_case(pid, r, deadline, max_bytes):
    """Read the child's answer until EOF or the deadline; kill its group; (status, bytes, CPU s).
    A child killed by its CPU limit timed out too."""
    buf = b""
    status = "ok"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            status = "timeout"
            break
        if not select.select([r], [], [], left)[0]:
            continue
        chunk = os.read(r, 1 << 16)
        if not chunk:
            break
        buf += chunk
        if len(buf) > max_bytes:
            status = "error"
            buf = b'{"error": "the returned values are too large"}'
            break
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    _, code, usage = os.wait4(pid, 0)
    os.close(r)
    if os.WIFSIGNALED(code) and os.WTERMSIG(code) == signal.SIGXCPU:
        status = "timeout"
    return status, buf, round(usage.ru_utime + usage.ru_stime, 4)


def main():
    try:  # non-dumpable: the agent's code (same uid) cannot ptrace this process or open its fds
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    req = json.loads(sys.stdin.buffer.read())
    out = os.dup(1)
    nonce = req.pop("nonce")

    def emit(obj):
        os.write(out, (nonce + " " + json.dumps(obj) + "\n").encode())

    for i in range(len(req["cases"])):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.close(out)
            child(req, i, w)
        os.close(w)
        wall = WALL_FACTOR * cpu_limit(req, i) + WALL_SLACK_S
        status, data, cpu_s = wait_case(pid, r, time.monotonic() + wall, int(req["max_bytes"]))
        try:
            payload = json.loads(data) if status == "ok" else None
        except ValueError:
            payload = None
        if status == "ok" and isinstance(payload, dict) and "calls" in payload:
            emit({"case": i, "status": "ok", "cpu_s": cpu_s, "result": payload})
            continue
        err = payload.get("error") if isinstance(payload, dict) else None
        if status == "ok":
            status, err = "error", err or "the case exited without a result"
        emit({"case": i, "status": status, "cpu_s": cpu_s, "error": str(err or "the case timed out")[:400]})
        if not req.get("keep_going"):
            break
    emit({"done": True})


if __name__ == "__main__":
    main()
