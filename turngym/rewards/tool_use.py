"""Tool-use reward (ToolRL style): score a turn's tool calls against the reference calls.

ToolRL (Qian et al. 2025) splits correctness into three parts, for predicted calls P and
reference (ground-truth) calls G:

    r_name  = |names(P) & names(G)| / |names(P) | names(G)|           (Jaccard of tool names)
    r_param = sum_j |keys(P_j) & keys(G_j)| / |keys(P_j) | keys(G_j)|  (per matched call pair)
    r_value = sum_j sum_{k in keys(G_j)} [P_j[k] == G_j[k]]           (per matched call pair)

where each reference call G_j is matched to a distinct predicted call P_j so that the total is
largest. ToolRL divides by the largest possible total, ``1 + |G| + sum_j |keys(G_j)|``; here the
``|G|`` term is ``max(|G|, |P|)``, so surplus calls cost something (ToolRL's only penalty for them
is through ``r_name``, which misses extra calls to a tool that is also in G). The score is in [0, 1].

Values match after light normalisation: strings compare case- and whitespace-insensitively,
numbers numerically (``1 == 1.0``; a numeric string equals its number), lists and dicts element
by element.

Where the reference comes from (first found wins):
    ``turn.info["reference_calls"]``: a list of calls for this turn;
    ``turn.info["reference_call"]``: one call;
    ``traj.metadata["reference_calls"][k]``: per-turn list (entry ``k`` for turn ``k``; an entry is a
    call, a list of calls, or None).
A call is a ``ToolCall`` or a dict ``{"name": ..., "arguments": {...}}``. A turn without a
reference gets ``missing`` (default 0). ``turngym.envs.wrappers.ReferenceCalls`` fills
``info["reference_call"]`` from any env's oracle.
"""

from __future__ import annotations

import itertools
from typing import Any, Sequence

from turngym.rewards.base import PerTurn
from turngym.types import ToolCall, Trajectory, Turn

_EXACT_MATCHING_MAX = 6  # above this many calls, match greedily instead of over all permutations


def normalize_value(v: Any) -> Any:
    """The comparable form of an argument value (see the module docstring)."""
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        s = " ".join(v.lower().split())
        try:
            return float(s)
        except ValueError:
            return s
    if isinstance(v, dict):
        return {str(k): normalize_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [normalize_value(x) for x in v]
    return str(v)


def jaccard(a: set, b: set) -> float:
    """``|a & b| / |a | b|``; two empty sets agree fully (1.0)."""
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def pair_score(pred: dict, ref: dict) -> float:
    """``r_param + r_value`` of one predicted call against one reference call (0 if names differ).

    Args:
        pred, ref: ``{"name": str, "arguments": dict}``.

    Returns:
        A float in ``[0, 1 + len(ref["arguments"])]``.
    """
    if pred["name"] != ref["name"]:
        return 0.0
    pa, ra = pred["arguments"], ref["arguments"]
    r_param = jaccard(set(pa), set(ra))
    r_value = sum(1.0 for k in ra if k in pa and normalize_value(pa[k]) == normalize_value(ra[k]))
    return r_param + r_value


def tool_use_score(pred_calls: Sequence[Any], ref_calls: Sequence[Any]) -> float:
    """ToolRL-style correctness of ``pred_calls`` against ``ref_calls``, in [0, 1].

    Args:
        pred_calls: The calls the agent made (``ToolCall``s or ``{"name", "arguments"}`` dicts).
        ref_calls: The reference calls.

    Returns:
        ``(r_name + sum_j r_param_j + r_value_j) / (1 + max(|G|, |P|) + sum_j |keys(G_j)|)``;
        1.0 when both are empty.
    """
    pred = [_as_dict(c) for c in pred_calls]
    ref = [_as_dict(c) for c in ref_calls]
    if not pred and not ref:
        return 1.0
    r_name = jaccard({c["name"] for c in pred}, {c["name"] for c in ref})
    matched = _best_matching(pred, ref)
    r_max = 1.0 + max(len(ref), len(pred)) + sum(len(c["arguments"]) for c in ref)
    return (r_name + matched) / r_max


def _best_matching(pred: list[dict], ref: list[dict]) -> float:
    """The largest total ``pair_score`` over one-to-one matchings of ref calls to pred calls."""
    if not pred or not ref:
        return 0.0
    scores = [[pair_score(p, r) for p in pred] for r in ref]
    if max(len(pred), len(ref)) <= _EXACT_MATCHING_MAX:
        best = 0.0
        if len(ref) <= len(pred):
            for perm in itertools.permutations(range(len(pred)), len(ref)):
                best = max(best, sum(scores[j][i] for j, i in enumerate(perm)))
        else:
            for perm in itertools.permutations(range(len(ref)), len(pred)):
                best = max(best, sum(scores[j][i] for i, j in enumerate(perm)))
        return best
    pairs = sorted(((scores[j][i], j, i) for j in range(len(ref)) for i in range(len(pred))), reverse=True)
    used_r, used_p, total = set(), set(), 0.0
    for s, j, i in pairs:
        if j not in used_r and i not in used_p:
            used_r.add(j)
            used_p.add(i)
            total += s
    return total


def _as_dict(call: Any) -> dict:
    if isinstance(call, ToolCall):
        return {"name": call.name, "arguments": dict(call.arguments)}
    if isinstance(call, dict) and isinstance(call.get("name"), str):
        args = call.get("arguments") or {}
        return {"name": call["name"], "arguments": dict(args) if isinstance(args, dict) else {}}
    raise ValueError(f"a tool call is a ToolCall or a dict with 'name' and 'arguments', got {call!r}")


def reference_calls(traj: Trajectory, k: int) -> list | None:
    """The reference calls of turn ``k`` (see the module docstring for where they are read), or None."""
    turn: Turn = traj.turns[k]
    if turn.info.get("reference_calls") is not None:
        return list(turn.info["reference_calls"])
    if turn.info.get("reference_call") is not None:
        return [turn.info["reference_call"]]
    per_turn = traj.metadata.get("reference_calls")
    if isinstance(per_turn, list) and k < len(per_turn) and per_turn[k] is not None:
        entry = per_turn[k]
        return list(entry) if isinstance(entry, list) else [entry]
    return None


class ToolUseReward:
    """Per-turn ToolRL-style score of the turn's tool calls against its reference.

    Args:
        scale: Multiplies the [0, 1] score.
        missing: Reward of a turn that has no reference.
    """

    def __init__(self, scale: float = 1.0, missing: float = 0.0) -> None:
        self.scale, self.missing = float(scale), float(missing)
        self.stats: dict[str, float] = {}

    def __call__(self, trajectories: Sequence[Trajectory]) -> PerTurn:
        out, scored, total = [], 0, 0.0
        for traj in trajectories:
            row = []
            for k, turn in enumerate(traj.turns):
                ref = reference_calls(traj, k)
                if ref is None:
                    row.append(self.missing)
                    continue
                s = tool_use_score(turn.tool_calls, ref)
                scored += 1
                total += s
                row.append(self.scale * s)
            out.append(row)
        self.stats = {"reward/tool_use_mean": total / scored if scored else 0.0, "reward/tool_use_turns": float(scored)}
        return out
