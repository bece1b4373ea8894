"""Chess endgames (LMRL-Gym's Endgames task): checkmate a lone king within N moves.

Positions are generated from seeds: king and queen (KQK), king and rook (KRK), or king and two
bishops on opposite colours (KBBK) against a bare king, the agent's side to move, legal, not
over, and no piece of the agent's en prise to the bare king. Half the positions are colour-flipped
so the agent plays Black. The limits (20, 30 and 40 moves) are about twice the longest forced
mates of these endgames (10, 16 and 19 moves), so a sound plan has room to spare.

Train and test never share a position, up to symmetry: a position's canonical key is the
smallest board FEN over the eight rotations and reflections of the board, with the agent's side
made White, and its split is a hash of that key (``turngym.envs.splits.split_of``). Since the
split is a function of the position, no position (or mirror image of one) can be in both.

The defender is Stockfish at ``depth`` (default 4); the oracle is Stockfish at ``oracle_depth``
(default 12) with its hash kept through the episode, which mates within the limits on every
position we tried (no tablebase needed). Reward: 1 for checkmate within the limit, else 0.
Everything else (tools, move formats, errors) is ``ChessEnv``'s.
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Any

import chess

from turngym.envs.games.chessgame import COLOUR, ChessEnv
from turngym.envs.splits import split_of

KINDS = {"KQK": "Q", "KRK": "R", "KBBK": "BB"}
MOVE_LIMITS = {"KQK": 20, "KRK": 30, "KBBK": 40}
_NAMES = {"KQK": "king and queen", "KRK": "king and rook", "KBBK": "king and two bishops"}
_SYMMETRIES = (
    lambda bb: bb,
    chess.flip_vertical,
    chess.flip_horizontal,
    lambda bb: chess.flip_vertical(chess.flip_horizontal(bb)),
    chess.flip_diagonal,
    chess.flip_anti_diagonal,
    lambda bb: chess.flip_vertical(chess.flip_diagonal(bb)),
    lambda bb: chess.flip_horizontal(chess.flip_diagonal(bb)),
)


def _light(sq: int) -> bool:
    return (chess.square_file(sq) + chess.square_rank(sq)) % 2 == 1


def generate(kind: str, index: int) -> chess.Board:
    """Endgame ``index`` of ``kind``, White (the strong side) to move; the same for the same args."""
    rng = random.Random(f"endgame:{kind}:{index}")
    pieces = KINDS[kind]
    while True:
        squares = rng.sample(chess.SQUARES, 2 + len(pieces))
        if kind == "KBBK" and _light(squares[2]) == _light(squares[3]):
            continue  # same-coloured bishops cannot mate
        board = chess.Board(None)
        board.set_piece_at(squares[0], chess.Piece(chess.KING, chess.WHITE))
        board.set_piece_at(squares[1], chess.Piece(chess.KING, chess.BLACK))
        for sq, sym in zip(squares[2:], pieces):
            board.set_piece_at(sq, chess.Piece.from_symbol(sym))
        board.turn = chess.WHITE
        hanging = any(board.is_attacked_by(chess.BLACK, sq) for sq in squares[2:])
        if board.is_valid() and not board.is_game_over() and not hanging:
            return board


def canonical_key(board: chess.Board) -> str:
    """The smallest board FEN over the 8 symmetries, with the side to move made White."""
    b = board if board.turn == chess.WHITE else board.mirror()
    return min(b.transform(f).board_fen() for f in _SYMMETRIES)


@lru_cache(maxsize=8)  # a few seconds to build the test split; envs of one process share it
def endgame_tasks(split: str, kinds: tuple[str, ...] = tuple(KINDS), n_per_kind: int = 100) -> dict[str, tuple[str, str]]:
    """``{task_id: (kind, FEN)}``: the first ``n_per_kind`` distinct positions of each kind whose
    canonical key hashes to ``split``; odd-hashed ones are colour-flipped (the agent plays Black)."""
    out: dict[str, tuple[str, str]] = {}
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"unknown endgame {kind!r}; choose from {sorted(KINDS)}")
        seen: set[str] = set()
        index = 0
        while len(seen) < n_per_kind:
            board, index = generate(kind, index), index + 1
            key = canonical_key(board)
            if key in seen or split_of(f"endgame:{key}") != split:
                continue
            seen.add(key)
            if random.Random(key).random() < 0.5:
                board = board.mirror()
            out[f"{kind}-{split}-{len(seen) - 1:03d}"] = (kind, board.fen())
    return out


class EndgamesEnv(ChessEnv):
    """Checkmate a lone king (KQK, KRK, KBBK) defended by Stockfish within N moves."""

    def __init__(self, split: str = "train", kinds: tuple[str, ...] | list[str] = tuple(KINDS),
                 n_per_kind: int = 100, move_limits: dict[str, int] | None = None, depth: int = 4,
                 oracle_depth: int = 12, draw_reward: float = 0.0, **kw: Any) -> None:
        """Args:
            split: ``train`` / ``test``: positions disjoint up to symmetry.
            kinds: Which endgames (``KQK``, ``KRK``, ``KBBK``).
            n_per_kind: Positions of each kind in the split.
            move_limits: Moves allowed per kind (default ``MOVE_LIMITS``).
            depth: The defender's search depth.
            oracle_depth: The oracle's search depth.
            draw_reward: Reward of a draw (stalemate, repetition, lost material): 0 by default.
            **kw: See ``ChessEnv`` (``engine_path``, ``dense_reward``, ...) and ``TextEnv``.
        """
        self.kinds, self.n_per_kind = tuple(kinds), n_per_kind
        self.move_limits = {**MOVE_LIMITS, **(move_limits or {})}
        super().__init__(split=split, depth=depth, oracle_depth=oracle_depth, draw_reward=draw_reward, **kw)

    def build_tasks(self, split: str) -> dict[str, Any]:
        return dict(endgame_tasks(split, self.kinds, self.n_per_kind))

    def start_position(self, task: Any) -> tuple[chess.Board, chess.Color]:
        board = chess.Board(task[1])
        return board, board.turn

    def rules(self) -> str:
        kind = self._tasks[self._task_id][0]
        return (f"Chess endgame: you play {COLOUR[self.agent]} with {_NAMES[kind]} against the lone "
                f"{COLOUR[not self.agent]} king, which Stockfish defends. Checkmate it within {self.move_limit()} "
                "of your moves to win (reward 1); stalemate, any draw or running out of moves scores 0.")

    def move_limit(self) -> int | None:
        return self.move_limits[self._tasks[self._task_id][0]]

    def task_type(self, task_id: str) -> str:
        task = self._tasks.get(task_id)
        return task[0] if task else "default"
