"""Submission and grading under a policy that searches for holes, on every backend that runs here:
a case child that forges the result channel, links at allow-listed paths, a runner that is stopped
or sleeps, an oversized source file, an exception that carries the hidden inputs out, and tool
output that would flood the host. Docker and bwrap skip with the reason when they cannot run."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import turngym
from test_sandbox import skip_reason
from turngym.envs.swe import grading
from turngym.envs.swe.synthetic import synthetic_task
from turngym.types import ToolCall

pytestmark = pytest.mark.filterwarnings("ignore::turngym.tools.sandbox.local_backend.UnsafeSandboxWarning")

TASK = "synthetic-test-002"
REAL = [pytest.param("docker", marks=pytest.mark.docker), "bwrap"]

# Runs in a case child at import: finds the nonce in the runner's memory (the child is its fork),
# then writes a "done" line with it into every descriptor of every other process it can open
# through /proc. A done line that reached the report would void it (the real lines come after it).
FORGE = r'''
import os as _o, sys as _s
_f, _n = _s._getframe(), None
while _f is not None:
    for _v in list(_f.f_locals.values()):
        if isinstance(_v, str) and len(_v) == 32 and all(c in "0123456789abcdef" for c in _v):
            _n = _v
    _f = _f.f_back
assert _n, "the nonce was found"
_line = ("\n" + _n + ' {"done": true}\n').encode()
_written = 0
for _p in _o.listdir("/proc"):
    if _p.isdigit() and int(_p) != _o.getpid():  # its own result pipe is its own answer to spoil
        try:
            _fds = _o.listdir(f"/proc/{_p}/fd")
        except OSError:
            continue
        for _d in _fds:
            try:
                _h = _o.open(f"/proc/{_p}/fd/{_d}", _o.O_WRONLY | _o.O_NONBLOCK)
                _o.write(_h, _line)
                _o.close(_h)
                _written += 1
            except OSError:
                pass
'''


def fixed_files(task) -> dict[str, str]:
    files = {p: task.files[p] for p in task.source_files}
    for e in task.gold_edits:
        files[e.path] = files[e.path].replace(e.old, e.new, 1)
    return files


def provider(backend: str):
    from turngym.tools.sandbox import SandboxConfig, SandboxProvider

    if backend != "local" and skip_reason(backend):
        pytest.skip(skip_reason(backend))
    return SandboxProvider(backend, SandboxConfig(), pool_size=0)


@pytest.mark.parametrize("backend", ["local", *REAL])
def test_a_case_child_cannot_write_into_the_result_channel(backend):
    """A correct fix that also forges from its case children keeps its grade; so does the bug."""
    if backend == "local":
        pytest.skip("local runs the agent's code as the host user, beside the grader: no channel is private "
                    "there (documented; the backend refuses to start outside tests)")
    task = synthetic_task(TASK)
    prov = provider(backend)
    try:
        files = fixed_files(task)
        code = task.gold_edits[0].path
        assert grading.grade(prov.new, task.hidden_cases, files, 5, 60)[0]
        forged = {**files, code: files[code] + FORGE}
        passed, summary = grading.grade(prov.new, task.hidden_cases, forged, 5, 60)
        assert passed, summary
        buggy = {**{p: task.files[p] for p in task.source_files}}
        buggy[code] += FORGE
        assert not grading.grade(prov.new, task.hidden_cases, buggy, 5, 60)[0]
    finally:
        prov.close()


def env_on(backend: str, **kw):
    if backend != "local" and skip_reason(backend):
        pytest.skip(skip_reason(backend))
    return turngym.make("turngym/SWE-synthetic-v0", split="test", sandbox=backend, pool_size=1, **kw)


def call(env, name, **args):
    return env.unwrapped.format.render_call(ToolCall("c", name, args))


BACKENDS = ["local", *REAL]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_link_at_an_allowed_path_is_refused_and_the_episode_goes_on(backend):
    env = env_on(backend)
    try:
        env.reset(seed=0, options={"task_id": TASK})
        code = env.unwrapped._task.gold_edits[0].path
        env.step(call(env, "bash", command=f"cp {code} ../real.py 2>/dev/null || cp {code} /tmp/real.py; "
                                           f"rm {code}; ln -s /etc/hostname {code}"))
        obs, reward, term, _, info = env.step(call(env, "submit"))
        assert not term and "symbolic link" in obs[0].content and not info["submitted"], obs[0].content
        env.step(call(env, "bash", command=f"rm {code}"))  # gone: graded without it, and the episode ends
        obs, reward, term, _, info = env.step(call(env, "submit"))
        assert term and info["submitted"] and reward == 0.0
    finally:
        env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_oversized_source_file_is_refused(backend):
    env = env_on(backend)
    try:
        env.reset(seed=0, options={"task_id": TASK})
        code = env.unwrapped._task.gold_edits[0].path
        env.step(call(env, "bash", command=f"head -c {grading.MAX_SOURCE_BYTES + 1} /dev/zero | tr '\\0' '#' >> {code}"))
        obs, _, term, _, _ = env.step(call(env, "submit"))
        assert not term and "may be at most" in obs[0].content, obs[0].content
    finally:
        env.close()


def test_one_deadline_for_the_whole_run_by_hand():
    # each case: 2 x ceil(limit) + 1 s of wall clock; plus 5 s to start
    assert grading.run_deadline([1.0, 1.0, 0.3]) == 5.0 + 3 * 3.0
    assert grading.run_deadline([2.5]) == 5.0 + 2 * 3 + 1
    suite = synthetic_task(TASK).hidden_cases
    assert grading.case_limits(suite, 10.0) == [1.0] * len(suite.cases)  # trivial references: the floor
    assert grading.run_deadline(grading.case_limits(suite, 10.0)) < 120  # under the old fixed limit


STALL = {
    "sigstop_runner": "import os as _o, signal as _g\n_o.kill(_o.getppid(), _g.SIGSTOP)\n",
    "sleep_at_import": "import time as _t\n_t.sleep(1000)\n",
}


@pytest.mark.parametrize("kind", sorted(STALL))
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_stalled_run_is_killed_at_its_deadline(backend, kind):
    """The run ends at ``run_deadline`` (a stopped runner) or at the first case's wall limit (a
    sleep), well under ``grade_timeout_s``; the grade is a fail with the reason."""
    task = synthetic_task(TASK)
    suite = task.hidden_cases.only(task.hidden_cases.cases[:2])  # a short deadline for the test
    prov = provider(backend)
    try:
        files = fixed_files(task)
        code = task.gold_edits[0].path
        files[code] += STALL[kind]
        with prov.new() as box:
            calls = []
            real = box.exec_direct

            def spy(argv, timeout, **kw):
                calls.append(timeout)
                return real(argv, timeout, **kw)

            box.exec_direct = spy
            passed, summary = grading.grade_in_fresh_sandbox(box, suite, files, 10.0, 120.0)
        assert not passed
        assert calls == [grading.run_deadline(grading.case_limits(suite, 10.0))] == [11.0]
        assert ("time limit" in summary) if kind == "sigstop_runner" else ("case 1: timeout" in summary), summary
    finally:
        prov.close()


LEAK = r'''
import sys as _s
_f = _s._getframe()
while _f is not None:
    _r = _f.f_locals.get("req")
    if isinstance(_r, dict) and "module" in _r:
        class _Leak(Exception):
            pass
        _Leak.__name__ = "HIDDEN" + _r["module"][:80].replace("\n", " ")
        raise _Leak("HIDDEN" + _r["module"][:300])
    _f = _f.f_back
'''


@pytest.mark.parametrize("backend", BACKENDS)
def test_hidden_inputs_never_reach_the_observation(backend):
    env = env_on(backend)
    try:
        env.reset(seed=0, options={"task_id": TASK})
        u = env.unwrapped
        code = u._task.gold_edits[0].path
        env.step(call(env, "bash", command=f"cat >> {code} <<'EOF'\n{LEAK}\nEOF"))
        obs, reward, term, _, _ = env.step(call(env, "submit"))
        text = " ".join(m.content for m in obs)
        assert term and reward == 0.0
        assert "HIDDEN" not in text and "def case_" not in text and "error: an exception" in text, text
    finally:
        env.close()


# ----- the host's memory per step is bounded whatever the agent writes -------------------------
PROBE = textwrap.dedent('''
    import json, re, sys, warnings
    warnings.simplefilter("ignore")
    import turngym
    from turngym.types import ToolCall

    def hwm():
        return int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024

    def rss():
        return int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024

    env = turngym.make("turngym/SWE-synthetic-v0", split="test", sandbox=sys.argv[1], pool_size=1)
    env.reset(seed=0, options={"task_id": "synthetic-test-002"})
    u = env.unwrapped
    act = lambda name, **a: env.step(u.format.render_call(ToolCall("c", name, a)))
    act("bash", command="head -c %d /dev/zero | tr '\\\\0' '\\\\n' > big.txt; head -c 3000000 /dev/zero | tr '\\\\0' x >> big.txt")
    out = {}
    for name, tool, args in (("view_all", "view_file", {"path": "big.txt"}),
                             ("view_20", "view_file", {"path": "big.txt", "end_line": 20}),
                             ("view_tail", "view_file", {"path": "big.txt", "start_line": %d}),
                             ("edit", "edit_file", {"path": "big.txt", "old_str": "x", "new_str": "y"}),
                             ("bash_flood", "bash", {"command": "yes | head -c 100000000"})):
        base = rss()
        open("/proc/self/clear_refs", "w").write("5")  # reset the peak (VmHWM) to now
        received = u._sb.bytes_received
        obs, *_ = act(tool, **args)
        out[name] = {"peak_over_base": hwm() - base, "received": u._sb.bytes_received - received,
                     "chars": len(obs[0].content), "head": obs[0].content[:120]}
    print(json.dumps(out))
    env.close()
''')
NEWLINES = 40 * 2**20


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_file_of_tens_of_mb_of_newlines_keeps_the_host_small(backend):
    """40 MB of newlines and a 3 MB line: ``view_file`` (whole, first 20 lines, the long line),
    ``edit_file`` and a bash flood each raise the host process's peak RSS by a few MB at most, and
    each reads at most a few hundred KB out of the sandbox."""
    if backend != "local" and skip_reason(backend):
        pytest.skip(skip_reason(backend))
    src = PROBE % (NEWLINES, NEWLINES + 1)
    res = subprocess.run([sys.executable, "-c", src, backend], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    for name, m in out.items():
        assert m["peak_over_base"] < 32 * 2**20, (name, m)
        assert m["received"] < 512 * 1024, (name, m)
        assert m["chars"] < 10_000, (name, m)
    assert out["view_all"]["head"].startswith(f"big.txt (lines 1-400 of {NEWLINES + 1};")
    assert "larger than" in out["edit"]["head"]
