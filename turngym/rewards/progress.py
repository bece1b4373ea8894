"""SPA: stepwise progress attribution (Wang et al. 2025, "SPA-RL: Reinforcing LLM Agents via
Stepwise Progress Attribution", arXiv:2505.20732).

A progress estimator (a small MLP head on an encoder of (task, history, action)) gives every step
a contribution c_t. It is trained so that a trajectory's contributions add up to its outcome:

    L = mean_trajectories (sum_t c_t - outcome)^2                  (MSE on the sum)

and the per-step reward is the contribution plus a grounding bonus for valid, executed actions:

    r_t = alpha * c_t + beta * [info["action_valid"]]

With ``exact_sum`` the residual (outcome - sum_t c_t) is spread evenly over the turns, so the
contributions of a scored trajectory add up to its outcome exactly (return decomposition).

``fit="potential"`` fits the head per step instead: h_t, read after the step's action, is fitted
to its episode's outcome (an estimate of P(success | history through a_t)), and a step's credit is
the rise it made,

    c_t = h_t - h_{t-1},   h_{-1} = the fitting set's success rate,   h_{T-1} = the outcome (reward only)

so the credits add up to outcome - base rate (a constant no action changes). Sum matching can be
solved by counting steps where failed episodes are the long ones (they run to the turn limit): a
head that gives every late turn a negative amount fits the sums. A per-step target cannot be met
that way, since every step of an episode has the same target, and the credits telescope, so
wandering earns nothing (potential-based shaping, Ng et al. 1999: the optimal policy is the
outcome's). The scored trajectory's last step is grounded in its real outcome.

Online (``online=True``): each call adds the batch to a trajectory buffer and trains ``updates``
steps before scoring the batch, so it plugs into any trainer as a plain reward transform (the
trainers call their transform once per iteration with the new batch). Offline: ``fit(trajs)`` on
a buffer of trajectories, then call with ``online=False``; or, as SPA-RL does, ``fit_first=N``:
the first batch it is called with (a tree rollout's exploration episodes) trains it for N steps,
and it is frozen from then on. ``encoder="policy"`` reads the SFT'd policy's own hidden states
(``PolicyEncoder``; the trainer binds its reference model through ``bind_policy``).

The head standardizes its features over the first set it trains on (``standardize``): the
policy's hidden states share a large common part, and unscaled, the summed credit tended to grow
with the episode's length. Sum matching alone can still be solved by length where failed episodes
are the long ones; ``scripts/spa_probe.py`` measures whether the credit tells a step of a won
episode from one of a lost episode at the same turn.

``state_dict`` / ``load_state_dict`` hold the head, its optimizer, the buffer and the sampling
RNG, so a trainer can checkpoint the estimator with its own state.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections import deque
from dataclasses import asdict, dataclass, fields
from typing import Any, Sequence

import torch

from turngym.config import knob
from turngym.rewards.base import PerTurn
from turngym.rewards.encoders import Encoder, make_encoder, step_inputs
from turngym.types import Trajectory


@dataclass
class SPAConfig:
    """The progress estimator and the reward it gives."""

    online: bool = knob(True, "train on every batch the transform is called with")
    alpha: float = knob(1.0, "weight of the estimated contribution c_t")
    bonus: float = knob(0.1, "beta: grounding bonus for a valid, executed action")
    exact_sum: bool = knob(False, "spread the residual so contributions sum to the outcome exactly")
    encoder: str = knob("hash", "hash | lm:PATH | default (the embedded SmolLM2) | policy (the trainer's frozen copy "
                                "of the SFT'd policy over the recorded token ids)")
    fit_first: int = knob(0, "with online=false: the first batch scored trains the estimator this many steps, "
                             "then it stays frozen (SPA-RL: offline on exploration episodes); 0 = off")
    dim: int = knob(2048, "feature size of the hash encoder")
    ngram: int = knob(2, "longest word n-gram of the hash encoder")
    history_turns: int = knob(2, "preceding (action, observation) pairs in the step's history")
    hidden: int = knob(64, "width of the estimator's MLP head")
    standardize: bool = knob(True, "scale every feature to zero mean and unit variance over the first set the head "
                                   "trains on (then fixed): the policy's hidden states share a large common part, "
                                   "and unscaled the head fit worse than the base rate in 2 of 3 initialisations "
                                   "(scripts/spa_probe.py)")
    lr: float = knob(3e-3, "estimator learning rate (Adam)")
    updates: int = knob(50, "estimator steps per online call")
    batch_size: int = knob(32, "trajectories per estimator step")
    buffer_size: int = knob(256, "trajectories kept for online training (oldest leave first)")
    seed: int = knob(0, "head initialisation and minibatch sampling")
    fit: str = knob("sum", "sum: SPA-RL's sum matching; potential: each step's output fitted to its episode's "
                           "outcome, credit = its rise over the previous step's (see the module docstring): "
                           "episode length cannot explain the fit")

    def __post_init__(self) -> None:
        if self.fit not in FITS:
            raise ValueError(f"fit must be one of {FITS}, not {self.fit!r}")
        if self.updates < 0 or self.batch_size < 1 or self.buffer_size < 1 or self.hidden < 1:
            raise ValueError("updates must be >= 0; batch_size, buffer_size and hidden >= 1")
        if self.history_turns < 0:
            raise ValueError("history_turns must be >= 0")
        if self.fit_first < 0 or (self.fit_first and self.online):
            raise ValueError("fit_first must be >= 0 and needs online=false (it trains once, then freezes)")


FITS = ("sum", "potential")


# ----- pure math -------------------------------------------------------------------------------
def sum_matching_loss(contrib: torch.Tensor, traj_index: torch.Tensor, outcomes: torch.Tensor) -> torch.Tensor:
    """MSE between each trajectory's summed contributions and its outcome.

    Args:
        contrib: ``(N,)`` per-step contributions of all steps in the batch.
        traj_index: ``(N,)`` long, which trajectory (0..B-1) each step belongs to.
        outcomes: ``(B,)`` the trajectories' outcomes.

    Returns:
        Scalar ``mean_b (sum_{t in b} c_t - outcome_b)^2``.
    """
    sums = torch.zeros_like(outcomes).index_add(0, traj_index, contrib)
    return torch.mean((sums - outcomes) ** 2)


def value_matching_loss(values: torch.Tensor, traj_index: torch.Tensor, outcomes: torch.Tensor) -> torch.Tensor:
    """MSE between every step's value and its trajectory's outcome, each trajectory weighing the
    same (a long episode does not outweigh a short one).

    Args:
        values: ``(N,)`` per-step values h_t of all steps in the batch.
        traj_index: ``(N,)`` long, which trajectory (0..B-1) each step belongs to.
        outcomes: ``(B,)`` the trajectories' outcomes.

    Returns:
        Scalar ``mean_b mean_{t in b} (h_t - outcome_b)^2``.
    """
    sq = (values - outcomes[traj_index]) ** 2
    per_traj = torch.zeros_like(outcomes).index_add(0, traj_index, sq)
    steps = torch.zeros_like(outcomes).index_add(0, traj_index, torch.ones_like(sq))
    return torch.mean(per_traj / steps.clamp(min=1))


def potential_contributions(values: Sequence[float], base: float, outcome: float | None = None) -> list[float]:
    """Each step's rise in value: ``c_t = h_t - h_{t-1}`` with ``h_{-1} = base``; with ``outcome``
    the last step's value is the outcome itself (the terminal state's value is known), so the
    contributions add up to ``outcome - base``."""
    h = list(values)
    if outcome is not None and h:
        h[-1] = outcome
    return [v - prev for v, prev in zip(h, [base] + h[:-1])]


def spa_step_rewards(contrib: Sequence[float], valid: Sequence[bool], outcome: float, alpha: float = 1.0,
                     bonus: float = 0.0, exact_sum: bool = False) -> list[float]:
    """SPA's per-step reward for one trajectory: ``alpha * c_t + bonus * valid_t``.

    Args:
        contrib: The estimator's contributions c_t.
        valid: Whether each step's action was valid and executed.
        outcome: The trajectory's outcome (used only by ``exact_sum``).
        exact_sum: First add ``(outcome - sum c) / T`` to every c_t.

    Raises:
        ValueError: ``contrib`` and ``valid`` differ in length.
    """
    if len(contrib) != len(valid):
        raise ValueError(f"{len(contrib)} contributions but {len(valid)} validity flags")
    c = list(contrib)
    if exact_sum and c:
        shift = (outcome - sum(c)) / len(c)
        c = [x + shift for x in c]
    return [alpha * x + (bonus if v else 0.0) for x, v in zip(c, valid)]


@contextlib.contextmanager
def _one_thread():
    """Run the tiny head's matmuls on one thread: on a busy CPU, OpenMP's fork/join over a few
    thousand FLOPs costs 30x the work itself (measured: 20 s vs 0.6 s for 400 steps)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


# ----- the estimator -----------------------------------------------------------------------------
class ProgressHead(torch.nn.Module):
    """``(T, D)`` step features -> ``(T,)`` contributions; the output layer starts at zero. Features
    are first shifted and scaled (identity until ``standardize_on`` sets them from a training set)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(dim, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))
        torch.nn.init.zeros_(self.net[2].weight)
        torch.nn.init.zeros_(self.net[2].bias)
        self.register_buffer("shift", torch.zeros(dim))
        self.register_buffer("scale", torch.ones(dim))
        self.register_buffer("base", torch.zeros(()))  # fit="potential": h_{-1}, the fitting set's outcome rate

    def standardize_on(self, feats: torch.Tensor) -> None:
        """Zero mean and unit variance per feature over ``feats`` ``(N, D)`` from now on (a constant
        feature keeps scale 1)."""
        std = feats.std(dim=0, unbiased=False) if len(feats) > 1 else torch.ones_like(self.scale)
        self.shift.copy_(feats.mean(dim=0))
        self.scale.copy_(torch.where(std > 1e-6, std, torch.ones_like(std)))

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        return self.net((feats - self.shift) / self.scale).squeeze(-1)


class ProgressReward:
    """SPA as a reward transform (see the module docstring).

    Args:
        cfg: The knobs; keyword arguments override its fields (``make_reward({"name": "spa", ...})``).
        encoder: An ``Encoder`` to use instead of ``cfg.encoder`` (a string sets ``cfg.encoder``).

    Raises:
        ValueError: an unknown knob.
    """

    def __init__(self, cfg: SPAConfig | None = None, encoder: Encoder | str | None = None, **overrides: Any) -> None:
        if isinstance(encoder, str):  # a spec's "encoder": "hash" names the config field
            overrides["encoder"], encoder = encoder, None
        names = {f.name for f in fields(SPAConfig)}
        if set(overrides) - names:
            raise ValueError(f"unknown SPA knob(s) {sorted(set(overrides) - names)}; valid: {sorted(names)}")
        self.cfg = SPAConfig(**{**asdict(cfg or SPAConfig()), **overrides})
        self.encoder = encoder or make_encoder(self.cfg.encoder, self.cfg.dim, self.cfg.ngram)
        self.head: ProgressHead | None = None
        self.opt: torch.optim.Optimizer | None = None
        self.fitted = False
        self.standardized = False
        if self.encoder.dim:  # a policy encoder learns its size when it is bound
            self._build_head()
        self.gen = torch.Generator().manual_seed(self.cfg.seed)
        self.buffer: deque[tuple[torch.Tensor, float]] = deque(maxlen=self.cfg.buffer_size)
        self.stats: dict[str, float] = {}

    def _build_head(self) -> None:
        with torch.random.fork_rng(devices=[]):  # do not move the trainer's global RNG
            torch.manual_seed(self.cfg.seed)
            self.head = ProgressHead(self.encoder.dim, self.cfg.hidden)
        self.opt = torch.optim.Adam(self.head.parameters(), lr=self.cfg.lr)

    @property
    def wants_policy(self) -> bool:
        """Whether it reads the policy's features (the trainer then calls ``bind_policy``)."""
        return hasattr(self.encoder, "bind")

    def bind_policy(self, model: Any) -> None:
        """Encode with ``model`` (a frozen copy of the SFT'd policy)."""
        self.encoder.bind(model)
        if self.head is None:
            self._build_head()

    def features(self, traj: Trajectory) -> torch.Tensor:
        """``(T, D)`` features of the trajectory's steps."""
        if not traj.turns:
            return torch.zeros(0, self.encoder.dim)
        if hasattr(self.encoder, "encode_trajectory"):
            return self.encoder.encode_trajectory(traj).float()
        return self.encoder.encode(step_inputs(traj, self.cfg.history_turns)).float()

    @torch.no_grad()
    def contributions(self, trajectories: Sequence[Trajectory]) -> list[list[float]]:
        """The estimator's c_t for every turn (no training; with ``fit="potential"`` the last step
        is not grounded in the outcome, so the credit is the estimator's alone)."""
        return [self._contrib(self.features(t)) for t in trajectories]

    def _outputs(self, feats: torch.Tensor) -> list[float]:
        """The head's output per step: c_t under a sum fit, h_t under a potential fit."""
        with torch.no_grad(), _one_thread():
            return self.head(feats).tolist() if len(feats) else []

    def _credit(self, out: list[float], outcome: float | None = None) -> list[float]:
        """c_t from the head's outputs; ``outcome`` grounds a potential fit's last step."""
        return potential_contributions(out, float(self.head.base), outcome) if self.cfg.fit == "potential" else out

    def _predicted(self, out: list[float]) -> float:
        """What the outputs say the episode earned: the credits' sum, or a potential fit's last value."""
        if self.cfg.fit == "potential":
            return out[-1] if out else float(self.head.base)
        return sum(out)

    def _contrib(self, feats: torch.Tensor) -> list[float]:
        return self._credit(self._outputs(feats))

    def predicted_outcome(self, feats: torch.Tensor) -> float:
        """What the estimator says the episode earned: the sum of its credits (under a potential
        fit, the base rate plus them: the last step's value)."""
        return self._predicted(self._outputs(feats))

    def fit(self, trajectories: Sequence[Trajectory], updates: int | None = None) -> dict[str, float]:
        """Offline training on a buffer of trajectories (the internal buffer is left alone).

        Args:
            trajectories: Scored trajectories (``outcome`` set).
            updates: Gradient steps (default ``10 * cfg.updates``).

        Returns:
            ``{"loss": last minibatch loss, "sum_abs_err": mean |predicted - real outcome| over the
            set}`` (predicted: the sum of the credits; under a potential fit, the last step's value).
        """
        items = [(self.features(t), float(t.outcome)) for t in trajectories if t.turns]
        loss = self._train(items, 10 * self.cfg.updates if updates is None else updates)
        return {"loss": loss, "sum_abs_err": self._sum_abs_err(items)}

    def _train(self, items: Sequence[tuple[torch.Tensor, float]], updates: int) -> float:
        loss_value = math.nan
        if not items:
            return loss_value
        if self.cfg.standardize and not self.standardized:  # once, on the first training set: then fixed
            self.head.standardize_on(torch.cat([f for f, _ in items]))
            self.standardized = True
        if self.cfg.fit == "potential":  # h_{-1}: before the first step, the set's success rate
            self.head.base.fill_(sum(o for _, o in items) / len(items))
        loss_fn = value_matching_loss if self.cfg.fit == "potential" else sum_matching_loss
        self.head.train()
        with torch.enable_grad(), _one_thread():
            for _ in range(updates):
                pick = torch.randint(len(items), (min(self.cfg.batch_size, len(items)),), generator=self.gen).tolist()
                feats = torch.cat([items[i][0] for i in pick])
                index = torch.cat([torch.full((len(items[i][0]),), b, dtype=torch.long) for b, i in enumerate(pick)])
                outcomes = torch.tensor([items[i][1] for i in pick])
                loss = loss_fn(self.head(feats), index, outcomes)
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                self.opt.step()
                loss_value = loss.item()
        self.head.eval()
        return loss_value

    def _sum_abs_err(self, items: Sequence[tuple[torch.Tensor, float]]) -> float:
        if not items:
            return 0.0
        return sum(abs(self.predicted_outcome(f) - o) for f, o in items) / len(items)

    def __call__(self, trajectories: Sequence[Trajectory]) -> PerTurn:
        if self.head is None:
            raise RuntimeError("SPA with encoder=policy needs bind_policy(model) first (trainers call it at setup)")
        feats = [self.features(t) for t in trajectories]
        loss = math.nan
        if self.cfg.online:
            self.buffer.extend((f, float(t.outcome)) for f, t in zip(feats, trajectories) if t.turns)
            loss = self._train(list(self.buffer), self.cfg.updates)
        elif self.cfg.fit_first and not self.fitted:  # offline, once, on the first (exploration) batch
            loss = self._train([(f, float(t.outcome)) for f, t in zip(feats, trajectories) if t.turns], self.cfg.fit_first)
            self.fitted = True
        out, grounded, steps, contrib_sum, abs_err = [], 0, 0, 0.0, 0.0
        for f, traj in zip(feats, trajectories):
            out_f = self._outputs(f)
            c = self._credit(out_f, float(traj.outcome))
            valid = [t.action_valid for t in traj.turns]
            out.append(spa_step_rewards(c, valid, float(traj.outcome), self.cfg.alpha, self.cfg.bonus, self.cfg.exact_sum))
            grounded += sum(valid)
            steps += len(valid)
            contrib_sum += sum(c)
            abs_err += abs(self._predicted(out_f) - float(traj.outcome))
        n = max(1, len(trajectories))
        self.stats = {"reward/spa_loss": loss, "reward/spa_sum_abs_err": abs_err / n,
                      "reward/spa_contrib_sum_mean": contrib_sum / n, "reward/spa_grounded_frac": grounded / max(1, steps),
                      "reward/spa_buffer": float(len(self.buffer)), "reward/spa_frozen": float(self.fitted)}
        return out

    # ----- checkpoints ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        # deep copies: Adam's load_state_dict keeps same-device tensors as they are, so a shallow
        # state would be shared between this estimator and the one that loads it
        return copy.deepcopy({"head": self.head.state_dict(), "opt": self.opt.state_dict(), "gen": self.gen.get_state(),
                              "buffer": list(self.buffer), "config": asdict(self.cfg), "fitted": self.fitted,
                              "standardized": self.standardized})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        head = state["head"]
        if "shift" not in head:  # saved before heads standardized their features: identity
            head = {**head, "shift": torch.zeros_like(self.head.shift), "scale": torch.ones_like(self.head.scale)}
        head = {"base": torch.zeros(()), **head}  # saved before potential fits: unused by a sum fit
        self.head.load_state_dict(head)
        self.standardized = bool(state.get("standardized", False))
        self.opt.load_state_dict(state["opt"])
        self.gen.set_state(state["gen"])
        self.buffer.clear()
        self.buffer.extend(state["buffer"])
        self.fitted = bool(state.get("fitted", False))
