"""The Collector: one place that plays a run's episodes. Envs stay open across collections and
evaluations, demonstrations carry the policy's own token record, screens record greedy outcomes."""

from __future__ import annotations

import toy_envs

from turngym.agents.base import SamplingParams
from turngym.agents.scripted import OracleAgent
from turngym.bench.evaluate import evaluate
from turngym.rollout import Collector, EnvTarget, TaskSchedule, episode_specs

ENV = EnvTarget("tests/Guess-v0", {"tool_format": "xml"})


def _count_envs(monkeypatch) -> list:
    made = []
    real = toy_envs.GuessEnv.__init__

    def counting(self, *a, **k):
        made.append(1)
        real(self, *a, **k)

    monkeypatch.setattr(toy_envs.GuessEnv, "__init__", counting)
    return made


def test_envs_stay_open_across_collections_and_evaluations(policy, monkeypatch):
    ENV.info  # the env's facts, probed once per process (EnvInfo): not a collection env
    made = _count_envs(monkeypatch)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6, seed=0)
    with Collector(policy) as collector:
        for it in range(3):
            trajs, metrics = collector.collect(ENV, episode_specs(["1", "2"], 4, seed=it), sampling, num_envs=4)
            assert len(trajs) == 4 and metrics["rollout/env_steps"] == sum(len(t.turns) for t in trajs)
        opened = len(made)
        assert opened == 4 and len(collector.pools) == 4  # one env per slot, opened once
        # an evaluation of the same env plays on the same open envs
        evaluate(ENV.env_id, policy, episodes=2, env_kwargs=ENV.kwargs, num_envs=2, progress=False, collector=collector)
        assert len(made) == opened
        # another split (or a turn limit) is another pool
        collector.play(EnvTarget(ENV.env_id, ENV.kwargs, max_turns=2), episode_specs(["1"], 1), num_envs=1)
        assert len(made) == opened + 1
    assert len(collector.pools) == 0  # closed with the collector


def test_old_style_evaluation_opens_and_closes_its_own_envs(policy, monkeypatch):
    ENV.info
    made = _count_envs(monkeypatch)
    for _ in range(2):
        evaluate(ENV.env_id, policy, episodes=2, env_kwargs=ENV.kwargs, num_envs=2, progress=False)
    assert len(made) == 2 * 2


def test_demonstrations_are_recorded_in_the_policys_tokens(policy):
    with Collector(policy) as collector:
        demos = collector.demonstrations(ENV, 3)
    assert len(demos) == 3 and all(t.success for t in demos)
    for t in demos:
        rec = t.record
        assert rec is not None and rec.starts == [0]
        for k, turn in enumerate(t.turns):
            ids = t.action_ids(k)
            assert policy.tokenizer.decode(ids[:-1]) == turn.action_text  # the oracle's text, then end of turn
            assert ids[-1] in policy.chat.end_token_ids and t.action_logprobs(k) == [0.0] * len(ids)
            assert sum(rec.loss_mask[turn.span[0] : turn.span[1]]) == len(ids)


def test_screen_records_greedy_outcomes_and_counts_its_steps():
    schedule = TaskSchedule(["1", "2", "3"], seed=0, sampling="greedy_failed")
    assert schedule.needs_screen(0)
    with Collector(OracleAgent()) as collector:  # the oracle solves every task in one turn
        metrics, steps = collector.screen(EnvTarget(ENV.env_id, {**ENV.kwargs, "scripted_hints": True}), schedule,
                                          SamplingParams(max_new_tokens=6), num_envs=3)
    assert schedule.greedy_outcomes == {"1": True, "2": True, "3": True}
    assert metrics["screen/greedy_success"] == 1.0 and steps == 3
    assert not schedule.needs_screen(1)
