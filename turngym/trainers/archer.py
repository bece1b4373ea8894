"""ArCHer (Zhou et al. 2024): an utterance-level critic and a token-level actor.

High level: Q1, Q2 (s, a) and V(s) over utterances, trained off-policy by TD from a replay buffer
of turns, with clipped double-Q and Polyak-averaged target heads:

    y_Q = r + gamma * (1 - done) * V_target(s')          (Q loss on both heads)
    y_V = min(Q1_target, Q2_target)(s, a)                (V loss)

Low level: the token-level actor maximises the utterance advantage A = min(Q1, Q2)(s, a) - V(s)
(or, with ``advantage="td"``, the one-step TD advantage r + gamma * V(s') - V(s) from the same critic),
given to every token of the utterance (optionally minus a token-level baseline b(s, a_<t)),
through PPO's clipped surrogate on the recorded sampling log-probs, with KL / entropy guards.

One iteration: collect episodes with the current policy -> per-turn rewards -> one reference
forward per episode (KL anchor + critic features) -> replay buffer -> N critic updates -> M actor
passes (after ``critic_warmup`` critic updates) -> log and checkpoint.

An episode that ends by the turn limit is treated as terminal: the limit is part of the task
(a timed-out game is a lost game), so there is no value to bootstrap beyond it.

The critic reads features of the conversation from a frozen LM encoder: the final hidden state
at the last prompt token summarises the state ``s``; at the last action token it summarises
``(s, a)``. The encoder is the frozen reference copy of the policy backbone (default; the same
token ids, nothing re-tokenized) or any other causal/encoder LM (``TextFeatureEncoder``). Because the
encoder is frozen, features are computed once per turn, stored in the replay buffer, and reused by
every TD update; only the heads train. That is what makes many critic updates per actor update
affordable on a CPU.

The file reads top to bottom: the config, the critic heads, the replay buffer, the transitions and
the TD loss (pure functions, tested by hand), then the trainer's iteration. The token-level actor
step it ends with is shared with the critic-free family (``turngym.trainers.actor``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from turngym.config import knob
from turngym.rewards import reward_stats
from turngym.trainers import functional as Fn
from turngym.trainers.actor import actor_update, advantage_stats, reference_pass
from turngym.trainers.distributed import DistContext
from turngym.trainers.sequences import PackedBatch, pack_batch
from turngym.trainers.trainer import OnlineConfig, OnlineTrainer, task_schedule
from turngym.types import Trajectory


@dataclass
class ArcherConfig(OnlineConfig):
    """ArCHer's knobs (plus the shared ``OnlineConfig`` ones)."""

    critic_hidden: int = knob(256, "width of the critic's MLP heads")
    critic_lr: float = knob(1e-3, "critic learning rate (AdamW)")
    critic_updates: int = knob(50, "N: critic TD updates per iteration")
    critic_batch_size: int = knob(64, "transitions per critic update")
    critic_warmup: int = knob(100, "critic updates before the actor starts")
    tau: float = knob(0.05, "Polyak rate of the target heads")
    buffer_capacity: int = knob(20_000, "replay buffer size in turns")
    categorical: bool = knob(False, "categorical (HL-Gauss) value heads instead of MSE regression")
    num_atoms: int = knob(51, "bins of the categorical heads")
    v_min: float = knob(-1.0, "lowest value of the categorical support")
    v_max: float = knob(1.5, "highest value of the categorical support")
    token_baseline: bool = knob(False, "subtract a token-level baseline b(s, a_<t) fitted to Q(s, a)")
    critic_encoder: str = knob("reference", "reference (frozen policy backbone) or a path to another LM")
    group_size: int = knob(1, "episodes per task per iteration, from one reset seed: repeats show the critic "
                                 "different actions from the same state, the contrast Q(s, a) - V(s) is made of")
    advantage: str = knob("q_minus_v", "q_minus_v: A = min(Q1, Q2)(s, a) - V(s) (the paper); td: A = r + gamma V(s') - V(s)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.critic_updates < 0 or self.critic_batch_size < 1:
            raise ValueError("critic_updates must be >= 0 and critic_batch_size >= 1")
        if not 0 < self.tau <= 1:
            raise ValueError(f"tau must be in (0, 1], got {self.tau}")
        if self.categorical and self.v_min >= self.v_max:
            raise ValueError("v_min must be < v_max")
        if self.advantage not in ("q_minus_v", "td"):
            raise ValueError(f"advantage must be q_minus_v or td, got {self.advantage!r}")


# ----- the critic: double Q heads and a V head over frozen features ---------------------------
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


# ----- the replay buffer of turns ---------------------------------------------------------------
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


# ----- transitions and the TD loss (pure: no backward, no optimizer) ----------------------------
def transitions(batch: PackedBatch, rewards: list[list[float]], s_feat: torch.Tensor):
    """The replay transitions of a packed batch: per flat turn ``(N,)`` reward, ``(N,)`` done and
    ``(N, H)`` next-state features (the next turn's ``s_feat``; zeros when done).

    Args:
        batch: The packed episodes (``turn_refs`` lists each flat turn as (trajectory, turn)).
        rewards: Per trajectory, per turn (after the reward transforms).
        s_feat: ``(N, H)`` state features of each flat turn.
    """
    n = len(batch.turn_refs)
    r = torch.tensor([rewards[ti][k] for ti, k in batch.turn_refs], dtype=torch.float32)
    done = torch.ones(n)
    next_feat = torch.zeros_like(s_feat)
    for i in range(n - 1):
        (ti, k), (tj, kj) = batch.turn_refs[i], batch.turn_refs[i + 1]
        if ti == tj and kj == k + 1:
            done[i] = 0.0
            next_feat[i] = s_feat[i + 1]
    # a turn whose successor carries no tokens stays "done": nothing to bootstrap from
    return r, done, next_feat


def td_loss(critic: UtteranceCritic, target: UtteranceCritic, b: dict[str, torch.Tensor],
            gamma: float) -> tuple[torch.Tensor, dict[str, float]]:
    """ArCHer's critic loss on one replay minibatch ``b`` (``ReplayBuffer.sample``): no backward, no step.

        y_Q = r + gamma * (1 - done) * V_target(s')        loss on Q1 and Q2
        y_V = min(Q1_target, Q2_target)(s, a)              loss on V

    Returns:
        The summed loss (differentiable in ``critic``) and its metrics.
    """
    with torch.no_grad():
        y = Fn.td_target(b["reward"], target.value(b["next_s"]), b["done"], gamma)
        y_v = Fn.double_q_min(*target.q_values(b["s"], b["sa"]))
    q1_raw, q2_raw = critic.q_raw(b["s"], b["sa"])
    q_loss = critic.value_loss(q1_raw, y) + critic.value_loss(q2_raw, y)
    v_loss = critic.value_loss(critic.v(b["s"]), y_v)
    q1 = critic.scalar(q1_raw.detach())
    stats = {"critic/q_loss": q_loss.item(), "critic/v_loss": v_loss.item(), "critic/td_error": (q1 - y).abs().mean().item(),
             "critic/q1_mean": q1.mean().item(), "critic/target_mean": y.mean().item()}
    return q_loss + v_loss, stats


class TextFeatureEncoder:
    """Critic features from another (small, frozen) LM over the conversation text.

    The state text is the rendered conversation up to the turn; the state-action text adds the
    utterance. Features are the mean of the encoder's last hidden states (left-truncated to
    ``max_length`` tokens, so the recent turns are kept).
    """

    def __init__(self, path: str, max_length: int = 512) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(path)
        self.tok.truncation_side = "left"
        self.model = AutoModel.from_pretrained(path).eval()
        self.dim = self.model.config.hidden_size
        self.max_length = max_length

    @torch.no_grad()
    def _embed(self, texts: list[str]) -> torch.Tensor:
        enc = self.tok(texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
        h = self.model(**enc).last_hidden_state
        m = enc["attention_mask"][..., None].float()
        return (h * m).sum(1) / m.sum(1).clamp_min(1)

    def turn_features(self, trajs: list[Trajectory], refs: list[tuple[int, int]]):
        states, actions = [], []
        for ti, k in refs:
            t = trajs[ti]
            lines = [f"{m.role}: {m.content}" for m in t.initial_observation]
            for turn in t.turns[:k]:
                lines += [f"assistant: {turn.action_text}"] + [f"{m.role}: {m.content}" for m in turn.observation]
            states.append("\n".join(lines))
            actions.append(states[-1] + f"\nassistant: {t.turns[k].action_text}")
        return self._embed(states), self._embed(actions)


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
                 env_kwargs: dict | None = None, out_dir: str | Path = "runs/archer", ctx: DistContext | None = None) -> None:
        super().__init__(policy, env_id, cfg or ArcherConfig(), env_kwargs=env_kwargs, out_dir=out_dir, ctx=ctx)
        self.critic_steps = 0

    # ----- setup ---------------------------------------------------------------------------
    def needs_reference(self) -> bool:
        return True  # the KL anchor, and by default the critic's feature encoder

    def _setup_extra(self) -> None:
        cfg = self.cfg
        self.encoder = self.ref if cfg.critic_encoder == "reference" else TextFeatureEncoder(cfg.critic_encoder)
        feat = self.ref.config.get_text_config().hidden_size if cfg.critic_encoder == "reference" else self.encoder.dim
        self.critic = UtteranceCritic(feat, cfg.critic_hidden, cfg.categorical, cfg.num_atoms, cfg.v_min, cfg.v_max)
        self.ctx.broadcast_params(self.critic)
        self.critic_target = make_target(self.critic)
        self.critic_opt = torch.optim.AdamW(self.critic.parameters(), lr=cfg.critic_lr)
        self.baseline = torch.nn.Linear(feat, 1) if cfg.token_baseline else None
        if self.baseline is not None:
            self.ctx.broadcast_params(self.baseline)
        self.baseline_opt = torch.optim.AdamW(self.baseline.parameters(), lr=cfg.critic_lr) if self.baseline else None
        self.buffer = ReplayBuffer(cfg.buffer_capacity, feat, seed=cfg.seed + self.ctx.rank)

    # ----- the loop -------------------------------------------------------------------------
    def step(self) -> dict[str, float]:
        """One iteration: collect, score, critic updates, actor update. Returns its metrics."""
        cfg = self.cfg
        # 1. collect with the current policy
        specs = task_schedule(self.task_ids, cfg.episodes_per_iter, cfg.seed, self.iteration, cfg.group_size)
        trajs, metrics = self.collect(specs, cfg.group_size)
        _check_tokens(trajs)
        rewards = self.reward_fn(trajs)
        metrics.update(reward_stats(self.reward_fn))  # G-RA gate rates, SPA fit error, shaping...
        # 2. one reference forward per episode: KL anchor and critic features
        batch = pack_batch(trajs, self.policy.pad_id)
        ref_logprobs, hidden = reference_pass(self.ref, batch, cfg.critic_encoder == "reference", cfg.autocast)
        s_feat, sa_feat = self._features(batch, hidden, trajs)
        r, done, next_feat = transitions(batch, rewards, s_feat)
        self.buffer.add(s_feat, sa_feat, r, done, next_feat)
        # 3. N critic updates from the replay buffer
        metrics.update(self._critic_updates(cfg.critic_updates))
        # 4. utterance advantages A = min(Q1, Q2) - V, broadcast to tokens, then the actor
        with torch.no_grad():
            q1, q2 = self.critic.q_values(s_feat, sa_feat)
            q = Fn.double_q_min(q1, q2)
            v = self.critic.value(s_feat)
            if cfg.advantage == "td":
                adv = Fn.td_advantage(r, v, self.critic.value(next_feat), done, cfg.gamma)
            else:
                adv = Fn.utterance_advantage(q, v)
        if cfg.normalize_advantages and adv.numel() > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-6)
        token_adv = Fn.broadcast_to_tokens(adv, batch.token_turn)
        if self.baseline is not None:
            token_adv, base_metrics = self._token_baseline(batch, hidden, q, token_adv)
            metrics.update(base_metrics)
        metrics.update(advantage_stats(adv))
        if self.critic_steps >= cfg.critic_warmup:
            with self.weights_lock():
                metrics.update(actor_update(self.model, self.actor_opt, batch, token_adv, ref_logprobs, cfg, self.gen, self.ctx))
        metrics["actor/active"] = float(self.critic_steps >= cfg.critic_warmup)
        return self.finish_step(metrics)

    # ----- pieces ---------------------------------------------------------------------------
    def _features(self, batch: PackedBatch, hidden: torch.Tensor | None, trajs: list[Trajectory]):
        if hidden is not None:
            s = hidden[batch.state_pos[:, 0], batch.state_pos[:, 1]].float()
            sa = hidden[batch.action_pos[:, 0], batch.action_pos[:, 1]].float()
            return s, sa
        return self.encoder.turn_features(trajs, batch.turn_refs)

    def _critic_updates(self, n: int) -> dict[str, float]:
        cfg, sums = self.cfg, {}
        for _ in range(n if len(self.buffer) else 0):
            loss, stats = td_loss(self.critic, self.critic_target, self.buffer.sample(cfg.critic_batch_size), cfg.gamma)
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


def _check_tokens(trajs: list[Trajectory]) -> None:
    for t in trajs:
        for turn in t.turns:
            if turn.action_ids and len(turn.action_logprobs) != len(turn.action_ids):
                raise ValueError("a turn has action ids but no recorded log-probs; train with a policy that records them")
