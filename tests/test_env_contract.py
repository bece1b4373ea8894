"""One checker over every registered turngym env (STYLE 22): Gymnasium's env checker, reset
determinism under a seed, JSON-serialisable info, turn-limit truncation, and the oracle earning
the maximum outcome. Envs whose data, sandbox engine, chess engine or LLM answerer is missing skip
with a reason."""

import json

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import turngym
from turngym.agents import OracleAgent
from turngym.rollout import episode_specs, rollout
from turngym.tools.sandbox import SandboxError, SandboxProvider

# Small task sets keep this fast; every family still runs its real code. Keys are id prefixes,
# so variants (e.g. the *-shaped-v0 wrappers) get the same sizes.
FAST_KWARGS = {
    "turngym/TextWorld-easy": {"num_games": 2},
    "turngym/TextWorld-medium": {"num_games": 1},
    "turngym/TextWorld-hard": {"num_games": 1},
    "turngym/SWE-synthetic": {"n_tasks": 2},
    "turngym/SWE-quixbugs": {"n_tasks": 2},
    "turngym/ALFWorld": {"max_games": 2},
    "turngym/Endgames": {"n_per_kind": 5},
}


def _fast(env_id):
    return next((kw for prefix, kw in FAST_KWARGS.items() if env_id.startswith(prefix)), {})
ENV_IDS = sorted(turngym.list_envs("turngym"))


def _make_or_skip(env_id, **extra):
    spec = gym.spec(env_id)
    if spec.nondeterministic:
        pytest.skip(f"{env_id} is nondeterministic (an LLM answers inside it)")
    try:
        return turngym.make(env_id, split="test", **_fast(env_id), **extra)
    except FileNotFoundError as e:  # turngym.data.DataNotFound is a FileNotFoundError
        pytest.skip(f"{env_id}: task data not available ({e})")
    except ImportError as e:  # the chess envs: no `stockfish` binary (EngineNotFound) or no `chess` package
        if "stockfish" in str(e).lower() or e.name == "chess":
            pytest.skip(f"{env_id}: no chess engine ({e})")
        raise
    except RuntimeError as e:
        if "sandbox" in str(e).lower() or "docker" in str(e).lower() or "bwrap" in str(e).lower():
            pytest.skip(f"{env_id}: no sandbox engine ({e})")
        raise


def _make(env_id, **extra):
    env = _make_or_skip(env_id, **extra)
    _skip_without_sandbox(env_id, env)
    return env


def _skip_without_sandbox(env_id, env):
    """An env that runs commands in a sandbox makes it on reset (SandboxError when neither Docker
    nor bubblewrap can run): one probe reset turns that into a skip with the reason."""
    if not any(isinstance(v, SandboxProvider) for v in vars(env.unwrapped).values()):
        return
    try:
        env.reset(seed=0)
    except SandboxError as e:
        env.close()
        pytest.skip(f"{env_id}: no sandbox can run here ({e})")


def test_builtin_families_are_registered():
    for family in ("TextWorld-easy", "SQL-synthetic", "Search-synthetic", "Maze", "Wordle", "SWE-synthetic"):
        assert any(family in i for i in ENV_IDS), family


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_gymnasium_checker_and_determinism(env_id):
    env = _make(env_id)  # Gymnasium's checker as it ships: no clock frozen, nothing patched
    try:
        check_env(env.unwrapped, skip_render_check=True, skip_close_check=True)
        task = env.unwrapped.task_ids[0]
        a = env.reset(seed=3, options={"task_id": task})
        b = env.reset(seed=3, options={"task_id": task})
        assert a[0] == b[0] and a[1]["state_key"] == b[1]["state_key"]
        json.dumps(a[1])
        obs, reward, term, trunc, info = env.step("")  # invalid in every format (text envs take any non-empty reply)
        assert info["action_valid"] is False and obs and isinstance(reward, float)
        json.dumps(info)
    finally:
        env.close()


LLM_IDS = [i for i in ENV_IDS if gym.spec(i).nondeterministic]
COUNTERPART = {"turngym/CarDealer-llm-v0": "buyer"}  # the others take an answerer


@pytest.mark.parametrize("env_id", LLM_IDS)
def test_gymnasium_checker_on_envs_a_language_model_answers_in(env_id, tiny_model):
    """The checker as it ships, with a tiny random model as the counterpart: the spec says
    nondeterministic, so Gymnasium itself leaves out its same-seed comparisons."""
    from turngym.agents.hf import HFPolicy

    counterpart = HFPolicy(tiny_model.model, tiny_model.tokenizer)
    env = turngym.make(env_id, split="test", **{COUNTERPART.get(env_id, "answerer"): counterpart})
    try:
        check_env(env.unwrapped, skip_render_check=True, skip_close_check=True)
        obs, info = env.reset(seed=0)
        assert info["nondeterministic"] is True and obs
    finally:
        env.close()


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_turn_limit_truncates(env_id):
    env = _make(env_id)
    try:
        limit = env.spec.max_episode_steps
        assert limit, f"{env_id} registers no max_turns"
        env.reset(seed=0)
        for turn in range(1, limit + 1):
            *_, term, trunc, _ = env.step("")
            assert not term
            assert trunc == (turn == limit)
    finally:
        env.close()


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_oracle_earns_the_maximum_outcome(env_id):
    probe = _make(env_id, scripted_hints=True)
    tasks = list(probe.unwrapped.task_ids)[:2]
    factory = probe.spec.make  # same kwargs, fresh instance
    probe.close()
    trajs = rollout(OracleAgent(), lambda: factory(), episode_specs(tasks, len(tasks)), progress=False)
    for t in trajs:
        assert t.outcome == 1.0 and t.terminated, (env_id, t.task_id, t.metadata.get("error"))
