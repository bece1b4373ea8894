"""ArCHer (Zhou et al. 2024): an utterance-level critic and a token-level actor.

High level: Q1, Q2 (s, a) and V(s) over utterances, trained off-policy by TD from a replay buffer
of turns, with clipped double-Q and Polyak-averaged target heads:

    y_Q = r + gamma * (1 - done) * V_target(s')          (Q loss on both heads)
    y_V = min(Q1_target, Q2_target)(s, a_V)              (V loss)

where a_V is the recorded action, or (``v_target="fresh_action"``, the paper's) a fresh a' ~ pi(s)
sampled when the batch is scored: fitted to the recorded action, V copies Q and Q - V is ~0.

Low level: the token-level actor maximises the utterance advantage A = min(Q1, Q2)(s, a) - V(s)
(or, with ``advantage="td"``, the one-step TD advantage r + gamma * V(s') - V(s) from the same critic;
``"gae"``, its lambda-return), centred over the batch, given to every token of the utterance
(optionally minus a token-level baseline b(s, a_<t)), through PPO's clipped surrogate on the
recorded sampling log-probs, with KL / entropy guards.

One iteration: collect episodes with the current policy -> per-turn rewards -> one reference
forward per episode (KL anchor + critic features) -> advantages from the critic before it sees
the batch (out of sample; ``advantage_timing``), and their AUC at telling the env's oracle moves
from the others -> replay buffer -> N critic updates -> M actor passes (after ``critic_warmup``
critic updates) -> log and checkpoint.

An episode that ends by the turn limit is treated as terminal: the limit is part of the task
(a timed-out game is a lost game), so there is no value to bootstrap beyond it.

The critic reads features of the conversation: at the last prompt token they summarise the state
``s``, at the last action token ``(s, a)``. ``critic_encoder`` picks the encoder:

- ``reference`` (default): the final hidden states of the frozen reference copy of the policy (the
  same token ids, nothing re-tokenized). Frozen features are computed once per turn, stored in the
  replay buffer and reused by every TD update, and only the heads train: many critic updates per
  actor update stay affordable on a CPU, but frozen features may not tell actions apart.
- ``top:K``: the critic trains its own encoder, as the paper does, at a CPU's cost. It is a copy of
  the reference's last K blocks (``critic_encoder.TrunkTopEncoder``) over the states the reference
  pass cached at the input of block N-K; the buffer stores a window of the last ``critic_window``
  of them ending at each token, every TD update runs the blocks over its windows and backpropagates
  into them, and the target critic holds a Polyak-averaged copy.
- a path: another frozen causal/encoder LM over the conversation text (``TextFeatureEncoder``).

The file reads top to bottom: the config, the critic heads, the replay buffer, the TD loss (a pure
function, tested by hand; the advantages, transitions and windows are in ``functional``, the
encoders in ``critic_encoder``), then the trainer's iteration. The token-level actor step it ends
with is shared with the critic-free family (``turngym.trainers.actor``).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from turngym.config import knob
from turngym.rewards import reward_stats
from turngym.rollout import env_info
from turngym.trainers import functional as Fn
from turngym.trainers.actor import actor_update, advantage_stats, reference_pass
from turngym.trainers.critic_encoder import TextFeatureEncoder, TrunkTopEncoder, Window
from turngym.trainers.distributed import DistContext
from turngym.trainers.registry import Algorithm, register_algorithm
from turngym.trainers.sequences import PackedBatch, pack_batch, pack_records
from turngym.trainers.trainer import OnlineConfig, OnlineTrainer
from turngym.types import Trajectory, Turn


@dataclass
class ArcherConfig(OnlineConfig):
    """ArCHer's knobs (plus the shared ``OnlineConfig`` ones)."""

    critic_hidden: int = knob(256, "width of the critic's MLP heads")
    critic_lr: float = knob(1e-3, "critic learning rate (AdamW)")
    critic_updates: int = knob(50, "N: critic TD updates per iteration")
    critic_batch_size: int = knob(64, "transitions per critic update")
    critic_warmup: int = knob(100, "critic updates before the actor starts")
    tau: float = knob(0.05, "Polyak rate of the target heads")
    buffer_capacity: int = knob(20_000, "replay buffer size in turns, allocated as it fills; top:K stores 3-4 windows "
                                        "a turn (~220-300 KB at 32 x 576 fp32: 20k turns ~ 5 GB), so lower it there")
    categorical: bool = knob(False, "categorical (HL-Gauss) value heads instead of MSE regression")
    num_atoms: int = knob(51, "bins of the categorical heads")
    v_min: float = knob(-1.0, "lowest value of the categorical support")
    v_max: float = knob(1.5, "highest value of the categorical support")
    token_baseline: bool = knob(False, "subtract a token-level baseline b(s, a_<t) fitted to Q(s, a)")
    critic_encoder: str = knob("reference", "reference (frozen policy backbone), top:K (the critic trains its own copy of "
                                            "the reference's last K blocks over cached lower layers) or a path to another LM")
    critic_window: int = knob(32, "top:K: trunk states the critic's blocks read, ending at the token encoded")
    critic_encoder_lr: float = knob(1e-5, "top:K: learning rate of the critic's own blocks (the heads use critic_lr)")
    group_size: int = knob(1, "episodes per task per iteration, from one reset seed: repeats show the critic "
                                 "different actions from the same state, the contrast Q(s, a) - V(s) is made of")
    advantage: str = knob("q_minus_v", "q_minus_v: A = min(Q1, Q2)(s, a) - V(s) (the paper); td: A = r + gamma V(s') - V(s); "
                                       "gae: lambda-returns of V over each episode's turns (gae_lambda)")
    gae_lambda: float = knob(0.9, "lambda of advantage=gae: 0 = td, 1 = discounted return - V(s)")
    advantage_timing: str = knob("before", "before: score the batch with the critic before its TD updates on it "
                                           "(out of sample); after: once the critic has been fitted to it")
    center_advantages: bool = knob(True, "subtract the batch mean of the utterance advantages (no std scaling)")
    v_target: str = knob("buffer_action", "V's target: buffer_action = min Q_target(s, a) of the recorded action; "
                                          "fresh_action = of a' ~ pi(s) sampled when the batch is scored (the paper)")
    expert_labels: bool = knob(True, "ask the env to label steps that match its oracle's move (env kwarg "
                                     "expert_labels) and log critic/auc_expert; envs without an oracle log nothing")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.critic_updates < 0 or self.critic_batch_size < 1:
            raise ValueError("critic_updates must be >= 0 and critic_batch_size >= 1")
        if not 0 < self.tau <= 1:
            raise ValueError(f"tau must be in (0, 1], got {self.tau}")
        if self.categorical and self.v_min >= self.v_max:
            raise ValueError("v_min must be < v_max")
        if self.advantage not in ("q_minus_v", "td", "gae"):
            raise ValueError(f"advantage must be q_minus_v, td or gae, got {self.advantage!r}")
        if not 0 <= self.gae_lambda <= 1:
            raise ValueError(f"gae_lambda must be in [0, 1], got {self.gae_lambda}")
        if self.advantage_timing not in ("before", "after"):
            raise ValueError(f"advantage_timing must be before or after, got {self.advantage_timing!r}")
        if self.v_target not in ("buffer_action", "fresh_action"):
            raise ValueError(f"v_target must be buffer_action or fresh_action, got {self.v_target!r}")
        if self.critic_encoder.startswith("top:"):
            if not self.critic_encoder[4:].isdigit() or self.critic_top_k < 1:
                raise ValueError(f"critic_encoder top:K needs an integer K >= 1, got {self.critic_encoder!r}")
            if self.token_baseline:
                raise ValueError("token_baseline reads the reference's final hidden states: not with critic_encoder=top:K")
        if self.critic_window < 1:
            raise ValueError(f"critic_window must be >= 1, got {self.critic_window}")

    @property
    def critic_top_k(self) -> int:
        """K of ``critic_encoder=top:K``; 0 for the frozen encoders."""
        return int(self.critic_encoder[4:]) if self.critic_encoder.startswith("top:") else 0


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
    ``phi(s, a')`` of a fresh policy action a' ~ pi(s) when ``fresh_action``.

    A state or state-action is its ``(H,)`` feature or, with ``critic_encoder=top:K``, a window:
    ``(W, H)`` trunk states in the field itself and their ``(W,)`` positions in ``<field>_pos``.
    Storage is allocated at the first ``add`` and doubles as it fills, up to ``capacity``, so memory
    follows the turns held (a window is W times a feature).

    Args:
        capacity: Oldest transitions are overwritten past this.
        feat_dim: Feature size ``H``.
        seed: Seeds minibatch sampling (its state is checkpointed).
        fresh_action: Also store ``fresh_sa`` (the V target's action features).
    """

    def __init__(self, capacity: int, feat_dim: int, seed: int = 0, fresh_action: bool = False) -> None:
        self.capacity, self.feat_dim = capacity, feat_dim
        self.FIELDS = ("s", "sa", "reward", "done", "next_s") + (("fresh_sa",) if fresh_action else ())
        self.data: dict[str, torch.Tensor] = {}  # storage: name -> (rows, ...), rows <= capacity
        self.size = 0
        self.ptr = 0
        self.gen = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return self.size

    def add(self, s: torch.Tensor | Window, sa: torch.Tensor | Window, reward: torch.Tensor, done: torch.Tensor,
            next_s: torch.Tensor | Window, fresh_sa: torch.Tensor | Window | None = None) -> None:
        """Append ``n`` transitions (each argument, or each part of a window, has leading size ``n``)."""
        if (fresh_sa is None) == ("fresh_sa" in self.FIELDS):
            raise ValueError("fresh_sa must be given exactly when the buffer stores fresh actions")
        given = {"s": s, "sa": sa, "reward": reward, "done": done, "next_s": next_s, "fresh_sa": fresh_sa}
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


# ----- the TD loss (pure: no backward, no optimizer; the transitions are Fn.turn_transitions) -----
def td_loss(critic: UtteranceCritic, target: UtteranceCritic, b: dict[str, torch.Tensor],
            gamma: float, v_action: str = "sa") -> tuple[torch.Tensor, dict[str, float]]:
    """ArCHer's critic loss on one replay minibatch ``b`` (``ReplayBuffer.sample``): no backward, no step.

        y_Q = r + gamma * (1 - done) * V_target(s')        loss on Q1 and Q2
        y_V = min(Q1_target, Q2_target)(s, a_V)            loss on V

    ``a_V`` is the recorded action (``v_action="sa"``) or a fresh a' ~ pi(s) (``"fresh_sa"``): with
    the recorded one, V fits Q of the same action and Q - V is near 0 by construction. Windows
    (``critic_encoder=top:K``) go through each critic's own encoder, so the loss trains it too.

    Returns:
        The summed loss (differentiable in ``critic``) and its metrics.
    """
    with torch.no_grad():
        y = Fn.td_target(b["reward"], target.value(b["next_s"]), b["done"], gamma)
        y_v = Fn.double_q_min(*target.q_values(b["s"], b[v_action]))
    s = critic.encode(b["s"])  # once for Q and V: a window costs K blocks
    q1_raw, q2_raw = critic.q_raw(s, b["sa"])
    q_loss = critic.value_loss(q1_raw, y) + critic.value_loss(q2_raw, y)
    v_loss = critic.value_loss(critic.v(s), y_v)
    q1 = critic.scalar(q1_raw.detach())
    stats = {"critic/q_loss": q_loss.item(), "critic/v_loss": v_loss.item(), "critic/td_error": (q1 - y).abs().mean().item(),
             "critic/q1_mean": q1.mean().item(), "critic/target_mean": y.mean().item()}
    return q_loss + v_loss, stats


# ----- the trainer: one iteration = collect, score, critic updates, actor update ------------------
class ArcherTrainer(OnlineTrainer):
    """Train ``policy`` (an ``HFPolicy``) on ``env_id`` with ArCHer.

    Args:
        policy: Exposes ``model``, ``tokenizer``, ``pad_id``, ``act`` and ``invalidate_caches``.
        env_id: A registered env; its ``task_ids`` (from ``env_kwargs``' split) are the training tasks.
        cfg: The knobs.
        out_dir: Checkpoints (``checkpoint/``), ``metrics.jsonl``, TensorBoard, the learning curve.
        ctx: Data-parallel context. Each rank keeps its own replay buffer; critic gradients are
            averaged like the actor's, so every rank holds the same critic.
    """

    name = "archer"

    def __init__(self, policy: Any, env_id: str, cfg: ArcherConfig | None = None, *,
                 env_kwargs: dict | None = None, out_dir: str | Path = "runs/archer", ctx: DistContext | None = None,
                 collector: Any = None) -> None:
        cfg = cfg or ArcherConfig()
        if cfg.expert_labels:  # the env marks steps that match its oracle (critic/auc_expert)
            env_kwargs = {"expert_labels": True, **(env_kwargs or {})}
        super().__init__(policy, env_id, cfg, env_kwargs=env_kwargs, out_dir=out_dir, ctx=ctx,
                         collector=collector)
        self.critic_steps = 0

    # ----- setup ---------------------------------------------------------------------------
    def needs_reference(self) -> bool:
        return True  # the KL anchor, and by default the critic's feature encoder

    def _setup_extra(self) -> None:
        cfg = self.cfg
        # the reference pass keeps hidden states for the critic: the final ones (reference) or the
        # trunk at the input of block N-K (top:K); a text encoder reads the conversation itself
        self._hidden = cfg.critic_encoder == "reference" or cfg.critic_top_k > 0
        self.encoder = self.ref if self._hidden else TextFeatureEncoder(cfg.critic_encoder)
        feat = self.ref.config.get_text_config().hidden_size if self._hidden else self.encoder.dim
        top = TrunkTopEncoder(self.ref, cfg.critic_top_k) if cfg.critic_top_k else None
        self._hidden_layer = top.trunk_layer if top is not None else None
        self.critic = UtteranceCritic(feat, cfg.critic_hidden, cfg.categorical, cfg.num_atoms, cfg.v_min, cfg.v_max, top)
        self.ctx.broadcast_params(self.critic)
        self.critic_target = make_target(self.critic)
        named = list(self.critic.named_parameters())
        groups = [{"params": [p for n, p in named if not n.startswith("encoder.")], "lr": cfg.critic_lr}]
        if top is not None:
            groups.append({"params": list(top.parameters()), "lr": cfg.critic_encoder_lr})
        self.critic_opt = torch.optim.AdamW(groups)
        self.baseline = torch.nn.Linear(feat, 1) if cfg.token_baseline else None
        if self.baseline is not None:
            self.ctx.broadcast_params(self.baseline)
        self.baseline_opt = torch.optim.AdamW(self.baseline.parameters(), lr=cfg.critic_lr) if self.baseline else None
        fresh = cfg.v_target == "fresh_action"
        self.buffer = ReplayBuffer(cfg.buffer_capacity, feat, seed=cfg.seed + self.ctx.rank, fresh_action=fresh)
        if fresh:
            if not hasattr(self.policy, "generate"):
                raise ValueError("v_target=fresh_action samples a' from token ids: it needs an HFPolicy")
            self._stops = list(env_info(self.env_id, **self.env_kwargs).stop_strings)  # as in collection

    # ----- the loop -------------------------------------------------------------------------
    def step(self) -> dict[str, float]:
        """One iteration: collect, score, critic updates, actor update. Returns its metrics."""
        cfg = self.cfg
        # 1. collect with the current policy
        specs = self.schedule(cfg.episodes_per_iter, cfg.group_size)
        trajs, metrics = self.collect(specs, cfg.group_size)
        _check_tokens(trajs)
        rewards = self.reward_fn(trajs)
        metrics.update(reward_stats(self.reward_fn))  # G-RA gate rates, SPA fit error, shaping...
        # 2. one reference forward per episode: KL anchor and critic features (top:K: windows of trunk states)
        batch = pack_batch(trajs, self.policy.pad_id)
        ref_logprobs, hidden = reference_pass(self.ref, batch, self._hidden, cfg.autocast, self._hidden_layer)
        s_feat, sa_feat = self._features(batch, hidden, trajs)
        r, done, next_feat = _transitions(batch.turn_refs, rewards, s_feat)
        fresh_sa = self._fresh_action_features(trajs, batch) if cfg.v_target == "fresh_action" else None
        # 3. advantages from the critic as it stands, before it has seen this batch (out of sample)
        feats = (s_feat, sa_feat, r, done, next_feat)
        adv, q = self._advantages(*feats)
        metrics.update(self._expert_auc(trajs, batch, adv))
        # 4. N critic updates from the replay buffer, this batch included
        self.buffer.add(*feats, fresh_sa=fresh_sa)
        metrics.update(self._critic_updates(cfg.critic_updates))
        if cfg.advantage_timing == "after":  # in sample: the critic has just been fitted to these turns
            adv, q = self._advantages(*feats)
        # 5. the utterance advantages, broadcast to tokens, train the actor
        if cfg.center_advantages:
            adv = Fn.center(adv)
        if cfg.normalize_advantages and adv.numel() > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-6)
        token_adv = Fn.broadcast_to_tokens(adv, batch.token_turn)
        if self.baseline is not None:
            token_adv, base_metrics = self._token_baseline(batch, hidden, q, token_adv)
            metrics.update(base_metrics)
        metrics.update(advantage_stats(adv))
        if self.critic_steps >= cfg.critic_warmup:
            with self.weights_lock():
                metrics.update(actor_update(self.model, self.actor_opt, batch, token_adv, ref_logprobs, cfg, self.gen, self.ctx,
                                            loss="ppo" if cfg.pg_loss == "auto" else cfg.pg_loss))
        metrics["actor/active"] = float(self.critic_steps >= cfg.critic_warmup)
        return self.finish_step(metrics)

    # ----- pieces ---------------------------------------------------------------------------
    @torch.no_grad()
    def _advantages(self, s_feat, sa_feat, r, done, next_feat) -> tuple[torch.Tensor, torch.Tensor]:
        """``(N,)`` utterance advantages (``cfg.advantage``) and ``(N,)`` min(Q1, Q2)(s, a) under the current critic."""
        cfg = self.cfg
        s_feat = self.critic.encode(s_feat)  # once for Q and V
        q = Fn.double_q_min(*self.critic.q_values(s_feat, sa_feat))
        v = self.critic.value(s_feat)
        if cfg.advantage == "q_minus_v":
            return Fn.utterance_advantage(q, v), q
        if cfg.advantage == "td":
            return Fn.td_advantage(r, v, self.critic.value(next_feat), done, cfg.gamma), q
        return Fn.gae_advantages(r, v, self.critic.value(next_feat), done, cfg.gamma, cfg.gae_lambda), q

    def _expert_auc(self, trajs: list[Trajectory], batch: PackedBatch, adv: torch.Tensor) -> dict[str, float]:
        """How well A ranks turns that played the env's oracle move above turns that did not
        (``info["expert_match"]``, see ``expert_labels``); nothing when the env gives no labels."""
        labels = [trajs[ti].turns[k].info.get("expert_match") for ti, k in batch.turn_refs]
        if all(y is None for y in labels):
            return {}
        y = torch.tensor([float("nan") if v is None else float(v) for v in labels])
        return {"critic/auc_expert": Fn.auc(adv, y), "critic/expert_rate": float(y.nan_to_num(0.0).sum() / (~y.isnan()).sum())}

    @torch.no_grad()
    def _fresh_action_features(self, trajs: list[Trajectory], batch: PackedBatch) -> torch.Tensor | Window:
        """``(N, H)`` phi(s, a') (or its window) of one fresh action a' ~ pi(s) per flat turn, sampled from
        the turn's recorded prompt ids and encoded like the recorded actions (V's target in ``td_loss``)."""
        cfg = self.cfg
        prompts = [trajs[ti].prompt_ids(k) for ti, k in batch.turn_refs]
        sampling = cfg.sampling(self.iteration)
        sampling.seed = self.ctx.rank_seed(sampling.seed) + 0x5EED  # not the collection's own samples
        gens = []
        with self.weights_lock():
            for i in range(0, len(prompts), cfg.num_envs):
                chunk = prompts[i : i + cfg.num_envs]
                gens += self.policy.generate(chunk, sampling, [self._stops] * len(chunk), None,
                                             [k for _, k in batch.turn_refs[i : i + cfg.num_envs]])[0]
        dec = self.policy.tokenizer.decode
        turns = [Turn(dec(g.action_ids, skip_special_tokens=True)) for g in gens]
        if self._hidden:  # one sequence per state: a branch of the record, its prompt then a'
            branches = [trajs[ti].record.branch(trajs[ti].turns[k].span[0], list(g.action_ids) or [self.policy.pad_id])
                        for (ti, k), g in zip(batch.turn_refs, gens)]
            fbatch = pack_records([(rec, [(0, span)]) for rec, span in branches], self.policy.pad_id)
            return self._features(fbatch, reference_pass(self.ref, fbatch, True, cfg.autocast, self._hidden_layer)[1], [])[1]
        fresh = [Trajectory(trajs[ti].task_id, turns=[*trajs[ti].turns[:k], t], initial_observation=trajs[ti].initial_observation)
                 for (ti, k), t in zip(batch.turn_refs, turns)]
        return self.encoder.turn_features(fresh, [(i, k) for i, (_, k) in enumerate(batch.turn_refs)])[1]

    def _features(self, batch: PackedBatch, hidden: torch.Tensor | None, trajs: list[Trajectory]):
        """phi(s), phi(s, a) of each flat turn: ``(N, H)`` each, or (top:K) the windows that end there."""
        if self._hidden_layer is not None:
            w = self.cfg.critic_window
            return Fn.gather_windows(hidden, batch.state_pos, w), Fn.gather_windows(hidden, batch.action_pos, w)
        if hidden is not None:
            s = hidden[batch.state_pos[:, 0], batch.state_pos[:, 1]].float()
            sa = hidden[batch.action_pos[:, 0], batch.action_pos[:, 1]].float()
            return s, sa
        return self.encoder.turn_features(trajs, batch.turn_refs)

    def _critic_updates(self, n: int) -> dict[str, float]:
        cfg, sums = self.cfg, {}
        v_action = "fresh_sa" if cfg.v_target == "fresh_action" else "sa"
        for _ in range(n if len(self.buffer) else 0):
            b = self.buffer.sample(cfg.critic_batch_size)
            loss, stats = td_loss(self.critic, self.critic_target, b, cfg.gamma, v_action)
            self.critic_opt.zero_grad(set_to_none=True)
            loss.backward()
            self.ctx.all_reduce_grads(self.critic.parameters())
            self.critic_opt.step()
            soft_update(self.critic_target, self.critic, cfg.tau)
            self.critic_steps += 1
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v / n
        return sums

    def _token_baseline(self, batch, hidden, q, token_adv):
        """Fit b(s, a_<t) to the utterance's Q on this batch, then use A_t = Q(s, a) - b(s, a_<t)."""
        feats = hidden[batch.score_mask].float() if hidden is not None else None
        if feats is None:
            return token_adv, {}
        target = q[batch.token_turn]
        for _ in range(10):
            loss = torch.nn.functional.mse_loss(self.baseline(feats).squeeze(-1), target)
            self.baseline_opt.zero_grad(set_to_none=True)
            loss.backward()
            self.ctx.all_reduce_grads(self.baseline.parameters())
            self.baseline_opt.step()
        with torch.no_grad():
            b = self.baseline(feats).squeeze(-1)
        return target - b, {"baseline/loss": loss.item()}

    # ----- checkpoints (the base class saves the actor, optimizer, RNG and counters) ------------
    def _extra_state(self) -> dict:
        return {
            "critic": self.critic.state_dict(), "critic_target": self.critic_target.state_dict(),
            "critic_opt": self.critic_opt.state_dict(), "buffer": self.buffer.state_dict(),
            "baseline": self.baseline.state_dict() if self.baseline else None,
            "baseline_opt": self.baseline_opt.state_dict() if self.baseline_opt else None,
            "critic_steps": self.critic_steps,
        }

    def _load_extra_state(self, st: dict) -> None:
        self.critic.load_state_dict(st["critic"])
        self.critic_target.load_state_dict(st["critic_target"])
        self.critic_opt.load_state_dict(st["critic_opt"])
        self.buffer.load_state_dict(st["buffer"])
        if self.baseline is not None and st["baseline"] is not None:
            self.baseline.load_state_dict(st["baseline"])
            self.baseline_opt.load_state_dict(st["baseline_opt"])
        self.critic_steps = st["critic_steps"]


register_algorithm(Algorithm("archer", section="archer", config=ArcherConfig, trainer=ArcherTrainer,
                             help="utterance-level critic, token-level actor"))


def _transitions(turn_refs: list[tuple[int, int]], rewards: list[list[float]], s: torch.Tensor | Window):
    """``Fn.turn_transitions`` of features, or of windows (states and positions shift alike; a done
    turn's next window is zeros at position 0, and its value is multiplied by 0)."""
    if isinstance(s, torch.Tensor):
        return Fn.turn_transitions(turn_refs, rewards, s)
    r, done, next_states = Fn.turn_transitions(turn_refs, rewards, s[0])
    return r, done, (next_states, Fn.turn_transitions(turn_refs, rewards, s[1])[2])


def _check_tokens(trajs: list[Trajectory]) -> None:
    for t in trajs:
        for k in range(len(t.turns)):
            if any(math.isnan(x) for x in t.action_logprobs(k)):
                raise ValueError("a turn has action ids but no recorded log-probs; train with a policy that records them")
