"""Chess against Stockfish (LMRL-Gym's Chess task): the agent plays one side of a full game.

Moves go through the ``move`` tool in SAN (``Nf3``, ``O-O``, ``e8=Q``) or UCI (``g1f3``,
``e7e8q``); with the default ``text`` format the whole reply is the move. ``legal`` (or the
``legal_moves`` tool) lists the legal moves. An illegal or unreadable move is an error
observation and does not change the position.

Tasks: every opening of two plies (one move each side, all 400 of them) times the agent's colour,
split into train/test by a hash of (opening, colour). The opponent is Stockfish limited by
``depth`` (default 1: a weak player), optionally by ``movetime`` and Stockfish's own
``skill_level``; ``blunder_prob`` makes it play a uniformly random legal move instead, drawn
from a seeded RNG. With depth and blunders only, the opponent is deterministic: one Stockfish
thread at a fixed depth, its hash cleared at every reset. ``skill_level`` and ``movetime``
make it nondeterministic (Stockfish seeds its skill randomness from the clock).

Reward at the end: 1 for checkmating the engine, ``draw_reward`` (0.5, the usual chess score)
for a draw, 0 for a loss or a game cut off by the turn limit. A position repeated three times
and fifty moves without a capture or pawn move end the game as a draw at once (no claim needed). With ``dense_reward = w > 0`` every move also earns
``w * (E_after - E_before)``, where E is Stockfish's expected score for the agent (from its
win/draw/loss model at ``eval_depth``) after the opponent's reply, and the final position's E is
the result itself, so the dense terms sum to ``w * (result - E_start)``.

The oracle is Stockfish at ``oracle_depth`` (default 8) in a second engine process, so hints
never touch the opponent's hash. It needs the ``chess`` package and the ``stockfish`` binary
(Debian: ``apt-get install stockfish``, which puts it in /usr/games).
"""

from __future__ import annotations

import hashlib
import random
import re
import shutil
from pathlib import Path
from typing import Any

import chess
import chess.engine

from turngym.envs.base import StepOutcome, TextEnv
from turngym.envs.splits import split_of
from turngym.tools.base import Tool
from turngym.types import Message, ToolCall

INSTALL_HINT = ("install it with `apt-get install stockfish` (Debian/Ubuntu; it lands in /usr/games/stockfish), "
                "or pass engine_path=/path/to/stockfish")
LEGAL_WORDS = {"legal", "legal moves", "moves", "list", "help", "?"}
COLOUR = {chess.WHITE: "White", chess.BLACK: "Black"}


class EngineNotFound(ImportError):
    """The Stockfish binary is missing: like a missing optional package, the env cannot run."""


def find_engine(path: str | None = None) -> str:
    """The Stockfish binary: ``path``, else ``stockfish`` on PATH, else /usr/games/stockfish.

    Raises:
        EngineNotFound: none of them exists (the message says how to install it).
    """
    candidates = [path] if path else [shutil.which("stockfish"), "/usr/games/stockfish"]
    for c in candidates:
        if c and Path(c).is_file():
            return str(c)
    where = path or "PATH and /usr/games"
    raise EngineNotFound(f"the Stockfish chess engine was not found (looked in {where}); {INSTALL_HINT}")


class Engine:
    """One Stockfish process, started on first use; ``game`` keys keep its hash within an episode."""

    def __init__(self, path: str, options: dict[str, Any]) -> None:
        self.path, self.options = path, options
        self._proc: chess.engine.SimpleEngine | None = None

    @property
    def proc(self) -> chess.engine.SimpleEngine:
        if self._proc is None:
            self._proc = chess.engine.SimpleEngine.popen_uci(self.path)
            self._proc.configure(self.options)
        return self._proc

    def best(self, board: chess.Board, limit: chess.engine.Limit, game: object) -> chess.Move:
        return self.proc.play(board, limit, game=game).move

    def expectation(self, board: chess.Board, limit: chess.engine.Limit, pov: chess.Color, game: object) -> float:
        """Expected score (win 1, draw 0.5) for ``pov`` from Stockfish's win/draw/loss model."""
        score = self.proc.analyse(board, limit, game=game)["score"]
        return score.pov(pov).wdl(model="sf", ply=board.ply()).expectation()

    def close(self) -> None:
        if self._proc is not None:
            try:
                self._proc.quit()
            except (chess.engine.EngineError, chess.engine.EngineTerminatedError, TimeoutError):
                self._proc.close()
            self._proc = None


def parse_move(board: chess.Board, text: str) -> chess.Move:
    """A legal move of ``board`` from SAN or UCI text (a move number and ``!?`` are ignored).

    Raises:
        ValueError: the text is not a move, or the move is illegal or ambiguous here.
    """
    t = re.sub(r"^\d+\s*\.+\s*", "", text.strip()).rstrip("!? .")
    t = t.replace("0-0-0", "O-O-O").replace("0-0", "O-O")
    if not t:
        raise ValueError("the move is empty")
    try:
        if re.fullmatch(r"[a-h][1-8][a-h][1-8][qrbnQRBN]?", t):
            return board.parse_uci(t.lower())
        return board.parse_san(t)
    except chess.AmbiguousMoveError:
        raise ValueError(f"{t!r} is ambiguous here; name the piece's file or rank (e.g. Nbd2) or use UCI") from None
    except (chess.IllegalMoveError, chess.InvalidMoveError):
        raise ValueError(f"{t!r} is not a legal move for {COLOUR[board.turn]} in this position") from None


def render_board(board: chess.Board) -> str:
    """The board as text, rank 8 on top, with coordinates (upper case = White)."""
    rows = [f"{r + 1} " + " ".join((p.symbol() if (p := board.piece_at(chess.square(f, r))) else ".") for f in range(8))
            for r in range(7, -1, -1)]
    return "\n".join(rows + ["  a b c d e f g h"])


def move_list(board: chess.Board) -> str:
    """The game's moves in numbered SAN, from the board's starting position."""
    start = board.root()
    return start.variation_san(board.move_stack) if board.move_stack else "(none)"


def openings() -> list[tuple[str, str]]:
    """All 400 two-ply openings as (White's UCI move, Black's UCI move), sorted."""
    out, b = [], chess.Board()
    for w in sorted(m.uci() for m in b.legal_moves):
        b.push_uci(w)
        out += [(w, x) for x in sorted(m.uci() for m in b.legal_moves)]
        b.pop()
    return out


class ChessEnv(TextEnv):
    """Chess against Stockfish at a configurable strength: checkmate it (win 1, draw 0.5)."""

    default_tool_format = "text"

    def __init__(self, split: str = "train", depth: int = 1, skill_level: int | None = None,
                 movetime: float | None = None, blunder_prob: float = 0.0, oracle_depth: int = 8,
                 dense_reward: float = 0.0, eval_depth: int = 8, draw_reward: float = 0.5,
                 engine_path: str | None = None, **kw: Any) -> None:
        """Args:
            split: ``train`` / ``test``: disjoint sets of (opening, colour) tasks.
            depth: The opponent's search depth in plies.
            skill_level: Stockfish's ``Skill Level`` (0-20) for the opponent; None leaves it at 20.
            movetime: The opponent's time per move in ms (None: depth only).
            blunder_prob: Chance that the opponent plays a random legal move (seeded per task and ply).
            oracle_depth: Search depth of the oracle's Stockfish.
            dense_reward: Weight of the per-move change in Stockfish's expected score (0: sparse only).
            eval_depth: Search depth of that evaluation.
            draw_reward: Reward of a draw.
            engine_path: The Stockfish binary (default: ``stockfish`` on PATH, else /usr/games/stockfish).

        Raises:
            EngineNotFound: no Stockfish binary (the message says how to install it).
        """
        super().__init__(**kw)
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if not 0.0 <= blunder_prob <= 1.0:
            raise ValueError(f"blunder_prob must be in [0, 1], got {blunder_prob}")
        path = find_engine(engine_path)
        opts = {"Threads": 1, "Hash": 16}
        self.opponent = Engine(path, {**opts, **({"Skill Level": skill_level} if skill_level is not None else {})})
        self.oracle_engine = Engine(path, opts)
        self.limit = chess.engine.Limit(depth=depth, time=movetime / 1000 if movetime else None)
        self.oracle_limit = chess.engine.Limit(depth=oracle_depth)
        self.eval_limit = chess.engine.Limit(depth=eval_depth)
        self.blunder_prob, self.dense_reward, self.draw_reward = blunder_prob, dense_reward, draw_reward
        self.nondeterministic = skill_level is not None or bool(movetime)
        self._tasks = self.build_tasks(split)
        self.task_ids = list(self._tasks)
        self.board = chess.Board()
        self.agent = chess.WHITE
        self._game: object = object()
        self._result: str | None = None
        self._termination = ""
        self._moves = 0  # the agent's moves this episode
        self._moved_now = False
        self._expect = 0.5
        self._dense_now = 0.0
        self._oracle_cache: tuple[str, str | None] | None = None

    # ----- tasks (the endgame env overrides these) ----------------------------------------------
    def build_tasks(self, split: str) -> dict[str, Any]:
        tasks = [(o, c) for o in openings() for c in ("white", "black") if split_of(f"chess:{o[0]}{o[1]}:{c}") == split]
        return {f"chess-{split}-{i:03d}": t for i, t in enumerate(tasks)}

    def start_position(self, task: Any) -> tuple[chess.Board, chess.Color]:
        (w, b), colour = task
        board = chess.Board()
        board.push_uci(w)
        board.push_uci(b)
        return board, chess.WHITE if colour == "white" else chess.BLACK

    def rules(self) -> str:
        return (f"You are playing chess as {COLOUR[self.agent]} against the Stockfish engine. Checkmate wins "
                f"(reward 1); a draw scores {self.draw_reward:g} and a loss 0. A position repeated three times, or "
                "fifty moves without a capture or pawn move, ends the game as a draw.")

    def move_limit(self) -> int | None:
        return None

    # ----- tools and steps ------------------------------------------------------------------------
    def _build_tools(self) -> list[Tool]:
        def move(move: str) -> str:
            """Play your move in SAN (e.g. Nf3, exd5, O-O, e8=Q) or UCI (e.g. g1f3, e7e8q); reply "legal" to list your legal moves.

            Args:
                move: your move, or "legal"
            """
            if self._result is not None:
                raise ValueError("the game is over")
            if move.strip().lower().rstrip(".!?") in LEGAL_WORDS or move.strip() == "?":
                return self._legal_text()
            try:
                m = parse_move(self.board, move)
            except ValueError as e:
                raise ValueError(f"{e}. Reply \"legal\" to list the legal moves.") from None
            return self._play(m)

        def legal_moves() -> str:
            """List your legal moves in SAN and UCI."""
            if self._result is not None:
                raise ValueError("the game is over")
            return self._legal_text()

        return [Tool.from_function(move, timeout_s=None), Tool.from_function(legal_moves, timeout_s=None)]

    def _legal_text(self) -> str:
        moves = sorted(self.board.legal_moves, key=lambda m: self.board.san(m))
        return f"Legal moves for {COLOUR[self.board.turn]}: " + ", ".join(f"{self.board.san(m)} ({m.uci()})" for m in moves)

    def _play(self, m: chess.Move) -> str:
        lines = [f"You played {self.board.san(m)}."]
        self.board.push(m)
        self._moves += 1
        self._moved_now = True
        if not self._check_over():
            limit = self.move_limit()
            if limit is not None and self._moves >= limit:
                self._result = "limit"
            else:
                reply = self._opponent_move()
                lines.append(f"Stockfish played {self.board.san(reply)}.")
                self.board.push(reply)
                self._check_over()
        if self.dense_reward:  # on the opponent's engine: never on the oracle's, which only runs with hints
            e = self._result_value() if self._result else self.opponent.expectation(self.board, self.eval_limit, self.agent, self._game)
            self._dense_now, self._expect = self.dense_reward * (e - self._expect), e
        return " ".join(lines) + "\n\n" + self._position_text()

    def _opponent_move(self) -> chess.Move:
        rng = random.Random(f"{self._task_id}:{self.board.ply()}")
        if self.blunder_prob and rng.random() < self.blunder_prob:
            return rng.choice(sorted(self.board.legal_moves, key=chess.Move.uci))
        return self.opponent.best(self.board, self.limit, self._game)

    def _check_over(self) -> bool:
        # Not outcome(claim_draw=True): that also ends the game when a repetition is merely one
        # legal move away. Here a draw needs the position itself thrice, or 50 idle moves.
        outcome = self.board.outcome()
        if outcome is None and (self.board.is_repetition(3) or self.board.is_fifty_moves()):
            outcome = chess.Outcome(chess.Termination.THREEFOLD_REPETITION if self.board.is_repetition(3)
                                    else chess.Termination.FIFTY_MOVES, None)
        if outcome is None:
            return False
        self._result = "draw" if outcome.winner is None else ("win" if outcome.winner == self.agent else "loss")
        self._termination = outcome.termination.name.lower().replace("_", " ")
        return True

    def _result_value(self) -> float:
        return {"win": 1.0, "draw": self.draw_reward}.get(self._result or "", 0.0)

    def _position_text(self) -> str:
        if self._result is not None:
            why = {"win": f"Checkmate: you win ({COLOUR[self.agent]}).", "loss": "Checkmate: you lose.",
                   "limit": f"You did not checkmate within {self.move_limit()} moves: the task is lost.",
                   "draw": f"The game is drawn ({self._termination})."}[self._result]
            return f"{render_board(self.board)}\n{why}"
        tail = f"You are {COLOUR[self.agent]}. Your move."
        if (limit := self.move_limit()) is not None:
            tail = f"You are {COLOUR[self.agent]}; {limit - self._moves} moves left to checkmate. Your move."
        return f"{render_board(self.board)}\nFEN: {self.board.fen()}\nMoves so far: {move_list(self.board)}\n{tail}"

    def _reset_task(self, task_id: str) -> list[Message]:
        self.board, self.agent = self.start_position(self._tasks[task_id])
        self._game = object()  # a new key: both engines get `ucinewgame` (a fresh hash) on next use
        self._result, self._moves, self._moved_now, self._dense_now = None, 0, False, 0.0
        self._oracle_cache = None
        opening = ""
        if self.board.turn != self.agent:
            reply = self._opponent_move()
            opening = f"Stockfish played {self.board.san(reply)}.\n\n"
            self.board.push(reply)
        self._expect = 0.5
        if self.dense_reward:
            self._expect = self.opponent.expectation(self.board, self.eval_limit, self.agent, self._game)
        system = (f"{self.rules()} Reply with one move per turn, in SAN (Nf3, exd5, O-O, e8=Q) or UCI (g1f3, e7e8q); "
                  f"reply \"legal\" to list your legal moves.\n\n{self.format.render_tools(self.tools.specs)}")
        return [Message("system", system), Message("user", opening + self._position_text())]

    def _step_outcome(self, parsed, results) -> StepOutcome:
        moved, self._moved_now = self._moved_now, False
        dense, self._dense_now = (self._dense_now if moved else 0.0), 0.0
        done = self._result is not None
        reward = dense + (self._result_value() if done and moved else 0.0)
        return StepOutcome(reward=reward, terminated=done,
                           info={"result": self._result or "", "moves": self._moves, "won": self._result == "win"})

    def outcome(self) -> float:
        return self._result_value() if self._result else 0.0

    def state_key(self) -> str:
        return f"{self._task_id}:{self.board.epd()}"

    def task_type(self, task_id: str) -> str:
        task = self._tasks.get(task_id)
        return str(task[1]) if task else "default"

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        info["nondeterministic"] = self.nondeterministic
        return obs, info

    def close(self) -> None:
        self.opponent.close()
        self.oracle_engine.close()
        super().close()

    # ----- scripted players -----------------------------------------------------------------------
    def oracle_action(self) -> str | None:
        if self._result is not None:
            return None
        key = hashlib.sha1(self.board.fen().encode()).hexdigest()
        if self._oracle_cache is None or self._oracle_cache[0] != key:
            m = self.oracle_engine.best(self.board, self.oracle_limit, self._game)
            self._oracle_cache = (key, self.board.san(m))
        return self.format.render_call(ToolCall("oracle", "move", {"move": self._oracle_cache[1]}))

    def admissible_actions(self) -> list[str] | None:
        if self._result is not None:
            return None
        return [self.format.render_call(ToolCall("r", "move", {"move": self.board.san(m)}))
                for m in sorted(self.board.legal_moves, key=chess.Move.uci)]
