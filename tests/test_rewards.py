"""Reward transforms with hand-computed expectations: specs, format, tool use (ToolRL), shaping,
G-RA gating at / above / below tau, and the shaping wrapper against the shaping transform."""

import math

import pytest

import turngym
from turngym.rewards import (
    FormatReward, GatedReward, OutcomeReward, ShapedStepReward, Sum, ToolUseReward, make_reward, reward_stats,
    tool_use_score,
)
from turngym.rewards.base import Scale
from turngym.rewards.gated import gate
from turngym.rewards.tool_use import jaccard, normalize_value, pair_score
from turngym.types import Message, ToolCall, Trajectory, Turn


def _turn(reward=0.0, valid=True, calls=1, obs="ok", info=None):
    tool_calls = [{"id": f"c{i}", "name": "act", "arguments": {}} for i in range(calls)]
    return Turn(action_text="a", observation=[Message("user", obs)], reward=reward,
                info={"action_valid": valid, "tool_calls": tool_calls, **(info or {})})


def _traj(rewards, outcome, **kw):
    return Trajectory("t", turns=[_turn(r, **kw) for r in rewards], outcome=outcome,
                      initial_observation=[Message("user", "start")])


# ----- specs -----------------------------------------------------------------------------------
def test_make_reward_specs_names_dicts_weights_and_lists():
    trajs = [_traj([0.1, 0.2], 1.0)]
    assert make_reward("outcome")(trajs) == [[0.0, 1.0]]
    assert make_reward({"name": "outcome", "scale": 2.0})(trajs) == [[0.0, 2.0]]
    weighted = make_reward({"name": "env", "weight": 0.5})
    assert isinstance(weighted, Scale) and weighted(trajs) == [[0.05, 0.1]]
    both = make_reward(["env", "outcome"])
    assert isinstance(both, Sum)
    assert both(trajs) == [[0.1, 1.2]]
    with pytest.raises(ValueError, match="unknown reward"):
        make_reward("nope")
    with pytest.raises(ValueError, match="bad parameters"):
        make_reward({"name": "outcome", "sclae": 2})
    with pytest.raises(ValueError, match="no 'name'"):
        make_reward({"scale": 2})
    with pytest.raises(ValueError, match="empty"):
        make_reward([])


def test_reward_stats_are_gathered_through_sums_and_wrappers():
    t = make_reward(["outcome", {"name": "gated", "tau": 1.0, "step": [{"name": "format"}]}])
    t([_traj([0.0], 0.0, valid=False)])
    stats = reward_stats(t)
    assert stats["reward/gra_open_frac"] == 0.0
    assert stats["reward/format_invalid_frac"] == 1.0


# ----- format ----------------------------------------------------------------------------------
def test_format_reward_by_action_status():
    traj = Trajectory("t", turns=[_turn(calls=0, valid=False), _turn(valid=False), _turn(valid=True)])
    f = FormatReward(unparseable=-1.0, invalid=-0.5, valid=0.25)
    assert f([traj]) == [[-1.0, -0.5, 0.25]]
    assert f.stats["reward/format_valid_frac"] == pytest.approx(1 / 3)


# ----- tool use (ToolRL) -------------------------------------------------------------------------
def test_tool_use_pieces():
    assert jaccard(set(), set()) == 1.0 and jaccard({"a", "b"}, {"b", "c"}) == pytest.approx(1 / 3)
    assert normalize_value(" Hello  World ") == "hello world" and normalize_value("1") == normalize_value(1.0)
    # same name, arg names {a} of {a, b, c}, no value right: 1/3 + 0
    assert pair_score({"name": "f", "arguments": {"a": 2, "c": 3}}, {"name": "f", "arguments": {"a": 1, "b": "x"}}) == pytest.approx(1 / 3)
    assert pair_score({"name": "g", "arguments": {"a": 1}}, {"name": "f", "arguments": {"a": 1}}) == 0.0


def test_tool_use_score_matching_calls():
    ref = [{"name": "search", "arguments": {"query": "Paris", "k": 3}}]
    # (r_name 1 + r_param 1 + r_value 2) / (1 + 1 + 2)
    assert tool_use_score([ToolCall("x", "search", {"query": "paris ", "k": "3"})], ref) == 1.0
    two = [{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {"b": 2}}]
    assert tool_use_score(list(reversed(two)), two) == 1.0  # matched regardless of order
    assert tool_use_score([], []) == 1.0


def test_tool_use_score_non_matching_calls():
    ref = [{"name": "f", "arguments": {"a": 1, "b": "x"}}]
    assert tool_use_score([{"name": "g", "arguments": {"a": 1, "b": "x"}}], ref) == 0.0  # wrong tool
    # right tool, arg names 1/3, no value: (1 + 1/3 + 0) / (1 + 1 + 2)
    assert tool_use_score([{"name": "f", "arguments": {"a": 2, "c": 3}}], ref) == pytest.approx(1 / 3)
    # right call plus a surplus call: r_name 1/2, pair 1 + 2; r_max 1 + max(1, 2) + 2
    extra = [{"name": "f", "arguments": {"a": 1, "b": "x"}}, {"name": "h", "arguments": {}}]
    assert tool_use_score(extra, ref) == pytest.approx((0.5 + 3) / 5)
    assert tool_use_score([], ref) == 0.0
    with pytest.raises(ValueError):
        tool_use_score(["not a call"], ref)


def test_tool_use_reward_reads_references_from_info_and_metadata():
    t1 = Turn("a", tool_calls=[ToolCall("1", "f", {"a": 1})], info={"reference_call": {"name": "f", "arguments": {"a": 1}}})
    t2 = Turn("b", tool_calls=[ToolCall("2", "f", {"a": 1})])  # no reference in info
    t3 = Turn("c", tool_calls=[ToolCall("3", "g", {})])
    traj = Trajectory("t", turns=[t1, t2, t3], metadata={"reference_calls": [None, None, {"name": "g", "arguments": {}}]})
    r = ToolUseReward(scale=2.0, missing=-0.5)
    assert r([traj]) == [[2.0, -0.5, 2.0]]
    assert r.stats["reward/tool_use_turns"] == 2.0


# ----- G-RA ------------------------------------------------------------------------------------
def test_gate_pure_function_at_above_and_below_tau():
    high, step = [0.0, 0.0, 1.0], [0.1, 0.2, 0.3]
    assert gate(high, step, tau=1.0) == ([0.1, 0.2, 1.3], True)       # at tau: open
    assert gate(high, step, tau=0.5) == ([0.1, 0.2, 1.3], True)       # above tau: open
    assert gate(high, step, tau=1.5) == ([0.0, 0.0, 1.0], False)      # below tau: only the high-level reward
    assert gate(high, step, tau=1.5, direct=True) == ([0.1, 0.2, 1.3], True)
    with pytest.raises(ValueError):
        gate([1.0], [0.1, 0.2], 1.0)


def test_gated_transform_and_its_logs():
    win, half, lose = _traj([0.1, 0.2, 0.3], 1.0), _traj([0.1, 0.2, 0.3], 0.5), _traj([0.1, 0.1], 0.0)
    g = GatedReward(step="env", high="outcome", tau=0.5)
    out = g([win, half, lose])
    for got, want in zip(out, [[0.1, 0.2, 1.3], [0.1, 0.2, 0.8], [0.0, 0.0]]):
        assert got == pytest.approx(want)
    assert [t.metadata["reward/gate_open"] for t in (win, half, lose)] == [True, True, False]
    assert lose.metadata["reward/step"] == pytest.approx(0.2) and half.metadata["reward/high"] == 0.5
    assert g.stats["reward/gra_open_frac"] == pytest.approx(2 / 3)
    assert g.stats["reward/gra_step_dropped_mean"] == pytest.approx(0.2 / 3)
    assert g.stats["reward/gra_step_on_failed_mean"] == 0.0

    direct = GatedReward(step="env", high="outcome", tau=0.5, mode="direct")
    out = direct([win, half, lose])
    assert out[2] == pytest.approx([0.1, 0.1])  # ungated: a lost episode keeps its step rewards
    assert direct.stats["reward/gra_open_frac"] == 1.0
    assert direct.stats["reward/gra_step_on_failed_mean"] == pytest.approx(0.2 / 3)
    with pytest.raises(ValueError, match="mode"):
        GatedReward(mode="sometimes")


def test_gated_spec_with_nested_specs():
    g = make_reward({"name": "gated", "tau": 1.0, "step": [{"name": "shaped", "bonus": 0.5}]})
    win, lose = _traj([0.0, 0.0], 1.0), _traj([0.0, 0.0], 0.0)
    assert g([win, lose]) == [[0.5, 1.5], [0.0, 0.0]]


# ----- the gameable shaping ----------------------------------------------------------------------
def test_shaped_step_reward_valid_call_and_new_observation():
    traj = Trajectory("t", initial_observation=[Message("user", "start")], turns=[
        _turn(obs="room A"), _turn(obs="room  A", valid=False), _turn(obs="start"), _turn(obs="room B", calls=0),
    ])
    assert ShapedStepReward("valid_call", 0.1)([traj]) == [[0.1, 0.0, 0.1, 0.0]]
    # the opening counts as seen; whitespace does not make a new observation
    assert ShapedStepReward("new_observation", 0.5)([traj]) == [[0.5, 0.0, 0.0, 0.5]]
    with pytest.raises(ValueError, match="shaping"):
        ShapedStepReward("anything")


def test_new_state_pays_each_state_once_and_never_for_a_refused_move():
    keys = ["B", "B", "A", "C", "B"]  # a refused move (state unchanged), back to the start, new, seen
    traj = Trajectory("t", initial_observation=[Message("user", "start")], metadata={"initial_state_key": "A"},
                      turns=[_turn(obs=f"text {i}", info={"state_key": k}) for i, k in enumerate(keys)])
    assert ShapedStepReward("new_state", 0.5)([traj]) == [[0.5, 0.0, 0.0, 0.5, 0.0]]
    # every observation text differs, so new_observation would have paid all five
    assert ShapedStepReward("new_observation", 0.5)([traj]) == [[0.5] * 5]


def test_shaped_wrapper_matches_the_transform_on_real_rollouts():
    from turngym.agents.scripted import RandomAgent
    from turngym.envs.wrappers import register_shaped
    from turngym.rollout import episode_specs, make_env_factory, rollout

    env_id = register_shaped("tests/Guess-v0", "tests/Guess-shaped-v0")
    for shaping in ("valid_call", "new_observation", "new_state"):
        trajs = rollout(RandomAgent(seed=3), make_env_factory(env_id, scripted_hints=True, shaping=shaping, bonus=0.25),
                        episode_specs(["1", "2", "3", "4"], 8), num_envs=3, progress=False)
        assert all(traj.turns and "error" not in traj.metadata for traj in trajs)
        from_env = [[t.info["shaped_bonus"] for t in traj.turns] for traj in trajs]
        assert from_env == ShapedStepReward(shaping, 0.25)(trajs)
        for traj in trajs:
            assert all(math.isclose(t.reward, t.info["env_reward"] + t.info["shaped_bonus"]) for t in traj.turns)
        assert any(b > 0 for row in from_env for b in row)


def test_shaped_variants_are_registered_for_textworld_and_sql():
    import gymnasium as gym

    from turngym.envs import wrappers

    assert wrappers.shaped_id("turngym/SQL-synthetic-v1") == "turngym/SQL-synthetic-shaped-v1"
    for env_id in ("turngym/TextWorld-easy-shaped-v0", "turngym/SQL-synthetic-shaped-v1"):
        assert env_id in gym.registry
    env = turngym.make("turngym/SQL-synthetic-shaped-v1", shaping="valid_call", bonus=0.2)
    env.reset(seed=0)
    _, reward, _, _, info = env.step("<list_tables></list_tables>")
    assert info["action_valid"] and reward == pytest.approx(0.2) and info["shaped_bonus"] == 0.2
    _, reward, _, _, info = env.step("not a tool call")
    assert not info["action_valid"] and reward == 0.0


def test_reference_calls_wrapper_feeds_the_tool_use_reward():
    from turngym.agents.scripted import OracleAgent
    from turngym.envs.wrappers import ReferenceCalls
    from turngym.rollout import episode_specs, rollout

    def make():
        return ReferenceCalls(turngym.make("tests/Guess-v0", scripted_hints=True))

    trajs = rollout(OracleAgent(), make, episode_specs(["3", "4"], 2), progress=False)
    assert all(t.turns[0].info["reference_calls"] for t in trajs)
    assert ToolUseReward()(trajs) == [[1.0], [1.0]]  # the oracle's move is its own reference
    assert OutcomeReward()(trajs) == [[1.0], [1.0]]


@pytest.mark.parametrize("name", ["reward_gra", "reward_spa", "reward_spa_gra", "reward_format"])
def test_reward_configs_load_and_build(name):
    from pathlib import Path

    from turngym.config import load_yaml
    from turngym.train import TrainConfig

    path = Path(__file__).resolve().parents[1] / "configs" / f"{name}.yaml"
    cfg = load_yaml(TrainConfig, path)
    rl = cfg.archer if cfg.algo == "archer" else cfg.pg
    transform = make_reward(rl.reward)
    assert transform([_traj([0.0, 0.0], 1.0)])[0][-1] > 0  # a solved episode is rewarded
