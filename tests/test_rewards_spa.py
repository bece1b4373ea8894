"""SPA (stepwise progress attribution): the sum-matching loss and the step reward by hand, the
estimator's redistribution summing to the outcome after training on a toy set, the grounding
bonus only on valid actions, online training, and checkpoint round trips."""

import math
import random

import pytest
import torch

from turngym.rewards import make_reward
from turngym.rewards.encoders import HashedNgramEncoder, StepInput, step_inputs
from turngym.rewards.progress import (ProgressHead, ProgressReward, SPAConfig, potential_contributions, spa_step_rewards,
                                     sum_matching_loss, value_matching_loss)
from turngym.types import Message, Trajectory, Turn

ACTIONS = ["look", "go north", "take key", "open chest", "inventory", "go south"]


def _toy_trajectory(rng: random.Random) -> Trajectory:
    """An episode of 3-5 random actions; the outcome is additive: 0.5 per key step (take key,
    open chest) taken at least once."""
    actions = [rng.choice(ACTIONS) for _ in range(rng.randint(3, 5))]
    outcome = 0.5 * ("take key" in actions) + 0.5 * ("open chest" in actions)
    turns = [Turn(action_text=a, observation=[Message("tool", f"You {a}.")], info={"action_valid": True}) for a in actions]
    return Trajectory("chest", turns=turns, outcome=outcome, initial_observation=[Message("user", "Open the chest.")])


def _toy_set(n: int, seed: int) -> list[Trajectory]:
    rng = random.Random(seed)
    out = []
    while len(out) < n:  # each key action at most once, so the additive target is exact
        t = _toy_trajectory(rng)
        acts = [x.action_text for x in t.turns]
        if acts.count("take key") <= 1 and acts.count("open chest") <= 1:
            out.append(t)
    return out


def test_sum_matching_loss_by_hand():
    contrib = torch.tensor([0.5, 0.25, 1.0])
    index = torch.tensor([0, 0, 1])
    outcomes = torch.tensor([1.0, 0.0])
    # sums (0.75, 1.0): ((0.75 - 1)^2 + (1 - 0)^2) / 2
    torch.testing.assert_close(sum_matching_loss(contrib, index, outcomes), torch.tensor(0.53125))


def test_value_matching_loss_by_hand():
    values = torch.tensor([0.5, 0.25, 1.0])
    index = torch.tensor([0, 0, 1])
    outcomes = torch.tensor([1.0, 0.0])
    # episode 0: ((0.5 - 1)^2 + (0.25 - 1)^2) / 2 = 0.40625; episode 1: (1 - 0)^2 = 1; each weighs the same
    torch.testing.assert_close(value_matching_loss(values, index, outcomes), torch.tensor(0.703125))


def test_potential_contributions_by_hand():
    assert potential_contributions([0.6, 0.9], base=0.5) == pytest.approx([0.1, 0.3])
    # grounded: the last value is the outcome, so the credits add up to outcome - base
    assert potential_contributions([0.6, 0.9], base=0.5, outcome=1.0) == pytest.approx([0.1, 0.4])
    assert potential_contributions([0.6, 0.9], base=0.5, outcome=0.0) == pytest.approx([0.1, -0.6])
    assert potential_contributions([], base=0.5, outcome=1.0) == []


def _timed_set(n: int, seed: int) -> list[Trajectory]:
    """Won episodes are short (take key, open chest); lost ones start elsewhere and wander to a
    6-turn limit: the length alone tells them apart, as on a tree without a loop cutoff."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        won = rng.random() < 0.5
        wander = ["look", "go north", "go south", "inventory"]
        actions = ["take key", "open chest"] if won else [rng.choice(wander) for _ in range(6)]
        turns = [Turn(action_text=a, observation=[Message("tool", f"You {a}.")], info={"action_valid": True})
                 for a in actions]
        out.append(Trajectory("chest", turns=turns, outcome=float(won), initial_observation=[Message("user", "Open the chest.")]))
    return out


def test_a_potential_fit_credits_the_step_that_decides_and_pays_nothing_for_wandering():
    train, held_out = _timed_set(64, seed=0), _timed_set(16, seed=1)
    spa = ProgressReward(online=False, bonus=0.0, fit="potential", dim=512, hidden=32, lr=1e-2, batch_size=16,
                         history_turns=0)
    spa.fit(train, updates=300)
    base = float(spa.head.base)
    assert base == pytest.approx(sum(t.outcome for t in train) / len(train))
    for traj, c in zip(held_out, spa.contributions(held_out)):
        if traj.outcome:  # the first step decides: it earns the whole rise; the second adds little
            assert c[0] == pytest.approx(1 - base, abs=0.1) and abs(c[1]) < 0.1
        else:  # the first step loses the base rate; wandering after it earns (and costs) nothing
            assert c[0] == pytest.approx(-base, abs=0.1) and all(abs(x) < 0.1 for x in c[1:])
    # as a transform the last step is grounded in the real outcome: the rewards add up to outcome - base
    for r, t in zip(spa(held_out), held_out):
        assert sum(r) == pytest.approx(t.outcome - base, abs=1e-6)
    assert spa.stats["reward/spa_sum_abs_err"] < 0.1
    clone = ProgressReward(online=False, bonus=0.0, fit="potential", dim=512, hidden=32, history_turns=0)
    clone.load_state_dict(spa.state_dict())
    assert float(clone.head.base) == base and clone.contributions(held_out) == spa.contributions(held_out)
    with pytest.raises(ValueError, match="fit must be one of"):
        ProgressReward(fit="length")


def test_spa_step_rewards_by_hand():
    assert spa_step_rewards([0.2, 0.3], [True, False], 1.0, alpha=1.0, bonus=0.1) == pytest.approx([0.3, 0.3])
    assert spa_step_rewards([0.2, 0.3], [True, False], 1.0, alpha=2.0, bonus=0.0) == pytest.approx([0.4, 0.6])
    # exact_sum spreads (1 - 0.5) / 2 = 0.25 over both steps
    assert spa_step_rewards([0.2, 0.3], [False, False], 1.0, exact_sum=True) == pytest.approx([0.45, 0.55])
    with pytest.raises(ValueError):
        spa_step_rewards([0.1], [True, True], 1.0)


def test_hashed_encoder_is_deterministic_and_field_aware():
    enc = HashedNgramEncoder(dim=256)
    a = enc.encode([StepInput("task", "", "take key")])
    b = enc.encode([StepInput("task", "", "take key")])
    c = enc.encode([StepInput("task", "take key", "")])  # same words, other field
    torch.testing.assert_close(a, b)
    assert a.shape == (1, 256) and not torch.allclose(a, c)


def test_step_inputs_hold_task_history_and_action():
    t = _toy_set(1, seed=3)[0]
    items = step_inputs(t, history_turns=1)
    assert len(items) == len(t.turns)
    assert items[0].task == "Open the chest." and items[0].history == "observation: Open the chest."
    assert items[2].history == f"action: {t.turns[1].action_text}\nobservation: You {t.turns[1].action_text}."
    assert items[2].action == t.turns[2].action_text


def test_redistribution_sums_to_the_outcome_after_training():
    train, held_out = _toy_set(48, seed=0), _toy_set(16, seed=1)
    spa = ProgressReward(online=False, bonus=0.0, dim=512, hidden=32, lr=1e-2, batch_size=16, history_turns=0)
    before = spa.fit(train, updates=0)["sum_abs_err"]
    after = spa.fit(train, updates=200)
    assert after["sum_abs_err"] < 0.05 < before
    for traj, c in zip(held_out, spa.contributions(held_out)):
        assert sum(c) == pytest.approx(traj.outcome, abs=0.1)
    # the credit lands on the key actions, not on the filler
    by_action: dict[str, list[float]] = {}
    for traj, c in zip(train, spa.contributions(train)):
        for turn, x in zip(traj.turns, c):
            by_action.setdefault(turn.action_text, []).append(x)
    mean = {a: sum(v) / len(v) for a, v in by_action.items()}
    assert mean["take key"] == pytest.approx(0.5, abs=0.1) and mean["open chest"] == pytest.approx(0.5, abs=0.1)
    assert abs(mean["look"]) < 0.1
    # as a transform with alpha = 1 and no bonus, the per-turn rewards are the contributions
    rewards = spa(held_out)
    assert all(sum(r) == pytest.approx(t.outcome, abs=0.1) for r, t in zip(rewards, held_out))


def test_exact_sum_makes_the_redistribution_exact():
    trajs = _toy_set(8, seed=2)
    spa = ProgressReward(online=False, bonus=0.0, exact_sum=True, dim=256)
    spa.fit(trajs, updates=20)
    for r, t in zip(spa(trajs), trajs):
        assert sum(r) == pytest.approx(t.outcome, abs=1e-6)


def test_grounding_bonus_only_on_valid_actions():
    t = Trajectory("x", outcome=0.0, initial_observation=[Message("user", "go")], turns=[
        Turn("a", info={"action_valid": True}), Turn("b", info={"action_valid": False}), Turn("c", info={}),
        Turn("d", info={"action_valid": True}),
    ])
    spa = ProgressReward(online=False, bonus=0.25, dim=64)  # untrained: every contribution is exactly 0
    assert spa([t]) == [[0.25, 0.0, 0.0, 0.25]]
    assert spa.stats["reward/spa_grounded_frac"] == 0.5


def test_head_standardizes_features_by_hand():
    head = ProgressHead(dim=2, hidden=3)
    feats = torch.tensor([[1.0, 2.0], [3.0, 2.0]])
    head.standardize_on(feats)
    # column 0: mean 2, population std 1; column 1 is constant, so its scale stays 1
    torch.testing.assert_close(head.shift, torch.tensor([2.0, 2.0]))
    torch.testing.assert_close(head.scale, torch.tensor([1.0, 1.0]))
    head.standardize_on(torch.tensor([[0.0, 10.0], [4.0, 30.0]]))
    torch.testing.assert_close(head.shift, torch.tensor([2.0, 20.0]))
    torch.testing.assert_close(head.scale, torch.tensor([2.0, 10.0]))


class _FixedFeatures:
    """An encoder whose step features are given: a small signal column and a huge noise column."""

    dim = 2

    def __init__(self, feats: dict[int, torch.Tensor]) -> None:
        self.feats = feats

    def encode_trajectory(self, traj: Trajectory) -> torch.Tensor:
        return self.feats[id(traj)]


def test_standardized_features_fit_a_small_signal_beside_a_huge_dimension():
    """One dimension is a large common part (500-1000 on every turn), the other a small signal:
    raw, the large part saturates the tanh layer and the sum cannot follow the outcome;
    standardized, the estimator fits it."""
    rng = torch.Generator().manual_seed(0)
    trajs, feats = [], {}
    for i in range(64):
        won = i % 2 == 0
        t = Trajectory("t", turns=[Turn(action_text="go", info={"action_valid": True}) for _ in range(3)],
                       outcome=float(won))
        signal = torch.full((3, 1), 0.01 if won else -0.01)
        noise = 500.0 * (1 + torch.rand(3, 1, generator=rng))
        feats[id(t)] = torch.cat([signal, noise], dim=1)
        trajs.append(t)
    errors = {}
    for standardize in (False, True):
        spa = ProgressReward(encoder=_FixedFeatures(feats), online=False, bonus=0.0, hidden=8, standardize=standardize)
        errors[standardize] = spa.fit(trajs, updates=300)["sum_abs_err"]
        assert spa.standardized == standardize
    assert errors[True] < 0.1 < 0.4 < errors[False]  # the base rate (0.5 for all) errs by 0.5


def test_a_standardized_head_round_trips_and_an_older_state_loads_as_identity():
    trajs = _toy_set(16, seed=3)
    spa = ProgressReward(online=False, bonus=0.0, dim=128, history_turns=0)
    spa.fit(trajs, updates=10)
    assert spa.standardized and float(spa.head.scale.min()) > 0
    clone = ProgressReward(online=False, bonus=0.0, dim=128, history_turns=0)
    clone.load_state_dict(spa.state_dict())
    assert clone.standardized and clone.contributions(trajs) == spa.contributions(trajs)
    old = spa.state_dict()
    old["head"] = {k: v for k, v in old["head"].items() if k not in ("shift", "scale")}
    del old["standardized"]
    clone.load_state_dict(old)
    assert not clone.standardized
    torch.testing.assert_close(clone.head.shift, torch.zeros(128))
    torch.testing.assert_close(clone.head.scale, torch.ones(128))


def test_online_mode_trains_on_each_batch_and_checkpoints():
    batches = [_toy_set(16, seed=s) for s in (10, 11, 12)]
    spa = make_reward({"name": "spa", "encoder": "hash", "dim": 256, "updates": 30, "lr": 1e-2, "bonus": 0.0,
                       "history_turns": 0})
    assert isinstance(spa, ProgressReward) and spa.cfg.online
    errs = []
    for batch in batches:
        spa(batch)
        errs.append(spa.stats["reward/spa_sum_abs_err"])
        assert math.isfinite(spa.stats["reward/spa_loss"])
    assert spa.stats["reward/spa_buffer"] == 48
    assert errs[-1] < errs[0]

    clone = ProgressReward(SPAConfig(**{**spa.cfg.__dict__}))
    clone.load_state_dict(spa.state_dict())
    probe = _toy_set(4, seed=99)
    assert clone.contributions(probe) == spa.contributions(probe)
    # the same next online call on both gives the same rewards (buffer, optimizer and RNG restored)
    assert clone(probe) == spa(probe)


def test_spa_does_not_move_the_global_rng_and_rejects_unknown_knobs():
    torch.manual_seed(0)
    want = torch.rand(1)
    torch.manual_seed(0)
    ProgressReward(dim=64)
    torch.testing.assert_close(torch.rand(1), want)
    with pytest.raises(ValueError, match="unknown SPA knob"):
        make_reward({"name": "spa", "alhpa": 1.0})


def test_nested_spa_state_round_trips_through_the_reward_tree(tmp_path):
    from turngym.rewards import load_reward_state_dict, reward_state_dict

    spec = ["outcome", {"name": "gated", "tau": 1.0, "step": [{"name": "spa", "dim": 128, "updates": 5}]}]
    a, b = make_reward(spec), make_reward(spec)
    a(_toy_set(8, seed=5))
    state = reward_state_dict(a)
    assert list(state) == ["0/1/1"]  # Sum -> gated (part 1) -> its step transform (child 1)
    torch.save(state, tmp_path / "r.pt")
    load_reward_state_dict(b, torch.load(tmp_path / "r.pt", weights_only=False))
    probe = _toy_set(4, seed=6)
    assert a(probe) == b(probe)
    with pytest.raises(ValueError, match="reward state"):
        load_reward_state_dict(make_reward("outcome"), state)


# ----- SPA-RL's setting: the SFT'd policy's features, fitted once on exploration episodes, frozen ----
def _played(policy, n=3):
    from turngym.rollout import episode_specs, make_env_factory, rollout
    from turngym.agents.base import SamplingParams

    return rollout(policy, make_env_factory("tests/Guess-v0", tool_format="text"), episode_specs(["2", "5", "7"], n),
                   sampling=SamplingParams(1.0, max_new_tokens=4, seed=0), progress=False)


def test_policy_encoder_reads_the_recorded_tokens_at_state_and_action(policy):
    from turngym.rewards.encoders import PolicyEncoder

    traj = next(t for t in _played(policy) if len(t.turns) >= 2)
    enc = PolicyEncoder(policy.model)
    feats = enc.encode_trajectory(traj)
    assert feats.shape == (len(traj.turns), enc.dim) and enc.dim == 2 * policy.model.config.hidden_size
    last = len(traj.turns) - 1
    ids = torch.tensor([traj.prompt_ids(last) + traj.action_ids(last)])
    with torch.no_grad():
        h = policy.model.model(input_ids=ids).last_hidden_state[0]
    s, a = len(traj.prompt_ids(1)) - 1, len(traj.prompt_ids(1)) + len(traj.action_ids(1)) - 1
    torch.testing.assert_close(feats[1], torch.cat([h[s], h[a]]), atol=1e-4, rtol=1e-4)
    with pytest.raises(RuntimeError, match="bind"):
        PolicyEncoder().encode_trajectory(traj)


def test_spa_fit_first_trains_once_on_exploration_episodes_then_stays_frozen(policy):
    spa = make_reward({"name": "spa", "encoder": "policy", "online": False, "fit_first": 20})
    assert spa.wants_policy and spa.head is None
    spa.bind_policy(policy.model)
    first = _played(policy)
    first[0].outcome = 1.0  # the random tiny model wins nothing: give the estimator something to attribute
    head0 = [p.detach().clone() for p in spa.head.parameters()]
    spa(first)
    trained = [p.detach().clone() for p in spa.head.parameters()]
    assert spa.fitted and spa.stats["reward/spa_frozen"] == 1.0
    assert any(not torch.equal(a, b) for a, b in zip(head0, trained))
    spa(_played(policy))  # later batches are only scored
    assert all(torch.equal(a, b) for a, b in zip(trained, spa.head.parameters()))
    with pytest.raises(ValueError, match="fit_first"):
        SPAConfig(fit_first=5)  # online training and a one-off fit do not mix


def test_a_trainer_binds_its_reference_to_spa(policy, tmp_path):
    from turngym.trainers.pg import PGConfig, PGTrainer

    cfg = PGConfig(algo="rloo", iterations=1, episodes_per_iter=2, group_size=2, num_envs=2, max_new_tokens=4,
                   autocast="none", reward=["env", {"name": "spa", "encoder": "policy", "online": False, "fit_first": 5}])
    trainer = PGTrainer(policy, "tests/Guess-v0", cfg, out_dir=tmp_path)
    row = trainer.step() if trainer.setup() is None else None
    assert trainer.ref is not None and row["reward/spa_frozen"] == 1.0
