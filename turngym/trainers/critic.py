"""ArCHer's utterance-level critic: double Q heads, a V head, and a replay buffer of turns.

The critic reads features of the conversation from a frozen LM encoder: the final hidden state
at the last prompt token summarises the state ``s``; at the last action token it summarises
``(s, a)``. The encoder is the frozen reference copy of the policy backbone (default; the same
token ids, nothing re-tokenized) or any other causal/encoder LM. Because the encoder is frozen,
features are computed once per turn, stored in the replay buffer, and reused by every TD update;
only the heads train. That is what makes many critic updates per actor update affordable on a CPU.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from turngym.trainers import functional as Fn


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
    """Q1(s, a), Q2(s, a) and V(s) heads over frozen features.

    Args:
        feat_dim: Encoder hidden size.
        hidden_dim: MLP width.
        categorical: Heads output logits over ``num_atoms`` bins in ``[v_min, v_max]`` and are
            trained by cross-entropy to an HL-Gauss histogram ("classification, not regression").
    """

    def __init__(
        self,
        feat_dim: int,
        hidden_dim: int = 256,
        categorical: bool = False,
        num_atoms: int = 51,
        v_min: float = -1.0,
        v_max: float = 1.0,
    ) -> None:
        super().__init__()
        out = num_atoms if categorical else 1
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

    def q_raw(self, s_feat: torch.Tensor, sa_feat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([s_feat, sa_feat], dim=-1)
        return self.q1(x), self.q2(x)

    def q_values(self, s_feat: torch.Tensor, sa_feat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q1, q2 = self.q_raw(s_feat, sa_feat)
        return self.scalar(q1), self.scalar(q2)

    def value(self, s_feat: torch.Tensor) -> torch.Tensor:
        return self.scalar(self.v(s_feat))


def make_target(critic: UtteranceCritic) -> UtteranceCritic:
    """A frozen copy for TD targets, moved toward the online critic by ``soft_update``."""
    target = copy.deepcopy(critic)
    for p in target.parameters():
        p.requires_grad_(False)
    return target


@torch.no_grad()
def soft_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """Polyak-average every parameter of ``target`` toward ``online`` (``Fn.polyak``)."""
    for t, o in zip(target.parameters(), online.parameters()):
        t.copy_(Fn.polyak(t, o, tau))


class ReplayBuffer:
    """A ring buffer of turn transitions ``(phi(s), phi(s, a), r, done, phi(s'))``.

    Args:
        capacity: Oldest transitions are overwritten past this.
        feat_dim: Feature size.
        seed: Seeds minibatch sampling (its state is checkpointed).
    """

    FIELDS = ("s", "sa", "reward", "done", "next_s")

    def __init__(self, capacity: int, feat_dim: int, seed: int = 0) -> None:
        self.capacity = capacity
        self.s = torch.zeros(capacity, feat_dim)
        self.sa = torch.zeros(capacity, feat_dim)
        self.next_s = torch.zeros(capacity, feat_dim)
        self.reward = torch.zeros(capacity)
        self.done = torch.zeros(capacity)
        self.size = 0
        self.ptr = 0
        self.gen = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return self.size

    def add(self, s: torch.Tensor, sa: torch.Tensor, reward: torch.Tensor, done: torch.Tensor, next_s: torch.Tensor) -> None:
        """Append ``n`` transitions (each argument has leading size ``n``)."""
        for i in range(s.shape[0]):
            j = self.ptr
            self.s[j], self.sa[j], self.reward[j], self.done[j], self.next_s[j] = s[i], sa[i], reward[i], done[i], next_s[i]
            self.ptr = (self.ptr + 1) % self.capacity
            self.size = min(self.size + 1, self.capacity)

    def sample(self, batch_size: int) -> dict[str, torch.Tensor]:
        idx = torch.randint(0, self.size, (batch_size,), generator=self.gen)
        return {f: getattr(self, f)[idx] for f in self.FIELDS}

    def state_dict(self) -> dict:
        return {
            **{f: getattr(self, f)[: self.size].clone() for f in self.FIELDS},
            "ptr": self.ptr,
            "capacity": self.capacity,
            "gen": self.gen.get_state(),
        }

    def load_state_dict(self, d: dict) -> None:
        n = d["s"].shape[0]
        for f in self.FIELDS:
            getattr(self, f)[:n] = d[f]
        self.size, self.ptr = n, d["ptr"]
        self.gen.set_state(d["gen"])
