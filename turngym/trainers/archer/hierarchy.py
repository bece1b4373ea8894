"""The hierarchy over a trained actor: ArCHer's utterance-level critic of that actor, which acts by
choosing among the actor's own replies.

Why: every use of the critic inside training has been level with branch BC or below it
(docs/experiments.md). In training the env judges every reply the search plays, and it is a better
judge than the critic. At test time the env cannot be asked, and the critic can. For the critic to
judge the actor that acts, it has to estimate that actor's own action values, Q^pi(s, a): how the
episode ends when reply ``a`` is played at ``s`` and the actor plays greedily after it. Acting by
argmax_a Q^pi(s, a) over the actor's replies is then a policy-improvement step (Sutton & Barto 4.2):
where Q^pi is right, it is never worse than pi. A critic trained on the trees of earlier policies
(ArCHer's own rounds) estimates their values, not those of the actor that finally acts.

The stage, after the RL stage (``turngym train`` with ``hierarchy.tasks > 0``):

1. **Screen.** The trained actor plays ``tasks`` training tasks greedily, those the RL stage never
   played first: the actor was not fitted to them, so their states look like held-out ones.
2. **Branch.** At up to ``points`` turns of every episode, won and lost, its ``width`` runner-up
   replies (the ones acting will score) are each played on greedily to the end (one level), and
   the replies the env refused or that changed nothing are kept as one-turn dead ends. Each
   branched turn then holds the candidates acting will face, each with the outcome it led to.
3. **Critic.** ArCHer's critic (``core.py``, one iteration, whose actor never trains: the
   iteration is its warm-up): clipped double Q and V over the frozen trained actor's hidden states
   (``critic_encoder=reference``), V fitted to Q of the actor's fresh replies, Polyak targets, TD from
   the replay buffer. Its sibling AUC is cross-fitted out of sample (plug-in ``sibling_auc``: two
   critics, each trained without one half of the tasks, rank the other half's siblings).
4. **Gate.** The critic acts (``acting.k`` runner-ups, ``acting.CriticGuidedPolicy``) only when that
   AUC is at least ``gate``; below it the hierarchy is the actor alone.

The actor is the RL stage's, unchanged, so "acting with the critic" and "the actor alone" are one
policy with and without its high level, paired game by game.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from turngym.clock import CLOCK
from turngym.config import knob
from turngym.rollout.branching import BRANCH_BY
from turngym.trainers.archer.acting import acting_policy, pick_reply
from turngym.trainers.archer.core import ArcherConfig, ArcherTrainer
from turngym.trainers.archer.critic_rank import reply_scores
from turngym.trainers.checkpoint import has_checkpoint, load_checkpoint
from turngym.trainers.logger import read_rows
from turngym.trainers.stages import Section, Stage, register_section, register_stage


@dataclass
class HierarchyConfig:
    """The critic of the trained actor (off while ``tasks`` is 0)."""

    tasks: int = knob(0, "training tasks the trained actor plays for its critic, the ones the RL stage never played "
                         "first (0: no hierarchy stage)")
    points: int = knob(8, "turns branched per episode (its last ones; a lost episode's up to where it first came back "
                          "to a state it had been in)")
    width: int = knob(3, "runner-up replies played on greedily at each branched turn (as many as acting scores)")
    by: str = knob("observation", "how a return to an earlier state is seen: observation (what the agent was "
                                  "shown) | state_key (the env's privileged key)")
    critic_updates: int = knob(3000, "TD steps of the critic's heads (over stored features: cheap)")
    critic_lr: float = knob(3e-4, "critic learning rate (AdamW)")
    critic_hidden: int = knob(256, "width of the critic's MLP heads")
    env_kwargs: dict = knob({}, "overrides of the training env's kwargs for the critic's episodes, e.g. "
                                "{num_games: 256} on TextWorld: more training tasks than the RL stage played")
    gate: float = knob(0.75, "the critic acts only when its cross-fitted sibling AUC is at least this (0: always)")
    seed: int | None = knob(None, "seeds the screen's task order and the critic's minibatches (None: the run's seed)")


    def __post_init__(self) -> None:
        if self.tasks < 0 or self.points < 1 or self.width < 1:
            raise ValueError(f"hierarchy: tasks must be >= 0, points and width >= 1 (got {self.tasks}, {self.points}, "
                             f"{self.width})")
        if self.by not in BRANCH_BY:
            raise ValueError(f"hierarchy.by must be one of {BRANCH_BY}, got {self.by!r}")
        if self.critic_updates < 1 or self.critic_lr <= 0 or self.critic_hidden < 1:
            raise ValueError("hierarchy: critic_updates and critic_hidden must be >= 1, critic_lr > 0")
        if not 0 <= self.gate <= 1:
            raise ValueError(f"hierarchy.gate must be in [0, 1], got {self.gate}")


def critic_config(cfg: HierarchyConfig, actor: Any) -> ArcherConfig:
    """The ArCHer run that fits the critic: one iteration, the actor left as it is (the iteration is
    the critic's warm-up). ``actor`` is the RL stage's config, whose episode limits the critic's keep."""
    if getattr(actor, "trainable", "all") == "lora":
        raise ValueError("hierarchy.tasks: the critic stage reads a merged actor; train it with trainable=all or top:K")
    return ArcherConfig(
        iterations=1, warmup_iters=1, episodes_per_iter=cfg.tasks, num_envs=actor.num_envs, max_turns=actor.max_turns,
        max_state_visits=actor.max_state_visits, max_new_tokens=actor.max_new_tokens, seed=cfg.seed,
        trainable=actor.trainable if actor.trainable != "lora" else "all", autocast=actor.autocast,
        temperature=0.0,  # V of the greedy actor that will act: its fresh reply is its greedy one
        critic_encoder="reference", critic_epochs=cfg.critic_updates, critic_lr=cfg.critic_lr,
        critic_hidden=cfg.critic_hidden,
        # the candidates acting will face: every turn's runner-ups, in won and lost episodes, refused ones too
        plugins=[{"name": "tree", "points": cfg.points, "width": cfg.width, "depth": 1, "by": cfg.by,
                  "from_wins": True, "no_ops": True},
                 {"name": "sibling_auc", "holdout": 0.0, "gate": 1.0}])


ACTING_PRIORS = (0.0, 0.03, 0.1, 0.3, 1.0)  # the prior weights whose acting is estimated out of sample


def acting_gain(scores: Sequence[float], values: Sequence[float], logprobs: Sequence[float], groups: list[list[int]],
                prior: float, margin: float = 0.0) -> dict[str, float]:
    """What acting with a critic would earn at a set of states, with ``CriticGuidedPolicy``'s rule.

    Each group holds the row indices of one state's candidate replies, the policy's own first; row
    ``i`` has the critic's score (out of sample), the return playing it earned (the actor greedy after
    it) and its log-probability under the actor. At each state the rule plays
    ``pick_reply(reply_scores(scores, logprobs, prior), margin)``.

    Returns:
        ``gain``: the mean over states of the return of the reply played minus the policy's own;
        ``moved``: the share of states where another reply is played; ``better`` / ``worse``: the
        states where that earned more / less; ``states``: how many.
    """
    diffs, moved = [], 0
    for g in groups:
        pick = pick_reply(reply_scores([scores[i] for i in g], [[logprobs[i]] for i in g], prior), margin)
        diffs.append(values[g[pick]] - values[g[0]])
        moved += pick != 0
    n = max(len(groups), 1)
    return {"gain": sum(diffs) / n, "moved": moved / n, "better": float(sum(d > 0 for d in diffs)),
            "worse": float(sum(d < 0 for d in diffs)), "states": float(len(groups))}


def acting_headroom(values: Sequence[float], groups: list[list[int]]) -> dict[str, float]:
    """What acting could earn at most at these states (``acting_gain``'s groups): playing each
    state's best candidate. ``gain``: the mean of its return minus the policy's own reply's;
    ``better``: the states where some candidate earned more than the policy's reply."""
    diffs = [max(values[i] for i in g) - values[g[0]] for g in groups]
    return {"gain": sum(diffs) / max(len(groups), 1), "better": float(sum(d > 0 for d in diffs)),
            "states": float(len(groups))}


def gate_open(auc: float | None, gate: float) -> bool:
    """Whether a critic whose out-of-sample sibling AUC is ``auc`` may act: at least ``gate``. Without
    sibling pairs (``auc`` None) nothing shows that it ranks replies, so only a gate of 0 opens."""
    return gate <= 0 or (auc is not None and auc >= gate)


def trained_actor(rl_dir: Path) -> dict:
    """The RL stage's checkpoint: its final weights (``model``) and the tasks it screened (``screened``:
    task -> iteration; empty for a trainer that keeps none).

    Raises:
        ValueError: the checkpoint was deleted (a finished arm's may be, to save disk).
    """
    if not has_checkpoint(rl_dir / "checkpoint"):
        raise ValueError(f"hierarchy.tasks: the critic is fitted to the RL stage's actor, but {rl_dir / 'checkpoint'} "
                         "is gone; rerun the RL stage (delete its eval_final from stages.json) or set hierarchy.tasks=0")
    st = load_checkpoint(rl_dir / "checkpoint", restore_rng=False)
    screened = st.get("screened") or st.get("plugins", {}).get("tree", {}).get("screened", {})
    return {"model": st["model"], "screened": dict(screened)}


def fit_critic(policy: Any, env_id: str, cfg: HierarchyConfig, actor: Any, *, trained_on: dict[str, int],
               env_kwargs: dict, out_dir: Path, collector: Any = None, progress: bool = True) -> tuple[ArcherTrainer, dict]:
    """Fit (or, from its checkpoint, reload) the critic of ``policy``, the trained actor.

    Args:
        policy: The trained actor (an ``HFPolicy``); its weights are not changed.
        env_id, env_kwargs: The training env and its split.
        cfg: The stage's knobs. actor: The RL stage's config (``critic_config``).
        trained_on: The tasks the RL stage played (``trained_actor``): they are screened last.
        out_dir: The critic's checkpoint and metrics.
        collector: Plays the episodes (the run's, so envs stay open).

    Returns:
        The trainer (``reply_values`` scores replies for ``CriticGuidedPolicy``) and the stage's
        record: the critic's cross-fitted sibling AUC, its interval and pairs, and whether the gate opened.
    """
    trainer = ArcherTrainer(policy, env_id, critic_config(cfg, actor), env_kwargs={**env_kwargs, **cfg.env_kwargs},
                            out_dir=out_dir, collector=collector)
    trainer.setup()
    tree = trainer.plugins.get("tree")
    # screen_order plays never-screened tasks first: marking the RL stage's tasks as screened puts them last
    tree.screened = {t: 0 for t in trained_on}
    rows = trainer.train(progress=progress)
    logged = rows or read_rows(out_dir / "metrics.jsonl")  # a resumed, finished run logs no row
    metrics = logged[-1] if logged else {}
    keys = ("critic/sibling_auc_xfit", "critic/sibling_auc_xfit_low", "critic/sibling_auc_xfit_high",
            "critic/sibling_pairs_xfit", "critic/sibling_auc_xfit_lost", "critic/sibling_pairs_xfit_lost", "search/branches",
            "search/no_op_leaves", "search/sibling_groups", "rollout/success", "env_steps", "train_seconds")
    record = {k.split("/")[-1]: metrics[k] for k in keys if k in metrics}
    record["fresh_tasks"] = sum(t not in trained_on for t in tree.screened)
    fit = trainer.plugins.get("sibling_auc").crossfit  # None for a critic reloaded from its checkpoint
    if fit is not None:
        record["acting_xfit"] = {str(p): acting_gain(fit["scores"], fit["values"], fit["logprobs"], fit["groups"], p)
                                 for p in ACTING_PRIORS}
        record["acting_headroom"] = acting_headroom(fit["values"], fit["groups"])
    record["gate_open"] = gate_open(metrics.get("critic/sibling_auc_xfit"), cfg.gate)
    record["config"] = asdict(cfg)
    return trainer, record



def hierarchy_stage(p: Any) -> None:
    """After the RL stage: the critic of the trained actor, then the held-out evaluation of the actor
    acting with it (stage ``final_critic``); below the gate the actor acts alone."""
    cfg = p.cfg
    if not cfg.hierarchy.tasks or p.stages.done("eval_final_critic") or not p.stages.done("eval_final"):
        return
    out = Path(cfg.output_dir)
    actor = trained_actor(out / cfg.algo)
    if not p.stages.done("hierarchy"):
        p.say(f"[hierarchy] fitting the critic of the trained actor on {cfg.hierarchy.tasks} training tasks")
    p.policy.model.load_state_dict(actor.pop("model"))  # the RL stage's final weights (a rerun starts from SFT's)
    p.policy.invalidate_caches()
    with CLOCK.stage("hierarchy"):
        critic, record = fit_critic(p.policy, cfg.env_id, cfg.hierarchy, cfg.rl_section(), trained_on=actor["screened"],
                                    env_kwargs=p.train_kwargs, out_dir=out / "hierarchy", collector=p.collector,
                                    progress=p.progress)
    if p.stages.done("hierarchy"):  # the critic was reloaded: the record made when it was fitted stands
        record = p.stages.data["hierarchy"]
    p.stages.finish("hierarchy", record)
    if record["gate_open"]:
        p.held_out("final_critic", lambda engine: acting_policy(cfg.acting, engine, critic.reply_values))
    else:
        p.say(f"[hierarchy] the critic's sibling AUC {record.get('sibling_auc_xfit')} is below the gate "
              f"{cfg.hierarchy.gate}: the actor acts alone")
        p.stages.finish("eval_final_critic", {**p.stages.data["eval_final"], "acting/gate_open": 0.0})


def _check(train_cfg: Any) -> None:
    if train_cfg.hierarchy.tasks and not train_cfg.acting.k:
        raise ValueError(f"hierarchy.tasks={train_cfg.hierarchy.tasks} fits a critic that acts: set acting.k (runner-ups "
                         f"scored per turn, e.g. {train_cfg.hierarchy.width}), or hierarchy.tasks=0")


register_section(Section("hierarchy", HierarchyConfig, HierarchyConfig, "after the RL stage: the critic of the trained "
                         "actor, which acts with it (acting.k; off while hierarchy.tasks is 0)", check=_check))
register_stage(Stage("hierarchy", 70, hierarchy_stage, "the critic of the trained actor, acting with it"))
