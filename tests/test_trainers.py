"""Trainer smoke tests on the tiny random model and the toy env: losses logged, trainable
parameters change, packing is exact, and a resumed run reproduces the uninterrupted one."""

import shutil

import pytest
import torch
from fixtures_model import build_tiny_model

from turngym.agents.base import SamplingParams
from turngym.rollout import episode_specs, make_env_factory, rollout
from turngym.trainers.archer import ArcherConfig, ArcherTrainer
from turngym.trainers.pg import PGConfig, PGTrainer, turn_advantages
from turngym.trainers.sequences import pack_batch, score
from turngym.trainers.sft import SFTConfig, sft
from turngym.types import Trajectory, Turn

ENV = "tests/Guess-v0"


def _archer_cfg(**kw):
    """ArCHer as the paper runs it, in a test's sizes (its pieces are tested in test_archer)."""
    base = dict(iterations=2, episodes_per_iter=4, num_envs=4, max_new_tokens=12, critic_epochs=4, critic_states=6,
                critic_batch_size=4, actor_states=2, warmup_iters=0, critic_encoder="top:1", critic_window=8,
                trainable="all", checkpoint_every=1, autocast="none")
    return ArcherConfig(**{**base, **kw})


class _LengthReward:
    """Rewards that differ from one reply to the next (by their ids), so critic-free advantages are never all 0."""

    def __call__(self, trajectories):
        return [[(sum(t.action_ids(k)) % 7) / 10 for k in range(len(t.turns))] for t in trajectories]


def _pg_cfg(**kw):
    from turngym.rewards import register_reward

    register_reward("test_length", _LengthReward)
    base = dict(algo="reinforce", iterations=2, episodes_per_iter=4, group_size=1, num_envs=4, max_new_tokens=12,
                minibatch_size=2, checkpoint_every=1, reward=["env", "test_length"])
    return PGConfig(**{**base, **kw})


def test_packed_scoring_matches_the_model_and_the_recorded_logprobs(policy):
    trajs = rollout(policy, make_env_factory(ENV), episode_specs(["1", "2"], 2),
                    sampling=SamplingParams(max_new_tokens=12, seed=0), progress=False)
    batch = pack_batch(trajs, policy.pad_id)
    assert batch.input_ids.shape[0] == 2  # one sequence per episode: prompts extend each other
    assert len(batch.turn_refs) == sum(len(t.turns) for t in trajs)
    with torch.no_grad():
        fast = score(policy.model, batch).logprobs
        logits = policy.model(batch.input_ids, attention_mask=batch.attention_mask).logits
        full = torch.log_softmax(logits.float(), -1).gather(-1, batch.targets[..., None]).squeeze(-1)[batch.score_mask]
    torch.testing.assert_close(fast, full)
    torch.testing.assert_close(fast, batch.old_logprobs, atol=1e-4, rtol=0)


def test_select_rows_keeps_tokens_and_turns_consistent(policy):
    trajs = rollout(policy, make_env_factory(ENV), episode_specs(["1", "2", "3"], 3),
                    sampling=SamplingParams(max_new_tokens=8, seed=1), progress=False)
    batch = pack_batch(trajs, policy.pad_id)
    sub, keep = batch.select_rows([2, 0])
    assert sub.num_tokens == int(keep.sum()) == sub.old_logprobs.numel()
    torch.testing.assert_close(sub.old_logprobs, batch.old_logprobs[keep])
    assert sub.token_turn.max() < len(sub.turn_refs) and sorted({r[0] for r in sub.turn_refs}) == [0, 2]


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def test_archer_smoke_logs_changes_params_and_resumes_exactly(policy, tiny_tokenizer, tmp_path):
    from turngym.agents.hf import HFPolicy

    before = _params(policy.model)
    trainer = ArcherTrainer(policy, ENV, _archer_cfg(iterations=3), out_dir=tmp_path / "full")
    rows = trainer.train(progress=False)
    assert len(rows) == 3 and all("critic/q_loss" in r and "actor/pg_loss" in r for r in rows)
    assert any(not torch.equal(before[n], p) for n, p in _params(policy.model).items())
    assert (tmp_path / "full" / "metrics.jsonl").exists() and (tmp_path / "full" / "learning_curve.png").exists()

    # a run "killed" after 2 iterations resumes from its checkpoint and reproduces iteration 3
    short = ArcherTrainer(HFPolicy(build_tiny_model(tiny_tokenizer), tiny_tokenizer), ENV, _archer_cfg(iterations=2),
                          out_dir=tmp_path / "killed")
    short.train(progress=False)
    resumed = ArcherTrainer(HFPolicy(build_tiny_model(tiny_tokenizer), tiny_tokenizer), ENV, _archer_cfg(iterations=3),
                            out_dir=tmp_path / "killed")
    resumed.setup()
    resumed.load(tmp_path / "killed" / "checkpoint")
    assert resumed.iteration == 2 and resumed.env_steps == short.env_steps
    nxt = resumed.step()
    for key in ("rollout/return", "rollout/env_steps", "critic/q_loss", "actor/pg_loss", "adv/mean"):
        assert nxt[key] == pytest.approx(rows[2][key], rel=1e-5, abs=1e-6), key


def test_resume_reproduces_the_next_batch_after_a_kill_mid_iteration(policy, tiny_tokenizer, tmp_path):
    from turngym.agents.hf import HFPolicy

    a = PGTrainer(policy, ENV, _pg_cfg(iterations=2), out_dir=tmp_path / "a")
    a.train(progress=False)
    shutil.copytree(tmp_path / "a" / "checkpoint", tmp_path / "ckpt_after_2")
    a.cfg = _pg_cfg(iterations=3)
    trajs_a = _next_batch(a)
    # a second process that died mid-iteration 3 (nothing saved past the checkpoint) resumes:
    b = PGTrainer(HFPolicy(build_tiny_model(tiny_tokenizer), tiny_tokenizer), ENV, _pg_cfg(iterations=3),
                  out_dir=tmp_path / "b")
    b.setup()
    b.load(tmp_path / "ckpt_after_2")
    assert b.iteration == a.iteration == 2
    trajs_b = _next_batch(b)
    assert [x.record.ids for x in trajs_a] == [x.record.ids for x in trajs_b]


def _next_batch(trainer):
    from turngym.rollout import task_schedule

    cfg = trainer.cfg
    specs = task_schedule(trainer.task_ids, cfg.episodes_per_iter, trainer.seed, trainer.iteration)
    return trainer.collector.collect(trainer.env, specs, cfg.sampling(trainer.iteration), num_envs=cfg.num_envs)[0]


@pytest.mark.parametrize("algo", ["reinforce", "rloo", "grpo", "gigpo"])
def test_pg_family_smoke(policy, tmp_path, algo):
    contrast = {} if algo == "reinforce" else {"filter_equal_groups": False}  # update even without contrast
    cfg = PGConfig(algo=algo, iterations=1, episodes_per_iter=4, group_size=2, num_envs=4, max_new_tokens=10,
                   reward=["env"], minibatch_size=2, **contrast)
    rows = PGTrainer(policy, ENV, cfg, out_dir=tmp_path).train(progress=False)
    assert rows[0]["rollout/env_steps"] > 0 and "adv/mean" in rows[0]


def test_turn_advantages_follow_the_algorithms_by_hand():
    def traj(rewards, keys):  # keys: the state each action was taken from (the rollout records it)
        return Trajectory("t", [Turn("a", reward=r, info={"anchor_state_key": k}) for r, k in zip(rewards, keys)])

    trajs = [traj([0, 1], ["s0", "s1"]), traj([0, 0], ["s0", "s1"])]
    rewards = [[0.0, 1.0], [0.0, 0.0]]
    grpo = turn_advantages(trajs, rewards, PGConfig(algo="grpo", group_size=2, episodes_per_iter=2))
    assert grpo == [[pytest.approx(1.0, abs=1e-5)] * 2, [pytest.approx(-1.0, abs=1e-5)] * 2]
    rloo = turn_advantages(trajs, rewards, PGConfig(algo="rloo", group_size=2, episodes_per_iter=2))
    assert rloo == [[1.0, 1.0], [-1.0, -1.0]]
    # GiGPO: both first steps are taken from s0 (returns .9 and 0 -> step adv +-1); second steps
    # are taken from the same s1 (returns 1 and 0 -> +-1). A = A_E + A_S.
    gigpo = turn_advantages(trajs, rewards, PGConfig(algo="gigpo", group_size=2, episodes_per_iter=2, gamma=0.9))
    assert gigpo[0] == [pytest.approx(2.0, abs=1e-4)] * 2 and gigpo[1] == [pytest.approx(-2.0, abs=1e-4)] * 2


def test_sft_lowers_the_expert_nll(policy):
    first = sft(policy, ENV, SFTConfig(episodes=4, epochs=1, lr=1e-3, batch_size=2), progress=False)
    again = sft(policy, ENV, SFTConfig(episodes=4, epochs=3, lr=1e-3, batch_size=2), progress=False)
    assert first["sft/episodes"] == 4 and again["sft/loss"] < first["sft/loss"]


@pytest.mark.parametrize("algo,trainable", [("reinforce", "lora"), ("archer", "top:1")])
def test_trainable_switches_train_only_what_they_say(policy, tmp_path, algo, trainable):
    if algo == "archer":  # its critic gives non-zero advantages even when every episode earns the same reward
        trainer = ArcherTrainer(policy, ENV, _archer_cfg(iterations=1, trainable=trainable, actor_lr=1e-2), out_dir=tmp_path)
    else:
        trainer = PGTrainer(policy, ENV, _pg_cfg(iterations=1, trainable=trainable, actor_lr=1e-2), out_dir=tmp_path)
    trainer.setup()
    names = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    if trainable == "lora":
        assert names and all("lora_" in n for n in names)
    else:
        assert names and all(".layers.1." in n or n.endswith("norm.weight") for n in names)
    frozen_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    before = _params(trainer.model)
    trainer.step()
    assert any(not torch.equal(before[n], p) for n, p in _params(trainer.model).items())
    assert all(torch.equal(frozen_before[n], p) for n, p in trainer.model.named_parameters() if n in frozen_before)


def test_async_collection_bounds_staleness(policy, tmp_path):
    cfg = _pg_cfg(iterations=3, async_staleness=1, env_workers="thread", actor_lr=1e-2, checkpoint_every=0)
    trainer = PGTrainer(policy, ENV, cfg, out_dir=tmp_path)
    trainer.setup()
    before = _params(trainer.model)
    rows = trainer.train(progress=False)
    assert [r["env_steps"] > 0 for r in rows] == [True] * 3
    assert all(r["async/staleness_max"] <= 1 for r in rows)
    assert any(not torch.equal(before[n], p) for n, p in _params(trainer.model).items())
    assert not trainer.collector.streaming  # stopped at the end of train()


def test_async_collection_refuses_groups(policy, tmp_path):
    cfg = PGConfig(algo="grpo", iterations=1, episodes_per_iter=4, group_size=2, num_envs=4, max_new_tokens=6,
                   async_staleness=0)
    with pytest.raises(ValueError, match="groups"):
        PGTrainer(policy, ENV, cfg, out_dir=tmp_path).train(progress=False)


def test_groups_replay_each_task_from_the_same_reset(policy, tmp_path):
    trainer = PGTrainer(policy, ENV, _pg_cfg(algo="grpo", iterations=1, group_size=2), out_dir=tmp_path)
    trainer.setup()
    played, collect = [], trainer.collect
    trainer.collect = lambda specs, group_size=1: played.append((list(specs), group_size)) or collect(specs, group_size)
    row = trainer.step()
    specs, group_size = played[0]
    assert group_size == 2 and len(specs) == 4 and row["rollout/env_steps"] > 0
    assert specs[0] == specs[1] and specs[2] == specs[3]  # same task and reset seed within a group
    with pytest.raises(ValueError, match="multiple of group_size"):
        _pg_cfg(algo="grpo", group_size=3)


def test_actor_lr_warms_up_from_the_optimizer_step_count(policy, tmp_path):
    cfg = _pg_cfg(iterations=1, actor_lr=1e-3, actor_warmup_steps=10)  # 4 episodes, minibatches of 2
    trainer = PGTrainer(policy, ENV, cfg, out_dir=tmp_path)
    trainer.setup()
    trainer.step()
    assert trainer.actor_opt.param_groups[0]["lr"] == pytest.approx(1e-3 * 2 / 10)  # the 2nd of 10 steps
    with pytest.raises(ValueError, match="actor_warmup_steps"):
        _pg_cfg(actor_warmup_steps=-1)
