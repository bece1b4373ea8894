"""An iteration's turns as the critic reads them: features, transitions, returns, prompts.

Episodes come as a ``rollout.branching.Tree``: sampled episodes are a tree of roots alone; a search
tree's branches share their parent's turns up to where they left it, and those shared turns belong
to the parent (``Tree.own_turns``), so each turn of the tree is one transition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from turngym.rollout.branching import Tree


def transitions(refs: list[tuple[int, int]], rewards: list[list[float]], s: torch.Tensor):
    """The replay transitions of flat turns: ``(N,)`` reward, ``(N,)`` done and ``(N, ...)`` next
    states (the next flat turn's ``s`` when it is the same episode's next turn; else zeros and done:
    a last turn, or one whose successor carries no tokens, has nothing to bootstrap from).

    Args:
        refs: ``(episode, turn)`` of each flat turn, sorted.
        rewards: Per episode, per turn (after the reward transforms).
        s: ``(N, ...)`` the state of each flat turn.
    """
    n = len(refs)
    r = torch.tensor([rewards[e][k] for e, k in refs], dtype=torch.float32)
    done = torch.ones(n)
    next_s = torch.zeros_like(s)
    for i in range(n - 1):
        (e, k), (e2, k2) = refs[i], refs[i + 1]
        if e == e2 and k2 == k + 1:
            done[i] = 0.0
            next_s[i] = s[i + 1]
    return r, done, next_s


def returns_after(refs: list[tuple[int, int]], rewards: list[list[float]]) -> torch.Tensor:
    """``(N,)`` per flat turn: its episode's summed reward from that turn to its end."""
    return torch.tensor([float(sum(rewards[e][k:])) for e, k in refs])


@dataclass
class Turns:
    """Every turn with tokens of an iteration's episodes, flat: ``refs[i] = (episode, turn)``.

    Attributes:
        s, sa: The critic's inputs for phi(s) and phi(s, a) (features ``(N, H)`` or windows).
        r, done, next_s: The transitions (``transitions``).
        returns: What each turn's episode earned from it on (``returns_after``): a reply's outcome.
        prompts: Each turn's prompt ids (the state a fresh reply is sampled at).
        own: The rows no other episode of the tree holds (each is one transition of the buffer).
        rewards: Per episode, per turn.
    """

    refs: list[tuple[int, int]]
    s: Any
    sa: Any
    r: torch.Tensor
    done: torch.Tensor
    next_s: Any
    returns: torch.Tensor
    prompts: list[list[int]]
    own: list[int]
    rewards: list[list[float]]

    @classmethod
    def build(cls, tree: Tree, refs: list[tuple[int, int]], s: Any, sa: Any, rewards: list[list[float]]) -> Turns:
        if isinstance(s, torch.Tensor):
            r, done, next_s = transitions(refs, rewards, s)
        else:  # windows: states and positions shift alike (a done turn's next window is zeros, its value x 0)
            r, done, states = transitions(refs, rewards, s[0])
            next_s = (states, transitions(refs, rewards, s[1])[2])
        row = {ref: i for i, ref in enumerate(refs)}
        own = [row[(e, k)] for e in range(len(tree.episodes)) for k in tree.own_turns(e) if (e, k) in row]
        prompts = [tree.episodes[e].prompt_ids(k) for e, k in refs]
        return cls(refs, s, sa, r, done, next_s, returns_after(refs, rewards), prompts, own, rewards)

    def transitions(self) -> tuple:
        """``(s, sa, r, done, next_s)``, as the replay buffer's fields."""
        return self.s, self.sa, self.r, self.done, self.next_s

    def row(self) -> dict[tuple[int, int], int]:
        """``(episode, turn) -> row``."""
        return {ref: i for i, ref in enumerate(self.refs)}
