"""ArCHer's high level: the utterance critic (double Q and V heads over features, or over its own
encoder's), its Polyak-averaged target copy, and the replay buffer of turn transitions.

``turngym.trainers.archer`` trains them (the TD loss and the iteration live there).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from turngym.trainers import functional as Fn
from turngym.trainers.critic_encoder import Window


# ----- the critic: double Q heads and a V head over features (or its own encoder's) -----------
class ValueHead(nn.Module):
    """A 2-layer MLP from features to one scalar or to ``num_atoms`` categorical logits."""

    def __init__(self, feat_dim: int, hidden_dim: int, out_dim: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.LayerNorm(feat_dim), nn.Linear(feat_dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, out_dim)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        return out.squeeze(-1) if out.shape[-1] == 1 else out


class UtteranceCritic(nn.Module):
    """Q1(s, a), Q2(s, a) and V(s) heads over features.

    A state or state-action input is its ``(N, H)`` feature from a frozen encoder, or a ``Window``
    of trunk states that the critic's own ``encoder`` turns into one (``critic_encoder=top:K``).

    Args:
        feat_dim: Encoder hidden size.
        hidden_dim: MLP width.
        categorical: Heads output logits over ``num_atoms`` bins in ``[v_min, v_max]`` and are
            trained by cross-entropy to an HL-Gauss histogram ("classification, not regression").
        encoder: Windows ``(N, W, H), (N, W)`` -> ``(N, H)`` features; trained with the heads and
            copied into the target critic (``make_target``).
    """

    def __init__(
        self,
        feat_dim: int,
        hidden_dim: int = 256,
        categorical: bool = False,
        num_atoms: int = 51,
        v_min: float = -1.0,
        v_max: float = 1.0,
        encoder: nn.Module | None = None,
    ) -> None:
        super().__init__()
        out = num_atoms if categorical else 1
        self.encoder = encoder
        self.categorical = categorical
        # Q reads [phi(s), phi(s, a)]: a causal LM's state at the action's last token is dominated by
        # the action's own tokens, and without phi(s) the heads cannot tell one state from another
        # (seen in practice: "take coin" valued highly in every room).
        self.q1 = ValueHead(2 * feat_dim, hidden_dim, out)
        self.q2 = ValueHead(2 * feat_dim, hidden_dim, out)
        self.v = ValueHead(feat_dim, hidden_dim, out)
        self.register_buffer("support", torch.linspace(v_min, v_max, num_atoms))
        # sigma = 0.75 bin widths, the paper's recommended ratio
        self.sigma = 0.75 * (v_max - v_min) / max(num_atoms - 1, 1)

    def scalar(self, raw: torch.Tensor) -> torch.Tensor:
        return Fn.categorical_expectation(raw, self.support) if self.categorical else raw

    def value_loss(self, raw: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.categorical:
            target = target.clamp(float(self.support[0]), float(self.support[-1]))
            return Fn.categorical_value_loss(raw, target, self.support, self.sigma)
        return torch.nn.functional.mse_loss(raw, target)

    def encode(self, x: torch.Tensor | Window) -> torch.Tensor:
        """``(N, H)`` features of an input: a feature tensor passes through, a window is encoded."""
        return x if isinstance(x, torch.Tensor) else self.encoder(*x)

    def q_raw(self, s: torch.Tensor | Window, sa: torch.Tensor | Window) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([self.encode(s), self.encode(sa)], dim=-1)
        return self.q1(x), self.q2(x)

    def q_values(self, s: torch.Tensor | Window, sa: torch.Tensor | Window) -> tuple[torch.Tensor, torch.Tensor]:
        q1, q2 = self.q_raw(s, sa)
        return self.scalar(q1), self.scalar(q2)

    def value(self, s: torch.Tensor | Window) -> torch.Tensor:
        return self.scalar(self.v(self.encode(s)))


def make_target(critic: UtteranceCritic) -> UtteranceCritic:
    """A frozen copy for TD targets (its encoder too), moved toward the online critic by ``soft_update``."""
    target = copy.deepcopy(critic)
    for p in target.parameters():
        p.requires_grad_(False)
    return target


@torch.no_grad()
def soft_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """Polyak-average every parameter of ``target`` toward ``online`` (``Fn.polyak``)."""
    for t, o in zip(target.parameters(), online.parameters()):
        t.copy_(Fn.polyak(t, o, tau))


# ----- the replay buffer of turns ---------------------------------------------------------------
class ReplayBuffer:
    """A ring buffer of turn transitions ``(phi(s), phi(s, a), r, done, phi(s'))``, plus
    ``phi(s, a_V)`` of the action V's target reads (``v_action``): the policy's own reply at ``s``
    (see ``ArcherConfig.v_target``).

    A state or state-action is its ``(H,)`` feature or, with ``critic_encoder=top:K``, a window:
    ``(W, H)`` trunk states in the field itself and their ``(W,)`` positions in ``<field>_pos``.
    Storage is allocated at the first ``add`` and doubles as it fills, up to ``capacity``, so memory
    follows the turns held (a window is W times a feature).

    Args:
        capacity: Oldest transitions are overwritten past this.
        feat_dim: Feature size ``H``.
        seed: Seeds minibatch sampling (its state is checkpointed).
        v_action: Also store ``v_sa`` (the V target's action features).
    """

    def __init__(self, capacity: int, feat_dim: int, seed: int = 0, v_action: bool = False) -> None:
        self.capacity, self.feat_dim = capacity, feat_dim
        self.FIELDS = ("s", "sa", "reward", "done", "next_s") + (("v_sa",) if v_action else ())
        self.data: dict[str, torch.Tensor] = {}  # storage: name -> (rows, ...), rows <= capacity
        self.size = 0
        self.ptr = 0
        self.gen = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return self.size

    def add(self, s: torch.Tensor | Window, sa: torch.Tensor | Window, reward: torch.Tensor, done: torch.Tensor,
            next_s: torch.Tensor | Window, v_sa: torch.Tensor | Window | None = None) -> None:
        """Append ``n`` transitions (each argument, or each part of a window, has leading size ``n``)."""
        if (v_sa is None) == ("v_sa" in self.FIELDS):
            raise ValueError("v_sa must be given exactly when the buffer stores V's actions")
        given = {"s": s, "sa": sa, "reward": reward, "done": done, "next_s": next_s, "v_sa": v_sa}
        items: dict[str, torch.Tensor] = {}
        for f in self.FIELDS:
            x = given[f]
            items.update({f: x[0], f + "_pos": x[1]} if isinstance(x, tuple) else {f: x})
        if items["s"].shape[-1] != self.feat_dim:
            raise ValueError(f"features of size {items['s'].shape[-1]} in a buffer of size {self.feat_dim}")
        n = reward.shape[0]
        self._reserve(items, min(self.capacity, self.size + n))
        for i in range(n):
            for k, x in items.items():
                self.data[k][self.ptr] = x[i]
            self.ptr = (self.ptr + 1) % self.capacity
            self.size = min(self.size + 1, self.capacity)

    def _reserve(self, like: dict[str, torch.Tensor], rows: int) -> None:
        """Grow the storage (shaped like ``like``'s items) to at least ``rows``, doubling."""
        if self.data and set(like) != set(self.data):
            raise ValueError(f"transitions with fields {sorted(like)} in a buffer of {sorted(self.data)}")
        have = next(iter(self.data.values())).shape[0] if self.data else 0
        if rows <= have:
            return
        rows = min(self.capacity, max(rows, 2 * have))
        for k, x in like.items():
            grown = x.new_zeros((rows, *x.shape[1:]))
            if have:
                grown[:have] = self.data[k]
            self.data[k] = grown

    def _get(self, f: str, idx: torch.Tensor) -> torch.Tensor | Window:
        x = self.data[f][idx]
        return (x, self.data[f + "_pos"][idx]) if f + "_pos" in self.data else x

    def sample(self, batch_size: int) -> dict[str, torch.Tensor | Window]:
        idx = torch.randint(0, self.size, (batch_size,), generator=self.gen)
        return {f: self._get(f, idx) for f in self.FIELDS}

    def clone(self) -> ReplayBuffer:
        """An independent copy (contents, sampling RNG), e.g. for a critic trained on the side."""
        twin = ReplayBuffer(self.capacity, self.feat_dim, v_action="v_sa" in self.FIELDS)
        twin.load_state_dict(self.state_dict())
        return twin

    def state_dict(self) -> dict:
        return {
            **{k: x[: self.size].clone() for k, x in self.data.items()},
            "ptr": self.ptr,
            "capacity": self.capacity,
            "gen": self.gen.get_state(),
        }

    def load_state_dict(self, d: dict) -> None:
        items = {k: x for k, x in d.items() if k not in ("ptr", "capacity", "gen")}
        n = items["reward"].shape[0] if items else 0
        self.data = {}
        self._reserve(items, n)
        for k, x in items.items() if n else ():
            self.data[k][:n] = x
        self.size, self.ptr = n, d["ptr"]
        self.gen.set_state(d["gen"])
