"""ArCHer (Zhou et al. 2024, "ArCHer: Training Language Model Agents via Hierarchical Multi-Turn RL"),
as the paper's official code runs it (github.com/YifeiZhou02/ArCHer: ``archer/algorithms/archer/trainer.py``,
``offpolicy_train_loop.py``, ``scripts/config/default.yaml``).

High level, an off-policy utterance critic (``critic.py``), trained by TD on a replay buffer of turns:

    y_Qi = r + gamma * (1 - done) * V_i,target(s')        (Q_i on the recorded reply a)
    y_Vi = Q_i,target(s, a'),   a' ~ pi(. | s)             (V_i on a fresh reply of the current actor)

Low level, a token-level actor trained by policy gradient at states drawn from the buffer, on a
fresh reply a' ~ pi(. | s), with the utterance advantage on every token of a':

    A(s, a') = min(Q1, Q2)(s, a') - min(V1, V2)(s),        loss = -A(s, a') * log pi(a' | s)

One iteration (``step``):
1. collect ``episodes_per_iter`` episodes sampled at ``temperature`` from the current actor; their
   turns go to the replay buffer (``collect``, ``add_turns``);
2. critic: ``critic_epochs`` TD steps, each followed by a Polyak step of the target (``update_critic``);
3. actor (after ``warmup_iters`` iterations of critic alone): ``actor_epochs`` policy-gradient steps,
   each at ``actor_states`` buffer states with fresh replies (``update_actor``).

Where this departs from the official code, and why (CPU sizes aside: iterations, episodes, epochs):
- The critic's encoder is the SFT'd model's top K blocks, its own trainable copy, over the frozen
  lower layers' states in a window ending at the token read (``encoder.TrunkTopEncoder``); the paper
  fine-tunes a whole RoBERTa. A whole LM per TD step does not fit a CPU.
- V's fresh replies are drawn once per iteration at ``critic_states`` buffer states, and the critic's
  epochs draw their minibatches from those; the paper draws a' anew for every minibatch. The actor
  does not change during the critic's epochs, so both are draws from the same pi(. | s).
- The loss averages ``-A log pi`` over tokens (the shared token-level step), where the paper sums
  over a reply's tokens and averages over replies: a per-reply scale, not a direction.

Plug-ins (``plugins.py``: tree collection, AWR, self-imitation...) hook into ``step`` by name
(``plugins=[...]``); this file names none of them. Results: docs/experiments.md (ArCHer as the paper
runs it); the plug-ins' in docs/results_archer.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from turngym.config import knob
from turngym.rewards import bind_policy, load_reward_state_dict, make_reward, reward_state_dict, reward_stats, wants_policy
from turngym.rollout import Collector, EnvTarget, TaskSchedule, env_info
from turngym.rollout.branching import Tree
from turngym.trainers.actor import actor_optimizer, actor_update, advantage_stats, frozen_copy, prepare_trainable
from turngym.trainers.archer.critic import ReplayBuffer, UtteranceCritic, make_target, soft_update, td_loss
from turngym.trainers.archer.encoder import TurnEncoder, cat_rows, select_rows
from turngym.trainers.archer.plugins import Plugins
from turngym.trainers.archer.turns import Turns
from turngym.trainers.distributed import DistContext
from turngym.trainers.loop import IterativeTrainer
from turngym.trainers.sequences import pack_records
from turngym.types import SamplingParams, TokenRecord


@dataclass
class ArcherConfig:
    """ArCHer's knobs: what the paper's algorithm reads, in CPU sizes (the official defaults in brackets)."""

    # ----- collection: episodes sampled from the current actor
    iterations: int = knob(4, "collect -> critic -> actor rounds [2000]")
    episodes_per_iter: int = knob(32, "episodes sampled per iteration [rollout_size 128]")
    temperature: float = knob(1.0, "sampling temperature of the collection and of fresh replies [1.0]")
    max_new_tokens: int = knob(48, "length cap of one reply [32] (turngym train: 0 = from the env's oracle)")
    num_envs: int = knob(32, "episodes in flight while collecting (the generation batch)")
    max_turns: int | None = knob(None, "override the env's turn limit")
    max_state_visits: int = knob(0, "end (truncate) an episode that reaches one env state this many times (0 = off)")
    # ----- critic
    critic_encoder: str = knob("top:2", "top:K: the critic's own copy of the SFT'd model's top K blocks trains over the "
                                        "frozen lower layers | reference: heads over the frozen final hidden states")
    critic_window: int = knob(32, "top:K: trunk states each feature reads, ending at its token")
    critic_hidden: int = knob(256, "width of the Q and V heads")
    critic_lr: float = knob(1e-3, "learning rate of the heads (AdamW) [1e-3 in the trainer's signature]")
    critic_encoder_lr: float = knob(1e-5, "top:K: learning rate of the critic's blocks [critic_lr 1e-5]")
    critic_epochs: int = knob(50, "TD steps per iteration, each followed by a Polyak step of the target [epochs 50]")
    critic_batch_size: int = knob(32, "transitions per TD step [batch 8 x grad_accum 32]")
    critic_states: int = knob(128, "buffer states per iteration whose fresh reply a' ~ pi(s) V's target reads")
    gamma: float = knob(0.95, "discount between turns [0.95]")
    tau: float = knob(0.1, "Polyak rate of the target critic [0.1]")
    buffer_capacity: int = knob(4096, "replay buffer size in turns [100000]")
    warmup_iters: int = knob(1, "iterations that train the critic alone [20]")
    # ----- actor
    actor_lr: float = knob(1e-5, "actor learning rate (AdamW) [lm_lr 1e-5]")
    actor_epochs: int = knob(3, "policy-gradient steps per iteration, each at fresh states and replies [3]")
    actor_states: int = knob(16, "buffer states per actor step, each with a fresh reply [batch 8 x grad_accum 32]")
    micro_batch_size: int = knob(4, "replies per forward inside an actor step (gradient accumulation)")
    trainable: str = knob("top:8", "all | top:K: the actor's trainable blocks")
    max_grad_norm: float = knob(1.0, "gradient clipping of actor and critic [1.0]")
    autocast: str = knob("auto", "auto | bf16 | none: mixed precision of the forwards")
    # ----- run
    reward: list = knob(["env"], "reward transforms, summed (see turngym.rewards)")
    plugins: list = knob([], "plug-ins by name, each a name or {name: ..., knob: value} (turngym.trainers.archer.plugins)")
    seed: int | None = knob(None, "seeds task order, sampling and minibatches (None: the run's seed, else 0)")
    checkpoint_every: int = knob(1, "iterations between checkpoints (0 = only at the end)")
    time_budget_s: float = knob(0.0, "stop after the iteration whose training seconds reach this (0 = no limit)")

    def __post_init__(self) -> None:
        counts = ("iterations", "episodes_per_iter", "num_envs", "critic_batch_size", "critic_states", "buffer_capacity",
                  "actor_states", "critic_window", "critic_hidden")
        bad = [k for k in counts if getattr(self, k) < (0 if k == "iterations" else 1)]
        if bad or min(self.critic_epochs, self.actor_epochs, self.warmup_iters, self.micro_batch_size) < 0:
            raise ValueError(f"{bad or 'epochs, warmup_iters and micro_batch_size'} must be >= 1 (iterations, epochs >= 0)")
        if not 0 < self.tau <= 1 or not 0 <= self.gamma <= 1:
            raise ValueError(f"tau must be in (0, 1] and gamma in [0, 1], got {self.tau}, {self.gamma}")
        if not (self.critic_encoder == "reference" or (self.critic_encoder.startswith("top:") and self.critic_encoder[4:].isdigit())):
            raise ValueError(f"critic_encoder must be reference or top:K, got {self.critic_encoder!r}")
        if self.critic_encoder == "reference" and self.critic_encoder_lr != 1e-5:
            raise ValueError("critic_encoder_lr trains the top:K encoder; critic_encoder=reference has none")
        if not (self.trainable == "all" or self.trainable.startswith("top:")):
            raise ValueError(f"trainable must be all or top:K, got {self.trainable!r}")
        if self.autocast not in ("auto", "bf16", "none"):
            raise ValueError(f"autocast must be auto, bf16 or none, got {self.autocast!r}")
        Plugins.check(self.plugins, self)  # names and knobs fail here, before any CPU is spent

    def run_seed(self) -> int:
        return 0 if self.seed is None else self.seed


class ArcherTrainer(IterativeTrainer):
    """Train ``policy`` (an ``HFPolicy``) on ``env_id`` with ArCHer.

    Args:
        policy: Exposes ``model``, ``tokenizer``, ``pad_id``, ``act``, ``generate`` and ``invalidate_caches``.
        env_id: A registered env; its ``task_ids`` (from ``env_kwargs``' split) are the training tasks.
        cfg: The knobs.
        out_dir: Checkpoints, ``metrics.jsonl``, the learning curve.
        ctx: Data-parallel context: each rank collects its share and keeps its own buffer; the critic's
            and actor's gradients are averaged over ranks.
        collector: Plays the episodes (shared with the caller's evaluations; default: its own).
        demos: The SFT stage's choice of demonstrations (``sft.SFTConfig.demo_choice``), for plug-ins
            that replay them.
    """

    name = "archer"

    def __init__(self, policy: Any, env_id: str, cfg: ArcherConfig | None = None, *, env_kwargs: dict | None = None,
                 out_dir: str | Path = "runs/archer", ctx: DistContext | None = None, collector: Any = None,
                 demos: dict | None = None) -> None:
        cfg = cfg or ArcherConfig()
        self._init_loop(policy, env_id, cfg, out_dir, ctx)
        self.seed = cfg.run_seed()
        self.env_kwargs, self.demos = dict(env_kwargs or {}), dict(demos or {})
        self.plugins = Plugins.build(cfg.plugins, cfg)
        self.env = EnvTarget(env_id, self.plugins.env_kwargs(self.env_kwargs), cfg.max_turns, cfg.max_state_visits)
        self.collector, self._own_collector = collector, collector is None

    # ----- setup ---------------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        torch.manual_seed(self.seed)
        self.reward_fn = make_reward(cfg.reward)
        self.ref = frozen_copy(self.policy.model)  # the SFT'd model: the critic's lower layers (and SPA's features)
        self.policy.model = self.model = prepare_trainable(self.policy.model, cfg.trainable)
        self.ctx.broadcast_params(self.model)
        self.actor_opt = actor_optimizer(self.model, cfg.actor_lr)
        self.gen = torch.Generator().manual_seed(self.seed)
        if wants_policy(self.reward_fn):
            bind_policy(self.reward_fn, self.ref)
        if self.collector is None:
            self.collector = Collector(self.policy, ctx=self.ctx)
        self.tasks = TaskSchedule(list(self.env.info.task_ids), self.seed)
        self.task_ids = self.tasks.task_ids
        self.stops = list(env_info(self.env_id, **self.env.kwargs).stop_strings)
        self.encoder = TurnEncoder(self.ref, cfg.critic_encoder, cfg.critic_window, cfg.autocast, self.policy.pad_id)
        self.critic = UtteranceCritic(self.encoder.dim, cfg.critic_hidden, self.encoder.critic_module())
        self.ctx.broadcast_params(self.critic)
        self.critic_target = make_target(self.critic)
        heads = [p for n, p in self.critic.named_parameters() if not n.startswith("encoder.")]
        groups = [{"params": heads, "lr": cfg.critic_lr}]
        if self.critic.encoder is not None:
            groups.append({"params": list(self.critic.encoder.parameters()), "lr": cfg.critic_encoder_lr})
        self.critic_opt = torch.optim.AdamW(groups)
        windows = self.critic.encoder is not None  # a window is W features: bf16 halves the buffer
        self.buffer = ReplayBuffer(cfg.buffer_capacity, self.ctx.rank_seed(self.seed) or 0,
                                   torch.bfloat16 if windows else torch.float32)
        self.critic_steps = 0
        self.plugins.setup(self)
        self._ready = True

    # ----- one iteration -------------------------------------------------------------------------
    def step(self) -> dict[str, float]:
        """Collect, then the critic's TD steps, then (after the warm-up) the actor's. Returns its metrics."""
        cfg, t0 = self.cfg, time.perf_counter()
        # 1. collect: a plug-in may collect otherwise (e.g. a search tree); the paper samples episodes
        tree, metrics = self.plugins.collect(self) or self.collect()
        rewards = self.reward_fn(tree.episodes)
        metrics.update(reward_stats(self.reward_fn))
        t1 = time.perf_counter()
        turns = self.turns(tree, rewards)
        self.plugins.on_turns(self, tree, turns, metrics)
        self.add_turns(turns, self.plugins.buffer_rows(self, tree, turns, turns.own))
        # 2. critic
        t2 = time.perf_counter()
        metrics.update(self.update_critic())
        self.plugins.after_critic(self, tree, turns, metrics)
        # 3. actor, once the critic has had warmup_iters iterations of its own
        t3 = time.perf_counter()
        active = self.iteration >= cfg.warmup_iters
        if active:
            with self.collector.weights_lock():
                metrics.update(self.plugins.update_actor(self, metrics) or self.update_actor())
        metrics.update({"actor/active": float(active), "time/collect_s": t1 - t0, "time/encode_s": t2 - t1,
                        "time/critic_s": t3 - t2, "time/actor_s": time.perf_counter() - t3})
        return self.finish_step(metrics)

    def collect(self) -> tuple[Tree, dict[str, float]]:
        """``episodes_per_iter`` episodes on tasks drawn uniformly, sampled from the current actor."""
        specs = self.tasks.specs(self.cfg.episodes_per_iter, self.iteration)
        trajs, metrics = self.collector.collect(self.env, specs, self.sampling(), num_envs=self.cfg.num_envs,
                                                version=self.iteration)
        self.tasks.record(trajs)
        return Tree(trajs, [-1] * len(trajs), [0] * len(trajs)), metrics

    def sampling(self, offset: int = 0) -> SamplingParams:
        # the seed depends only on (seed, iteration, offset): a resumed run samples as the original did
        seed = self.ctx.rank_seed(self.seed * 100_003 + self.iteration * 101 + offset)
        return SamplingParams(self.cfg.temperature, 1.0, self.cfg.max_new_tokens, seed=seed)

    def turns(self, tree: Tree, rewards: list[list[float]]) -> Turns:
        """Every turn of the tree's episodes as the critic reads it (one forward per episode)."""
        refs, s, sa = self.encoder.episodes(tree.episodes, tree.parent, tree.branch_turn)
        return Turns.build(tree, refs, s, sa, rewards)

    def add_turns(self, turns: Turns, rows: list[int]) -> None:
        """Put the transitions of ``rows`` (flat turns) in the replay buffer, with their episodes."""
        if not rows:
            return
        index = torch.tensor(rows, dtype=torch.long)
        pick = lambda x: select_rows(x, index)  # noqa: E731
        episodes = torch.tensor([self.iteration * 1_000_000 + turns.refs[i][0] for i in rows], dtype=torch.long)
        self.buffer.add(pick(turns.s), pick(turns.sa), turns.r[index], turns.done[index], pick(turns.next_s),
                        [turns.prompts[i] for i in rows], episodes)

    # ----- 2. critic -----------------------------------------------------------------------------
    def update_critic(self) -> dict[str, float]:
        """``critic_epochs`` TD steps of the critic on this iteration's pool (``critic_pool``)."""
        if not len(self.buffer) or not self.cfg.critic_epochs:
            return {}
        out = self.fit_critic(self.critic, self.critic_target, self.critic_opt, self.critic_pool())
        self.critic_steps += self.cfg.critic_epochs
        return out

    def critic_pool(self, extra: tuple[Turns, list[int]] | None = None) -> dict[str, Any] | None:
        """``critic_states`` transitions drawn from the buffer (plus ``extra``: rows of an iteration's
        turns), each with one fresh reply a' ~ pi(s) of the actor as it stands (``fresh_sa``: V's
        target); None when there is none."""
        buf = self.buffer
        parts, prompts, groups = [], [], []
        if len(buf):  # whole episodes: their states share prefixes (ReplayBuffer.sample_episodes)
            episodes = buf.sample_episodes(self.cfg.critic_states)
            rows = torch.tensor([i for g in episodes for i in g], dtype=torch.long)
            parts.append({f: buf.get(f, rows) for f in ReplayBuffer.FIELDS})
            prompts += [buf.prompt(int(i)) for i in rows]
            groups += _consecutive([len(g) for g in episodes])
        if extra is not None and extra[1]:
            turns, index = extra[0], torch.tensor(extra[1], dtype=torch.long)
            parts.append({f: select_rows(x, index) for f, x in zip(ReplayBuffer.FIELDS, turns.transitions())})
            prompts += [turns.prompts[i] for i in extra[1]]
            groups += [[len(prompts) - len(extra[1]) + i] for i in range(len(extra[1]))]
        if not parts:
            return None
        pool = {f: cat_rows([p[f] for p in parts]) for f in ReplayBuffer.FIELDS}
        fresh = [g.action_ids for g in self.sample_replies(prompts, offset=1, groups=groups)]
        pool["fresh_sa"] = self.encoder.replies(prompts, fresh, groups)[1]
        return pool

    def fit_critic(self, critic: UtteranceCritic, target: UtteranceCritic, opt: torch.optim.Optimizer,
                   pool: dict[str, Any]) -> dict[str, float]:
        """``critic_epochs`` TD steps (``critic.td_loss``) on minibatches of ``pool``, each followed by
        a Polyak step of ``target``; returns the mean metrics."""
        cfg, sums = self.cfg, {}
        params = list(critic.parameters())
        n = pool["reward"].shape[0]
        for _ in range(cfg.critic_epochs):
            mb = torch.randint(0, n, (cfg.critic_batch_size,), generator=self.gen)
            loss, stats = td_loss(critic, target, {k: select_rows(x, mb) for k, x in pool.items()}, cfg.gamma)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            self.ctx.all_reduce_grads(params)
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            opt.step()
            soft_update(target, critic, cfg.tau)
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v / cfg.critic_epochs
        return sums

    # ----- 3. actor ------------------------------------------------------------------------------
    def update_actor(self) -> dict[str, float]:
        """``actor_epochs`` steps of ``-A(s, a') log pi(a' | s)`` at ``actor_states`` buffer states,
        each with a fresh reply a' of the actor as it stands, A from the critic (``critic.advantage``)."""
        cfg, sums = self.cfg, {}
        for epoch in range(cfg.actor_epochs):
            episodes = self.buffer.sample_episodes(cfg.actor_states)
            prompts = [self.buffer.prompt(i) for g in episodes for i in g]
            groups = _consecutive([len(g) for g in episodes])
            gens = self.sample_replies(prompts, offset=2 + epoch, groups=groups)
            with torch.no_grad():
                adv = self.critic.advantage(*self.encoder.replies(prompts, [g.action_ids for g in gens], groups))
            items, keep = [], []
            for i, (prompt, g) in enumerate(zip(prompts, gens)):
                if g.action_ids:  # an empty reply has no token to move
                    rec = TokenRecord()
                    rec.add_prompt(prompt)
                    items.append((rec, [(0, rec.add_action(g.action_ids, g.logprobs))]))
                    keep.append(i)
            if not items:
                continue
            batch = pack_records(items, self.policy.pad_id)
            token_adv = adv[torch.tensor(keep)][batch.token_turn]  # A(s, a') on every token of a'
            stats = actor_update(self.model, self.actor_opt, batch, token_adv, None, self.actor_step(len(items)),
                                 self.gen, self.ctx, loss="nll")
            for k, v in {**stats, **advantage_stats(adv)}.items():
                sums[k] = sums.get(k, 0.0) + v / cfg.actor_epochs
        self.policy.invalidate_caches()
        return sums

    def actor_step(self, replies: int) -> SimpleNamespace:
        """The shared token-level step's knobs: one optimizer step over all ``replies`` (as the official
        actor epoch accumulates its batch), no KL or entropy term (the paper has none)."""
        cfg = self.cfg
        return SimpleNamespace(minibatch_size=replies, micro_batch_size=cfg.micro_batch_size, actor_epochs=1,
                               max_grad_norm=cfg.max_grad_norm, actor_lr=cfg.actor_lr, actor_warmup_steps=0,
                               kl_coef=0.0, ent_coef=0.0, autocast=cfg.autocast, old_logprobs="sampled")

    @torch.no_grad()
    def sample_replies(self, prompts: list[list[int]], offset: int = 0, groups: list[list[int]] | None = None) -> list[Any]:
        """One reply a' ~ pi(. | s) per prompt's ids, at the collection's temperature, from the actor
        as it stands (``HFPolicy.generate``), with its ids and raw log-probs. ``groups``: rows whose
        prompts extend one another in that order; each is sampled on the KV cache of the one before,
        so an episode's history is prefilled once (the samples are the same as without)."""
        groups = groups or [[i] for i in range(len(prompts))]
        out: list[Any] = [None] * len(prompts)
        caches: dict[int, Any] = {}
        sampling = self.sampling(offset)
        for depth in range(max((len(g) for g in groups), default=0)):  # the j-th state of every group at once
            live = [(gi, g[depth]) for gi, g in enumerate(groups) if depth < len(g)]
            for c in range(0, len(live), self.cfg.num_envs):
                chunk = live[c : c + self.cfg.num_envs]
                gens, new = self.policy.generate([prompts[i] for _, i in chunk], sampling, [self.stops] * len(chunk),
                                                 [caches.get(gi) for gi, _ in chunk], None)
                for (gi, i), g, cache in zip(chunk, gens, new):
                    out[i], caches[gi] = g, cache
        return out

    @torch.no_grad()
    def reply_values(self, prompt: list[int], replies: list[list[int]]) -> list[float]:
        """min(Q1, Q2)(s, a) under the current critic of each reply's ids after the prompt's ids."""
        q1, q2 = self.critic.q_values(*self.encoder.one_prompt(prompt, replies))
        return torch.minimum(q1, q2).tolist()

    # ----- bookkeeping -----------------------------------------------------------------------------
    def finish_step(self, metrics: dict[str, float]) -> dict[str, float]:
        metrics = super().finish_step(metrics)
        self.collector.set_version(self.iteration)
        return metrics

    def close(self) -> None:
        if self.collector is not None and self._own_collector:
            self.collector.close()

    def _state(self) -> dict:
        return {"model": self.model.state_dict(), "actor_opt": self.actor_opt.state_dict(), "gen": self.gen.get_state(),
                "critic": self.critic.state_dict(), "critic_target": self.critic_target.state_dict(),
                "critic_opt": self.critic_opt.state_dict(), "buffer": self.buffer.state_dict(),
                "critic_steps": self.critic_steps, "reward": reward_state_dict(self.reward_fn),
                "plugins": self.plugins.state_dict(), **self.tasks.state_dict()}

    def _load_state(self, st: dict) -> None:
        self.model.load_state_dict(st["model"])
        self.actor_opt.load_state_dict(st["actor_opt"])
        self.gen.set_state(st["gen"])
        self.critic.load_state_dict(st["critic"])
        self.critic_target.load_state_dict(st["critic_target"])
        self.critic_opt.load_state_dict(st["critic_opt"])
        self.buffer.load_state_dict(st["buffer"])
        self.critic_steps = st["critic_steps"]
        load_reward_state_dict(self.reward_fn, st.get("reward", {}))
        self.plugins.load_state_dict(st["plugins"])
        self.tasks.load_state_dict(st)


def _consecutive(sizes: list[int]) -> list[list[int]]:
    """Row groups of the given sizes laid end to end: ``[2, 1] -> [[0, 1], [2]]``."""
    out, start = [], 0
    for n in sizes:
        out.append(list(range(start, start + n)))
        start += n
    return out
