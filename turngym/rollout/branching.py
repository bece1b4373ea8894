"""Branched rollouts: search for a success from the states a failed episode went through.

A failed episode usually goes wrong at one turn and never recovers (on TextWorld, a greedy policy
takes one wrong exit and then paces between two rooms). Sampling whole new episodes finds a
success only when every turn comes out right at once, and after SFT on a few demonstrations the
policy is so sure of its wrong turn (top probability above 0.99) that sampling hardly ever leaves
it. Branching replays the failed episode up to a turn near the mistake (deterministic resets make
the replay exact: the same observations, the same token ids), takes the policy's own runner-up
replies for that turn (``HFPolicy.alternatives``: the next most likely tokens at the reply's least
certain token), and plays each on greedily. Tree-structured rollouts of this kind are used for
agent RL in Tree-GRPO (Ji et al., 2025) and TreeRL (Hou et al., 2025), which also fork at the
least certain tokens. The branch points are the turns just before the episode first came back to
where it had been: by default as the agent saw it (an observation it had already been shown,
``branch_by="observation"``), or by the env's privileged ``state_key`` (``"state_key"``). Among the
turns before that return, ``pick="latest"`` (the default) takes the last ones; ``pick="uncertain"``
the ones where the policy was least sure of its own reply (the lowest recorded log-prob of any of the
reply's tokens): there its runner-ups are replies it nearly gave, not forced ones it gave p ~ 0.003.
Which runner-ups are played is the policy's order by default; a ``rank`` callable (a learner's
critic, say: ``ArcherConfig.branch_rank``) can instead score a larger ``pool`` of them and keep the
``width`` it rates highest, so a value estimate steers the search while the env still decides what won.

    tree = tree_rollout(policy, make_env, specs, stops=["</act>"])   # greedy roots, then the search
    tree.episodes, tree.parent, tree.branch_turn, tree.sibling_groups()

Each branch is a whole episode of its root's task and seed (the replayed turns included) with
``metadata["branch_turn"]``, the turn where it left its parent, and ``metadata["parent"]``, the
parent's index in ``Tree.episodes``. Turns before ``branch_turn`` are the parent's own turns replayed
(the same token ids): consumers train on each episode's ``own_turns`` so a shared prefix counts once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from turngym.agents.base import Policy, SamplingParams
from turngym.clock import CLOCK, bar
from turngym.rollout.episode import EpisodeSpec
from turngym.rollout.sync import rollout
from turngym.types import Message, Trajectory, Utterance

BRANCH_BY = ("observation", "state_key")
BRANCH_PICK = ("latest", "uncertain")
ReplyRanker = Callable[[list[tuple[Trajectory, int]], list[list[Utterance]]], list[list[float]]]


def observation_key(messages: Sequence[Message]) -> str:
    """What the agent was shown, as a key: a hash of the messages' roles and whitespace-normalised text."""
    text = "\n".join(f"{m.role}:{' '.join(m.content.split())}" for m in messages)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def visit_keys(traj: Trajectory, by: str = "observation") -> list[str | None]:
    """The episode's states before turn 0 and after each turn: the observations it was shown
    (``by="observation"``; the opening observation is its last message) or the env's ``state_key``s."""
    if by == "observation":
        first = traj.initial_observation[-1:] if traj.initial_observation else []
        return [observation_key(first)] + [observation_key(t.observation) for t in traj.turns]
    if by == "state_key":
        return [traj.metadata.get("initial_state_key")] + [t.info.get("state_key") for t in traj.turns]
    raise ValueError(f"branch_by must be one of {BRANCH_BY}, got {by!r}")


def reply_certainty(traj: Trajectory, j: int) -> float:
    """How sure the policy was of turn ``j``'s reply: the lowest raw log-prob recorded for any of its
    sampled tokens (0.0, sure, for a turn without a record or without log-probs)."""
    span = traj.turns[j].span
    if traj.record is None or span is None:
        return 0.0
    known = [x for x in traj.record.logprobs[span[0]:span[1]] if not math.isnan(x)]
    return min(known, default=0.0)


def branch_points(traj: Trajectory, points: int, after: int = 0, by: str = "state_key",
                  pick: str = "latest") -> list[int]:
    """The turns of ``traj`` worth branching at, at most ``points`` of them, none before ``after``,
    the latest first.

    The episode's states are ``visit_keys(traj, by)``. The first turn that leads back to a state
    already visited (a loop, or a refused action that changed nothing) is where the episode went
    wrong, or the turn after the mistake: the candidates are that turn and the ones before it
    (without a return, or without keys, every turn). ``pick="latest"`` takes the last candidates;
    ``pick="uncertain"`` the ones whose reply the policy was least sure of (``reply_certainty``;
    ties go to the later turn).
    """
    if pick not in BRANCH_PICK:
        raise ValueError(f"branch_pick must be one of {BRANCH_PICK}, got {pick!r}")
    n = len(traj.turns)
    keys = visit_keys(traj, by)
    end = n
    if None not in keys:
        end = next((k for k in range(1, len(keys)) if keys[k] in keys[:k]), n)  # turn end-1 returned
    if pick == "latest":
        return list(range(end - 1, max(after, end - points) - 1, -1))
    least_sure = sorted(range(after, end), key=lambda j: (reply_certainty(traj, j), -j))[:points]
    return sorted(least_sure, reverse=True)


def branch_search(policy: Policy, make_env: Any, roots: list[tuple[EpisodeSpec, Trajectory]], *,
                  stops: Sequence[str] = (), points: int = 2, width: int = 3, depth: int = 1,
                  max_new_tokens: int = 64, num_envs: int = 32, workers: bool | str = False,
                  pools: Any = None, by: str = "state_key", pick: str = "latest", progress: bool | str = False,
                  from_wins: bool = False, rank: ReplyRanker | None = None, pool: int = 0,
                  keep_no_ops: bool = False) -> list[Trajectory]:
    """Branches of the failed ``roots``, searched ``depth`` levels deep.

    At each branch point (``branch_points``) the policy's ``width`` runner-up replies
    (``policy.alternatives``) are each played on greedily to the end; a reply the env refuses or
    that changes nothing ends its branch at once. With ``depth`` > 1, branches that failed are
    branched again after their own branch turn, for the tasks still without a success.

    Args:
        policy: Has ``alternatives(prompts, actions, k, stops, max_new_tokens)`` (``HFPolicy``)
            and a token record, since prefixes are replayed.
        make_env: The env factory the roots were played with.
        roots: ``(spec, trajectory)`` pairs; successful roots (and their tasks) are skipped
            unless ``from_wins``.
        stops: The env's tool-format stop strings. points: Branch points per episode.
        width: Alternatives per branch point. depth: Search levels.
        max_new_tokens, num_envs, workers, pools: As when sampling / for ``rollout``.
        by: How branch points see a return to an earlier state (``visit_keys``).
        pick: Which turns before it are branched (``branch_points``): the latest, or the least certain.
        progress: A progress bar per search level (a string names it).
        from_wins: Also branch the won roots (at their last turns: nothing came back) and keep
            searching a task after a branch of it won. A search for successes does not need this;
            a critic learning Q(s, a) - V(s) does: a won root's runner-ups are mostly replies that
            lose, and a pair that earned differently at one state is the contrast it learns from.
        rank: Scores replies: ``rank(points, replies)``, ``points`` a list of ``(episode, turn)`` and
            ``replies`` the candidate utterances at each, returns a score per candidate (higher is
            played first). With it, ``pool`` (> ``width``) runner-ups are proposed per point and the
            ``width`` best scored are played (``keep_top``). None: the policy's first ``width``.
        pool: Runner-ups proposed per point for ``rank`` to choose from.
        keep_no_ops: Also return the branches that ended at once because the env refused their reply
            or it changed nothing (``metadata["stopped"] == "branch_no_op"``: one own turn, truncated,
            never branched again). A search has no use for them; a critic that will later choose
            among replies does: without them it never learns what a refused reply is worth.

    Returns:
        Every finished branch (each a whole episode, with ``metadata["branch_turn"]`` and
        ``metadata["parent"]``: the parent's index in ``roots`` followed by the returned list).

    Raises:
        ValueError: the policy cannot propose alternatives.
    """
    if not hasattr(policy, "alternatives"):
        raise ValueError(f"{type(policy).__name__} cannot propose alternative replies; branching needs an HFPolicy")
    if rank is not None and pool <= width:
        raise ValueError(f"ranking replies needs a pool larger than the width ({width}), got {pool}")
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    found: list[Trajectory] = []
    solved = set() if from_wins else {t.task_id for _, t in roots if t.success}
    level = [(s, t, 0, i) for i, (s, t) in enumerate(roots) if from_wins or not t.success]  # (spec, episode, after, index)
    for level_no in range(depth):
        at = [(spec, traj, j, node) for spec, traj, after, node in level if traj.task_id not in solved
              for j in branch_points(traj, points, after, by, pick)]
        name = f"{progress if isinstance(progress, str) else 'search'} {level_no + 1}/{depth}"
        alts = _alternatives(policy, at, pool if rank else width, stops, max_new_tokens,
                             f"{name} runner-ups" if progress else None)
        if rank is not None and at:
            alts = [keep_top(r, sc, width) for r, sc in zip(alts, rank([(t, j) for _, t, j, _ in at], alts))]
        for _, traj, _, _ in level:
            traj.cache = None  # also the episodes with no branch point left: nothing scores from them now
        again = level_no + 1 < depth  # a failed branch is branched again: it keeps its cache where its root did
        specs, turns = [], []
        for (spec, traj, j, node), replies in zip(at, alts):
            for alt in replies:  # the branch shares traj's record up to turn j, then plays alt there
                specs.append(EpisodeSpec(spec.task_id, spec.seed, greedy=True, parent=traj, replay_turns=j, reply=alt,
                                         keep_cache=again and spec.keep_cache))
                turns.append((j, node))
        if not specs:
            break
        played = rollout(policy, make_env, specs, sampling=greedy, num_envs=num_envs, workers=workers,
                         progress=name if progress else False, pools=pools)
        kept = []
        for spec, (j, node), t in zip(specs, turns, played):
            t.metadata["branch_turn"], t.metadata["parent"] = j, node
            if not t.metadata.get("error") and (keep_no_ops or not is_no_op(t)):
                kept.append((spec, t, len(roots) + len(found) + len(kept)))
        found += [t for _, t, _ in kept]
        if not from_wins:
            solved |= {t.task_id for _, t, _ in kept if t.success}
        level = [(s, t, t.metadata["branch_turn"] + 1, node) for s, t, node in kept
                 if not t.success and not is_no_op(t)]
    return found


def is_no_op(traj: Trajectory) -> bool:
    """Whether a branch ended at its own first turn: the env refused the reply or it changed nothing."""
    return traj.metadata.get("stopped") == "branch_no_op"


def keep_top(replies: list, scores: Sequence[float], width: int) -> list:
    """The ``width`` replies with the highest scores, in that order (ties keep the policy's order)."""
    if len(scores) != len(replies):
        raise ValueError(f"a ranker gave {len(scores)} scores for {len(replies)} replies")
    order = sorted(range(len(replies)), key=lambda i: -float(scores[i]))
    return [replies[i] for i in order[:width]]


def _alternatives(policy: Policy, at: list, width: int, stops: Sequence[str], max_new_tokens: int,
                  bar_name: str | None, chunk: int = 16) -> list[list]:
    """``policy.alternatives`` at every branch point of ``at``, ``chunk`` points a call, so a bar
    (``bar_name``) can show the scoring of long prompts move. An episode's KV cache (``keep_cache``)
    scores its points and is released after its last one, so the budget it shares with the runner-ups'
    carried caches goes to them."""
    out: list[list] = []
    last = {id(t): i for i, (_, t, _, _) in enumerate(at)}
    with bar(len(at), bar_name or "", "point", disable=bar_name is None) as shown, CLOCK.kind("generation"):
        for i in range(0, len(at), chunk):
            part = at[i : i + chunk]
            held = [t.cache for _, t, _, _ in part]
            kw = {"episode_caches": held} if any(c is not None for c in held) else {}
            out += policy.alternatives([t.prompt_ids(j) for _, t, j, _ in part], [t.action_ids(j) for _, t, j, _ in part],
                                       width, stops, max_new_tokens, **kw)
            del held, kw
            for _, t, _, _ in part:
                if last[id(t)] < i + chunk:
                    t.cache = None
            shown.update(len(part))
    return out


@dataclass
class Tree:
    """A tree rollout: root episodes, then the branches searched from them.

    Attributes:
        episodes: Roots first, then branches, each a whole episode.
        parent: Per episode, its parent's index (-1 for a root).
        branch_turn: Per episode, the first turn that is its own (0 for a root): earlier turns
            replay its parent's.
    """

    episodes: list[Trajectory] = field(default_factory=list)
    parent: list[int] = field(default_factory=list)
    branch_turn: list[int] = field(default_factory=list)

    @classmethod
    def from_search(cls, roots: list[Trajectory], branches: list[Trajectory]) -> Tree:
        return cls(list(roots) + list(branches), [-1] * len(roots) + [b.metadata["parent"] for b in branches],
                   [0] * len(roots) + [b.metadata["branch_turn"] for b in branches])

    @property
    def roots(self) -> list[Trajectory]:
        return [e for e, p in zip(self.episodes, self.parent) if p < 0]

    def own_turns(self, i: int) -> range:
        """Turn indices of episode ``i`` that no other episode of the tree holds."""
        return range(self.branch_turn[i], len(self.episodes[i].turns))

    def sibling_groups(self, no_ops: bool = False) -> list[list[tuple[int, int]]]:
        """``(episode, turn)`` pairs that are different actions from one state: a parent's turn j
        (first) and the first turn of every branch that left it at turn j. Each action's episode plays
        on from it (greedily), so that episode's outcome is the action's label. Groups of one are left
        out, and so are no-op branches (``is_no_op``) unless ``no_ops``: a refused reply is told from an
        accepted one by the env's message alone, so ranking it below its siblings says nothing about
        the critic (but a critic that acts is offered such replies too)."""
        groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for i, (p, j) in enumerate(zip(self.parent, self.branch_turn)):
            if p >= 0 and (no_ops or not is_no_op(self.episodes[i])):
                groups.setdefault((p, j), [(p, j)]).append((i, j))
        return [g for g in groups.values() if len(g) > 1]


def tree_rollout(policy: Policy, make_env: Any, specs: list[EpisodeSpec], *, stops: Sequence[str] = (),
                 points: int = 2, width: int = 3, depth: int = 1, max_new_tokens: int = 64, num_envs: int = 32,
                 workers: bool | str = False, pools: Any = None, by: str = "observation", pick: str = "latest",
                 roots: list[Trajectory] | None = None, from_wins: bool = False, rank: ReplyRanker | None = None,
                 pool: int = 0, keep_no_ops: bool = False) -> Tree:
    """Play ``specs`` greedily (the roots), then ``branch_search`` from the failed ones.

    Args:
        policy, make_env, stops, points, width, depth, max_new_tokens, num_envs, workers, pools, by, pick, from_wins,
        rank, pool, keep_no_ops:
            As for ``branch_search``.
        specs: One greedy episode each (reset seeds fixed, so every replay is exact).
        roots: The roots, already played from ``specs`` (a caller that screened them itself).

    Returns:
        The ``Tree``: roots in ``specs``' order, then every kept branch.
    """
    if roots is None:
        roots = rollout(policy, make_env, [dataclasses.replace(s, greedy=True) for s in specs],
                        sampling=SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens),
                        num_envs=num_envs, workers=workers, progress=False, pools=pools)
    found = branch_search(policy, make_env, list(zip(specs, roots)), stops=stops, points=points, width=width,
                          depth=depth, max_new_tokens=max_new_tokens, num_envs=num_envs, workers=workers,
                          pools=pools, by=by, pick=pick, from_wins=from_wins, rank=rank, pool=pool,
                          keep_no_ops=keep_no_ops)
    return Tree.from_search(roots, found)
