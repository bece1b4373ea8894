"""Grade an SWE fix where the agent never was, and decide pass/fail where its code never runs.

At submit, everything the agent left running is killed and only the allow-listed source files are
read out of its sandbox, as data. That sandbox is then closed. A fresh sandbox, in which no agent
process ever ran, receives those files plus the task's own support files, and ``case_runner``
runs the hidden cases there: inputs only, one forked child per case, the returned values sent back
as plain JSON. This process (the host) holds the expected values and compares. No test framework
that the agent's code could patch takes part in the verdict, and what the sandbox prints is data:
to pass, the agent's code has to return the right values.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from turngym.envs.swe import case_runner
from turngym.envs.swe.task import CaseSuite
from turngym.tools.sandbox import Sandbox, SandboxError

RUNNER_SOURCE = Path(case_runner.__file__).read_text()
MAX_REPORT_BYTES = 16 * 2**20
_PY = ["python3", "-I", "-S", "-B"]  # no site / user site / .pth / PYTHON* variables / bytecode writes


def collect_sources(box: Sandbox, allowed: list[str]) -> dict[str, str]:
    """Kill what the agent left running, then read the allow-listed files out of its sandbox.

    Only regular files at exactly the allowed paths come back; anything else the agent made
    (plugins, ``.pth`` files, caches, links elsewhere) is never copied.
    """
    box.kill_all()
    files = box.read_files(list(allowed))
    return {p: text for p, text in files.items() if p in set(allowed)}


def grade_in_fresh_sandbox(box: Sandbox, suite: CaseSuite, files: dict[str, str], case_timeout_s: float,
                           timeout_s: float) -> tuple[bool, str]:
    """Run ``suite`` on ``files`` in ``box`` (a sandbox no agent process ever ran in) and judge it.

    Returns:
        ``(every case returned the expected values, a one-line summary)``.
    """
    box.put_files({**files, **suite.support})
    nonce = secrets.token_hex(16)
    request = {"root": box.workdir, "module": suite.module, "cases": list(suite.cases), "targets": list(suite.targets),
               "timeout": case_timeout_s, "max_bytes": MAX_REPORT_BYTES // max(1, len(suite.cases)), "nonce": nonce}
    res = box.exec([*_PY, "-c", RUNNER_SOURCE], timeout=timeout_s, stdin=json.dumps(request).encode(),
                   max_output=MAX_REPORT_BYTES)
    if res.stdout_bytes > len(res.stdout.encode()):  # stderr (the agent's prints) may be cut; results may not
        return False, "the test run produced more output than the grader accepts"
    return judge(suite, parse_report(res.stdout, nonce, len(suite.cases)), res.timed_out)


def parse_report(stdout: str, nonce: str, n_cases: int) -> list[dict | None]:
    """Each case's line from the runner (``None`` where missing). A case reported twice, or a
    report that does not end in the done line, voids the whole report."""
    out: list[dict | None] = [None] * n_cases
    done = False
    for line in stdout.splitlines():
        head, _, body = line.partition(" ")
        if head != nonce or done:
            continue
        try:
            msg = json.loads(body)
        except (ValueError, RecursionError):
            return [None] * n_cases
        if not isinstance(msg, dict):
            return [None] * n_cases
        if msg.get("done") is True:
            done = True
            continue
        i = msg.get("case")
        if type(i) is not int or not 0 <= i < n_cases or out[i] is not None:
            return [None] * n_cases
        out[i] = msg
    return out if done else [None] * n_cases


def judge(suite: CaseSuite, report: list[dict | None], timed_out: bool = False) -> tuple[bool, str]:
    """Compare the reported values with the expected ones (Python ``==`` on decoded plain data)."""
    n = len(suite.cases)
    passed, first_fail = 0, ""
    for i, (msg, want) in enumerate(zip(report, suite.expected)):
        why = _case_failure(msg, want)
        if why:
            first_fail = first_fail or f"case {i + 1}: {why}"
        else:
            passed += 1
    if len(suite.expected) != n:
        return False, "the task has no expected values for its cases"
    summary = f"{passed}/{n} hidden cases passed"
    if timed_out:
        summary += " (the test run hit its time limit)"
    return passed == n, summary + (f"; first failure: {first_fail}" if first_fail else "")


def _case_failure(msg: dict | None, want: dict) -> str:
    if msg is None:
        return "no result"
    if msg.get("status") != "ok":
        return f"{msg.get('status')}: {str(msg.get('error', ''))[:200]}"
    try:
        got = decode(msg.get("result"))
    except (ValueError, TypeError, KeyError, RecursionError):
        return "the result could not be read"
    return "" if got == decode(want) else "returned a different value"


@dataclass(frozen=True)
class _Ref:
    k: int


class _Opaque:
    """A value the runner could not encode (a builtin's subclass, past a cap): equal to nothing,
    not even another of its kind, so two unreadable values never count as the same."""

    def __init__(self, tag: str, value: str) -> None:
        self.tag, self.value = tag, value

    def __eq__(self, other) -> bool:
        return False

    __hash__ = object.__hash__


def decode(record) -> tuple:
    """A runner record as plain Python data (``(calls, objects)``); ``ValueError`` if malformed."""
    if not isinstance(record, dict) or not isinstance(record.get("calls"), list) or not isinstance(
            record.get("objs", []), list):
        raise ValueError("not a case record")
    objs = tuple((str(o["cls"]), tuple((str(a), _value(v)) for a, v in o["attrs"])) for o in record.get("objs", []))
    return tuple(_value(c) for c in record["calls"]), objs


def _value(x):
    if x is None or type(x) in (bool, int, str, float):
        return x
    if type(x) is not dict or len(x) != 1:
        raise ValueError("malformed value")
    ((tag, v),) = x.items()
    if tag == "float":
        return float(v)
    if tag in ("list", "iter"):
        return [_value(e) for e in v]
    if tag == "tuple":
        return tuple(_value(e) for e in v)
    if tag in ("set", "frozenset"):
        return frozenset(_value(e) for e in v)
    if tag == "dict":
        return {_value(k): _value(val) for k, val in v}
    if tag == "ref":
        return _Ref(int(v))
    if tag == "bytes":
        return bytes.fromhex(v)
    if tag in ("other", "truncated"):
        return _Opaque(tag, str(v))
    raise ValueError(f"unknown tag {tag!r}")


def reference_results(suite: CaseSuite, files: dict[str, str], case_timeout_s: float = 60.0) -> tuple[dict, ...]:
    """Run ``suite`` on the reference solution (``files``) in a host subprocess: the expected values.

    Raises:
        RuntimeError: A case of the reference solution failed or timed out.
    """
    nonce = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="turngym-reference-") as d:
        for path, text in {**files, **suite.support}.items():
            p = Path(d, path)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        request = {"root": d, "module": suite.module, "cases": list(suite.cases), "targets": list(suite.targets),
                   "timeout": case_timeout_s, "max_bytes": MAX_REPORT_BYTES, "nonce": nonce}
        proc = subprocess.run([sys.executable, *_PY[1:], "-c", RUNNER_SOURCE], input=json.dumps(request).encode(),
                              capture_output=True, cwd=d, timeout=case_timeout_s * len(suite.cases) + 60)
    report = parse_report(proc.stdout.decode("utf-8", "replace"), nonce, len(suite.cases))
    bad = [i for i, m in enumerate(report) if m is None or m.get("status") != "ok"]
    if bad:
        msg = report[bad[0]] or {}
        raise RuntimeError(f"the reference solution fails case {suite.cases[bad[0]]}: {msg.get('error')} "
                           f"{proc.stderr.decode('utf-8', 'replace')[-300:]}")
    results = tuple(m["result"] for m in report)
    for case, r in zip(suite.cases, results):
        check_gradable(r, case)
    return results


def check_gradable(record: dict, case: str = "") -> None:
    """Raise ``ValueError`` if an expected record holds a value no answer can equal (an
    unencodable object or a cap hit): the case could never pass."""
    text = json.dumps(record)
    if '{"other": ' in text or '{"truncated": ' in text:
        raise ValueError(f"case {case}: the reference returns a value the grader cannot compare")


def grade(new_sandbox, suite: CaseSuite | None, files: dict[str, str], case_timeout_s: float,
          timeout_s: float) -> tuple[bool, str]:
    """Grade ``files`` in a sandbox from ``new_sandbox()`` (closed afterwards); infrastructure
    failures are a failed grade with the reason, never an exception."""
    if suite is None or not suite.cases:
        return False, "the task has no hidden cases to grade with"
    try:
        with new_sandbox() as box:
            return grade_in_fresh_sandbox(box, suite, files, case_timeout_s, timeout_s)
    except SandboxError as e:
        return False, f"grading failed: {e}"
