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

import builtins
import json
import math
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
MAX_SOURCE_BYTES = 2**20  # a source file past this is refused at submit (the tasks' are a few KB)
CASE_MIN_CPU_S = 1.0  # the floor of a case's CPU limit
CASE_CPU_FACTOR = 10.0  # a case may take this many times the reference solution's CPU time
GRADE_STARTUP_S = 5.0  # starting the runner, on top of the cases' own limits
_PY = ["python3", "-I", "-S", "-B"]  # no site / user site / .pth / PYTHON* variables / bytecode writes
# What the runner itself says about a case (any other error text is the agent's code talking).
_RUNNER_ERRORS = ("the case exited without a result", "the returned values are too large", "the case timed out")
_BUILTIN_ERRORS = frozenset(n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException))


class SubmitRefused(ValueError):
    """The agent's files cannot be graded as they are (a link, a file too large); says why."""


_LIST_SOURCES = ('for f in "$@"; do if [ -L "$f" ]; then echo "link 0 $f"; elif [ -f "$f" ]; then '
                 'echo "file $(stat -c %s -- "$f") $f"; elif [ -e "$f" ]; then echo "other 0 $f"; fi; done')


def collect_sources(box: Sandbox, allowed: list[str], max_bytes: int = MAX_SOURCE_BYTES, *,
                    kill: bool = True) -> dict[str, str]:
    """Kill what the agent left running, then read the allow-listed files out of its sandbox.

    Only regular files at exactly the allowed paths come back; anything else the agent made
    (plugins, ``.pth`` files, caches) is never copied. Missing files are left out.

    Args:
        kill: End the agent's processes first (at submit). Without it (a look at the files
            mid-episode), a file a running process changes is read as it happens to be.

    Raises:
        SubmitRefused: An allowed path is a link or not a regular file, or larger than ``max_bytes``.
        SandboxError: The listing is not what the sandbox's own ``sh`` prints (it is checked,
            line by line, before anything in it is believed).
    """
    if kill:
        box.kill_all()
    listing = box.exec(["sh", "-c", _LIST_SOURCES, "sh", *allowed], timeout=60, max_output=1 << 16)
    for line in listing.stdout.splitlines():
        kind, size, path = _listing_line(line, allowed)
        if kind == "link":
            raise SubmitRefused(f"{path} is a symbolic link; only regular files are graded. Replace it with the file itself.")
        if kind != "file":
            raise SubmitRefused(f"{path} is not a regular file")
        if size > max_bytes:
            raise SubmitRefused(f"{path} is {size:,} bytes; a source file may be at most {max_bytes:,} bytes")
    files = box.read_files(list(allowed), max_bytes=max_bytes)
    return {p: text for p, text in files.items() if p in set(allowed)}


def _listing_line(line: str, allowed: list[str]) -> tuple[str, int, str]:
    kind, _, rest = line.partition(" ")
    size, _, path = rest.partition(" ")
    if kind not in ("link", "file", "other") or not size.isdigit() or len(size) > 15 or path not in allowed:
        raise SandboxError(f"the sandbox listed the source files in a form it cannot print: {line[:100]!r}")
    return kind, int(size), path


def case_limits(suite: CaseSuite, cap_s: float) -> list[float]:
    """Each case's CPU limit in seconds: ``CASE_CPU_FACTOR`` x the reference solution's CPU time,
    at least ``CASE_MIN_CPU_S`` and at most ``cap_s`` (``cap_s`` where the reference's time is unknown)."""
    if len(suite.cpu_s) != len(suite.cases):
        return [float(cap_s)] * len(suite.cases)
    return [min(float(cap_s), max(CASE_MIN_CPU_S, CASE_CPU_FACTOR * t)) for t in suite.cpu_s]


def run_deadline(limits: list[float]) -> float:
    """The whole run's deadline: a few seconds above the sum of the cases' wall-clock limits."""
    wall = sum(case_runner.WALL_FACTOR * max(1, math.ceil(t)) + case_runner.WALL_SLACK_S for t in limits)
    return GRADE_STARTUP_S + wall


def grade_in_fresh_sandbox(box: Sandbox, suite: CaseSuite, files: dict[str, str], case_timeout_s: float,
                           timeout_s: float) -> tuple[bool, str]:
    """Run ``suite`` on ``files`` in ``box`` (a sandbox no agent process ever ran in) and judge it.

    Args:
        case_timeout_s: The most CPU seconds any one case may take (see ``case_limits``).
        timeout_s: The most the whole run may take; the run's own deadline (``run_deadline``) is
            often shorter, and the runner is killed at whichever comes first.

    Returns:
        ``(every case returned the expected values, a one-line summary)``.
    """
    report, timed_out = run_cases(box, suite, files, case_timeout_s, timeout_s)
    if report is None:
        return False, "the test run produced more output than the grader accepts"
    return judge(suite, report, timed_out)


def run_cases(box: Sandbox, suite: CaseSuite, files: dict[str, str], case_timeout_s: float, timeout_s: float, *,
              keep_going: bool = False) -> tuple[list[dict | None] | None, bool]:
    """Run ``suite`` on ``files`` in ``box`` (a sandbox no agent process ever ran in).

    Args:
        keep_going: Run every case, past the first that fails (to count the cases that pass).

    Returns:
        The runner's report (one message or ``None`` per case; ``None`` for the whole report when
        it is larger than the grader accepts) and whether the run hit its deadline.
    """
    box.put_files({**files, **suite.support})
    nonce = secrets.token_hex(16)
    limits = case_limits(suite, case_timeout_s)
    request = {"root": box.workdir, "module": suite.module, "cases": list(suite.cases), "targets": list(suite.targets),
               "limits": limits, "max_bytes": MAX_REPORT_BYTES // max(1, len(suite.cases)), "nonce": nonce,
               "keep_going": keep_going}
    res = box.exec_direct([*_PY, "-c", RUNNER_SOURCE], timeout=min(float(timeout_s), run_deadline(limits)),
                          stdin=json.dumps(request).encode(), max_output=MAX_REPORT_BYTES)
    if res.stdout_bytes > len(res.stdout.encode()):
        return None, res.timed_out
    return parse_report(res.stdout, nonce, len(suite.cases)), res.timed_out


def shown_cases_passed(new_sandbox, suite: CaseSuite | None, files: dict[str, str], case_timeout_s: float,
                       timeout_s: float) -> float | None:
    """The fraction of the cases the agent was shown (``suite.shown``: the statement's example,
    the visible tests) that ``files`` pass, judged as at submit: in a fresh sandbox from
    ``new_sandbox()``, by values compared here. Nothing the agent's code prints takes part.

    Returns:
        The fraction, or ``None`` when the task shows no case or the run could not be made.
    """
    if suite is None or not suite.shown:
        return None
    shown = suite.only(suite.shown)
    if not shown.cases:
        return None
    try:
        with new_sandbox() as box:
            report, _ = run_cases(box, shown, files, case_timeout_s, timeout_s, keep_going=True)
    except SandboxError:
        return None
    if report is None:
        return 0.0
    return sum(not _case_failure(msg, want) for msg, want in zip(report, shown.expected)) / len(shown.cases)


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
    if msg.get("status") == "timeout":
        return "timeout"
    if msg.get("status") != "ok":
        return f"error: {_error_name(msg.get('error'))}"
    try:
        got = decode(msg.get("result"))
    except (ValueError, TypeError, KeyError, RecursionError):
        return "the result could not be read"
    return "" if got == decode(want) else "returned a different value"


def _error_name(error: object) -> str:
    """What the agent may read about a failed case: the runner's own message, or the exception's
    type when it is a builtin one. An exception's text (or a type the agent named) can carry the
    hidden inputs out, so none of it reaches the observation."""
    text = str(error or "")
    if text in _RUNNER_ERRORS:
        return text
    name = text.split(":", 1)[0].strip()
    return name if name in _BUILTIN_ERRORS else "an exception"


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


def run_on_host(suite: CaseSuite, files: dict[str, str], limits: list[float]) -> tuple[list[dict | None], str]:
    """Run ``suite`` on trusted ``files`` (a reference solution, a task's own buggy code) in a host
    subprocess: the runner's report (one message or ``None`` per case) and its stderr."""
    nonce = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="turngym-reference-") as d:
        for path, text in {**files, **suite.support}.items():
            p = Path(d, path)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        request = {"root": d, "module": suite.module, "cases": list(suite.cases), "targets": list(suite.targets),
                   "limits": list(limits), "max_bytes": MAX_REPORT_BYTES, "nonce": nonce}
        proc = subprocess.run([sys.executable, *_PY[1:], "-c", RUNNER_SOURCE], input=json.dumps(request).encode(),
                              capture_output=True, cwd=d, timeout=run_deadline(list(limits)) + 60)
    report = parse_report(proc.stdout.decode("utf-8", "replace"), nonce, len(suite.cases))
    return report, proc.stderr.decode("utf-8", "replace")


def reference_results(suite: CaseSuite, files: dict[str, str], case_timeout_s: float = 60.0) -> tuple[tuple[dict, ...], tuple[float, ...]]:
    """Run ``suite`` on the reference solution (``files``) in a host subprocess.

    Returns:
        The expected values (one record per case) and the CPU seconds each case took.

    Raises:
        RuntimeError: A case of the reference solution failed or timed out.
        ValueError: The reference returns a value no answer can equal (see ``check_gradable``).
    """
    report, stderr = run_on_host(suite, files, [case_timeout_s] * len(suite.cases))
    bad = [i for i, m in enumerate(report) if m is None or m.get("status") != "ok"]
    if bad:
        msg = report[bad[0]] or {}
        raise RuntimeError(f"the reference solution fails case {suite.cases[bad[0]]}: {msg.get('error')} {stderr[-300:]}")
    results = tuple(m["result"] for m in report)
    for case, r in zip(suite.cases, results):
        check_gradable(r, case)
    return results, tuple(float(m.get("cpu_s", 0.0)) for m in report)


def hidden_cases_catch_the_bug(suite: CaseSuite, buggy_files: dict[str, str], cap_s: float = 10.0) -> tuple[bool, str]:
    """Whether the task's own buggy code fails a case the agent was not shown (``suite.shown``
    aside): the rule that makes special-casing the shown examples worthless.

    Returns:
        ``(caught, why)``: ``why`` names the first unshown case that fails, or says none does.
    """
    unshown = [c for c in suite.cases if c not in set(suite.shown)]
    if not unshown:
        return False, "every hidden case is shown to the agent"
    sub = suite.only(unshown)
    report, _ = run_on_host(sub, buggy_files, case_limits(sub, cap_s))
    passed, summary = judge(sub, report)
    return not passed, summary


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
