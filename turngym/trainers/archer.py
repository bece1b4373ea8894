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
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from turngym.rewards import reward_stats
from turngym.trainers import functional as Fn
from turngym.trainers.config import knob
from turngym.trainers.critic import ReplayBuffer, UtteranceCritic, make_target, soft_update
from turngym.trainers.distributed import DistContext
from turngym.trainers.online import OnlineConfig, actor_update, advantage_stats, reference_pass, task_schedule
from turngym.trainers.sequences import PackedBatch, pack_batch
from turngym.trainers.trainer import OnlineTrainer
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
        r, done, next_feat = _transitions(batch, rewards, s_feat)
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
        token_adv = adv[batch.token_turn]
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
            b = self.buffer.sample(cfg.critic_batch_size)
            with torch.no_grad():
                y = Fn.td_target(b["reward"], self.critic_target.value(b["next_s"]), b["done"], cfg.gamma)
                y_v = Fn.double_q_min(*self.critic_target.q_values(b["s"], b["sa"]))
            q1_raw, q2_raw = self.critic.q_raw(b["s"], b["sa"])
            q_loss = self.critic.value_loss(q1_raw, y) + self.critic.value_loss(q2_raw, y)
            v_loss = self.critic.value_loss(self.critic.v(b["s"]), y_v)
            self.critic_opt.zero_grad(set_to_none=True)
            (q_loss + v_loss).backward()
            self.ctx.all_reduce_grads(self.critic.parameters())
            self.critic_opt.step()
            soft_update(self.critic_target, self.critic, cfg.tau)
            self.critic_steps += 1
            q1 = self.critic.scalar(q1_raw.detach())
            for k, v in {"critic/q_loss": q_loss.item(), "critic/v_loss": v_loss.item(),
                         "critic/td_error": (q1 - y).abs().mean().item(), "critic/q1_mean": q1.mean().item(),
                         "critic/target_mean": y.mean().item()}.items():
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


def _transitions(batch: PackedBatch, rewards: list[list[float]], s_feat: torch.Tensor):
    """Per flat turn: reward, done, and the next turn's state features (zeros when done)."""
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
