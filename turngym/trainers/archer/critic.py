"""ArCHer's high level: the utterance-level critic, its target copy, its replay buffer and its TD loss.

As the paper's official code has it (``archer/models/critic.py``, ``archer/algorithms/archer/trainer.py``):
two Q heads read ``[phi(s), phi(s, a)]`` and two V heads read ``phi(s)``, where ``phi`` is an encoder
of the conversation that trains with the heads; a target copy follows the critic by Polyak averaging;
the loss regresses each head on its target:

    y_Qi = r + gamma * (1 - done) * V_i,target(s')       Q_i(s, a)  -> y_Qi      (a: the recorded reply)
    y_Vi = Q_i,target(s, a'),  a' ~ pi(. | s)            V_i(s)     -> y_Vi      (a': a fresh reply)

and the actor's advantage is ``A(s, a') = min(Q1, Q2)(s, a') - min(V1, V2)(s)``.

The math is pure (``td_targets``, ``advantage``, ``polyak``); ``td_loss`` calls no backward.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from turngym.trainers.archer.encoder import Window

Features = torch.Tensor | Window
"""A batch of states or state-actions: ``(N, H)`` features from a frozen encoder, or the windows
``(N, W, H), (N, W)`` that the critic's own encoder reads (``encoder.TrunkTopEncoder``)."""


# ----- the math ---------------------------------------------------------------------------------
def td_target(reward: torch.Tensor, next_value: torch.Tensor, done: torch.Tensor, gamma: float) -> torch.Tensor:
    """One-step TD target ``y = r + gamma * (1 - done) * V_target(s')``, all ``(N,)``."""
    return reward + gamma * (1.0 - done.float()) * next_value


def double_min(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """Clipped double estimates: ``min(x1, x2)`` elementwise, against over-estimation (Fujimoto et al. 2018)."""
    return torch.minimum(x1, x2)


def advantage(q1: torch.Tensor, q2: torch.Tensor, v1: torch.Tensor, v2: torch.Tensor) -> torch.Tensor:
    """ArCHer's utterance advantage ``A(s, a) = min(Q1, Q2)(s, a) - min(V1, V2)(s)``, ``(N,)``."""
    return double_min(q1, q2) - double_min(v1, v2)


def polyak(target: torch.Tensor, online: torch.Tensor, tau: float) -> torch.Tensor:
    """Soft target update ``theta_target <- tau * theta + (1 - tau) * theta_target``."""
    return tau * online + (1.0 - tau) * target


# ----- the critic ---------------------------------------------------------------------------------
class ValueHead(nn.Module):
    """A 2-layer MLP from features to one scalar."""

    def __init__(self, feat_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(feat_dim), nn.Linear(feat_dim, hidden_dim), nn.GELU(),
                                 nn.Linear(hidden_dim, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)


class UtteranceCritic(nn.Module):
    """Q1(s, a), Q2(s, a), V1(s) and V2(s) over an encoder's features.

    Args:
        feat_dim: The encoder's feature size ``H``.
        hidden_dim: The heads' width.
        encoder: Windows -> ``(N, H)`` features, trained with the heads (``TrunkTopEncoder``); None
            when the inputs are already features (a frozen encoder's).
    """

    def __init__(self, feat_dim: int, hidden_dim: int = 256, encoder: nn.Module | None = None) -> None:
        super().__init__()
        self.encoder = encoder
        # Q reads [phi(s), phi(s, a)] as the official critic does: a causal LM's state at the reply's last
        # token is dominated by the reply's own tokens, and without phi(s) one state looks like another
        self.q1, self.q2 = ValueHead(2 * feat_dim, hidden_dim), ValueHead(2 * feat_dim, hidden_dim)
        self.v1, self.v2 = ValueHead(feat_dim, hidden_dim), ValueHead(feat_dim, hidden_dim)

    def encode(self, x: Features) -> torch.Tensor:
        """``(N, H)`` features: a feature tensor passes through, windows go through the encoder."""
        return x if isinstance(x, torch.Tensor) else self.encoder(*x)

    def q_values(self, s: Features, sa: Features) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([self.encode(s), self.encode(sa)], dim=-1)
        return self.q1(x), self.q2(x)

    def values(self, s: Features) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.encode(s)
        return self.v1(s), self.v2(s)

    def value(self, s: Features) -> torch.Tensor:
        """``min(V1, V2)(s)``: the state's value as the actor's advantage reads it."""
        return double_min(*self.values(s))

    def advantage(self, s: Features, sa: Features) -> torch.Tensor:
        """``min(Q1, Q2)(s, a) - min(V1, V2)(s)`` (``advantage``), the state encoded once."""
        s = self.encode(s)
        return advantage(*self.q_values(s, sa), *self.values(s))


def make_target(critic: UtteranceCritic) -> UtteranceCritic:
    """A frozen copy for TD targets (its encoder too), moved toward the critic by ``soft_update``."""
    target = copy.deepcopy(critic)
    for p in target.parameters():
        p.requires_grad_(False)
    return target


@torch.no_grad()
def soft_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """Polyak-average every parameter of ``target`` toward ``online`` (``polyak``)."""
    for t, o in zip(target.parameters(), online.parameters()):
        t.copy_(polyak(t, o, tau))


def td_loss(critic: UtteranceCritic, target: UtteranceCritic, b: dict, gamma: float) -> tuple[torch.Tensor, dict]:
    """ArCHer's critic loss on one minibatch: no backward, no step.

    Args:
        b: ``s``, ``sa`` (the recorded reply), ``reward``, ``done``, ``next_s`` and ``fresh_sa``
            (a fresh reply a' ~ pi(s) from the current actor), each with leading size ``N``.

    Returns:
        The summed MSE of the four heads (differentiable in ``critic``) and its metrics.
    """
    with torch.no_grad():
        tv1, tv2 = target.values(b["next_s"])
        y_q1, y_q2 = td_target(b["reward"], tv1, b["done"], gamma), td_target(b["reward"], tv2, b["done"], gamma)
        y_v1, y_v2 = target.q_values(b["s"], b["fresh_sa"])
    s = critic.encode(b["s"])  # once for Q and V: windows cost K blocks each
    q1, q2 = critic.q_values(s, b["sa"])
    v1, v2 = critic.values(s)
    mse = nn.functional.mse_loss
    q_loss, v_loss = mse(q1, y_q1) + mse(q2, y_q2), mse(v1, y_v1) + mse(v2, y_v2)
    stats = {"critic/q_loss": q_loss.item(), "critic/v_loss": v_loss.item(),
             "critic/td_error": (q1.detach() - y_q1).abs().mean().item(), "critic/q1_mean": q1.mean().item(),
             "critic/v1_mean": v1.mean().item(), "critic/target_mean": y_q1.mean().item()}
    return q_loss + v_loss, stats


# ----- the replay buffer -----------------------------------------------------------------------
class ReplayBuffer:
    """A ring buffer of utterance transitions ``(s, a, r, done, s')``: each state's and
    state-action's features (or windows: the states ``(W, H)`` in the field itself, their ``(W,)``
    positions in ``<field>_pos``), each state's prompt token ids, from which the actor samples fresh
    replies, and the episode each transition came from. Storage is allocated at the first ``add`` and
    doubles as it fills, up to ``capacity``; windows are kept in ``store_dtype``.

    Args:
        capacity: The oldest transitions are overwritten past this.
        seed: Seeds ``sample`` (its state is checkpointed).
        store_dtype: dtype of stored features (bf16 halves a window's memory; reads come back fp32).
    """

    FIELDS = ("s", "sa", "reward", "done", "next_s")

    def __init__(self, capacity: int, seed: int = 0, store_dtype: torch.dtype = torch.float32) -> None:
        self.capacity, self.store_dtype = capacity, store_dtype
        self.data: dict[str, torch.Tensor] = {}
        self.prompts: list[torch.Tensor | None] = []
        self.size = self.ptr = 0
        self.gen = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return self.size

    def add(self, s: Features, sa: Features, reward: torch.Tensor, done: torch.Tensor, next_s: Features,
            prompts: list[list[int]], episodes: torch.Tensor | None = None) -> None:
        """Append ``n`` transitions (each argument, or each part of a window, has leading size ``n``;
        ``episodes``: an id per transition, default one episode each)."""
        items: dict[str, torch.Tensor] = {}
        for f, x in zip(self.FIELDS, (s, sa, reward, done, next_s)):
            items.update({f: x[0], f + "_pos": x[1]} if isinstance(x, tuple) else {f: x})
        n = reward.shape[0]
        items["episode"] = episodes if episodes is not None else torch.arange(self.ptr, self.ptr + n) + 2**40
        if len(prompts) != n:
            raise ValueError(f"{len(prompts)} prompts for {n} transitions")
        self._reserve(items, min(self.capacity, self.size + n))
        for i in range(n):
            for k, x in items.items():
                self.data[k][self.ptr] = x[i]
            ids = torch.tensor(prompts[i], dtype=torch.int32)
            if self.ptr < len(self.prompts):
                self.prompts[self.ptr] = ids
            else:
                self.prompts.append(ids)
            self.ptr = (self.ptr + 1) % self.capacity
            self.size = min(self.size + 1, self.capacity)

    def _reserve(self, like: dict[str, torch.Tensor], rows: int) -> None:
        if self.data and set(like) != set(self.data):
            raise ValueError(f"transitions with fields {sorted(like)} in a buffer of {sorted(self.data)}")
        have = next(iter(self.data.values())).shape[0] if self.data else 0
        if rows <= have:
            return
        rows = min(self.capacity, max(rows, 2 * have))
        for k, x in like.items():
            dtype = self.store_dtype if x.is_floating_point() and x.dim() > 1 else x.dtype
            grown = x.new_zeros((rows, *x.shape[1:]), dtype=dtype)
            if have:
                grown[:have] = self.data[k]
            self.data[k] = grown

    def get(self, f: str, idx: torch.Tensor) -> Features:
        """Rows ``idx`` of field ``f`` (float fields as fp32; a window as its pair)."""
        x = self.data[f][idx]
        x = x.float() if x.is_floating_point() else x
        return (x, self.data[f + "_pos"][idx]) if f + "_pos" in self.data else x

    def sample_rows(self, n: int) -> torch.Tensor:
        """``n`` row indices drawn uniformly with replacement (the official buffer's sampling)."""
        return torch.randint(0, self.size, (n,), generator=self.gen)

    def sample_episodes(self, n: int) -> list[list[int]]:
        """Whole episodes' rows, each episode's in turn order (its prompts grow), drawn until they hold
        at least ``n`` transitions: an episode is drawn through one of its transitions, uniformly, so
        with probability in proportion to its turns held. Why whole episodes: one episode's states
        are prefixes of each other, so a fresh reply at each of them costs one forward over the
        episode, not one per state (``ArcherTrainer.sample_replies``)."""
        ids = self.data["episode"][: self.size]
        groups, held, seen = [], 0, set()
        for r in torch.randperm(self.size, generator=self.gen).tolist():
            e = int(ids[r])
            if e in seen:
                continue
            seen.add(e)
            rows = sorted((ids == e).nonzero().flatten().tolist(), key=lambda i: len(self.prompts[i]))
            groups.append(rows)
            held += len(rows)
            if held >= n:
                break
        return groups

    def prompt(self, i: int) -> list[int]:
        return self.prompts[i].tolist()

    def state_dict(self) -> dict:
        return {"data": {k: x[: self.size].clone() for k, x in self.data.items()},
                "prompts": list(self.prompts[: self.size]), "ptr": self.ptr, "gen": self.gen.get_state()}

    def load_state_dict(self, d: dict) -> None:
        items = d["data"]
        n = items["reward"].shape[0] if items else 0
        self.data = {}
        if n:
            self._reserve(items, n)
            for k, x in items.items():
                self.data[k][:n] = x
        self.prompts = list(d["prompts"])
        self.size, self.ptr = n, d["ptr"]
        self.gen.set_state(d["gen"])
