"""Branched rollouts and branch-search BC: exact prefix replay, branch points by hand, the policy's
runner-up replies (packed and plain paths agree), the search's plumbing, and the trainer's smoke test."""

from __future__ import annotations

import copy
import dataclasses
import gc
from typing import NamedTuple

import pytest
import torch

from turngym.agents.base import SamplingParams
from turngym.agents.hf import HFPolicy
from turngym.agents.kvcache import common_prefix
from turngym.agents.sampling import decision_position, runner_up_heads
from turngym.rollout import EpisodeSpec, make_env_factory, rollout
from turngym.rollout.branching import (Tree, branch_points, branch_search, is_no_op, keep_top, observation_key,
                                       reply_certainty, tree_rollout, visit_keys)
from turngym.rollout.episode import branch_of, moved
from turngym.trainers.branch_bc import BranchBCConfig, BranchBCTrainer, better
from turngym.types import Message, TokenRecord, Trajectory, Turn, Utterance

from fixtures_model import EveryGuess as _EveryGuess
from fixtures_model import NonsenseFirst
from fixtures_model import build_tiny_model

ENV = "tests/Guess-v0"


class _Recorded(NamedTuple):
    prompt_ids: list[int]
    action_ids: list[int]
TEXT = {"tool_format": "text"}  # the whole reply is the guess: "3" is a valid move


def _episode(keys, initial="s0", outcome=0.0):
    """A trajectory whose turns reach ``keys`` (state keys), for branch-point arithmetic."""
    turns = [Turn(f"a{i}", info={"state_key": k, "action_valid": True}) for i, k in enumerate(keys)]
    return Trajectory("t", turns, outcome=outcome, metadata={"initial_state_key": initial})


def test_branch_points_by_hand():
    # s0 -a0-> s1 -a1-> s2 -a2-> s1: turn 2 is the first return, so the mistake is turn 2 or turn 1
    assert branch_points(_episode(["s1", "s2", "s1", "s2"]), 2) == [2, 1]
    assert branch_points(_episode(["s1", "s2", "s1", "s2"]), 3) == [2, 1, 0]
    # a refused move changes nothing: turn 0 returns at once
    assert branch_points(_episode(["s0", "s1"]), 2) == [0]
    # no return at all: the last turns
    assert branch_points(_episode(["s1", "s2", "s3"]), 2) == [2, 1]
    # a deeper level never branches before its own branch turn
    assert branch_points(_episode(["s1", "s2", "s3", "s2"]), 3, after=2) == [3, 2]
    # without state keys: the last turns
    assert branch_points(Trajectory("t", [Turn("a"), Turn("b"), Turn("c")]), 2) == [2, 1]


def _unsure(keys, token_logprobs):
    """``_episode(keys)`` whose turn i sampled tokens with ``token_logprobs[i]`` (None: no log-probs)."""
    traj, record = _episode(keys), TokenRecord()
    for turn, lps in zip(traj.turns, token_logprobs):
        record.add_prompt([1, 2])
        turn.span = record.add_action([7] * (len(lps) if lps else 2), lps)
    traj.record = record
    return traj


def test_branch_points_where_the_policy_was_least_sure():
    # s0 -> s1 -> s2 -> s3 -> s2: turn 3 returned, so turns 0-3 are candidates. The least certain token of
    # each reply: turn 0 -2.0, turn 1 -0.1, turn 2 no log-probs (sure), turn 3 -0.5, turn 4 (after the return) -9
    traj = _unsure(["s1", "s2", "s3", "s2", "s4"], [[-0.01, -2.0], [-0.1], None, [-0.5, -0.2], [-9.0]])
    assert [reply_certainty(traj, j) for j in range(5)] == [-2.0, -0.1, 0.0, -0.5, -9.0]
    assert branch_points(traj, 2, pick="uncertain") == [3, 0]  # the latest two would be [3, 2]
    assert branch_points(traj, 2) == [3, 2]
    assert branch_points(traj, 2, after=1, pick="uncertain") == [3, 1]  # turn 0 is before the level's own turns
    assert branch_points(traj, 9, pick="uncertain") == [3, 2, 1, 0]
    # all equally sure (no record): ties go to the later turn, as "latest" does
    assert branch_points(_episode(["s1", "s2", "s3"]), 2, pick="uncertain") == [2, 1]
    with pytest.raises(ValueError, match="branch_pick"):
        branch_points(traj, 2, pick="random")


def _seen(texts, opening="room A"):
    """A trajectory whose turns were answered with ``texts`` (what the agent was shown), no state keys."""
    turns = [Turn(f"a{i}", observation=[Message("user", t)]) for i, t in enumerate(texts)]
    return Trajectory("t", turns, initial_observation=[Message("system", "rules"), Message("user", opening)])


def test_branch_points_from_what_the_agent_was_shown():
    # A -a0-> B -a1-> A: turn 1 brought back an observation already shown (whitespace aside)
    traj = _seen(["room  B", "room A", "room B"])
    assert visit_keys(traj)[0] == observation_key([Message("user", "room A")]) == visit_keys(traj)[2]
    assert branch_points(traj, 2, by="observation") == [1, 0]
    assert branch_points(traj, 2, by="state_key") == [2, 1]  # no state keys: the last turns
    with pytest.raises(ValueError, match="branch_by"):
        visit_keys(traj, "facts")


def test_tree_own_turns_and_sibling_groups_by_hand():
    root = _episode(["s1", "s2", "s1"])
    b1 = _episode(["s1", "s3"], outcome=1.0)
    b1.metadata.update(parent=0, branch_turn=1)  # left the root at turn 1
    b2 = _episode(["s1", "s4", "s5"])
    b2.metadata.update(parent=0, branch_turn=1)
    b3 = _episode(["s1", "s4", "s6"], outcome=1.0)
    b3.metadata.update(parent=2, branch_turn=2)  # left b2 at its turn 2
    tree = Tree.from_search([root], [b1, b2, b3])
    assert tree.parent == [-1, 0, 0, 2] and tree.branch_turn == [0, 1, 1, 2] and tree.roots == [root]
    assert list(tree.own_turns(0)) == [0, 1, 2] and list(tree.own_turns(2)) == [1, 2] and list(tree.own_turns(3)) == [2]
    groups = sorted(tree.sibling_groups())
    assert groups == [[(0, 1), (1, 1), (2, 1)], [(2, 2), (3, 2)]]


def test_memory_prefers_the_higher_return_then_the_shorter_success():
    short, long = _episode(["s1"], outcome=1.0), _episode(["s1", "s2", "s3"], outcome=1.0)
    short.turns[0].reward = long.turns[2].reward = 1.0
    assert better(None, long) and better(long, short) and not better(short, long)
    rich = _episode(["s1", "s2", "s3"], outcome=1.0)
    rich.turns[2].reward = 2.0
    assert better(short, rich)


def _played(policy, task="3", seed=7, turns=4):
    spec = EpisodeSpec(task, seed)
    traj = rollout(policy, make_env_factory(ENV, **TEXT), [spec],
                   sampling=SamplingParams(1.0, max_new_tokens=6, seed=1), progress=False)[0]
    assert len(traj.turns) >= turns - 1
    return spec, traj


def test_a_branch_replays_its_prefix_token_for_token(policy):
    spec, root = _played(policy)
    j = 2  # the free turn is not the turn limit's
    branch = rollout(policy, make_env_factory(ENV, **TEXT), [branch_of(root, spec, j, free_turns=1)],
                     sampling=SamplingParams(1.0, max_new_tokens=6, seed=99), progress=False)[0]
    assert len(branch.turns) == j + 1 and branch.truncated and branch.metadata["stopped"] == "free_turns"
    for k, (a, b) in enumerate(zip(root.turns[:j], branch.turns[:j])):
        assert (root.prompt_ids(k), root.action_ids(k), a.action_text) == (branch.prompt_ids(k), branch.action_ids(k), b.action_text)
        assert a.info["state_key"] == b.info["state_key"] and a.observation == b.observation
    # the policy's own turn after the prefix continues the same token record: the branch's record
    # shares the root's up to that turn's prompt
    assert branch.prompt_ids(j) == root.prompt_ids(j)
    assert branch.record.ids[: branch.turns[j].span[0]] == root.record.ids[: root.turns[j].span[0]]
    assert branch.metadata["branch_at"] == j


def test_a_replay_that_meets_another_prompt_ends_with_an_error(policy):
    spec, root = _played(policy)
    bad = dataclasses.replace(root, record=copy.deepcopy(root.record))
    bad.record.ids[bad.turns[1].span[0] - 1] += 1  # the recording's prompt for turn 1 differs by one token
    out = rollout(policy, make_env_factory(ENV, **TEXT), [EpisodeSpec(spec.task_id, spec.seed, parent=bad, replay_turns=2)],
                  sampling=SamplingParams(max_new_tokens=6, seed=0), progress=False)[0]
    assert out.truncated and "different prompt" in out.metadata["error"] and len(out.turns) == 1


def _reply(policy, text: str) -> Utterance:
    ids = policy.chat.encode(text) + sorted(policy.chat.end_token_ids)[:1]
    return Utterance(text, ids, [0.0] * len(ids))


def test_a_branch_whose_new_reply_changes_nothing_stops_at_once(policy):
    spec, root = _played(policy)
    for text, stopped in (("not a number", True), ("3", False)):
        branch = EpisodeSpec(spec.task_id, spec.seed, greedy=True, parent=root, replay_turns=0, reply=_reply(policy, text))
        out = rollout(policy, make_env_factory(ENV, **TEXT), [branch],
                      sampling=SamplingParams(max_new_tokens=6, seed=0), progress=False)[0]
        assert (out.metadata.get("stopped") == "branch_no_op") == stopped
    assert out.success and len(out.turns) == 1  # "3" wins task 3 at once


@pytest.mark.parametrize("k", [1, 3])
def test_alternatives_fork_the_least_certain_token_and_packed_equals_plain(tiny_tokenizer, k):
    model = build_tiny_model(tiny_tokenizer)
    packed = HFPolicy(model, tiny_tokenizer, generation_dtype=torch.float32, packed=True)
    plain = HFPolicy(model, tiny_tokenizer, generation_dtype=torch.float32, packed=False)
    _, root = _played(packed)
    turn = _Recorded(root.prompt_ids(0), root.action_ids(0))
    got = packed.alternatives([turn.prompt_ids], [turn.action_ids], k, max_new_tokens=6)[0]
    want = plain.alternatives([turn.prompt_ids], [turn.action_ids], k, max_new_tokens=6)[0]
    assert [u.action_ids for u in got] == [u.action_ids for u in want] and len(got) == k
    for u, v in zip(got, want):
        torch.testing.assert_close(torch.tensor(u.logprobs), torch.tensor(v.logprobs), atol=1e-4, rtol=1e-4)
    # every alternative keeps the recorded reply up to one token, and differs there
    logp = plain._decision_logprobs([turn.prompt_ids], [turn.action_ids], 6)[0][0]
    pos = int(logp.max(-1).values.argmin())
    for u in got:
        assert u.action_ids[:pos] == turn.action_ids[:pos] and u.action_ids[pos] != turn.action_ids[pos]
        assert len(u.logprobs) == len(u.action_ids) <= 6
        # the recorded log-probs are the model's own
        torch.testing.assert_close(torch.tensor(u.logprobs), torch.tensor(plain.score(turn.prompt_ids, u.action_ids)),
                                   atol=1e-4, rtol=1e-4)
    # runner-ups are ranked: the forced tokens' log-probs fall
    forced = [u.logprobs[pos] for u in got]
    assert forced == sorted(forced, reverse=True)


def test_branch_search_returns_whole_episodes_that_leave_their_root_once(tiny_tokenizer):
    policy = _EveryGuess(build_tiny_model(tiny_tokenizer), tiny_tokenizer, generation_dtype=torch.float32)
    spec, root = _played(policy, task="4")
    assert not root.success
    found = branch_search(policy, make_env_factory(ENV, **TEXT), [(spec, root)], points=1, width=8, depth=1,
                          max_new_tokens=6)
    j = branch_points(root, 1)[0]
    assert found and all(t.metadata["branch_turn"] == j and t.task_id == "4" for t in found)
    for t in found:
        assert [t.action_ids(k) for k in range(j)] == [root.action_ids(k) for k in range(j)]
        assert t.turns[j].action_text != root.turns[j].action_text
    assert sum(t.success for t in found) == 1  # exactly one guess is right
    assert all(t.metadata["parent"] == 0 for t in found)
    # pick="uncertain": the branch leaves at the turn whose recorded reply the policy was least sure of
    unsure = branch_points(root, 1, pick="uncertain")[0]
    assert reply_certainty(root, unsure) == min(reply_certainty(root, k) for k in range(j + 1)) < 0
    picked = branch_search(policy, make_env_factory(ENV, **TEXT), [(spec, root)], points=1, width=8, depth=1,
                           max_new_tokens=6, pick="uncertain")
    assert picked and all(t.metadata["branch_turn"] == unsure for t in picked)
    tree = tree_rollout(policy, make_env_factory(ENV, **TEXT), [spec], roots=[root], points=1, width=8,
                        max_new_tokens=6, by="state_key")
    assert tree.episodes[0] is root and len(tree.episodes) == 1 + len(found)
    (group,) = tree.sibling_groups()  # the root's turn j and every reply tried there
    assert group[0] == (0, j) and len(group) == 1 + len(found)
    with pytest.raises(ValueError, match="alternative"):
        branch_search(object(), make_env_factory(ENV, **TEXT), [(spec, root)])


def test_keep_no_ops_returns_refused_runner_ups_as_leaves_outside_the_sibling_groups(tiny_tokenizer):
    policy = NonsenseFirst(build_tiny_model(tiny_tokenizer), tiny_tokenizer, generation_dtype=torch.float32)
    spec, root = _played(policy, task="4")
    make = make_env_factory(ENV, **TEXT)
    search = lambda **kw: branch_search(policy, make, [(spec, root)], points=1, width=3, depth=2, max_new_tokens=6, **kw)
    plain, kept = search(), search(keep_no_ops=True)
    leaves = [t for t in kept if is_no_op(t)]
    assert not any(is_no_op(t) for t in plain) and leaves
    # the same search otherwise: the replies that moved are played and searched on alike
    assert [t.turns[-1].action_text for t in kept if not is_no_op(t)] == [t.turns[-1].action_text for t in plain]
    for leaf in leaves:  # one own turn, refused or idle (a guess made before), then the branch ends truncated
        j = leaf.metadata["branch_turn"]
        assert len(leaf.turns) == j + 1 and leaf.truncated and not leaf.success and not moved(leaf, j)
    # every branch point of both levels keeps its refused reply, and a leaf is never branched again
    points = {(t.metadata["parent"], t.metadata["branch_turn"]) for t in kept}
    refused = {(t.metadata["parent"], t.metadata["branch_turn"]) for t in leaves if t.turns[-1].action_text == "not a number"}
    assert refused == points and len({p for p, _ in points}) > 1
    nodes = {1 + i for i, t in enumerate(kept) if is_no_op(t)}
    assert not any(t.metadata["parent"] in nodes for t in kept)
    # the tree holds them, but a sibling pair never does: the env's refusal alone tells them apart
    tree = Tree.from_search([root], kept)
    grouped = {i for g in tree.sibling_groups() for i, _ in g}
    assert grouped and not grouped & nodes
    assert sorted(map(len, tree.sibling_groups())) == sorted(map(len, Tree.from_search([root], plain).sibling_groups()))


def test_keep_top_by_hand():
    assert keep_top(["a", "b", "c", "d"], [0.1, 0.9, 0.5, 0.9], 2) == ["b", "d"]  # a tie keeps the policy's order
    assert keep_top(["a", "b"], [0.3, -1.0], 5) == ["a", "b"]
    with pytest.raises(ValueError, match="scores"):
        keep_top(["a", "b"], [0.3], 1)


def test_a_ranker_chooses_which_runner_ups_are_played(tiny_tokenizer):
    policy = _EveryGuess(build_tiny_model(tiny_tokenizer), tiny_tokenizer, generation_dtype=torch.float32)
    spec, root = _played(policy, task="4")
    make = make_env_factory(ENV, **TEXT)
    seen = []

    def prefers_four(points, replies):  # a value estimate that knows the answer
        seen.append((points, replies))
        return [[1.0 if u.text == "4" else 0.0 for u in us] for us in replies]

    search = lambda **kw: branch_search(policy, make, [(spec, root)], points=1, width=1, max_new_tokens=6, **kw)
    plain, ranked = search(), search(rank=prefers_four, pool=8)
    assert [t.turns[t.metadata["branch_turn"]].action_text for t in plain] == ["1"]  # the policy's first runner-up
    assert [t.turns[t.metadata["branch_turn"]].action_text for t in ranked] == ["4"] and ranked[0].success
    ((points, replies),) = seen  # one call per search level: every point with its whole pool
    assert points == [(root, branch_points(root, 1)[0])] and [len(us) for us in replies] == [8]
    with pytest.raises(ValueError, match="pool"):
        search(rank=prefers_four, pool=1)


def test_from_wins_branches_won_roots_and_searches_on_after_a_success(tiny_tokenizer):
    policy = _EveryGuess(build_tiny_model(tiny_tokenizer), tiny_tokenizer, generation_dtype=torch.float32)
    spec, root = _played(policy, task="4")
    make = make_env_factory(ENV, **TEXT)
    search = lambda r, **kw: branch_search(policy, make, [(spec, r)], points=1, width=8, max_new_tokens=6, **kw)
    won = dataclasses.replace(root, outcome=1.0)  # the search reads only .success: a root it must skip
    assert won.success and search(won) == []
    from_won = search(won, from_wins=True)
    assert len(from_won) == len(search(root)) and all(t.metadata["parent"] == 0 for t in from_won)
    # depth 2: once a branch guessed right, the plain search stops; from_wins branches the failed ones again
    plain, wide = search(root, depth=2), search(root, depth=2, from_wins=True)
    assert any(t.success for t in plain) and len(wide) > len(plain)
    deeper = [t for t in wide if t.metadata["parent"] > 0]
    assert deeper and all(t.metadata["branch_turn"] > branch_points(root, 1)[0] for t in deeper)


def _cfg(**kw):
    base = dict(iterations=2, episodes_per_iter=4, num_envs=4, max_new_tokens=6, branch_points=1, branch_width=8,
                branch_depth=1, expert_replay=2, minibatch_size=2, actor_lr=1e-3, autocast="none")
    return BranchBCConfig(**{**base, **kw})


def test_branch_bc_remembers_what_the_search_found_trains_and_resumes_exactly(tiny_tokenizer, tmp_path):
    make = lambda: _EveryGuess(build_tiny_model(tiny_tokenizer), tiny_tokenizer, generation_dtype=torch.float32)
    full = BranchBCTrainer(make(), ENV, _cfg(), env_kwargs=TEXT, out_dir=tmp_path / "full")
    full.setup()
    before = {n: p.detach().clone() for n, p in full.model.named_parameters() if p.requires_grad}
    rows = full.train(progress=False)
    assert len(rows) == 2 and all("actor/pg_loss" in r and "search/solved_rate" in r for r in rows)
    assert rows[0]["memory/tasks"] == rows[0]["search/solved_tasks"] > 0
    assert all(t.success for t in full.memory.values())
    # the fit clones in task order, whichever order the search finished the tasks in
    shuffled = dict(reversed(list(full.memory.items())))
    assert len(shuffled) > 1 and list(shuffled) != sorted(shuffled)
    full.memory = shuffled
    assert [t.task_id for t in full.clone_data()] == sorted(shuffled) + [t.task_id for t in full.experts]
    assert any(not torch.equal(before[n], p) for n, p in full.model.named_parameters() if n in before)
    # killed after iteration 1: the checkpoint brings back the memory and reproduces iteration 2
    short = BranchBCTrainer(make(), ENV, _cfg(iterations=1), env_kwargs=TEXT, out_dir=tmp_path / "killed")
    short.train(progress=False)
    resumed = BranchBCTrainer(make(), ENV, _cfg(), env_kwargs=TEXT, out_dir=tmp_path / "killed")
    resumed.setup()
    resumed.load(tmp_path / "killed" / "checkpoint")
    assert set(resumed.memory) == set(short.memory) and resumed.screened == short.screened
    nxt = resumed.step()
    for key in ("rollout/success", "rollout/env_steps", "memory/tasks", "actor/pg_loss"):
        assert nxt[key] == pytest.approx(rows[1][key], rel=1e-5, abs=1e-6), key
    # the fit calls back after each epoch, in eval mode (scripts/clone_epochs.py evaluates there)
    seen = []
    resumed.clone(list(resumed.memory.values()), on_epoch=lambda e: seen.append((e, resumed.model.training)))
    assert seen == [(e, False) for e in range(1, resumed.cfg.actor_epochs + 1)] and not resumed.model.training


def test_branch_bc_config_is_validated():
    with pytest.raises(ValueError, match=">= 1"):
        BranchBCConfig(branch_width=0)
    with pytest.raises(ValueError, match="branch_by"):
        BranchBCConfig(branch_by="room")
    with pytest.raises(ValueError, match="branch_pick"):
        BranchBCConfig(branch_pick="first")
    with pytest.raises(TypeError):  # its own knobs only: no PPO loss, no sampling temperature
        BranchBCConfig(pg_loss="ppo")


def test_branch_bc_applies_its_kl_guard(tiny_tokenizer, tmp_path):
    """kl_coef > 0 keeps a frozen copy of the starting policy and pulls the clone update toward it.
    (Before the likelihood update was shared with SFT, the copy was built and never used.)"""
    make = lambda: _EveryGuess(build_tiny_model(tiny_tokenizer), tiny_tokenizer, generation_dtype=torch.float32)
    params = {}
    for kl in (0.0, 1.0):
        trainer = BranchBCTrainer(make(), ENV, _cfg(iterations=1, kl_coef=kl, actor_epochs=3, minibatch_size=1,
                                                    actor_lr=1e-2), env_kwargs=TEXT, out_dir=tmp_path / str(kl))
        row = trainer.train(progress=False)[0]
        params[kl] = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        if kl:
            assert row["actor/kl"] > 0  # the policy moved away from the reference, and the loss saw it
        else:
            assert row["actor/kl"] == 0.0
    assert any(not torch.equal(params[0.0][n], params[1.0][n]) for n in params[0.0])


def test_decision_position_is_the_least_certain_token_first_on_a_tie():
    assert decision_position([-0.01, -0.9, -0.2, -0.9]) == 1
    assert decision_position([-0.3]) == 0


def test_runner_up_heads_keep_the_prefix_and_skip_tokens_that_make_the_same_reply():
    surface = {1: "go", 2: "north", 3: "north", 4: "south", 5: "east", 6: "west"}.__getitem__
    # at position 1 the recorded token is 2; token 3 (" North", the same surface) makes the same reply
    heads = runner_up_heads([1, 2, 9], 1, [(2, -0.1), (3, -2.0), (4, -2.5), (5, -3.0), (6, -4.0)],
                            [-0.05], k=2, surface=surface)
    assert heads == [([1, 4], [-0.05, -2.5]), ([1, 5], [-0.05, -3.0])]
    # fewer distinct candidates than k: what there is
    assert runner_up_heads([2], 0, [(2, -0.1), (3, -0.2), (4, -3.0)], [], k=3, surface=surface) == [([4], [-3.0])]


def test_a_branch_continues_from_the_cache_its_runner_up_reply_carries(tiny_tokenizer):
    """The runner-up replies carry their prompt's KV cache; the branch that plays one prefills only
    what follows it, and plays what it plays when it prefills its whole history again."""
    model = build_tiny_model(tiny_tokenizer)
    runs = {}
    for mb in (0, 1024):
        policy = HFPolicy(model, tiny_tokenizer, generation_dtype=torch.float32, packed=True, carried_cache_mb=mb)
        spec, root = _played(policy)
        alts = policy.alternatives([root.prompt_ids(1)], [root.action_ids(1)], 3, max_new_tokens=6)[0]
        assert all((u.cache is not None) == (mb > 0) for u in alts)
        # the tiny model's runner-ups are not guesses (a branch that changes nothing stops at once):
        # play guesses that carry the runner-ups' cache instead
        replies = [dataclasses.replace(_reply(policy, g), cache=u.cache) for g, u in zip("158", alts)]
        before = policy.stats["prefill_tokens"]
        specs = [EpisodeSpec(spec.task_id, spec.seed, greedy=True, parent=root, replay_turns=1, reply=u, free_turns=1)
                 for u in replies]
        played = rollout(policy, make_env_factory(ENV, **TEXT), specs, sampling=SamplingParams(max_new_tokens=6),
                         progress=False)
        assert all(len(t.turns) == 3 for t in played)
        runs[mb] = ([[t.action_ids(k) for k in range(3)] for t in played], policy.stats["prefill_tokens"] - before)
        cached = alts[0].cache.ids if mb else None
        del alts, replies, specs
        gc.collect()
        assert policy._carried == {}  # the played branches keep none of the carried caches alive
    assert runs[1024][0] == runs[0][0]  # the same branches, token for token
    # with the cache, a branch's one policy turn computes only what follows the replayed prompt
    assert runs[1024][1] == sum(len(t.prompt_ids(2)) - common_prefix(cached, t.prompt_ids(2)) for t in played)
    assert runs[1024][1] < runs[0][1]


def test_carried_caches_stay_within_their_budget_and_are_released_with_their_replies(tiny_tokenizer):
    policy = HFPolicy(build_tiny_model(tiny_tokenizer), tiny_tokenizer, generation_dtype=torch.float32, packed=True)
    _, root = _played(policy)
    points = [(root.prompt_ids(k), root.action_ids(k)) for k in range(2)]
    one = policy.alternatives([points[0][0]], [points[0][1]], 2, max_new_tokens=6)[0][0].cache
    policy.carried_cache_bytes = sum(t.numel() * t.element_size() for t in one.keys + one.values)  # room for one
    del one
    gc.collect()
    alts = policy.alternatives([p for p, _ in points], [a for _, a in points], 2, max_new_tokens=6)
    assert [[u.cache is not None for u in row] for row in alts] == [[True, True], [False, False]]
    del alts
    gc.collect()
    assert policy._carried == {}  # released with the replies that held them


def test_a_failed_keep_cache_episode_scores_its_turns_from_its_own_cache(tiny_tokenizer):
    """A failed episode played with ``keep_cache`` keeps its conversation's KV cache, trimmed to its
    tokens; a decision at one of its turns reads it instead of prefilling the turn's history, and
    finds the same runner-ups (fp32). A success keeps none."""
    policy = HFPolicy(build_tiny_model(tiny_tokenizer), tiny_tokenizer, generation_dtype=torch.float32, packed=True)
    make = make_env_factory(ENV, **TEXT)
    sampling = SamplingParams(1.0, max_new_tokens=6, seed=1)
    root = rollout(policy, make, [EpisodeSpec("4", 7, keep_cache=True)], sampling=sampling, progress=False)[0]
    assert not root.success and root.cache is not None
    assert root.cache.ids == root.record.ids[: len(root.cache.ids)] and root.cache.capacity == len(root.cache.ids)
    k = len(root.turns) - 1
    prompt, action = root.prompt_ids(k), root.action_ids(k)
    runs = {}
    for name, kw in (("own cache", {"episode_caches": [root.cache]}), ("shared prefix", {})):
        before = policy.stats["prefill_tokens"]
        logp, _ = policy._decision_logprobs([prompt], [action], 6, **kw)
        runs[name] = logp[0], policy.stats["prefill_tokens"] - before
        alts = policy.alternatives([prompt], [action], 3, max_new_tokens=6, **kw)[0]
        runs[name] += ([u.action_ids for u in alts],)
    torch.testing.assert_close(runs["own cache"][0], runs["shared prefix"][0], atol=1e-4, rtol=1e-4)
    assert runs["own cache"][2] == runs["shared prefix"][2]
    assert runs["own cache"][1] == len(action) + 1  # the prompt's last token and the reply: nothing else
    assert runs["shared prefix"][1] > runs["own cache"][1]
    won = rollout(_EveryGuess(policy.model, tiny_tokenizer, generation_dtype=torch.float32), make,
                  [EpisodeSpec("4", 7, greedy=True, parent=root, replay_turns=0, reply=_reply(policy, "4"), keep_cache=True)],
                  sampling=sampling, progress=False)[0]
    assert won.success and won.cache is None


def test_branch_search_releases_the_kept_caches_and_proposes_what_it_proposes_without_them(tiny_tokenizer):
    model = build_tiny_model(tiny_tokenizer)
    make = make_env_factory(ENV, **TEXT)
    runs = []
    for keep in (False, True):
        policy = HFPolicy(model, tiny_tokenizer, generation_dtype=torch.float32, packed=True)
        proposed = []
        own = policy.alternatives
        policy.alternatives = lambda *a, **kw: proposed.append(own(*a, **kw)) or proposed[-1]
        specs = [EpisodeSpec(t, 7, greedy=True, keep_cache=keep) for t in ("3", "4")]
        roots = rollout(policy, make, specs, sampling=SamplingParams(0.0, max_new_tokens=6), progress=False)
        assert all(not r.success and (r.cache is not None) == keep for r in roots)
        before = policy.stats["prefill_tokens"]
        found = branch_search(policy, make, list(zip(specs, roots)), points=2, width=2, depth=2, max_new_tokens=6,
                              by="observation")
        assert all(t.cache is None for t in roots + found)
        runs.append(([[u.action_ids for u in row] for call in proposed for row in call],
                     policy.stats["prefill_tokens"] - before))
        del roots, found, proposed
        gc.collect()
        assert policy._carried == {}  # nothing holds a kept cache once the search is over
    assert runs[1][0] == runs[0][0] and len(runs[0][0]) == 4  # 2 episodes x 2 branch points, the same runner-ups
    assert runs[1][1] < runs[0][1]
