"""Single turns cut from one episode ride in one row: the nested batch scores each turn's tokens
exactly as the turns alone do, with fewer rows and fewer tokens."""

from __future__ import annotations

import torch

from turngym.trainers.archer.awr import alone as _alone  # how a plug-in's memory keeps a single turn
from turngym.trainers.sequences import nest_turns, pack_batch, score
from turngym.types import TokenRecord, Trajectory, Turn


def _episode(task: str, pairs: list[tuple[list[int], list[int]]], logprob: float = -0.5) -> Trajectory:
    rec = TokenRecord()
    turns = [Turn("x", span=rec.add_turn(p, a, [logprob] * len(a))) for p, a in pairs]
    return Trajectory(task, turns=turns, record=rec)


def _per_turn(model, trajs: list[Trajectory]) -> dict[tuple[int, ...], float]:
    """Each scored turn's summed log-prob, keyed by its action ids and the ids before it."""
    batch = pack_batch(trajs, pad_id=0)
    with torch.no_grad():
        lp = score(model, batch).logprobs
    out = {}
    for flat, (ti, k) in enumerate(batch.turn_refs):
        key = (*trajs[ti].prompt_ids(k), -1, *trajs[ti].action_ids(k))
        out[key] = float(lp[batch.token_turn == flat].sum())
    return out


def test_an_episodes_turns_share_one_row_and_score_as_they_do_alone(tiny_model):
    first = [11, 12, 13, 14, 15]
    a = _episode("a", [(first, [16, 17]), (first + [16, 17, 18, 19], [20, 21, 22]),
                       (first + [16, 17, 18, 19, 20, 21, 22, 23], [24])])
    b = _episode("b", [([31, 32], [33]), ([31, 32, 33, 34], [35, 36])])
    singles = [_alone(a, 0), _alone(b, 1), _alone(a, 2), _alone(a, 1), _alone(b, 0)]
    weights = [0.1, 0.2, 0.3, 0.4, 0.5]

    nested, nested_w = nest_turns(singles, weights)

    assert [(t.task_id, len(t.turns)) for t in nested] == [("a", 3), ("b", 2)]
    assert nested_w == [0.1, 0.4, 0.3, 0.5, 0.2]  # each turn keeps its weight, in record order
    alone_batch, nested_batch = pack_batch(singles, 0), pack_batch(nested, 0)
    assert nested_batch.input_ids.shape[0] == 2 and alone_batch.input_ids.shape[0] == 5
    assert int(nested_batch.attention_mask.sum()) == 14 + 6 < int(alone_batch.attention_mask.sum())
    assert nested_batch.num_tokens == alone_batch.num_tokens == 9  # the same action tokens are scored
    alone, together = _per_turn(tiny_model.model, singles), _per_turn(tiny_model.model, nested)
    assert alone.keys() == together.keys()
    for key in alone:
        assert abs(alone[key] - together[key]) < 1e-4, key


def test_a_replayed_game_with_other_log_probs_is_not_nested():
    pairs = [([1, 2, 3], [4]), ([1, 2, 3, 4, 5], [6])]
    old, new = _episode("a", pairs, -0.5), _episode("a", pairs, -0.25)  # same ids, sampled by other weights
    nested, _ = nest_turns([_alone(old, 0), _alone(new, 1)], [1.0, 1.0])
    assert len(nested) == 2
    assert nest_turns([], []) == ([], [])
