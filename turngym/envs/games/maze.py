"""Maze navigation (LMRL-Gym style), fully or partially observed.

Each task is a perfect maze (one path between any two cells) carved from a seed by a randomised
depth-first search, with the start and the goal far apart. The agent calls ``move(direction)``.

- Fully observed: every observation shows the map (``#`` wall, ``A`` agent, ``G`` goal) and both
  positions.
- Partially observed: the agent only learns which of the four directions are open from where it
  stands, and whether the goal is next to it; it must remember where it has been.

Reward: 1.0 on reaching the goal (which ends the episode), minus ``step_penalty`` per move.
The oracle follows a shortest path (breadth-first search) from wherever the agent is.

Held-out mazes are held out in content: a test maze that would equal (walls, start and goal) one of
the first ``TRAIN_GUARD`` training mazes of its size is drawn again from the next seed in its own
line (4x4 mazes are few: ``small-test-0044`` used to be ``small-train-0071``). Test mazes that
never collided are unchanged.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import random
from collections import deque
from typing import Any

from turngym.envs.base import StepOutcome, TextEnv
from turngym.tools.base import Tool
from turngym.types import Message, ToolCall

DIRS = {"north": (-1, 0), "south": (1, 0), "west": (0, -1), "east": (0, 1)}
SIZES = {"small": 4, "medium": 6, "large": 8}
TRAIN_GUARD = 1000  # training mazes per size that no held-out maze may equal


def carve_maze(n: int, rng: random.Random) -> list[str]:
    """An ``(2n+1) x (2n+1)`` character grid: ``#`` walls, ``.`` floor; cell (r, c) is at (2r+1, 2c+1)."""
    grid = [["#"] * (2 * n + 1) for _ in range(2 * n + 1)]
    stack = [(0, 0)]
    seen = {(0, 0)}
    grid[1][1] = "."
    while stack:
        r, c = stack[-1]
        nxt = [(r + dr, c + dc, dr, dc) for dr, dc in DIRS.values() if 0 <= r + dr < n and 0 <= c + dc < n and (r + dr, c + dc) not in seen]
        if not nxt:
            stack.pop()
            continue
        nr, nc, dr, dc = rng.choice(nxt)
        grid[2 * r + 1 + dr][2 * c + 1 + dc] = "."
        grid[2 * nr + 1][2 * nc + 1] = "."
        seen.add((nr, nc))
        stack.append((nr, nc))
    return ["".join(row) for row in grid]


def open_dirs(grid: list[str], pos: tuple[int, int]) -> list[str]:
    r, c = pos
    return [d for d, (dr, dc) in DIRS.items() if grid[2 * r + 1 + dr][2 * c + 1 + dc] == "."]


def shortest_path(grid: list[str], start: tuple[int, int], goal: tuple[int, int]) -> list[str]:
    """The moves of a shortest path from ``start`` to ``goal`` (breadth-first search)."""
    prev: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    queue = deque([start])
    while queue:
        cur = queue.popleft()
        if cur == goal:
            break
        for d in open_dirs(grid, cur):
            nxt = (cur[0] + DIRS[d][0], cur[1] + DIRS[d][1])
            if nxt not in prev:
                prev[nxt] = (cur, d)
                queue.append(nxt)
    moves: list[str] = []
    node = goal
    while prev.get(node) is not None:
        node, d = prev[node]
        moves.append(d)
    return moves[::-1]


def _draw(n: int, seed: str) -> tuple[list[str], tuple[int, int], random.Random]:
    """The walls and the start drawn from ``seed``, and the generator, ready to draw the goal."""
    rng = random.Random(seed)
    grid = carve_maze(n, rng)
    return grid, rng.choice([(r, c) for r in range(n) for c in range(n)]), rng


def _goal(grid: list[str], start: tuple[int, int], n: int, rng: random.Random) -> tuple[int, int]:
    cells = [(r, c) for r in range(n) for c in range(n)]
    dist = {cell: len(shortest_path(grid, start, cell)) for cell in cells}
    far = max(dist.values())
    return rng.choice([cell for cell in cells if dist[cell] >= max(2, far * 2 // 3)])


@functools.cache
def _training_layouts(size: str) -> dict[tuple, list[str]]:
    """``(walls, start)`` -> ids of the first ``TRAIN_GUARD`` training mazes of ``size`` that have
    them (cheap: the goal, the slow part, is drawn only for a test maze that matches one)."""
    out: dict[tuple, list[str]] = {}
    for i in range(TRAIN_GUARD):
        tid = f"{size}-train-{i:04d}"
        grid, start, _ = _draw(SIZES[size], f"maze:{tid}")
        out.setdefault((tuple(grid), start), []).append(tid)
    return out


def make_task(task_id: str) -> tuple[list[str], tuple[int, int], tuple[int, int]]:
    """The maze, start and goal of ``task_id`` (``"<size>-<split>-<index>"``), from its own seed; a
    test maze equal to an early training maze is drawn again (see the module docstring)."""
    size, split, _ = task_id.split("-")
    n = SIZES[size]
    for k in itertools.count():
        grid, start, rng = _draw(n, f"maze:{task_id}" + (f":redraw{k}" if k else ""))
        goal = _goal(grid, start, n, rng)
        twins = _training_layouts(size).get((tuple(grid), start), []) if split == "test" else []
        if all(make_task(t) != (grid, start, goal) for t in twins):
            return grid, start, goal
    raise AssertionError("unreachable")


def maze_digest(task_id: str) -> str:
    """A digest of the maze, start and goal: equal digests, equal tasks."""
    return hashlib.sha1(repr(make_task(task_id)).encode()).hexdigest()[:16]


class MazeEnv(TextEnv):
    """Find the goal in a grid maze with move(direction); fully or partially observed."""

    default_tool_format = "text"

    def __init__(self, split: str = "train", observation: str = "full", sizes: tuple[str, ...] = ("small", "medium"),
                 n_tasks: int = 100, step_penalty: float = 0.0, **kw: Any) -> None:
        """Args:
            split: ``train`` or ``test`` (different mazes).
            observation: ``full`` (the map) or ``partial`` (only the open directions here).
            sizes: Maze sizes to include: ``small`` (4x4), ``medium`` (6x6), ``large`` (8x8).
            n_tasks: Mazes per size.
            step_penalty: Subtracted from the reward on every move.
        """
        super().__init__(**kw)
        if observation not in ("full", "partial"):
            raise ValueError(f"observation must be 'full' or 'partial', got {observation!r}")
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        unknown = set(sizes) - set(SIZES)
        if unknown:
            raise ValueError(f"unknown maze sizes {sorted(unknown)}; choose from {sorted(SIZES)}")
        self.observation, self.step_penalty = observation, step_penalty
        self.task_ids = [f"{s}-{split}-{i:04d}" for s in sizes for i in range(n_tasks)]
        self._pos = self._goal = (0, 0)
        self._grid: list[str] = []
        self._moved = False

    def _build_tools(self) -> list[Tool]:
        def move(direction: str) -> str:
            """Move one step: north, south, east or west.

            Args:
                direction: north, south, east or west
            """
            d = direction.strip().lower()
            if d.startswith("go "):
                d = d[3:].strip()
            d = {"n": "north", "s": "south", "e": "east", "w": "west", "up": "north", "down": "south",
                 "left": "west", "right": "east"}.get(d, d)
            if d not in DIRS:
                raise ValueError(f"unknown direction {direction!r}; use north, south, east or west")
            if d in open_dirs(self._grid, self._pos):
                self._pos = (self._pos[0] + DIRS[d][0], self._pos[1] + DIRS[d][1])
                self._moved = True
                return self._describe(f"You move {d}.")
            self._moved = True
            return self._describe(f"There is a wall to the {d}; you stay where you are.")

        return [Tool.from_function(move, timeout_s=None)]

    def _render_map(self) -> str:
        rows = [list(r) for r in self._grid]
        rows[2 * self._goal[0] + 1][2 * self._goal[1] + 1] = "G"
        rows[2 * self._pos[0] + 1][2 * self._pos[1] + 1] = "A"
        return "\n".join("".join(r) for r in rows)

    def _describe(self, lead: str = "") -> str:
        if self._pos == self._goal:
            return f"{lead} You reached the goal!".strip()
        opens = open_dirs(self._grid, self._pos)
        if self.observation == "full":
            return (f"{lead}\n{self._render_map()}\nYou are at row {self._pos[0]}, column {self._pos[1]}; the goal is at "
                    f"row {self._goal[0]}, column {self._goal[1]}. Open directions: {', '.join(opens)}.").strip()
        near = [d for d in opens if (self._pos[0] + DIRS[d][0], self._pos[1] + DIRS[d][1]) == self._goal]
        seen = f" The goal is right next to you, to the {near[0]}." if near else ""
        walls = [d for d in DIRS if d not in opens]
        return f"{lead} Open: {', '.join(opens)}. Walls: {', '.join(walls) or 'none'}.{seen}".strip()

    def _reset_task(self, task_id: str) -> list[Message]:
        self._grid, self._pos, self._goal = make_task(task_id)
        self._moved = False
        rules = ("You are in a maze. Reach the goal by moving north, south, east or west, one step per reply. "
                 + ("You see the whole map: # is a wall, A is you, G is the goal." if self.observation == "full"
                    else "You cannot see the map: each step you learn only which directions are open."))
        return [Message("system", f"{rules}\n\n{self.format.render_tools(self.tools.specs)}"), Message("user", self._describe())]

    def _step_outcome(self, parsed, results) -> StepOutcome:
        won = self._pos == self._goal
        reward = (1.0 if won else 0.0) - (self.step_penalty if self._moved else 0.0)
        self._moved = False
        return StepOutcome(reward=reward, terminated=won, info={"won": won})

    def outcome(self) -> float:
        return float(self._pos == self._goal)

    def state_key(self) -> str:
        return f"{self._task_id}:{self._pos[0]},{self._pos[1]}"

    def task_type(self, task_id: str) -> str:
        return task_id.split("-")[0]

    def content_keys(self, task_id: str) -> set[str]:
        """The maze itself (``turngym.bench.heldout``): no held-out maze equals a training one."""
        return {f"maze:{maze_digest(task_id)}"}

    def oracle_action(self) -> str | None:
        path = shortest_path(self._grid, self._pos, self._goal)
        return self.format.render_call(ToolCall("oracle", "move", {"direction": path[0]})) if path else None

    def admissible_actions(self) -> list[str] | None:
        return [self.format.render_call(ToolCall("r", "move", {"direction": d})) for d in DIRS]
