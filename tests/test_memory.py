"""What a run's memory holds: KV caches grow by a quarter, not by doubling; a Collector keeps at most
``max_envs`` episodes (envs and caches) in flight whatever a caller asks."""

from __future__ import annotations

import pytest
import torch
from fixtures_model import build_tiny_model

from turngym.agents.hf import HFPolicy
from turngym.agents.packed import GROW_MIN_SLOTS
from turngym.rollout import Collector, EnvTarget, episode_specs


def test_a_growing_cache_keeps_a_quarter_of_room_and_its_keys(tiny_tokenizer):
    policy = HFPolicy(build_tiny_model(tiny_tokenizer), tiny_tokenizer)
    engine = policy.packed
    assert engine is not None
    ids = torch.randint(0, len(tiny_tokenizer), (1000,), generator=torch.Generator().manual_seed(0)).tolist()
    cache = engine.new_cache(0, capacity=16)
    at = 0
    for n in (500, 20, 1, 1, 130, 300):  # a prompt, turns, decoded tokens
        logits = engine.forward([cache], [ids[at : at + n]])
        at += n
        # doubling had the 500-token cache take room for 1,000 at its 520th token
        assert len(cache.ids) == at <= cache.capacity <= at + max(GROW_MIN_SLOTS, at // 4)
    with torch.no_grad():
        want = policy.model(input_ids=torch.tensor([ids[:at]])).logits[0, -1]
    torch.testing.assert_close(logits[0], want, rtol=1e-4, atol=1e-4)  # the copies kept every key and value


@pytest.mark.parametrize("max_envs", [2, None])
def test_a_collector_plays_at_most_max_envs_episodes_at_once(max_envs):
    from turngym.agents.scripted import OracleAgent

    with Collector(OracleAgent(), max_envs=max_envs) as collector:
        env = EnvTarget("tests/Guess-v0", {"scripted_hints": True})
        trajs = collector.play(env, episode_specs(["1", "2", "3", "4"], 8), num_envs=8)
        assert len(trajs) == 8 and all(t.success for t in trajs)
        assert len(collector.pools) == (max_envs or 8)  # the envs opened: one per episode in flight
    with pytest.raises(ValueError, match="max_envs"):
        Collector(OracleAgent(), max_envs=0)


def test_by_default_a_cpu_policy_plays_at_most_cpu_max_envs_at_once(tiny_tokenizer):
    from turngym.agents.scripted import OracleAgent
    from turngym.rollout.collector import CPU_MAX_ENVS

    policy = HFPolicy(build_tiny_model(tiny_tokenizer), tiny_tokenizer)
    assert policy.device.type == "cpu" and Collector(policy).max_envs == CPU_MAX_ENVS
    assert Collector(OracleAgent()).max_envs is None  # a scripted agent holds no caches
    assert Collector(policy, max_envs=None).max_envs is None
