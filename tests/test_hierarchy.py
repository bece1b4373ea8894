"""The hierarchy over a trained actor (``trainers.hierarchy``): its knobs, and the stage end to end on the
tiny model and the toy env: the critic is fitted to the RL stage's final actor on the tasks that stage
never played, reported beside the actor alone, resumed from its checkpoint, and held back by its gate."""

from __future__ import annotations

import json

import pytest
import torch
from test_protocol import _protocol, _tiny_base

from turngym.train import TrainConfig
from turngym.trainers.archer import ArcherConfig
from turngym.trainers.archer.acting import ActingConfig
from turngym.trainers.archer.hierarchy import HierarchyConfig, acting_gain, critic_config, gate_open
from turngym.trainers.branch_bc import BranchBCConfig

BRANCH = "branch: {iterations: 1, episodes_per_iter: 2, num_envs: 2, max_new_tokens: 6, autocast: none}"


def test_the_critic_run_leaves_the_actor_alone_and_branches_every_candidate():
    actor = BranchBCConfig(num_envs=5, max_turns=7, max_state_visits=3, max_new_tokens=11, trainable="top:2")
    cfg = critic_config(HierarchyConfig(tasks=12, points=4, width=2, seed=3), actor)
    # one iteration that is the critic's warm-up: the actor never trains
    assert isinstance(cfg, ArcherConfig) and cfg.iterations == cfg.warmup_iters == 1
    tree, auc = cfg.plugins
    assert (cfg.episodes_per_iter, tree["points"], tree["width"], tree["depth"]) == (12, 4, 2, 1)
    assert tree["from_wins"] and tree["no_ops"] and auc["holdout"] == 0 and cfg.seed == 3
    assert cfg.temperature == 0.0  # V of the greedy actor that acts
    assert (cfg.num_envs, cfg.max_turns, cfg.max_state_visits, cfg.max_new_tokens) == (5, 7, 3, 11)
    with pytest.raises(ValueError, match="trainable=all or top:K"):
        critic_config(HierarchyConfig(tasks=1), BranchBCConfig(trainable="lora"))


def test_gate_by_hand():
    assert gate_open(0.75, 0.75) and gate_open(0.9, 0.75) and not gate_open(0.74, 0.75)
    assert not gate_open(None, 0.75) and gate_open(None, 0.0) and gate_open(0.2, 0.0)


def test_hierarchy_knobs_are_checked():
    with pytest.raises(ValueError, match="hierarchy.gate"):
        HierarchyConfig(gate=1.5)
    with pytest.raises(ValueError, match="hierarchy.by"):
        HierarchyConfig(by="oracle")
    with pytest.raises(ValueError, match="set acting.k"):
        TrainConfig(hierarchy=HierarchyConfig(tasks=8))
    # any RL stage can act with the critic the stage fits: branch BC trains none of its own
    assert TrainConfig(hierarchy=HierarchyConfig(tasks=8), acting=ActingConfig(k=3)).algo == "branch_bc"
    with pytest.raises(ValueError, match="trains no utterance critic"):
        TrainConfig(acting=ActingConfig(k=3))


def test_the_hierarchy_stage_end_to_end_resumes_and_gates(tmp_path, tiny_tokenizer, capsys):
    cfg = _tiny_base(tmp_path, tiny_tokenizer, "branch_bc", BRANCH)
    text = cfg.read_text().replace("env_kwargs: {}", "env_kwargs: {n_tasks: 6}")
    cfg.write_text(text)
    out = tmp_path / "protocol"
    arm = "hier=branch_bc:hierarchy.tasks=2 hierarchy.gate=0 hierarchy.critic_updates=4 acting.k=2"
    argv = ["--config", str(cfg), "--arm", "sft", "--arm", "branch_bc", "--arm", arm, "--seeds", "0",
            "--games", "3", "--samples", "0", "--out", str(out), "--quiet"]
    report = _protocol(argv)
    assert set(report["finals"]) == {"sft", "branch_bc", "hier", "hier+critic"}
    # the same actor as the arm without the stage, game for game
    assert report["finals"]["hier"][0]["per_episode_success"] == report["finals"]["branch_bc"][0]["per_episode_success"]
    guided = report["finals"]["hier+critic"][0]
    assert guided["acting/turns"] > 0 and 0 <= guided["acting/moved"] <= guided["acting/turns"]
    stages = json.loads((out / "seed0" / "hier" / "stages.json").read_text())
    record = stages["hierarchy"]
    assert record["fresh_tasks"] == 2 and record["gate_open"]  # the 2 tasks branch BC never screened
    if "sibling_auc_xfit" in record:  # sibling pairs were found: acting was estimated out of sample at their states
        assert set(record["acting_xfit"]) == {"0.0", "0.03", "0.1", "0.3", "1.0"}
    critic_rows = (out / "seed0" / "hier" / "hierarchy" / "metrics.jsonl").read_text().splitlines()
    assert len(critic_rows) == 1 and json.loads(critic_rows[0])["actor/active"] == 0.0
    # a rerun after a kill before the acting evaluation reloads the critic (no second fit) and evaluates it
    del stages["eval_final_critic"]
    (out / "seed0" / "hier" / "stages.json").write_text(json.dumps(stages))
    capsys.readouterr()
    again = _protocol(argv)
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[protocol]")]
    assert len(lines) == 1 and "hier final_critic" in lines[0]
    assert again["finals"]["hier+critic"][0]["per_episode_success"] == guided["per_episode_success"]
    assert len((out / "seed0" / "hier" / "hierarchy" / "metrics.jsonl").read_text().splitlines()) == 1

    # a gate the critic cannot pass: the hierarchy is the actor alone, with no second evaluation
    shut = "shut=branch_bc:hierarchy.tasks=2 hierarchy.gate=1.0 hierarchy.critic_updates=4 acting.k=2"
    gated = _protocol([*argv[:6], "--arm", shut, *argv[6:]])
    shut_record = json.loads((out / "seed0" / "shut" / "stages.json").read_text())["hierarchy"]
    assert shut_record["gate_open"] == (shut_record.get("sibling_auc_xfit") == 1.0)  # only a perfect ranking passes
    if not shut_record["gate_open"]:
        assert gated["finals"]["shut+critic"][0]["acting/gate_open"] == 0.0
        assert gated["finals"]["shut+critic"][0]["per_episode_success"] == gated["finals"]["shut"][0]["per_episode_success"]


def test_acting_gain_by_hand():
    # two states; the policy's own reply first in each. State A: own 0.0 (logp -0.1), runner-up 1.0 (logp -3.0).
    # State B: own 1.0 (logp -0.2), runner-up 0.0 (logp -2.0).
    groups = [[0, 1], [2, 3]]
    values, logprobs = [0.0, 1.0, 1.0, 0.0], [-0.1, -3.0, -0.2, -2.0]
    scores = [0.2, 0.6, 0.5, 0.55]  # the critic prefers the runner-up at both
    alone = acting_gain(scores, values, logprobs, groups, prior=0.0)
    assert alone == {"gain": 0.0, "moved": 1.0, "better": 1.0, "worse": 1.0, "states": 2.0}  # (+1 - 1) / 2
    # prior 0.1: A scores 0.2 - 0.01 = 0.19 vs 0.6 - 0.3 = 0.3 (moves); B 0.5 - 0.02 = 0.48 vs 0.55 - 0.2 = 0.35 (stays)
    assert acting_gain(scores, values, logprobs, groups, prior=0.1) == {"gain": 0.5, "moved": 0.5, "better": 1.0,
                                                                        "worse": 0.0, "states": 2.0}
    # prior 1.0: A 0.2 - 0.1 = 0.1 vs 0.6 - 3.0: the actor's choice everywhere
    assert acting_gain(scores, values, logprobs, groups, prior=1.0)["moved"] == 0.0


def test_tree_features_match_a_whole_forward_of_every_episode(tiny_tokenizer):
    import torch

    from fixtures_model import NonsenseFirst, build_tiny_model
    from test_branching import ENV, TEXT, _played
    from turngym.rollout import make_env_factory
    from turngym.rollout.branching import Tree, branch_search
    from turngym.trainers.actor import reference_pass
    from turngym.trainers.archer.encoder import tree_features
    from turngym.trainers.sequences import pack_batch

    policy = NonsenseFirst(build_tiny_model(tiny_tokenizer), tiny_tokenizer, generation_dtype=torch.float32)
    spec, root = _played(policy, task="4")
    found = branch_search(policy, make_env_factory(ENV, **TEXT), [(spec, root)], points=2, width=3, depth=2,
                          max_new_tokens=6, keep_no_ops=True, from_wins=True)
    tree = Tree.from_search([root], found)
    parts = tree_features(policy.model, tree.episodes, tree.parent, tree.branch_turn)
    direct = {i for i, p in enumerate(tree.parent) if p == 0}
    deeper = {i for i, p in enumerate(tree.parent) if p > 0}
    assert direct and deeper  # both kinds are in this tree
    assert {i for i, _ in parts} == {0} | direct  # a branch of a branch is left to the whole-episode path
    batch = pack_batch(tree.episodes, policy.pad_id)
    hidden = reference_pass(policy.model, batch, True, "none")[1]
    for n, (ti, k) in enumerate(batch.turn_refs):
        if (ti, k) in parts:
            s, sa = parts[(ti, k)]
            torch.testing.assert_close(s, hidden[tuple(batch.state_pos[n])].float(), atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(sa, hidden[tuple(batch.action_pos[n])].float(), atol=1e-4, rtol=1e-4)


def test_acting_headroom_by_hand():
    from turngym.trainers.archer.hierarchy import acting_headroom

    # state A: own 0, a runner-up 1 -> +1; state B: own 1, runner-up 0 -> nothing to gain
    assert acting_headroom([0.0, 1.0, 1.0, 0.0], [[0, 1], [2, 3]]) == {"gain": 0.5, "better": 1.0, "states": 2.0}
