"""The learning-design knobs of the critic-free family and the shared actor step, on hand-worked
numbers: equal-group filtering, online filtered BC, gradient accumulation, old log-probs on the
update's precision path, and the revisit limit."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from turngym.agents.base import SamplingParams
from turngym.envs.wrappers import RevisitLimit
from turngym.rollout import Collector, EnvTarget, EpisodeSpec, episode_specs, make_env_factory, rollout
from turngym.rollout.schedule import contrast_weight
from turngym.trainers import functional as Fn
from turngym.trainers.actor import actor_update, rescore_old_logprobs
from turngym.trainers.filtered_bc import best_of_group_advantages
from turngym.trainers.pg import PGConfig, PGTrainer, turn_advantages
from turngym.trainers.sequences import pack_batch
from turngym.types import ToolCall, Trajectory, Turn

ENV = "tests/Guess-v0"


def test_equal_group_mask_by_hand():
    returns = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [-0.1, -0.1, -0.2]])
    assert Fn.equal_group_mask(returns).tolist() == [False, True, True]


def test_best_of_group_clones_only_a_successful_best_episode():
    returns = torch.tensor([[0.5, 0.9, 0.9], [0.0, 0.2, 0.1]])
    success = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])  # the 2nd group's best failed
    torch.testing.assert_close(best_of_group_advantages(returns, success),
                               torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))  # first of the tied best


def test_best_of_group_prefers_the_shorter_success_and_clones_k():
    # group: returns 1.0 (6 turns), 0.9 (2 turns), 1.0 (3 turns), a failure with 0.0 (9 turns)
    returns = torch.tensor([[1.0, 0.9, 1.0, 0.0]])
    success = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    lengths = torch.tensor([[6, 2, 3, 9]])
    # ranking: return first (1.0 ties broken by 3 < 6 turns), then the 0.9 episode
    assert best_of_group_advantages(returns, success, lengths).tolist() == [[0.0, 0.0, 1.0, 0.0]]
    assert best_of_group_advantages(returns, success, lengths, k=2).tolist() == [[1.0, 0.0, 1.0, 0.0]]
    # k beyond the successes clones every success, never the failure
    assert best_of_group_advantages(returns, success, lengths, k=8).tolist() == [[1.0, 1.0, 1.0, 0.0]]


def test_best_of_group_skips_a_failed_episode_with_a_higher_return():
    returns = torch.tensor([[0.5, 0.2, 0.3]])  # a shaped failure outscores both successes
    success = torch.tensor([[0.0, 1.0, 1.0]])
    assert best_of_group_advantages(returns, success).tolist() == [[0.0, 0.0, 1.0]]


def test_token_share_by_hand():
    assert Fn.token_share([3, 1]) == [0.75, 0.25]
    assert Fn.token_share([0, 0]) == [0.0, 0.0]


def _act(valid: bool = True) -> Turn:
    """A parsed tool call the env accepted (or rejected)."""
    return Turn("<act>x</act>", tool_calls=[ToolCall("c0", "act", {"command": "x"})], info={"action_valid": valid})


def test_filtered_bc_turn_advantages():
    # group 1: a failure and a success; group 2: a success with a penalty, and a failure
    trajs = [Trajectory("t", [_act(), _act()], outcome=o) for o in (0.0, 1.0, 1.0, 0.0)]
    rewards = [[0.0, 0.0], [0.0, 1.0], [-0.1, 1.0], [0.0, 0.0]]
    cfg = PGConfig(algo="filtered_bc", group_size=2, episodes_per_iter=4)
    assert turn_advantages(trajs, rewards, cfg) == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0], [0.0, 0.0]]


def test_filtered_bc_clones_only_the_valid_turns_of_the_chosen_episode():
    # the chosen success: a rejected command, an unparseable answer, then two valid moves
    best = Trajectory("t", [_act(valid=False), Turn("go east"), _act(), _act()], outcome=1.0)
    failed = Trajectory("t", [_act()], outcome=0.0)
    cfg = PGConfig(algo="filtered_bc", group_size=2, episodes_per_iter=2)
    adv = turn_advantages([best, failed], [[-0.1, -0.1, 0.0, 1.0], [0.0]], cfg)
    assert adv == [[0.0, 0.0, 1.0, 1.0], [0.0]]


def test_filtered_bc_top_k_clones_the_shortest_successes():
    turns = [2, 4, 1, 3]  # one group of 4: three successes with the same return, one failure
    trajs = [Trajectory("t", [_act()] * k, outcome=o) for k, o in zip(turns, (1.0, 1.0, 0.0, 1.0))]
    rewards = [[0.0] * (k - 1) + [r] for k, r in zip(turns, (1.0, 1.0, 0.0, 1.0))]
    cfg = PGConfig(algo="filtered_bc", group_size=4, episodes_per_iter=4, bc_top_k=2)
    assert turn_advantages(trajs, rewards, cfg) == [[1.0] * 2, [0.0] * 4, [0.0], [1.0] * 3]
    with pytest.raises(ValueError, match="bc_top_k"):
        PGConfig(algo="filtered_bc", bc_top_k=0)


class _Rooms(gym.Env):
    """A state key that is the action itself ('stay' keeps the state)."""

    def reset(self, *, seed=None, options=None):
        self.state = "A"
        return [], {"state_key": "A"}

    def step(self, action):
        if action != "stay":
            self.state = action
        return [], 0.0, False, False, {"state_key": self.state}


def test_revisit_limit_truncates_on_the_third_return_not_on_a_refused_move():
    env = RevisitLimit(_Rooms(), max_visits=3)
    env.reset()
    flags = [env.step(a)[3] for a in ["B", "A", "stay", "stay", "B"]]
    assert flags == [False, False, False, False, False]  # A twice, B twice; staying is no return
    _, _, _, truncated, info = env.step("A")  # A a third time
    assert truncated and "3 times" in info["truncated_reason"]
    env.reset()  # counts start over
    assert env.step("B")[3] is False


def _batch(policy, n=4):
    trajs = rollout(policy, make_env_factory(ENV), episode_specs(["1", "2", "3", "4"], n),
                    sampling=SamplingParams(max_new_tokens=10, seed=0), progress=False)
    return pack_batch(trajs, policy.pad_id)


def _update(policy, batch, adv=None, **kw):
    model = policy.model
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cfg = PGConfig(**{"algo": "reinforce", "episodes_per_iter": 4, "minibatch_size": 4, **kw})
    adv = torch.linspace(-1, 1, batch.old_logprobs.numel()) if adv is None else adv
    metrics = actor_update(model, opt, batch, adv, None, cfg, torch.Generator().manual_seed(0), loss=cfg.loss)
    after = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(start[n])
    return after, metrics


def test_gradient_accumulation_equals_one_big_step(policy):
    batch = _batch(policy)
    whole, _ = _update(policy, batch, micro_batch_size=4)
    accumulated, _ = _update(policy, batch, micro_batch_size=1)
    for n in whole:
        torch.testing.assert_close(accumulated[n], whole[n], atol=1e-6, rtol=1e-5)


def test_rescored_old_logprobs_put_the_first_ratio_at_one(policy):
    batch = _batch(policy)
    batch.old_logprobs = batch.old_logprobs + 0.05  # as if sampled on another precision path
    # fp32 updates (autocast none): on a bf16 CPU, auto would score in bf16 (~2e-3 from the samples)
    _, sampled = _update(policy, batch, micro_batch_size=4, actor_lr=0.0, old_logprobs="sampled", autocast="none")
    assert sampled["actor/logprob_drift"] == pytest.approx(0.05, abs=1e-4)
    _, rescored = _update(policy, batch, micro_batch_size=4, actor_lr=0.0, old_logprobs="rescored", autocast="none")
    assert rescored["actor/logprob_drift"] < 1e-6
    _, bf16 = _update(policy, batch, micro_batch_size=4, actor_lr=0.0, old_logprobs="rescored", autocast="bf16")
    assert bf16["actor/logprob_drift"] < 1e-6  # rescoring puts the ratio at 1 on the bf16 path too
    assert not rescore_old_logprobs("auto", policy.model, "none")  # fp32 update: the recorded ones match


def test_pg_trainer_drops_groups_without_contrast(policy, tmp_path):
    cfg = PGConfig(algo="rloo", iterations=1, episodes_per_iter=4, group_size=2, num_envs=4, max_new_tokens=8,
                   minibatch_size=4, filter_equal_groups=True)
    row = PGTrainer(policy, ENV, cfg, out_dir=tmp_path).train(progress=False)[0]
    kept = row["pg/groups_kept"]
    assert 0.0 <= kept <= 1.0 and row["pg/episodes_trained"] == pytest.approx(4 * kept)


def test_filtered_bc_trains_and_new_knobs_are_validated(policy, tmp_path):
    cfg = PGConfig(algo="filtered_bc", iterations=1, episodes_per_iter=4, group_size=2, num_envs=4, max_new_tokens=8,
                   max_state_visits=3)
    row = PGTrainer(policy, ENV, cfg, out_dir=tmp_path).train(progress=False)[0]
    assert row["rollout/env_steps"] > 0 and "pg/episodes_trained" in row
    with pytest.raises(ValueError, match="old_logprobs"):
        PGConfig(old_logprobs="fresh")
    with pytest.raises(ValueError, match="group_size"):
        PGConfig(algo="filtered_bc", group_size=1)


def test_contrast_weight_by_hand():
    # p = (s + 1) / (n + 2); w = p (1 - p)
    assert contrast_weight(0, 0) == pytest.approx(0.25)  # unseen: the maximum
    assert contrast_weight(4, 8) == pytest.approx(0.25)  # 5/10
    assert contrast_weight(8, 8) == pytest.approx(0.09)  # 9/10 * 1/10
    assert contrast_weight(0, 8) == pytest.approx(0.09)
    assert contrast_weight(2, 8) == pytest.approx(0.21)  # 3/10 * 7/10


def test_weighted_task_schedule_draws_without_replacement_and_prefers_heavy_tasks():
    from turngym.rollout import task_schedule

    tasks = [f"t{i}" for i in range(8)]
    specs = task_schedule(tasks, 16, seed=0, iteration=3, group_size=2, weights=[1.0] * 8)
    picked = [s.task_id for s in specs[::2]]
    assert sorted(picked) == tasks  # 8 groups, 8 tasks: each once
    assert all(a == b for a, b in zip(specs[::2], specs[1::2]))  # a group replays one task and seed
    assert specs == task_schedule(tasks, 16, seed=0, iteration=3, group_size=2, weights=[1.0] * 8)
    heavy = [1e-3] * 7 + [1.0]  # one group per iteration: the heavy task wins almost always
    wins = sum(task_schedule(tasks, 2, seed=0, iteration=it, group_size=2, weights=heavy)[0].task_id == "t7"
               for it in range(50))
    assert wins >= 45


def test_contrast_sampling_records_outcomes_and_resumes_them(policy, tmp_path):
    cfg = PGConfig(algo="rloo", iterations=1, episodes_per_iter=4, group_size=2, num_envs=4, max_new_tokens=6,
                   reward=["env"], minibatch_size=2, task_sampling="contrast")
    a = PGTrainer(policy, ENV, cfg, out_dir=tmp_path / "a")
    a.train(progress=False)
    assert sum(n for _, n in a.tasks.task_outcomes.values()) == 4 and len(a.tasks.task_outcomes) == 2
    b = PGTrainer(policy, ENV, cfg, out_dir=tmp_path / "b")
    b.load(tmp_path / "a" / "checkpoint")
    assert b.tasks.task_outcomes == a.tasks.task_outcomes
    assert b.schedule(4, 2) == a.schedule(4, 2)


def test_weighted_nll_loss_by_hand():
    logprobs = torch.tensor([-0.5, -1.0, -2.0, -4.0])
    adv = torch.tensor([1.0, 1.0, 0.0, 0.0])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    # -(1 * -0.5 + 1 * -1.0 + 0 * -2.0) / 3 tokens
    torch.testing.assert_close(Fn.weighted_nll_loss(logprobs, adv, mask), torch.tensor(0.5))


def test_filtered_bc_with_the_nll_loss_is_sft_on_the_chosen_episodes(policy):
    """pg_loss=nll (filtered BC's default): A = 1 on every token gives the SFT stage's loss and
    gradient, whatever the recorded log-probs (no ratio)."""
    from turngym.trainers.sequences import score

    batch = _batch(policy)
    batch.old_logprobs = batch.old_logprobs - 3.0  # would put a PPO ratio far from 1
    ones = torch.ones(batch.old_logprobs.numel())
    after, metrics = _update(policy, batch, adv=ones, micro_batch_size=4, algo="filtered_bc", group_size=2,
                             autocast="none", actor_lr=0.1, max_grad_norm=1e9)
    model = policy.model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    loss = -score(model, batch).logprobs.mean()  # the SFT stage's loss
    opt.zero_grad()
    loss.backward()
    opt.step()
    assert metrics["actor/pg_loss"] == pytest.approx(loss.item(), abs=1e-5)
    for n, p in model.named_parameters():
        torch.testing.assert_close(after[n], p.detach(), atol=1e-6, rtol=1e-5)


def test_greedy_in_group_plays_each_groups_first_episode_greedily(policy):
    from turngym.rollout import task_schedule

    specs = task_schedule(["1", "2", "3"], 6, seed=0, iteration=0, group_size=3, greedy_first=True)
    assert [s.greedy for s in specs] == [True, False, False, True, False, False]
    assert len({(s.task_id, s.seed) for s in specs[:3]}) == 1  # one task and reset per group
    sp = SamplingParams(temperature=1.0, max_new_tokens=8, seed=4)
    trajs = rollout(policy, make_env_factory(ENV), specs, sampling=sp, num_envs=6, progress=False)
    alone = rollout(policy, make_env_factory(ENV), [s for s in specs if s.greedy],
                    sampling=SamplingParams(temperature=0.0, max_new_tokens=8), num_envs=2, progress=False)
    greedy = [t for t, s in zip(trajs, specs) if s.greedy]
    assert [t.metadata.get("greedy") for t in trajs] == [s.greedy or None for s in specs]
    # the anchors play exactly what a greedy rollout plays, though they share batches with samples
    assert [[t.action_ids(k) for k in range(len(t.turns))] for t in greedy] == [[t.action_ids(k) for k in range(len(t.turns))] for t in alone]


def test_greedy_in_group_drops_groups_greedy_decoding_already_wins(policy, tmp_path):
    cfg = PGConfig(algo="rloo", iterations=1, episodes_per_iter=4, group_size=2, greedy_in_group=True,
                   filter_equal_groups=False)
    trainer = PGTrainer(policy, ENV, cfg, out_dir=tmp_path)
    won, lost = Trajectory("a", [Turn("x")], outcome=1.0), Trajectory("b", [Turn("x")], outcome=0.0)
    trajs = [won, lost, lost, won]  # group 1: greedy won; group 2: greedy lost, a sample won
    metrics: dict = {}
    kept, adv = trainer._contrast_only(trajs, [[1.0], [0.0], [0.0], [1.0]], [[0.5], [-0.5], [-0.5], [0.5]], metrics)
    assert kept == [lost, won] and adv == [[-0.5], [0.5]]
    assert metrics["pg/greedy_success"] == 0.5 and metrics["pg/episodes_trained"] == 2
    with pytest.raises(ValueError, match="greedy_in_group"):
        PGConfig(algo="rloo", group_size=2, episodes_per_iter=2, greedy_in_group=True, async_staleness=0)


def test_greedy_failed_sampling_screens_every_task_and_targets_the_failures(policy, tmp_path):
    cfg = PGConfig(algo="rloo", iterations=2, episodes_per_iter=4, group_size=2, num_envs=4, max_new_tokens=6,
                   reward=["env"], minibatch_size=2, task_sampling="greedy_failed", screen_every=2, autocast="none")
    a = PGTrainer(policy, ENV, cfg, out_dir=tmp_path / "a")
    a.setup()
    a.screen()  # what a greedy rollout of every training task gives
    greedy = rollout(policy, make_env_factory(ENV), [EpisodeSpec(t, i) for i, t in enumerate(a.task_ids)],
                     sampling=SamplingParams(0.0, max_new_tokens=6), num_envs=4, progress=False)
    assert a.tasks.greedy_outcomes == {t.task_id: t.success for t in greedy}
    assert a.env_steps == sum(len(t.turns) for t in greedy)  # its env steps count
    a.env_steps, a.tasks.greedy_outcomes = 0, {}
    logs = a.train(progress=False, resume=False)
    assert "screen/greedy_success" in logs[0] and "screen/greedy_success" not in logs[1]  # screen_every=2
    assert logs[0]["env_steps"] > logs[0]["rollout/env_steps"]  # iteration 0: the screen plus 4 episodes
    # tasks greedy decoding solved are drawn with weight 0.1, failed ones with 1
    a.tasks.greedy_outcomes = {t: i == 0 for i, t in enumerate(a.task_ids)}
    drawn = []
    for it in range(60):
        a.iteration = 2 * it + 1  # no screen due
        drawn += [s.task_id for s in a.schedule(2, 2)]
    assert drawn.count(a.task_ids[0]) < drawn.count(a.task_ids[1]) / 3
    b = PGTrainer(policy, ENV, cfg, out_dir=tmp_path / "b")
    b.load(tmp_path / "a" / "checkpoint")
    assert set(b.tasks.greedy_outcomes) == set(a.task_ids)
    with pytest.raises(ValueError, match="async_staleness"):
        PGConfig(task_sampling="greedy_failed", async_staleness=0)


def test_expert_replay_adds_the_sft_data_to_every_filtered_bc_update(policy, tmp_path):

    cfg = PGConfig(algo="filtered_bc", iterations=1, episodes_per_iter=2, group_size=2, num_envs=2, max_new_tokens=6,
                   reward=["env"], minibatch_size=4, expert_replay=2, autocast="none", actor_lr=1e-3)
    trainer = PGTrainer(policy, ENV, cfg, out_dir=tmp_path)
    trainer.setup()
    # the SFT stage's data, token for token
    want = _demos(policy, 2)
    assert [[t.action_ids(k) for k in range(len(t.turns))] for t in trainer.experts] == [[t.action_ids(k) for k in range(len(t.turns))] for t in want]
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    logs = trainer.train(progress=False, resume=False)
    assert logs[0]["pg/expert_episodes"] == 2.0
    # the demonstrations are trained on even in an iteration that cloned nothing
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters() if n in before)
    with pytest.raises(ValueError, match="NLL"):
        PGConfig(algo="rloo", group_size=2, episodes_per_iter=2, expert_replay=2)


def test_expert_replay_is_sharded_over_ranks(policy, tmp_path):
    """Gradients are averaged over ranks, so each rank replays its own share of the demonstrations."""
    from turngym.trainers.distributed import DistContext

    cfg = PGConfig(algo="filtered_bc", episodes_per_iter=2, group_size=2, num_envs=2, expert_replay=3)
    want = [[t.action_ids(k) for k in range(len(t.turns))] for t in _demos(policy, 3)]
    shards = []
    for rank in (0, 1):
        ctx = DistContext(rank=rank, world_size=2)
        trainer = PGTrainer(policy, ENV, cfg, out_dir=tmp_path / str(rank), ctx=ctx, collector=Collector(policy, ctx=ctx))
        trainer._setup_extra()
        shards.append([[t.action_ids(k) for k in range(len(t.turns))] for t in trainer.experts])
    assert shards == [[want[0], want[2]], [want[1]]]


def test_switching_algo_in_overrides_reconciles_the_pg_section():
    """``algo=filtered_bc pg.expert_replay=8`` over an rloo config builds (pg.algo follows algo);
    switching the quickstart's filtered BC to rloo drops the replay its PPO loss cannot take."""
    from turngym.config import apply_overrides
    from turngym.train import TrainConfig

    rloo = apply_overrides(TrainConfig(), ["algo=rloo"])
    assert (rloo.pg.algo, rloo.pg.expert_replay) == ("rloo", 0)
    back = apply_overrides(rloo, ["algo=filtered_bc", "pg.expert_replay=8"])
    assert (back.pg.algo, back.pg.expert_replay) == ("filtered_bc", 8)
    nll = apply_overrides(TrainConfig(), ["algo=rloo", "pg.pg_loss=nll"])
    assert (nll.pg.algo, nll.pg.expert_replay) == ("rloo", 8)


def _demos(policy, n):
    """The SFT stage's demonstrations of the toy env (``Collector.demonstrations``)."""
    with Collector(policy) as collector:
        return collector.demonstrations(EnvTarget(ENV), n)
