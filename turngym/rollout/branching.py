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
least certain tokens; the branch points here come from the env's ``state_key``: the turns just
before the episode first returned to a state it had been in.

    found = branch_search(policy, make_env, [(spec, failed_traj)], stops=["</act>"])

Each returned trajectory is a whole episode of its root's task and seed (the replayed turns
included) with ``metadata["branch_turn"]``, the turn where it left the root.
"""

from __future__ import annotations

from typing import Any, Sequence

from turngym.agents.base import Policy, SamplingParams
from turngym.rollout.episode import EpisodeSpec
from turngym.rollout.sync import rollout
from turngym.types import Trajectory


def branch_points(traj: Trajectory, points: int, after: int = 0) -> list[int]:
    """The turns of ``traj`` worth branching at, at most ``points`` of them, none before ``after``.

    The episode's states are its ``initial_state_key`` and each turn's ``state_key``. The first turn
    that leads back to a state already visited (a loop, or a refused action that changed nothing)
    is where the episode went wrong, or the turn after the mistake: the branch points are that turn
    and the ones before it, the latest first. Without a return (or without state keys), the last turns.
    """
    n = len(traj.turns)
    keys = [traj.metadata.get("initial_state_key")] + [t.info.get("state_key") for t in traj.turns]
    end = n
    if None not in keys:
        end = next((k for k in range(1, len(keys)) if keys[k] in keys[:k]), n)  # turn end-1 returned
    return list(range(end - 1, max(after, end - points) - 1, -1))


def branch_search(policy: Policy, make_env: Any, roots: list[tuple[EpisodeSpec, Trajectory]], *,
                  stops: Sequence[str] = (), points: int = 2, width: int = 3, depth: int = 1,
                  max_new_tokens: int = 64, num_envs: int = 32, workers: bool | str = False,
                  pools: Any = None) -> list[Trajectory]:
    """Branches of the failed ``roots``, searched ``depth`` levels deep.

    At each branch point (``branch_points``) the policy's ``width`` runner-up replies
    (``policy.alternatives``) are each played on greedily to the end; a reply the env refuses or
    that changes nothing ends its branch at once. With ``depth`` > 1, branches that failed are
    branched again after their own branch turn, for the tasks still without a success.

    Args:
        policy: Has ``alternatives(prompts, actions, k, stops, max_new_tokens)`` (``HFPolicy``)
            and a token record, since prefixes are replayed.
        make_env: The env factory the roots were played with.
        roots: ``(spec, trajectory)`` pairs; successful roots (and their tasks) are skipped.
        stops: The env's tool-format stop strings. points: Branch points per episode.
        width: Alternatives per branch point. depth: Search levels.
        max_new_tokens, num_envs, workers, pools: As when sampling / for ``rollout``.

    Returns:
        Every finished branch (each a whole episode, with ``metadata["branch_turn"]``).

    Raises:
        ValueError: the policy cannot propose alternatives.
    """
    if not hasattr(policy, "alternatives"):
        raise ValueError(f"{type(policy).__name__} cannot propose alternative replies; branching needs an HFPolicy")
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    found: list[Trajectory] = []
    solved = {t.task_id for _, t in roots if t.success}
    level = [(s, t, 0) for s, t in roots if not t.success]
    for _ in range(depth):
        at = [(spec, traj, j) for spec, traj, after in level if traj.task_id not in solved
              for j in branch_points(traj, points, after)]
        alts = policy.alternatives([t.prompt_ids(j) for _, t, j in at], [t.action_ids(j) for _, t, j in at],
                                   width, stops, max_new_tokens) if at else []
        specs, turns = [], []
        for (spec, traj, j), replies in zip(at, alts):
            for alt in replies:  # the branch shares traj's record up to turn j, then plays alt there
                specs.append(EpisodeSpec(spec.task_id, spec.seed, greedy=True, parent=traj, replay_turns=j, reply=alt))
                turns.append(j)
        if not specs:
            break
        played = rollout(policy, make_env, specs, sampling=greedy, num_envs=num_envs, workers=workers,
                         progress=False, pools=pools)
        kept = []
        for spec, j, t in zip(specs, turns, played):
            t.metadata["branch_turn"] = j
            if not t.metadata.get("error") and t.metadata.get("stopped") != "branch_no_op":
                kept.append((spec, t))
        found += [t for _, t in kept]
        solved |= {t.task_id for _, t in kept if t.success}
        level = [(s, t, t.metadata["branch_turn"] + 1) for s, t in kept if not t.success]
    return found
