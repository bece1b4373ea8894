"""Reward transforms inside the real trainers (tiny random model, toy env): G-RA and SPA specs go
through the config, the trainers train on them, and the transforms log what they did."""

import pytest
import torch
from fixtures_model import build_tiny_model

from turngym.config import from_dict
from turngym.rewards import reward_stats
from turngym.trainers.archer import ArcherConfig, ArcherTrainer
from turngym.trainers.pg import PGConfig, PGTrainer

ENV = "tests/Guess-v0"
GATED = {"name": "gated", "tau": 1.0, "high": "outcome", "step": [{"name": "shaped", "shaping": "valid_call", "bonus": 0.1}]}
SMALL = dict(iterations=1, episodes_per_iter=4, num_envs=4, max_new_tokens=12, minibatch_size=2, checkpoint_every=0)


@pytest.fixture(autouse=True)
def one_thread():
    # the tiny model's matmuls are far below OpenMP's break-even: on a shared 2-core box one
    # thread ran an iteration in 1.4 s where two took 19 s
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def policy(tiny_tokenizer):
    from turngym.agents.hf import HFPolicy

    return HFPolicy(build_tiny_model(tiny_tokenizer), tiny_tokenizer)


def test_reward_specs_load_from_config_dicts():
    cfg = from_dict(PGConfig, {"reward": ["outcome", GATED], "group_size": 2, "episodes_per_iter": 4})
    assert cfg.reward[1]["tau"] == 1.0


def test_grpo_trains_on_gated_shaping(policy, tmp_path):
    trainer = PGTrainer(policy, ENV, PGConfig(algo="grpo", group_size=2, reward=[GATED], **SMALL), out_dir=tmp_path)
    rows = trainer.train(progress=False)
    assert len(rows) == 1
    stats = reward_stats(trainer.reward_fn)
    assert 0.0 <= stats["reward/gra_open_frac"] <= 1.0
    # a closed gate drops the step bonus: failed episodes got none of it
    assert stats["reward/gra_step_on_failed_mean"] == 0.0
    assert stats["reward/shaped_mean"] >= 0.0


def test_archer_trains_on_spa_with_gating(policy, tmp_path):
    spa = {"name": "spa", "dim": 256, "updates": 5, "bonus": 0.05}
    small = {k: v for k, v in SMALL.items() if k != "minibatch_size"}
    cfg = ArcherConfig(critic_epochs=2, critic_states=4, actor_states=2, warmup_iters=0, critic_encoder="reference",
                       reward=[{"name": "gated", "tau": 1.0, "step": [spa]}], **small)
    trainer = ArcherTrainer(policy, ENV, cfg, out_dir=tmp_path)
    rows = trainer.train(progress=False)
    assert "critic/q_loss" in rows[0]
    stats = reward_stats(trainer.reward_fn)
    assert stats["reward/spa_buffer"] == 4 and "reward/gra_open_frac" in stats
