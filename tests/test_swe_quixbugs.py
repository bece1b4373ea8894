"""QuixBugs as SWE tasks (real data from ``shared_data``; skipped without it)."""

from __future__ import annotations

import pytest
from test_sandbox import skip_reason
from test_swe import apply_all, call

import turngym
from turngym.agents.scripted import OracleAgent, RandomAgent
from turngym.envs.swe.quixbugs import quixbugs_task, quixbugs_task_ids
from turngym.rollout import episode_specs, make_env_factory, rollout

pytestmark = [pytest.mark.data,
              pytest.mark.filterwarnings("ignore::turngym.tools.sandbox.local_backend.UnsafeSandboxWarning")]


@pytest.fixture
def qb(shared_data):
    root = shared_data / "quixbugs"
    if not (root / "python_programs").is_dir():
        pytest.skip(f"no QuixBugs copy in {shared_data}")
    return root


def test_tasks_split_and_gold_patches(qb):
    everything = quixbugs_task_ids(qb, "all")
    train, test = quixbugs_task_ids(qb, "train"), quixbugs_task_ids(qb, "test")
    assert len(everything) == 20 and sorted(train + test) == sorted(everything) and not set(train) & set(test)
    for tid in everything:
        task = quixbugs_task(qb, tid)
        name = tid.removeprefix("quixbugs-")
        code = f"python_programs/{name}.py"
        assert task.source_files == [code]
        assert apply_all(task.files[code], task.gold_edits) == (qb / "correct_python_programs" / f"{name}.py").read_text()
        for path, hidden in task.hidden_tests.items():  # the agent's copy is a strict slice of the hidden file
            assert task.files.get(path) != hidden or path.endswith(".py")
    cycle = quixbugs_task(qb, "quixbugs-detect_cycle")
    visible = cycle.files["python_testcases/test_detect_cycle.py"]
    assert "def test1" in visible and "def test2" not in visible
    gcd = quixbugs_task(qb, "quixbugs-gcd")
    assert len(gcd.files["json_testcases/gcd.json"].splitlines()) == 2
    assert len(gcd.hidden_tests["json_testcases/gcd.json"].splitlines()) > 2


def test_oracle_fixes_and_unfixed_fails_on_a_few(qb):
    env = turngym.make("turngym/SWE-quixbugs-v0", split="all", data_dir=str(qb.parent), sandbox="local",
                       scripted_hints=True, test_timeout_s=3)
    try:
        for tid in ("quixbugs-gcd", "quixbugs-detect_cycle", "quixbugs-bitcount"):  # bitcount's bug loops forever
            _, info = env.reset(seed=0, options={"task_id": tid})
            obs, reward, term, _, info = env.step(call(env, "run_tests"))
            assert info["visible_tests_passed"] is not None
            _, reward, term, _, info = env.step(call(env, "submit"))
            assert term and reward == 0.0, tid
            _, info = env.reset(seed=0, options={"task_id": tid})
            for _ in range(10):
                _, reward, term, _, info = env.step(info["oracle_action"])
                if term:
                    break
            assert term and reward == 1.0, tid
    finally:
        env.close()


def _backend_or_skip() -> str:
    for b in ("docker", "bwrap"):
        if skip_reason(b) is None:
            return b
    pytest.skip("no Docker engine and no bubblewrap sandbox here")


@pytest.mark.slow
def test_oracle_solves_all_20_and_random_edits_almost_none(qb):
    backend = _backend_or_skip()
    factory = make_env_factory("turngym/SWE-quixbugs-v0", split="all", data_dir=str(qb.parent), sandbox=backend,
                               scripted_hints=True)  # levenshtein's reference needs ~4 CPU s on one case
    ids = quixbugs_task_ids(qb, "all")
    trajs = rollout(OracleAgent(), factory, episode_specs(ids, len(ids)), num_envs=1, progress=False)
    assert {t.task_id: t.outcome for t in trajs} == {t: 1.0 for t in ids}
    randoms = rollout(RandomAgent(seed=0), factory, episode_specs(ids, len(ids)), num_envs=1, progress=False)
    assert sum(t.outcome for t in randoms) <= 1
