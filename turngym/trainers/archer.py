"""ArCHer (Zhou et al. 2024): an utterance-level critic and a token-level actor, on tree rollouts.

High level: Q1, Q2 (s, a) and V(s) over utterances, trained off-policy by TD from a replay buffer
of turns, with clipped double-Q and Polyak-averaged target heads:

    y_Q = r + gamma * (1 - done) * V_target(s')          (Q loss on both heads)
    y_V = min(Q1_target, Q2_target)(s, a_pi)             (V loss)

where a_pi is the policy's own reply at s (``v_target``): V is the value of following the policy,
and A(s, a) = min(Q1, Q2)(s, a) - V(s) says how much better a is than what the policy would do.

Low level: the token-level actor learns from the critic's utterance advantage, given to every
token of the utterance: by default as advantage-weighted regression (AWR: the likelihood of the
replayed utterances weighted by exp(A / beta), on states drawn from the actor's replay memory),
or with ``actor_loss="ppo"`` through PPO's clipped surrogate on this iteration's episodes.

One iteration (``collect="tree"``, the default):

1. collect: play ``episodes_per_iter`` training tasks greedily (the roots; held-out evaluation is
   greedy), then branch search from the failed ones (``branch_wins``: from every root, and on after a
   success; ``turngym.rollout.branching``): at the turns
   before an episode came back to where it had been, the policy's runner-up replies are played
   on. A tree holds several actions from one state, each followed to the end: the contrast
   Q(s, a) - V(s) is learned from. Shared prefixes count once: a branch adds only its own turns.
2. rewards: the reward transforms (env, format, G-RA, SPA...) per turn.
3. features: one reference forward per episode gives phi(s), phi(s, a) for every turn.
4. critic: the turns go to the replay buffer, then N TD updates. Before they do, the iteration's
   sibling pairs are scored out of sample by two side copies of the critic, each trained without
   one half of the tasks (``critic/sibling_auc_xfit``: how often Q - V ranks the sibling that earned
   more first; ``_low``/``_high``: its 95% bootstrap interval over states; ``_lost``: at the forks of
   episodes that lost). The turns of a fixed
   share of the training tasks (``critic_holdout``) never train the critic: their pairs, kept across
   iterations, give ``critic/sibling_auc``.
5. actor: AWR at the states of the actor's memory (this and earlier iterations' siblings) where the
   critic ranks another valid reply above the policy's own by at least ``awr_margin`` (replies the
   env rejected are never targets), only while the out-of-sample sibling AUC (the cross-fit, else
   the held-out tasks') is at least ``critic_gate``: a critic at chance does not drive the actor.
   With them, the SFT stage's ``expert_replay`` demonstrations and, with ``self_imitation``, the
   policy's own turns whose episode earned more than the critic's V(s), and, with ``clone_wins``,
   each task's best success the search found (branch BC's update, weight 1); these wins the env
   confirmed also train while the gate is closed (V only weights the self-imitation ones).
6. log and checkpoint.

``collect="sample"`` plays ``episodes_per_iter`` episodes at the sampling temperature instead
(``group_size`` per task and reset), with ``v_target="fresh_action"`` the paper's setting.

Where this departs from the paper, and why:
- The actor learns by AWR on replayed states, not by REINFORCE on them. The branches' replies are
  forced runner-ups (p ~ 0.003 after SFT); a ratio-based update on such tokens cannot move them,
  a weighted likelihood can. ``actor_loss="ppo"`` is the on-policy alternative.
- The actor learns only at states where the critic prefers another valid reply to the policy's own
  by ``awr_margin``, not at every buffer state: at a tree's states most siblings earned alike, and
  a weighted likelihood toward the critic's noise among them raised losing replies (on multi-hop
  search most of the target's mass went to runner-ups that had lost, and the policy fell below SFT).
- ``self_imitation`` (off by default) adds self-imitation learning (Oh et al. 2018) to the actor:
  the policy's own turns that earned more than V(s), weighted by (R - V(s))+. The AWR term moves
  the policy only at a tree's forks; the turns around them stay the policy's own, and on Search a
  fork-only actor raised the invalid-turn rate above SFT's while cloning whole winning episodes
  lowered it. ``clone_wins`` (off by default) instead clones the search's best success per task at
  full weight, as branch BC does: on TextWorld-easy branch BC beat the (R - V)+-weighted wins by 10
  points from the same tree; with its update inside ArCHer the critic's AWR is measured as an
  addition to that floor (there, ArCHer was level with branch BC, and opening the gate to a critic
  at sibling AUC 0.585 cost 10 points: docs/experiments.md#archer-pieces). ``branch_wins`` (off by
  default) gives the critic pairs at won games' forks too; there its AUC passed the gate (0.82, 0.74
  out of sample), and with the gate open the arm was level with branch BC, while at lost games' forks
  it ranked at about 0.68 with or without them; on multi-hop search it led branch BC by 6.2 and 9.4
  points on seeds 0 and 1 and fell 21.9 below it on seed 2, its AUC reaching 0.75 in 3 of 6 rounds:
  pooled -2.1 (-7.6 to +3.6) (docs/experiments.md#critic-contrast, #search-wins-three-seeds).
  With the gate closed (``critic_gate=1.0``: the critic's V weights self-imitation, its Q - V never
  moves the actor) the same arm led branch BC by 6.5 (+0.0 to +13.3) over 3 seeds, and was 33.6 points
  above the gate-open arm on seed 2's same tree (#search-sil-three-seeds). Without V
  (``sil_baseline=zero``: every win cloned at weight R) seed 2 reached 61.7% against 53.9% from the same
  weights, +7.8 (-0.8 to +16.4): V's share of that lead is not measurably above 0 (#sil-baseline).
  Over 3 seeds from one machine's weights, that V-free arm led branch BC by 5.7 (+0.3 to +11.5;
  seed-level t -6.0 to +17.4) with more search and train time (#sil-v0-three-seeds). Branch BC that also
  clones the screen's greedy wins (``clone_greedy``) led that arm by 7.3 (+1.8 to +12.8) in a fifth of
  its time (#clone-greedy-search): its lead was the cloning of its own wins, not the critic.
- ``branch_rank=critic`` (off by default; not in the paper) uses the critic in the search instead of
  in the actor: of ``branch_pool`` runner-ups at a branch point it plays the ``branch_width`` with the
  highest min(Q1, Q2). With branch BC's clones as the actor and the gate shut, on multi-hop search
  (seed 0) it was level with branch BC + greedy wins (+0.8, -7.0 to +8.6), its ranked round solved
  4 of 33 failed tasks (branch BC: 7 of 39), and that search took 13x as long, each candidate then
  encoded with its whole prompt (#critic-ranked-search). ``branch_rank_prior`` adds the policy's own
  log pi(a|s) to the score, so the critic reorders the replies the policy nearly chose: at 0.1 the
  search solved the same tasks and the held-out outcomes matched the critic-only arm game for game.
- Acting with the critic (``eval.critic_guided``; not in the paper, where the critic only trains the
  actor): after training, the actor is also evaluated with the critic choosing, at every turn, among
  its greedy reply and K runner-ups (``critic_guided.CriticGuidedPolicy``, scored by ``reply_values``);
  the protocol reports it as the arm ``<name>+critic``, paired with the actor alone. On multi-hop
  search (seed 0) the final critic alone cost 29.7 points (-39.1 to -20.3): the search drops refused
  runner-ups, so the critic never saw one and often rated a malformed reply highest (invalid turns
  8.4% -> 40.3%). With 0.1 x log pi(a|s) in the score (``critic_prior``) it changed 15 of 548 turns,
  +2.3 (+0.0 to +5.5) (#critic-guided-acting). ``critic_no_ops`` (off by default) keeps those refused
  runner-ups (and the ones that changed nothing) as one-turn leaves that train the critic only: each is
  a dead end, its reward and done. That label is pessimistic (the env would let the policy go on from
  the same state one turn later), and on purpose: a critic that acts and rates a refused reply above
  the policy's would play it again at the next turn. They are never sibling pairs (the env's refusal
  alone tells them apart, which would lift the sibling AUC without the critic ranking anything) and
  never actor targets. On multi-hop search (seed 0; 352 leaves over two rounds, the actor unchanged)
  acting with that critic won 30.5% against 22.7% without them, +7.8 (+1.6 to +14.1), still 21.9
  points below the actor alone, and its invalid turns stayed at 39.4%: every leaf was at a state of
  a lost game (the search branched lost roots only), where every reply's target is about 0 too (#critic-no-ops).
  With ``branch_wins`` they sit at won games' forks too (seed 0: sibling AUC 0.83 out of sample in both rounds):
  acting alone that critic won 35.9%, and with 0.1 x log pi(a|s) 56.2%, +3.9 (+0.0 to +7.8) over the
  actor alone (#critic-wins-no-ops).
- V's action a_pi is the reply the collecting policy chose at s (greedy at the roots and on every
  branch after its fork; at a forced runner-up, its parent's reply at that state), recorded at
  collection, not re-sampled from the current policy at every update. For the greedy policy this
  collects with, that is exactly pi's action while the policy is unchanged; older buffer rows
  carry older policies' replies. ``v_target="fresh_action"`` re-samples (one generation per turn).
- The critic's encoder is a frozen copy of the SFT'd policy (``reference``) by default, with MLP
  heads over its hidden states; the paper fine-tunes a RoBERTa. ``critic_encoder="top:K"`` trains
  the top K blocks of that copy, at a CPU cost.
- An episode that ends by the turn limit is terminal: the limit is part of the task (a timed-out
  game is a lost game), so there is no value to bootstrap beyond it.

The critic reads features of the conversation: at the last prompt token they summarise the state
``s``, at the last action token ``(s, a)``. ``critic_encoder`` picks the encoder:

- ``reference`` (default): the final hidden states of the frozen reference copy of the policy (the
  same token ids, nothing re-tokenized), computed once per turn, stored and reused by every TD
  update; only the heads train, so many critic updates per actor update stay affordable.
- ``top:K``: the critic trains its own copy of the reference's last K blocks
  (``critic_encoder.TrunkTopEncoder``) over windows of ``critic_window`` trunk states.
- a path: another frozen causal/encoder LM over the conversation text (``TextFeatureEncoder``).

The file reads top to bottom: the config, the TD loss (pure, tested by hand), then the trainer's
iteration and its pieces. The critic's heads and replay buffer are in ``archer_critic``, the
advantages, AWR weights, sibling AUC, transitions and windows in ``functional``, the encoders in
``critic_encoder``; the token-level update is ``turngym.trainers.actor.actor_update``.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from turngym.config import knob
from turngym.rewards import reward_stats
from turngym.rewards.format import action_status
from turngym.rollout import EpisodeSpec, env_info
from turngym.rollout.branching import BRANCH_BY, BRANCH_PICK, Tree, is_no_op
from turngym.rollout.schedule import run_seed, screen_order
from turngym.trainers import functional as Fn
from turngym.trainers.actor import actor_update, advantage_stats, autocast, reference_pass
from turngym.trainers.archer_critic import ReplayBuffer, UtteranceCritic, ValueHead, make_target, soft_update  # noqa: F401
from turngym.trainers.branch_bc import better
from turngym.trainers.critic_encoder import (PromptFeatures, TextFeatureEncoder, TrunkTopEncoder, Window,
                                             tree_features)
from turngym.trainers.critic_guided import reply_scores
from turngym.trainers.distributed import DistContext
from turngym.trainers.registry import Algorithm, register_algorithm
from turngym.trainers.sequences import PackedBatch, nest_turns, pack_batch, pack_records
from turngym.trainers.trainer import OnlineConfig, OnlineTrainer
from turngym.types import TokenRecord, Trajectory, Turn


@dataclass
class ArcherConfig(OnlineConfig):
    """ArCHer's knobs (plus the shared ``OnlineConfig`` ones; with ``collect=tree``,
    ``episodes_per_iter`` is the number of training tasks screened per iteration)."""

    collect: str = knob("tree", "tree: greedy roots on episodes_per_iter training tasks, then branch search from the "
                                "failed ones (several actions per state) | sample: episodes at the sampling temperature")
    branch_points: int = knob(2, "tree: turns to branch at in each failed episode (the one that first came back to "
                                 "where it had been, and the ones before it)")
    branch_width: int = knob(3, "tree: runner-up replies tried at each branch point")
    branch_depth: int = knob(2, "tree: search levels (failed branches are branched again after their branch turn)")
    branch_by: str = knob("observation", "tree: how a branch point sees a return: observation (what the agent was "
                                         "shown) | state_key (the env's privileged world-state key)")
    branch_pick: str = knob("latest", "tree: which turns before that return to branch at: latest | uncertain (where "
                                      "the policy was least sure of its reply: its runner-ups there are near misses)")
    branch_rank: str = knob("policy", "tree: which runner-ups each branch point plays: policy (its branch_width most likely) "
                                      "| critic (branch_pool of them, the branch_width with the highest min(Q1, Q2)(s, a) "
                                      "under the critic of the iterations before; the first iteration, with no critic "
                                      "fitted yet, plays the policy's; the reference encoder reads each point's prompt once "
                                      "for all its candidates, the top:K and text encoders once per candidate)")
    branch_rank_prior: float = knob(0.0, "branch_rank=critic: the score is min(Q1, Q2)(s, a) + this x log pi(a|s), so the "
                                         "policy's own preference counts too (awr_beta ranks by the AWR target "
                                         "pi(a|s) exp(A / beta)); 0 = the critic alone")
    branch_pool: int = knob(8, "tree, branch_rank=critic: runner-ups proposed per branch point for the critic to choose from")
    branch_wins: bool = knob(False, "tree: also branch the won roots, and go on searching a task after a branch won: "
                                    "more sibling pairs that earned differently, for the critic (the search then "
                                    "costs more)")
    critic_no_ops: bool = knob(False, "tree: the runner-ups the env refused or that changed nothing train the critic too, "
                                      "each a one-turn dead end (its reward, done): a critic that acts (eval.critic_guided) "
                                      "then knows what a refused reply is worth; they are never sibling pairs or actor targets")
    actor_loss: str = knob("awr", "awr: at each replayed state with several actions (a tree's siblings), the likelihood "
                                  "of each weighted by softmax(log pi + A / awr_beta) over the siblings | ppo: the "
                                  "clipped surrogate on this iteration's episodes")
    awr_beta: float = knob(0.1, "AWR temperature (in reward units: the outcome is 1)")
    awr_values: str = knob("critic", "what ranks the siblings: critic (Q - V) | returns (what each sibling's episode "
                                     "earned after it: the tree alone, no critic; an ablation)")
    awr_margin: float = knob(0.15, "awr: a state trains the actor only where the critic ranks another valid sibling above "
                                   "the policy's own reply by at least this (reward units); below it the ranking is the "
                                   "critic's noise among replies that earned alike (0: any state where one ranks level)")
    awr_min_shift: float = knob(0.05, "a state trains the actor only when its AWR target moves at least this much "
                                      "probability (total variation) away from the policy's own choice among the siblings")
    actor_memory: int = knob(2048, "awr: sibling groups (states with their actions and features) the actor replays from")
    actor_groups: int = knob(64, "awr: the states of the memory whose target moves most (at least awr_min_shift) "
                                 "train each actor update; a sibling below awr_min_weight of its state is left out")
    awr_min_weight: float = knob(0.05, "awr: a sibling whose share of its state's target is below this is not "
                                       "trained on (each one costs a forward and backward over its whole prompt)")
    self_imitation: float = knob(0.0, "awr: the actor also clones its own turns whose episode earned more after them than "
                                      "the critic's V(s) (self-imitation, Oh et al. 2018), each weighted by this x "
                                      "(R - V(s))+; the turns of earlier iterations are kept (actor_memory of them); 0 = off")
    sil_baseline: str = knob("critic", "self-imitation's baseline: critic = V(s), weight (R - V(s))+ | zero = none, "
                                       "every remembered win at weight self_imitation x R (an ablation: with the gate "
                                       "closed the critic then moves nothing)")
    clone_wins: bool = knob(False, "awr: the actor also clones, at weight 1 on valid turns, each training task's best "
                                   "success the search found (highest return, then fewest turns; kept across "
                                   "iterations): branch BC's update, so the critic's AWR is measured as an addition to it")
    clone_greedy: bool = knob(False, "clone_wins: the screen's greedy wins are remembered too, as branch BC's clone_greedy "
                                     "(else only what the search found)")
    train_actor: bool = knob(True, "false: only the critic learns, the actor is left as it is (the critic of a trained "
                                   "actor that turngym.trainers.hierarchy fits for acting)")
    expert_replay: int = knob(0, "the oracle's episodes on N training tasks (the SFT stage's demonstrations) join every "
                                 "actor update with weight 1; 0 = off")
    critic_holdout: float = knob(0.125, "share of the training tasks whose turns the critic never trains on: their "
                                        "sibling pairs score it out of sample (critic/sibling_auc)")
    critic_gate: float = knob(0.6, "the actor trains only while the out-of-sample sibling AUC (this iteration's "
                                   "two-fold cross-fit, else the held-out tasks') is at least this (0 = always)")
    critic_hidden: int = knob(256, "width of the critic's MLP heads")
    critic_lr: float = knob(1e-3, "critic learning rate (AdamW)")
    critic_updates: int = knob(200, "N: critic TD updates per iteration (the heads over stored features: cheap; an "
                                    "underfit critic misranks the siblings the actor learns from, see critic/sibling_auc_xfit)")
    critic_batch_size: int = knob(64, "transitions per critic update")
    critic_warmup: int = knob(0, "critic updates before the actor starts")
    tau: float = knob(0.05, "Polyak rate of the target heads")
    buffer_capacity: int = knob(20_000, "replay buffer size in turns, allocated as it fills; top:K stores 3-4 windows "
                                        "a turn (~220-300 KB at 32 x 576 fp32: 20k turns ~ 5 GB), so lower it there")
    categorical: bool = knob(False, "categorical (HL-Gauss) value heads instead of MSE regression")
    num_atoms: int = knob(51, "bins of the categorical heads")
    v_min: float = knob(-1.0, "lowest value of the categorical support")
    v_max: float = knob(1.5, "highest value of the categorical support")
    token_baseline: bool = knob(False, "ppo: subtract a token-level baseline b(s, a_<t) fitted to Q(s, a)")
    critic_encoder: str = knob("reference", "reference (frozen policy backbone), top:K (the critic trains its own copy of "
                                            "the reference's last K blocks over cached lower layers) or a path to another LM")
    critic_window: int = knob(32, "top:K: trunk states the critic's blocks read, ending at the token encoded")
    critic_encoder_lr: float = knob(1e-5, "top:K: learning rate of the critic's own blocks (the heads use critic_lr)")
    group_size: int = knob(1, "sample: episodes per task per iteration, from one reset seed: repeats show the critic "
                                 "different actions from the same state")
    advantage: str = knob("q_minus_v", "q_minus_v: A = min(Q1, Q2)(s, a) - V(s) (the paper); td: A = r + gamma V(s') - V(s); "
                                       "gae: lambda-returns of V over each episode's turns (gae_lambda)")
    gae_lambda: float = knob(0.9, "lambda of advantage=gae: 0 = td, 1 = discounted return - V(s)")
    advantage_timing: str = knob("before", "ppo: score the batch with the critic before its TD updates on it (out of "
                                           "sample) | after: once the critic has been fitted to it")
    center_advantages: bool = knob(True, "ppo: subtract the batch mean of the utterance advantages (no std scaling)")
    v_target: str = knob("policy_action", "V's target action: policy_action = the reply the collecting policy chose at "
                                          "s (a forced runner-up: its parent's) | buffer_action = the recorded one | "
                                          "fresh_action = a' ~ pi(s) sampled when the batch is scored")
    expert_labels: bool = knob(True, "ask the env to label steps that match its oracle's move (env kwarg "
                                     "expert_labels) and log critic/auc_expert; envs without an oracle log nothing")
    dump_trees: bool = knob(False, "write each iteration's tree (its episodes, every turn's features, rewards, returns "
                                   "and sibling groups) to out_dir/tree<iteration>.pt, for offline critic probes "
                                   "(scripts/sibling_probe.py --dump)")

    def __post_init__(self) -> None:
        super().__post_init__()
        choices = {"collect": ("tree", "sample"), "branch_by": BRANCH_BY, "branch_pick": BRANCH_PICK, "actor_loss": ("awr", "ppo"),
                   "advantage": ("q_minus_v", "td", "gae"), "advantage_timing": ("before", "after"),
                   "v_target": ("policy_action", "buffer_action", "fresh_action"), "sil_baseline": ("critic", "zero"),
                   "branch_rank": ("policy", "critic")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.critic_updates < 0 or self.critic_batch_size < 1:
            raise ValueError("critic_updates must be >= 0 and critic_batch_size >= 1")
        if not 0 < self.tau <= 1:
            raise ValueError(f"tau must be in (0, 1], got {self.tau}")
        if self.categorical and self.v_min >= self.v_max:
            raise ValueError("v_min must be < v_max")
        if not 0 <= self.gae_lambda <= 1:
            raise ValueError(f"gae_lambda must be in [0, 1], got {self.gae_lambda}")
        if min(self.branch_points, self.branch_width, self.branch_depth) < 1:
            raise ValueError("branch_points, branch_width and branch_depth must be >= 1")
        if self.awr_beta <= 0 or not 0 <= self.awr_min_shift < 1 or min(self.actor_memory, self.actor_groups) < 1:
            raise ValueError("awr_beta must be > 0, awr_min_shift in [0, 1), actor_memory and actor_groups >= 1")
        if self.awr_margin < 0:
            raise ValueError(f"awr_margin must be >= 0, got {self.awr_margin}")
        if not 0 <= self.awr_min_weight < 1:
            raise ValueError(f"awr_min_weight must be in [0, 1), got {self.awr_min_weight}")
        if self.awr_values not in ("critic", "returns"):
            raise ValueError(f"awr_values must be critic or returns, got {self.awr_values!r}")
        if not 0 <= self.critic_holdout < 1 or not 0 <= self.critic_gate <= 1:
            raise ValueError("critic_holdout must be in [0, 1) and critic_gate in [0, 1]")
        if self.expert_replay < 0:
            raise ValueError(f"expert_replay must be >= 0, got {self.expert_replay}")
        if self.self_imitation < 0 or (self.self_imitation > 0 and self.actor_loss != "awr"):
            raise ValueError(f"self_imitation must be >= 0, and is for actor_loss=awr (got {self.self_imitation})")
        if self.clone_wins and self.actor_loss != "awr":
            raise ValueError("clone_wins is for actor_loss=awr")
        if self.clone_greedy and not self.clone_wins:
            raise ValueError("clone_greedy adds the greedy wins to clone_wins' memory: set clone_wins=true")
        if self.branch_rank_prior < 0:
            raise ValueError(f"branch_rank_prior must be >= 0, got {self.branch_rank_prior}")
        if self.branch_rank == "critic" and self.branch_pool <= self.branch_width:
            raise ValueError(f"branch_rank=critic chooses branch_width of branch_pool runner-ups: branch_pool must be "
                             f"> branch_width ({self.branch_width}), got {self.branch_pool}")
        if self.collect == "tree":
            if self.group_size != 1 or self.async_staleness >= 0 or self.rollout_engine == "vllm" or self.sharding != "none":
                raise ValueError("collect=tree screens each task once and branches with the HF policy in one process "
                                 "(group_size=1, async_staleness=-1, rollout_engine=hf, sharding=none)")
            if self.v_target == "fresh_action":
                raise ValueError("collect=tree: the roots and branches are the greedy policy's own replies; "
                                 "use v_target=policy_action")
        elif self.critic_gate > 0:
            raise ValueError("critic_gate needs sibling pairs, which only collect=tree makes: set critic_gate=0")
        if self.actor_loss == "awr":
            if self.collect != "tree":
                raise ValueError("actor_loss=awr learns at states with several actions, which collect=tree makes")
            if self.pg_loss not in ("auto", "nll"):
                raise ValueError("actor_loss=awr is a weighted likelihood: pg_loss must be auto or nll")
            self.pg_loss = "nll"  # derived: the actor step's loss is the (AWR-weighted) likelihood
            if self.token_baseline:
                raise ValueError("token_baseline is for actor_loss=ppo")
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


# ----- the trainer: one iteration = collect, features, critic updates, actor update -----------------
@dataclass
class Encoded:
    """Every turn of a list of episodes, flat: ``refs[i] = (episode, turn)``, its features
    ``s[i]``, ``sa[i]`` (``(N, H)``, or windows with ``critic_encoder=top:K``) and, when the episodes
    were encoded as one batch (``actor_loss=ppo``), that batch, its reference log-probs and hidden states."""

    refs: list[tuple[int, int]]
    s: torch.Tensor | Window
    sa: torch.Tensor | Window
    batch: PackedBatch | None = None
    ref_logprobs: torch.Tensor | None = None
    hidden: torch.Tensor | None = None


class ArcherTrainer(OnlineTrainer):
    """Train ``policy`` (an ``HFPolicy``) on ``env_id`` with ArCHer.

    Args:
        policy: Exposes ``model``, ``tokenizer``, ``pad_id``, ``act``, ``alternatives`` (tree
            collection) and ``invalidate_caches``.
        env_id: A registered env; its ``task_ids`` (from ``env_kwargs``' split) are the training tasks.
        cfg: The knobs.
        out_dir: Checkpoints (``checkpoint/``), ``metrics.jsonl``, TensorBoard, the learning curve.
        ctx: Data-parallel context (``collect=sample``). Each rank keeps its own replay buffer;
            critic gradients are averaged like the actor's, so every rank holds the same critic.
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
        if cfg.collect == "tree" and self.ctx.enabled:
            raise ValueError("collect=tree runs in one process, not under torchrun")
        self.critic_steps = 0
        self.memory: list[dict] = []  # the actor's replay: one state's sibling actions, features, log-probs, values
        self.wins: list[dict] = []  # self-imitation's replay: own turns that earned a return, with their state features
        self.best: dict[str, Trajectory] = {}  # clone_wins: task -> the best success the search found for it
        self.screened: dict[str, int] = {}  # task -> the iteration it was last screened in
        self.heldout: dict[str, torch.Tensor] = {}  # sibling pairs of the held-out tasks: s, sa, value, group
        self.experts: list[Trajectory] = []
        self._rank_stats: dict[str, float] = {}  # branch_rank=critic: this iteration's points, and replies moved
        self.crossfit: dict | None = None  # the last cross-fit's out-of-sample scores of each state's candidates

    # ----- setup ---------------------------------------------------------------------------
    def needs_reference(self) -> bool:
        return True  # the critic's feature encoder, and the KL anchor

    def _setup_extra(self) -> None:
        cfg = self.cfg
        # the reference pass keeps hidden states for the critic: the final ones (reference) or the
        # trunk at the input of block N-K (top:K); a text encoder reads the conversation itself
        self._hidden = cfg.critic_encoder == "reference" or cfg.critic_top_k > 0
        self.encoder = self.ref if self._hidden else TextFeatureEncoder(cfg.critic_encoder)
        feat = self.ref.config.get_text_config().hidden_size if self._hidden else self.encoder.dim
        top = TrunkTopEncoder(self.ref, cfg.critic_top_k) if cfg.critic_top_k else None
        self._hidden_layer = top.trunk_layer if top is not None else None
        # reply_values' prompts grow turn by turn when the critic acts: each runs only its new tokens
        self._prompt_features = PromptFeatures(self.ref) if self._hidden and top is None else None
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
        self.buffer = ReplayBuffer(cfg.buffer_capacity, feat, seed=cfg.seed + self.ctx.rank,
                                   v_action=cfg.v_target != "buffer_action")
        self._stops = list(env_info(self.env_id, **self.env_kwargs).stop_strings)  # as in collection
        if cfg.v_target == "fresh_action" and not hasattr(self.policy, "generate"):
            raise ValueError("v_target=fresh_action samples a' from token ids: it needs an HFPolicy")
        self.heldout_tasks = heldout_tasks(self.task_ids, cfg.critic_holdout, cfg.seed)
        if cfg.expert_replay:
            self.experts = self.collector.demonstrations(self.env, cfg.expert_replay, cfg.seed, cfg.demo_seed,
                                                        pool=cfg.demo_pool)

    # ----- the loop -------------------------------------------------------------------------
    def step(self) -> dict[str, float]:
        """One iteration: collect, features, critic updates, actor update. Returns its metrics."""
        cfg = self.cfg
        # 1. collect: a tree (greedy roots, branches from the failed ones) or sampled episodes
        tree, metrics = self._collect_tree() if cfg.collect == "tree" else self._collect_sampled()
        trajs = tree.episodes
        _check_tokens(trajs)
        # 2. per-turn rewards
        rewards = self.reward_fn(trajs)
        metrics.update(reward_stats(self.reward_fn))  # G-RA gate rates, SPA fit error, shaping...
        # 3. features of every turn: one reference forward per episode
        enc = self._encode(trajs, whole=cfg.actor_loss == "ppo", tree=tree)
        r, done, next_s = _transitions(enc.refs, rewards, enc.s)
        row = {ref: i for i, ref in enumerate(enc.refs)}
        own = [row[(i, k)] for i in range(len(trajs)) for k in tree.own_turns(i) if (i, k) in row]
        v_sa = self._v_action_features(tree, trajs, enc)
        siblings = [[row[ref] for ref in g] for g in tree.sibling_groups()]
        values = _returns_after(enc.refs, rewards)
        # 4. critic: out-of-sample scores first, then the held-in own turns train it
        adv, q = self._advantages(enc.s, enc.sa, r, done, next_s)
        metrics.update(self._expert_auc(trajs, enc.refs, adv))
        held = [i for i in own if trajs[enc.refs[i][0]].task_id in self.heldout_tasks]
        train = [i for i in own if trajs[enc.refs[i][0]].task_id not in self.heldout_tasks]
        fresh = [g for g in siblings if trajs[enc.refs[g[0]][0]].task_id not in self.heldout_tasks]
        auc_before, pairs_before = Fn.sibling_auc(adv, values, fresh)
        if pairs_before:  # in sample for states seen in earlier iterations; undefined without a pair
            metrics["critic/sibling_auc_before"] = auc_before
        offered = fresh  # what a critic that acts is offered at a state: the refused replies too
        if cfg.critic_no_ops:
            offered = [g for g in ([row[ref] for ref in g] for g in tree.sibling_groups(no_ops=True))
                       if trajs[enc.refs[g[0]][0]].task_id not in self.heldout_tasks]
        metrics.update(self._crossfit_auc(train, fresh, enc, (r, done, next_s, v_sa), values, trajs, offered))
        if cfg.dump_trees:
            _save_atomic(tree_record(tree, rewards, enc, offered), self.out_dir / f"tree{self.iteration}.pt")
        self._add_transitions(self.buffer, train, enc, r, done, next_s, v_sa)
        metrics.update(self._critic_updates(cfg.critic_updates))
        self._keep_heldout_pairs([g for g in siblings if g[0] in set(held)], enc, values)
        metrics.update(self._heldout_auc())
        # 5. actor, while the critic ranks siblings out of sample (this iteration's cross-fit, else the held-out tasks)
        evidence = metrics.get("critic/sibling_auc_xfit", metrics.get("critic/sibling_auc", 0.0))
        # the gate guards against a critic at chance driving the actor: with awr_values=returns it does not drive it
        gate = cfg.critic_gate <= 0 or cfg.awr_values == "returns" or evidence >= cfg.critic_gate
        active = self.critic_steps >= cfg.critic_warmup and gate
        if not cfg.train_actor:  # the critic of a fixed actor: no actor memory, no update
            metrics["actor/active"] = 0.0
            return self.finish_step(metrics)
        if cfg.actor_loss == "awr":
            self._remember(trajs, enc, siblings, values)
            self._remember_wins(trajs, enc, own, values)
            self._remember_best(tree)
            # self-imitation's and the clones' targets are wins the env confirmed (V only weights the
            # former): a closed gate stops the critic's sibling ranking, not those
            if active or ((cfg.self_imitation > 0 or cfg.clone_wins) and self.critic_steps >= cfg.critic_warmup):
                with self.weights_lock():
                    metrics.update(self._awr_update(siblings=active))
        else:
            if cfg.advantage_timing == "after":  # in sample: the critic has just been fitted to these turns
                adv, q = self._advantages(enc.s, enc.sa, r, done, next_s)
            token_adv, adv = self._ppo_advantages(enc, adv, q, metrics)
            if active:
                with self.weights_lock():
                    metrics.update(actor_update(self.model, self.actor_opt, enc.batch, token_adv, enc.ref_logprobs,
                                                cfg, self.gen, self.ctx, loss=_loss(cfg)))
        metrics["actor/active"] = float(active)
        return self.finish_step(metrics)

    # ----- 1. collection -----------------------------------------------------------------------
    def _collect_tree(self) -> tuple[Tree, dict[str, float]]:
        """Screen ``episodes_per_iter`` training tasks greedily (unsolved and least recently
        screened first), then search from the failed ones."""
        cfg = self.cfg
        solved = {t for t, ok in self.tasks.greedy_outcomes.items() if ok}
        tasks = screen_order(self.task_ids, solved, self.screened, cfg.seed, self.iteration, cfg.episodes_per_iter)
        specs = [EpisodeSpec(t, run_seed(cfg.seed, self.task_ids.index(t)), greedy=True) for t in tasks]
        roots, metrics = self.collect(specs)
        self.screened.update({t: self.iteration for t in tasks})
        self.tasks.record_screen(roots)
        t0 = time.perf_counter()
        ranked = cfg.branch_rank == "critic" and self.critic_steps > 0  # a critic fitted on earlier trees
        self._rank_stats = {}
        tree = self.collector.tree_rollout(self.env, specs, roots=roots, points=cfg.branch_points,
                                           width=cfg.branch_width, depth=cfg.branch_depth,
                                           max_new_tokens=cfg.max_new_tokens, num_envs=cfg.num_envs, by=cfg.branch_by,
                                           pick=cfg.branch_pick, from_wins=cfg.branch_wins, keep_no_ops=cfg.critic_no_ops,
                                           rank=self._rank_replies if ranked else None,
                                           pool=cfg.branch_pool if ranked else 0)
        branches = [b for b in tree.episodes[len(roots):] if not is_no_op(b)]
        metrics["search/critic_ranked"] = float(ranked)
        if ranked:  # replies played that the policy's own order (its first branch_width) would not have played
            metrics.update(self._rank_stats)
        failed = {r.task_id for r in roots if not r.success}
        metrics.update({"search/seconds": time.perf_counter() - t0, "search/branches": float(len(branches)),
                        "search/failed_tasks": float(len(failed)),
                        "search/solved_tasks": float(len({b.task_id for b in branches if b.success})),
                        "search/sibling_groups": float(len(tree.sibling_groups())),
                        "search/no_op_leaves": float(len(tree.episodes) - len(roots) - len(branches))})
        # replayed turns step the env too
        metrics["rollout/env_steps"] += sum(len(b.turns) for b in tree.episodes[len(roots):])
        return tree, metrics

    @torch.no_grad()
    def _rank_replies(self, points: list[tuple[Trajectory, int]], replies: list[list[Any]]) -> list[list[float]]:
        """min(Q1, Q2)(s, a) (plus ``branch_rank_prior`` x log pi(a|s)) of each candidate reply a at each
        branch point s (episode, turn) under the current critic; -inf for a reply without ids."""
        if self._hidden and self._hidden_layer is None:  # the reference encoder: each prompt's forward once
            q = [x for (traj, j), us in zip(points, replies) for x in self._shared_prompt_q(traj, j, us)]
        else:
            flat = [(traj, j, u) for (traj, j), us in zip(points, replies) for u in us if u.action_ids]
            n = self.cfg.num_envs
            q = [x for i in range(0, len(flat), n) for x in self._branch_q(flat[i : i + n])]
        it = iter(q)
        return self._count_moved([[self._with_prior(next(it), u) if u.action_ids else -math.inf for u in us]
                                  for us in replies])

    def _shared_prompt_q(self, traj: Trajectory, j: int, replies: list[Any]) -> list[float]:
        """min(Q1, Q2) of the replies (with ids) at turn ``j`` of ``traj``."""
        ids = [list(u.action_ids) for u in replies if u.action_ids]
        return self.reply_values(traj.prompt_ids(j), ids) if ids else []

    @torch.no_grad()
    def reply_values(self, prompt: list[int], replies: list[list[int]]) -> list[float]:
        """min(Q1, Q2)(s, a) under the current critic of each reply's ids ``a`` to the prompt ids ``s``
        (what ``critic_guided.CriticGuidedPolicy`` ranks a turn's candidates by). The reference encoder
        runs the prompt's forward once for all of them, on the keys and values of the longest earlier
        prompt it extends (``PromptFeatures``); ``top:K`` reads
        each as a record of its own.

        Raises:
            ValueError: a text encoder (``critic_encoder`` a path): it reads the conversation's text.
        """
        if not self._hidden:
            raise ValueError("scoring replies from token ids needs critic_encoder=reference or top:K")
        if self._hidden_layer is None:
            with autocast(self.ref, self.cfg.autocast):
                s, sa = self._prompt_features(list(prompt), [list(a) for a in replies])
            return self._q_min(s.expand_as(sa), sa)
        n = len(prompt)
        head = TokenRecord(list(prompt), [0] * n, [0.0] * n)
        return self._q_min(*self._record_features([head.branch(n, list(a)) for a in replies]))

    def _branch_q(self, chunk: list[tuple[Trajectory, int, Any]]) -> list[float]:
        """min(Q1, Q2) of each (episode, turn, reply), each encoded as a sequence of its own (the top:K
        windows; the text encoders read the conversation with the reply in place of the turn's)."""
        if self._hidden:
            s, sa = self._branch_features([(traj, j, list(u.action_ids)) for traj, j, u in chunk])
        else:
            alt = [Trajectory(traj.task_id, turns=[*traj.turns[:j], Turn(u.text)],
                              initial_observation=traj.initial_observation) for traj, j, u in chunk]
            s, sa = self.encoder.turn_features(alt, [(k, j) for k, (_, j, _) in enumerate(chunk)])
        return self._q_min(s, sa)

    def _q_min(self, s, sa) -> list[float]:
        return Fn.double_q_min(*self.critic.q_values(self.critic.encode(s), sa)).tolist()

    def _branch_features(self, items: list[tuple[Trajectory, int, list[int]]]):
        """phi(s), phi(s, a) of reply ids at (episode, turn), each a branch of the episode's record (its
        prompt, then the reply), from one reference pass."""
        return self._record_features([traj.record.branch(traj.turns[k].span[0], ids) for traj, k, ids in items])

    def _record_features(self, branches: list[tuple[TokenRecord, tuple[int, int]]]):
        """phi(s), phi(s, a) of records that each end with one reply (its span), from one reference pass."""
        batch = pack_records([(rec, [(0, span)]) for rec, span in branches], self.policy.pad_id)
        return self._features(batch, reference_pass(self.ref, batch, True, self.cfg.autocast, self._hidden_layer)[1], [])

    def _with_prior(self, q: float, reply: Any) -> float:
        """A reply's ranking score: its Q plus ``branch_rank_prior`` x its recorded log pi(a|s)."""
        return reply_scores([q], [reply.logprobs], self.cfg.branch_rank_prior)[0]

    def _count_moved(self, out: list[list[float]]) -> list[list[float]]:
        """Count the points scored and the replies the critic's top ``branch_width`` takes from
        beyond the policy's own first ``branch_width`` (``search/ranked_*``); returns ``out``."""
        width = self.cfg.branch_width  # how far the critic moved the search off the policy's own order
        chosen = [i for xs in out for i in sorted(range(len(xs)), key=lambda i: -xs[i])[:width]]
        stats = self._rank_stats
        stats["search/ranked_points"] = stats.get("search/ranked_points", 0.0) + len(out)
        stats["search/ranked_off_policy"] = stats.get("search/ranked_off_policy", 0.0) + sum(i >= width for i in chosen)
        return out

    def _collect_sampled(self) -> tuple[Tree, dict[str, float]]:
        specs = self.schedule(self.cfg.episodes_per_iter, self.cfg.group_size)
        trajs, metrics = self.collect(specs, self.cfg.group_size)
        return Tree(trajs, [-1] * len(trajs), [0] * len(trajs)), metrics

    # ----- 3. features ---------------------------------------------------------------------------
    @torch.no_grad()
    def _encode(self, trajs: list[Trajectory], whole: bool = False, tree: Tree | None = None) -> Encoded:
        """phi(s), phi(s, a) of every turn of ``trajs``: one reference forward per episode, in
        chunks of ``num_envs`` episodes of similar length (little padding); ``whole``: one batch,
        kept with its reference log-probs and hidden states (the PPO actor and token baseline read them).
        With ``tree`` (whose episodes ``trajs`` are) and the reference encoder, a branch that leaves a
        root runs only its own tokens, on the root's keys and values (``critic_encoder.tree_features``)."""
        cfg = self.cfg
        if whole:
            batch = pack_batch(trajs, self.policy.pad_id)
            ref_logprobs, hidden = reference_pass(self.ref, batch, self._hidden, cfg.autocast, self._hidden_layer)
            s, sa = self._features(batch, hidden, trajs)
            return Encoded(list(batch.turn_refs), s, sa, batch, ref_logprobs, hidden)
        parts: dict[tuple[int, int], tuple] = {}
        if tree is not None and self._hidden and self._hidden_layer is None:
            with autocast(self.ref, cfg.autocast):
                parts = tree_features(self.ref, trajs, tree.parent, tree.branch_turn)
        covered = {i for i, _ in parts}
        rest = [i for i in range(len(trajs)) if i not in covered]
        order = sorted(rest, key=lambda i: sum(t.num_tokens for t in trajs[i].turns)
                       + len(trajs[i].prompt_ids(len(trajs[i].turns) - 1) if trajs[i].turns else []))
        for c in range(0, len(order), cfg.num_envs):
            idx = order[c : c + cfg.num_envs]
            chunk = [trajs[i] for i in idx]
            batch = pack_batch(chunk, self.policy.pad_id)
            hidden = reference_pass(self.ref, batch, True, cfg.autocast, self._hidden_layer)[1] if self._hidden else None
            s, sa = self._features(batch, hidden, chunk)
            for j, (ti, k) in enumerate(batch.turn_refs):
                parts[(idx[ti], k)] = (_row(s, j), _row(sa, j))
        refs = sorted(parts)
        return Encoded(refs, _stack([parts[r][0] for r in refs]), _stack([parts[r][1] for r in refs]))

    def _v_action_features(self, tree: Tree, trajs: list[Trajectory], enc: Encoded):
        """phi(s, a_V) per flat turn: the policy's own reply (``policy_action``: a branch's forced
        first turn reads its parent's reply at that state), a fresh sample, or None (``buffer_action``)."""
        cfg = self.cfg
        if cfg.v_target == "buffer_action":
            return None
        if cfg.v_target == "fresh_action":
            return self._fresh_action_features(trajs, enc.refs)
        return _select(enc.sa, policy_action_rows(enc.refs, tree.parent, tree.branch_turn))

    # ----- 4. critic ---------------------------------------------------------------------------
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

    @staticmethod
    def _add_transitions(buffer: ReplayBuffer, rows: list[int], enc: Encoded, r, done, next_s, v_sa) -> None:
        if not rows:
            return
        index = torch.tensor(rows, dtype=torch.long)
        pick = lambda x: None if x is None else _select(x, index)
        buffer.add(pick(enc.s), pick(enc.sa), r[index], done[index], pick(next_s), v_sa=pick(v_sa))

    def _critic_updates(self, n: int) -> dict[str, float]:
        sums = self._td_steps(self.critic, self.critic_target, self.critic_opt, self.buffer, n, self.ctx)
        self.critic_steps += n if len(self.buffer) else 0
        return sums

    def _td_steps(self, critic: UtteranceCritic, target: UtteranceCritic, opt: torch.optim.Optimizer,
                  buffer: ReplayBuffer, n: int, ctx: DistContext | None = None) -> dict[str, float]:
        """``n`` TD updates of ``critic`` (and Polyak steps of ``target``) on minibatches of ``buffer``."""
        cfg, sums = self.cfg, {}
        v_action = "sa" if cfg.v_target == "buffer_action" else "v_sa"
        for _ in range(n if len(buffer) else 0):
            loss, stats = td_loss(critic, target, buffer.sample(cfg.critic_batch_size), cfg.gamma, v_action)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if ctx is not None:
                ctx.all_reduce_grads(critic.parameters())
            opt.step()
            soft_update(target, critic, cfg.tau)
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v / n
        return sums

    def _crossfit_auc(self, rows: list[int], groups: list[list[int]], enc: Encoded, transitions: tuple,
                      values: torch.Tensor, trajs: list[Trajectory],
                      offered: list[list[int]] | None = None) -> dict[str, float]:
        """``critic/sibling_auc_xfit``: this iteration's sibling pairs, out of sample. The tasks are
        split in two halves; for each half, a copy of the critic as it stands trains (``critic_updates``
        steps, on the replay buffer plus this iteration's turns of the OTHER half) and scores the
        half's pairs, so no pair is scored by a critic that saw its task this iteration.

        ``offered`` (default ``groups``): the states' whole candidate sets, refused replies included,
        scored the same way; with their returns and log-probs they are kept in ``self.crossfit``, from
        which ``trainers.hierarchy`` estimates, out of sample, what acting with the critic would earn."""
        offered = groups if offered is None else offered
        self.crossfit = None
        if not groups or self._hidden_layer is not None:  # top:K: a copy of its blocks per fold is too dear
            return {}
        task = lambda i: trajs[enc.refs[i][0]].task_id
        half = lambda i: int(hashlib.sha256(f"{self.iteration}:{task(i)}".encode()).hexdigest()[:8], 16) % 2
        scores = torch.zeros(len(enc.refs))
        for f in (0, 1):
            mine = [i for g in offered if half(g[0]) == f for i in g]
            if not mine:
                continue
            critic, target = copy.deepcopy(self.critic), copy.deepcopy(self.critic_target)
            opt = torch.optim.AdamW(critic.parameters(), lr=self.cfg.critic_lr)
            buffer = self.buffer.clone()
            self._add_transitions(buffer, [i for i in rows if half(i) != f], enc, *transitions)
            self._td_steps(critic, target, opt, buffer, self.cfg.critic_updates)
            index = torch.tensor(mine, dtype=torch.long)
            with torch.no_grad():
                s = critic.encode(_select(enc.s, index))
                adv = Fn.double_q_min(*critic.q_values(s, _select(enc.sa, index))) - critic.value(s)
            scores[index] = adv
        logp = [sum(x for x in trajs[ti].action_logprobs(k) if not math.isnan(x)) for ti, k in enc.refs]
        self.crossfit = {"groups": offered, "scores": scores.tolist(), "values": values.tolist(), "logprobs": logp}
        auc, pairs = Fn.sibling_auc(scores, values, groups)
        if not pairs:
            return {}
        low, high = Fn.sibling_auc_interval(scores, values, groups, seed=self.iteration)
        out = {"critic/sibling_auc_xfit": auc, "critic/sibling_pairs_xfit": float(pairs),
               "critic/sibling_auc_xfit_low": low, "critic/sibling_auc_xfit_high": high}
        # the forks of lost episodes apart (with branch_wins the won roots' forks are the rest): there the
        # policy's own reply lost, and a critic that merely trusts the policy ranks them wrong
        lost_auc, lost_pairs = Fn.sibling_auc(scores, values, [g for g in groups if not trajs[enc.refs[g[0]][0]].success])
        if lost_pairs:
            out.update({"critic/sibling_auc_xfit_lost": lost_auc, "critic/sibling_pairs_xfit_lost": float(lost_pairs)})
        return out

    def _keep_heldout_pairs(self, groups: list[list[int]], enc: Encoded, values: torch.Tensor) -> None:
        """Store the held-out tasks' sibling groups (features and values): the critic never trains
        on them, so every later iteration can score it on all of them, out of sample."""
        if not groups or self._hidden_layer is not None:  # windows: too large to keep for scoring
            return
        rows = torch.tensor([i for g in groups for i in g], dtype=torch.long)
        base = int(self.heldout["group"].max()) + 1 if self.heldout else 0
        gid = torch.tensor([base + n for n, g in enumerate(groups) for _ in g], dtype=torch.long)
        new = {"s": enc.s[rows], "sa": enc.sa[rows], "value": values[rows], "group": gid}
        self.heldout = {k: torch.cat([self.heldout[k], x]) if self.heldout else x for k, x in new.items()}

    @torch.no_grad()
    def _heldout_auc(self) -> dict[str, float]:
        """``critic/sibling_auc``: the critic's Q - V ranking of the held-out sibling pairs (out of sample)."""
        if not self.heldout:
            return {}
        h = self.heldout
        s = self.critic.encode(h["s"])
        adv = Fn.double_q_min(*self.critic.q_values(s, h["sa"])) - self.critic.value(s)
        groups: dict[int, list[int]] = {}
        for i, g in enumerate(h["group"].tolist()):
            groups.setdefault(g, []).append(i)
        auc, pairs = Fn.sibling_auc(adv, h["value"], list(groups.values()))
        return {"critic/sibling_auc": auc, "critic/sibling_pairs": float(pairs)} if pairs else {}

    def _expert_auc(self, trajs: list[Trajectory], refs: list[tuple[int, int]], adv: torch.Tensor) -> dict[str, float]:
        """How well A ranks turns that played the env's oracle move above turns that did not
        (``info["expert_match"]``, see ``expert_labels``); nothing when the env gives no labels."""
        labels = [trajs[ti].turns[k].info.get("expert_match") for ti, k in refs]
        if all(y is None for y in labels):
            return {}
        y = torch.tensor([float("nan") if v is None else float(v) for v in labels])
        out = {"critic/expert_rate": float(y.nan_to_num(0.0).sum() / (~y.isnan()).sum())}
        auc = Fn.auc(adv, y)
        if not math.isnan(auc):  # undefined when no turn (or every turn) played the oracle's move
            out["critic/auc_expert"] = auc
        return out

    # ----- 5. actor ----------------------------------------------------------------------------
    def _remember(self, trajs: list[Trajectory], enc: Encoded, siblings: list[list[int]], values: torch.Tensor) -> None:
        """Keep every sibling group (one state, several actions) for the actor, oldest out first."""
        for g in siblings:
            index = torch.tensor(g, dtype=torch.long)
            turns = [_alone(trajs[enc.refs[i][0]], enc.refs[i][1]) for i in g]  # each a record of its own
            self.memory.append({"task": trajs[enc.refs[g[0]][0]].task_id, "turns": turns,
                                "s": _select(enc.s, index), "sa": _select(enc.sa, index), "value": values[index],
                                "logp": torch.tensor([float(sum(t.action_logprobs(0))) for t in turns])})
        del self.memory[: max(0, len(self.memory) - self.cfg.actor_memory)]

    def _remember_wins(self, trajs: list[Trajectory], enc: Encoded, own: list[int], values: torch.Tensor) -> None:
        """Keep each own turn (roots' and branches' own, shared prefixes once) that earned a return
        after it, for self-imitation, oldest out first."""
        if self.cfg.self_imitation <= 0:
            return
        for i in own:
            if float(values[i]) > 0:
                self.wins.append({"turn": _alone(trajs[enc.refs[i][0]], enc.refs[i][1]), "s": _row(enc.s, i),
                                  "value": float(values[i])})
        del self.wins[: max(0, len(self.wins) - self.cfg.actor_memory)]

    def _remember_best(self, tree: Tree) -> None:
        """Keep each task's best success among the search's branches (with ``clone_greedy``, its
        greedy roots too: branch BC's memory)."""
        if not self.cfg.clone_wins:
            return
        for ep, parent in zip(tree.episodes, tree.parent):
            if (parent >= 0 or self.cfg.clone_greedy) and ep.success and better(self.best.get(ep.task_id), ep):
                self.best[ep.task_id] = ep

    def _clone_rows(self) -> tuple[list[Trajectory], list[float]]:
        """The remembered best successes in task order, with weight 1 on each valid turn (0 on a
        turn the env rejected), as branch BC clones them."""
        clones = [self.best[k] for k in sorted(self.best)]
        return clones, [float(action_status(t) == "valid") for ep in clones for t in ep.turns]

    @torch.no_grad()
    def _self_imitation_rows(self) -> tuple[list[Trajectory], list[float]]:
        """The remembered wins whose self-imitation weight (``Fn.self_imitation_weights`` under the
        current critic's V, or V = 0 with ``sil_baseline=zero``) is at least ``awr_min_weight``, with
        those weights, an episode's turns nested in one row (``nest_turns``)."""
        if not self.wins:
            return [], []
        returns = torch.tensor([e["value"] for e in self.wins])
        if self.cfg.sil_baseline == "zero":
            v = torch.zeros_like(returns)
        else:
            v = self.critic.value(self.critic.encode(_stack([e["s"] for e in self.wins])))
        w = Fn.self_imitation_weights(returns, v, self.cfg.self_imitation)
        keep = [i for i in range(len(self.wins)) if float(w[i]) >= self.cfg.awr_min_weight]
        # an episode's kept turns in one row: each turn alone re-read its whole prompt (5x the tokens:
        # 316k against 63k for the 515 wins of TextWorld-medium's first iteration)
        return nest_turns([self.wins[i]["turn"] for i in keep], [float(w[i]) for i in keep])

    def _awr_update(self, siblings: bool = True) -> dict[str, float]:
        """AWR at remembered states: each sibling's likelihood weighted by its share of
        pi*(a|s) ~ pi(a|s) exp(A / beta) (``Fn.sibling_awr_weights``), A from the current critic (or
        the siblings' returns); states where pi* differs from pi by less than ``awr_min_shift`` are
        skipped, as are states where no valid sibling beats the policy's own reply by ``awr_margin``
        (without it, most of the target's mass went to runner-ups whose episodes had lost: on
        Search, states where every sibling lost outnumber the others ten to one, and the critic's
        small differences among them still moved the target); the ``actor_groups`` that differ most
        are kept, and siblings below ``awr_min_weight`` of their state are left out; the
        self-imitation turns (``self_imitation``, their own weights) and the demonstrations (weight
        1 on every turn) join. ``siblings=False`` (the critic's gate is closed) leaves the AWR rows out."""
        cfg = self.cfg
        if not self.memory and not self.wins and not self.best:
            return {}
        rows, row_w, out = [], [], {"actor/states": 0.0, "actor/memory": float(len(self.memory))}
        if self.memory:  # a tree whose roots all won has no forks, but its wins still teach
            groups, turns, logp, values, valid = memory_rows(self.memory)
            adv = values if cfg.awr_values == "returns" else memory_advantages(self.memory, self.critic)
            w, targets, shift, useful, pick = awr_targets(logp, adv, groups, valid, cfg)
            pick = pick if siblings else []
            kept = [r for i in pick for r in targets[i] if float(w[r]) >= cfg.awr_min_weight]
            rows, row_w = [turns[r] for r in kept], [float(w[r]) for r in kept]
            out.update({"actor/states": float(len(pick)), "actor/informative_states": float(len(useful)),
                        "actor/target_shift": sum(shift) / len(shift)})
            out.update(advantage_stats(adv))
        imitate, imitate_w = self._self_imitation_rows()
        clones, clone_w = self._clone_rows()
        data = rows + imitate + clones + self.experts
        weight = row_w + imitate_w + clone_w + [1.0] * sum(len(t.turns) for t in self.experts)
        if cfg.self_imitation > 0:
            out.update({"actor/sil_turns": float(len(imitate_w)), "actor/sil_rows": float(len(imitate)),
                        "actor/sil_memory": float(len(self.wins)),
                        "actor/sil_weight": sum(imitate_w) / max(1, len(imitate_w))})
        if cfg.clone_wins:
            out["actor/clone_episodes"] = float(len(clones))
        if not data:
            return out
        batch = pack_batch(data, self.policy.pad_id)
        token_w = Fn.broadcast_to_tokens(torch.tensor(weight), batch.token_turn)
        ref_logprobs = reference_pass(self.ref, batch, False, cfg.autocast)[0] if cfg.kl_coef > 0 else None
        out.update(actor_update(self.model, self.actor_opt, batch, token_w, ref_logprobs, cfg, self.gen, self.ctx,
                                loss=_loss(cfg)))
        return out

    def _ppo_advantages(self, enc: Encoded, adv: torch.Tensor, q: torch.Tensor, metrics: dict):
        """The utterance advantages of this batch, centred / standardised, broadcast to tokens
        (optionally minus the token-level baseline)."""
        cfg = self.cfg
        if cfg.center_advantages:
            adv = Fn.center(adv)
        if cfg.normalize_advantages and adv.numel() > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-6)
        token_adv = Fn.broadcast_to_tokens(adv, enc.batch.token_turn)
        if self.baseline is not None:
            token_adv, base_metrics = self._token_baseline(enc.batch, enc.hidden, q, token_adv)
            metrics.update(base_metrics)
        metrics.update(advantage_stats(adv))
        return token_adv, adv

    # ----- pieces ---------------------------------------------------------------------------
    @torch.no_grad()
    def _fresh_action_features(self, trajs: list[Trajectory], refs: list[tuple[int, int]]) -> torch.Tensor | Window:
        """``(N, H)`` phi(s, a') (or its window) of one fresh action a' ~ pi(s) per flat turn, sampled from
        the turn's recorded prompt ids and encoded like the recorded actions (V's target in ``td_loss``)."""
        cfg = self.cfg
        prompts = [trajs[ti].prompt_ids(k) for ti, k in refs]
        sampling = cfg.sampling(self.iteration)
        sampling.seed = self.ctx.rank_seed(sampling.seed) + 0x5EED  # not the collection's own samples
        gens = []
        with self.weights_lock():
            for i in range(0, len(prompts), cfg.num_envs):
                chunk = prompts[i : i + cfg.num_envs]
                gens += self.policy.generate(chunk, sampling, [self._stops] * len(chunk), None,
                                             [k for _, k in refs[i : i + cfg.num_envs]])[0]
        dec = self.policy.tokenizer.decode
        turns = [Turn(dec(g.action_ids, skip_special_tokens=True)) for g in gens]
        if self._hidden:  # one sequence per state: a branch of the record, its prompt then a'
            return self._branch_features([(trajs[ti], k, list(g.action_ids) or [self.policy.pad_id])
                                          for (ti, k), g in zip(refs, gens)])[1]
        fresh = [Trajectory(trajs[ti].task_id, turns=[*trajs[ti].turns[:k], t], initial_observation=trajs[ti].initial_observation)
                 for (ti, k), t in zip(refs, turns)]
        return self.encoder.turn_features(fresh, [(i, k) for i, (_, k) in enumerate(refs)])[1]

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
            "critic_steps": self.critic_steps, "screened": dict(self.screened), "heldout": dict(self.heldout),
            "memory": [{**e, "turns": [t.to_dict() for t in e["turns"]]} for e in self.memory],
            "wins": [{**e, "turn": e["turn"].to_dict()} for e in self.wins],
            "best": {k: t.to_dict() for k, t in self.best.items()},
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
        self.screened = dict(st.get("screened", {}))
        self.heldout = dict(st.get("heldout", {}))
        self.memory = [{**e, "turns": [Trajectory.from_dict(t) for t in e["turns"]]} for e in st.get("memory", [])]
        self.wins = [{**e, "turn": Trajectory.from_dict(e["turn"])} for e in st.get("wins", [])]
        self.best = {k: Trajectory.from_dict(d) for k, d in st.get("best", {}).items()}


def memory_rows(memory: list[dict]):
    """The actor memory flat: ``(groups, turns, logp, values, valid)``, a group being the row
    indices of one state's siblings, each row a one-turn record with its recorded log-prob, the
    return its episode earned after it, and whether the env accepted it."""
    groups, start = [], 0
    for e in memory:
        groups.append(list(range(start, start + len(e["turns"]))))
        start += len(e["turns"])
    turns = [t for e in memory for t in e["turns"]]
    valid = torch.tensor([t.turns[0].action_valid for t in turns])
    return groups, turns, torch.cat([e["logp"] for e in memory]), torch.cat([e["value"] for e in memory]), valid


@torch.no_grad()
def memory_advantages(memory: list[dict], critic: UtteranceCritic) -> torch.Tensor:
    """The critic's min(Q1, Q2) - V at every row of the actor memory."""
    s = critic.encode(_cat([e["s"] for e in memory]))
    return Fn.double_q_min(*critic.q_values(s, _cat([e["sa"] for e in memory]))) - critic.value(s)


def awr_targets(logp: torch.Tensor, adv: torch.Tensor, groups: list[list[int]], valid: torch.Tensor, cfg: ArcherConfig):
    """The AWR targets at the remembered states, and which states train the actor.

    Returns ``(w, targets, shift, useful, pick)``: the per-row weights (``Fn.sibling_awr_weights``
    over each state's valid replies, ``targets``), each state's total-variation ``shift`` away from
    pi, the states that pass ``awr_min_shift`` and ``awr_margin`` (``useful``), and the
    ``actor_groups`` of them that shift most (``pick``, in memory order).
    """
    # a reply the env rejected is never a target, whatever the critic says of it
    margins = Fn.sibling_margins(logp, adv, groups, valid)
    targets = [[r for r in g if valid[r]] for g in groups]
    w = Fn.sibling_awr_weights(logp, adv, targets, cfg.awr_beta)
    prior = Fn.sibling_awr_weights(logp, torch.zeros_like(adv), targets, cfg.awr_beta)  # pi on the siblings
    shift = [0.5 * float((w[g] - prior[g]).abs().sum()) for g in targets]
    useful = [i for i, d in enumerate(shift) if d >= cfg.awr_min_shift and margins[i] >= cfg.awr_margin]
    # the states where the critic most wants another reply; ties by memory order (oldest first)
    pick = sorted(sorted(useful, key=lambda i: -shift[i])[: cfg.actor_groups])
    return w, targets, shift, useful, pick


def _transitions(turn_refs: list[tuple[int, int]], rewards: list[list[float]], s: torch.Tensor | Window):
    """``Fn.turn_transitions`` of features, or of windows (states and positions shift alike; a done
    turn's next window is zeros at position 0, and its value is multiplied by 0)."""
    if isinstance(s, torch.Tensor):
        return Fn.turn_transitions(turn_refs, rewards, s)
    r, done, next_states = Fn.turn_transitions(turn_refs, rewards, s[0])
    return r, done, (next_states, Fn.turn_transitions(turn_refs, rewards, s[1])[2])


def policy_action_rows(refs: list[tuple[int, int]], parent, branch_turn) -> torch.Tensor:
    """``(N,)`` per flat turn ``(episode, turn)``: the row of the policy's own reply at that state.
    A turn is its own reply, except a branch's forced first turn (``k == branch_turn[episode]``),
    whose state the parent reached and answered with its own reply. ``parent`` and ``branch_turn``
    are indexed by episode (``parent < 0``: a root)."""
    row = {ref: i for i, ref in enumerate(refs)}
    at = [row.get((parent[e], k), i) if parent[e] >= 0 and k == branch_turn[e] else i for i, (e, k) in enumerate(refs)]
    return torch.tensor(at, dtype=torch.long)


def heldout_tasks(task_ids: list[str], share: float, seed: int) -> set[str]:
    """The tasks whose turns the critic never trains on: each task is in with probability ``share``,
    decided by a hash of (seed, task). Independent of every schedule's RNG (a shuffle seeded like
    the greedy screen's would hold out exactly the tasks screened first)."""
    cut = int(share * 2**32)
    return {t for t in task_ids if int(hashlib.sha256(f"{seed}:{t}".encode()).hexdigest()[:8], 16) < cut}


def _row(x: torch.Tensor | Window, i: int):
    return x[i] if isinstance(x, torch.Tensor) else (x[0][i], x[1][i])


def _stack(rows: list) -> torch.Tensor | Window:
    """Single rows (``_row``) into one tensor (or window)."""
    if isinstance(rows[0], tuple):
        return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])
    return torch.stack(rows)


def _cat(blocks: list) -> torch.Tensor | Window:
    """Blocks of rows (``_select``) into one tensor (or window)."""
    if isinstance(blocks[0], tuple):
        return torch.cat([b[0] for b in blocks]), torch.cat([b[1] for b in blocks])
    return torch.cat(blocks)


def _select(x: torch.Tensor | Window, index: torch.Tensor) -> torch.Tensor | Window:
    return x[index] if isinstance(x, torch.Tensor) else (x[0][index], x[1][index])


def tree_record(tree: Tree, rewards: list[list[float]], enc: Encoded, offered: list[list[int]] | None = None) -> dict:
    """One iteration's tree as an offline critic probe reads it (``scripts/sibling_probe.py``): every
    flat turn's features ``s``, ``sa`` and transition (``r``, ``done``), the return after it
    (``values``), the rows of the episodes' own turns (``own``), the sibling groups as rows, the
    candidates a critic that acts is offered (``offered``: refused replies too), each row's ``info``
    (task, episode, turn, parent, branch turn, oracle match, success, the reply's log-prob), and the
    episodes themselves (``tree``: to compute other features from)."""
    r, done, _ = _transitions(enc.refs, rewards, enc.s)
    row = {ref: i for i, ref in enumerate(enc.refs)}
    eps = tree.episodes
    info = [{"task": eps[e].task_id, "ep": e, "turn": k, "parent": tree.parent[e], "branch_turn": tree.branch_turn[e],
             "expert": bool(eps[e].turns[k].info.get("expert_match")), "success": eps[e].success,
             "logprob": sum(x for x in eps[e].action_logprobs(k) if not math.isnan(x))} for e, k in enc.refs]
    siblings = [[row[ref] for ref in g] for g in tree.sibling_groups()]
    return {"s": enc.s, "sa": enc.sa, "r": r, "done": done, "values": _returns_after(enc.refs, rewards),
            "own": [row[(e, k)] for e in range(len(eps)) for k in tree.own_turns(e) if (e, k) in row],
            "siblings": siblings, "offered": siblings if offered is None else offered, "info": info,
            "rewards": rewards, "tree": {"episodes": [t.to_dict() for t in eps], "parent": list(tree.parent),
                                         "branch_turn": list(tree.branch_turn)}}


def _save_atomic(obj: Any, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)


def _returns_after(refs: list[tuple[int, int]], rewards: list[list[float]]) -> torch.Tensor:
    """``(N,)`` per flat turn: the episode's summed reward from that turn to its end (an action's value)."""
    return torch.tensor([float(sum(rewards[ti][k:])) for ti, k in refs])


def _check_tokens(trajs: list[Trajectory]) -> None:
    for t in trajs:
        for k in range(len(t.turns)):
            if any(math.isnan(x) for x in t.action_logprobs(k)):
                raise ValueError("a turn has action ids but no recorded log-probs; train with a policy that records them")


def _alone(traj: Trajectory, k: int) -> Trajectory:
    """Turn ``k`` of ``traj`` as a one-turn episode: a record that shares ``traj``'s prefix up to the
    turn's prompt, then holds its action (what the actor's memory keeps of a sibling)."""
    turn = traj.turns[k]
    rec, span = traj.record.branch(turn.span[0], traj.action_ids(k), traj.action_logprobs(k))
    return Trajectory(traj.task_id, turns=[dataclasses.replace(turn, span=span)], record=rec)


def _loss(cfg: ArcherConfig) -> str:
    """The actor step's loss: ``pg_loss`` (awr sets nll: a weighted likelihood), PPO's surrogate by default."""
    return "ppo" if cfg.pg_loss == "auto" else cfg.pg_loss


register_algorithm(Algorithm("archer", section="archer", config=ArcherConfig, trainer=ArcherTrainer,
                             help="utterance-level critic, token-level actor, on tree rollouts"))
