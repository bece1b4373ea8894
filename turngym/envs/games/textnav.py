"""Text-Nav: move through rooms described in text, pick up an object and deliver it.

A house of nine rooms on a 3x3 plan is generated from the task's seed: doors follow a random
spanning tree plus a few extra doors; an object to deliver, a key and two distractors lie in
random rooms. In ``locked`` tasks every door of the target room is locked and the key opens it.

Commands (one per turn, via ``act``): ``go <direction>`` (or just the direction), ``take <item>``,
``drop <item>``, ``unlock <direction>``, ``look``, ``inventory``.

Reward 1.0 when the object lies in the target room. The oracle runs a breadth-first search over
the game's own transition function (ignoring distractors), so it always plays a shortest solution.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

from turngym.envs.base import StepOutcome, TextEnv
from turngym.tools.base import Tool
from turngym.types import Message, ToolCall

ROOM_NAMES = ["kitchen", "hallway", "library", "bedroom", "bathroom", "garden", "study", "cellar", "attic",
              "pantry", "parlor", "workshop"]
ITEMS = ["red book", "blue vase", "old lamp", "green apple", "silver spoon", "wooden box", "paper map", "glass jar"]
DIRS = {"north": (-1, 0), "south": (1, 0), "west": (0, -1), "east": (0, 1)}
VARIANTS = ("easy", "locked")


@dataclass(frozen=True)
class NavState:
    room: str
    items: tuple[tuple[str, str], ...]  # (item, room name or "inventory"), sorted
    unlocked: frozenset = frozenset()

    def where(self, item: str) -> str:
        return dict(self.items)[item]

    def moved(self, item: str, loc: str) -> NavState:
        return replace(self, items=tuple(sorted({**dict(self.items), item: loc}.items())))


@dataclass(frozen=True)
class House:
    doors: dict  # room -> {direction: neighbour room}
    locked: frozenset  # frozenset of frozenset({a, b}) door pairs that start locked
    target_item: str
    target_room: str
    key: str


def build_house(task_id: str) -> tuple[House, NavState]:
    rng = random.Random(f"textnav:{task_id}")
    names = rng.sample(ROOM_NAMES, 9)
    cell = {(r, c): names[3 * r + c] for r in range(3) for c in range(3)}
    edges: set[frozenset] = set()
    stack, seen = [(0, 0)], {(0, 0)}
    while stack:  # random spanning tree (depth first), then two extra doors
        r, c = stack[-1]
        nxt = [(r + dr, c + dc) for dr, dc in DIRS.values() if (r + dr, c + dc) in cell and (r + dr, c + dc) not in seen]
        if not nxt:
            stack.pop()
            continue
        n = rng.choice(nxt)
        edges.add(frozenset({(r, c), n}))
        seen.add(n)
        stack.append(n)
    all_pairs = [frozenset({a, (a[0] + dr, a[1] + dc)}) for a in cell for dr, dc in DIRS.values() if (a[0] + dr, a[1] + dc) in cell]
    edges |= set(rng.sample(sorted({p for p in all_pairs if p not in edges}, key=sorted), 2))
    doors: dict[str, dict[str, str]] = {name: {} for name in names}
    for e in edges:
        a, b = sorted(e)
        for x, y in ((a, b), (b, a)):
            d = next(k for k, (dr, dc) in DIRS.items() if (x[0] + dr, x[1] + dc) == y)
            doors[cell[x]][d] = cell[y]
    variant = task_id.split("-")[0]
    start = rng.choice(names)
    candidates = [n for n in names if n != start and (variant == "easy" or _connected_without(doors, n))]
    target_room = rng.choice(candidates)
    locked = frozenset(frozenset({target_room, nb}) for nb in doors[target_room].values()) if variant == "locked" else frozenset()
    items = rng.sample(ITEMS, 3)
    target_item, distractors = items[0], items[1:]
    others = [n for n in names if n != target_room]
    placed = {target_item: rng.choice(others), "brass key": rng.choice(others)}
    placed.update({d: rng.choice(names) for d in distractors})
    state = NavState(start, tuple(sorted(placed.items())))
    return House(doors, locked, target_item, target_room, "brass key"), state


def _connected_without(doors: dict, removed: str) -> bool:
    rooms = [r for r in doors if r != removed]
    seen, queue = {rooms[0]}, deque([rooms[0]])
    while queue:
        for nb in doors[queue.popleft()].values():
            if nb != removed and nb not in seen:
                seen.add(nb)
                queue.append(nb)
    return len(seen) == len(rooms)


def is_locked(house: House, state: NavState, a: str, b: str) -> bool:
    pair = frozenset({a, b})
    return pair in house.locked and pair not in state.unlocked


def apply(house: House, state: NavState, command: str) -> tuple[NavState, str]:
    """The game's transition: the next state and the message. Raises ``ValueError`` on a bad command."""
    words = command.strip().lower().rstrip(".!").split()
    if not words:
        raise ValueError("empty command")
    verb, rest = words[0], " ".join(words[1:])
    if verb in DIRS or verb in ("n", "s", "e", "w"):
        verb, rest = "go", verb
    rest = {"n": "north", "s": "south", "e": "east", "w": "west"}.get(rest, rest)
    if verb in ("go", "move", "walk"):
        nb = house.doors[state.room].get(rest)
        if rest not in DIRS:
            raise ValueError(f"go where? use go north/south/east/west, not {rest!r}")
        if nb is None:
            return state, f"There is no door to the {rest}."
        if is_locked(house, state, state.room, nb):
            return state, f"The door to the {rest} is locked."
        return replace(state, room=nb), f"You go {rest} into the {nb}."
    if verb in ("take", "get", "pick"):
        item = _match_item(state, rest.removeprefix("up ").strip(), state.room)
        return state.moved(item, "inventory"), f"You take the {item}."
    if verb in ("drop", "put"):
        item = _match_item(state, rest.removesuffix(" down").strip(), "inventory")
        return state.moved(item, state.room), f"You drop the {item} in the {state.room}."
    if verb == "unlock":
        rest = rest.removeprefix("door").strip().removeprefix("to the").strip()
        nb = house.doors[state.room].get(rest)
        if nb is None or not is_locked(house, state, state.room, nb):
            return state, f"There is no locked door to the {rest}."
        if state.where(house.key) != "inventory":
            return state, "You need a key to unlock this door."
        return replace(state, unlocked=state.unlocked | {frozenset({state.room, nb})}), f"You unlock the door to the {rest}."
    if verb in ("look", "l", "inventory", "i"):
        return state, ""
    raise ValueError(f"unknown command {command.strip()[:60]!r}; use go, take, drop, unlock, look or inventory")


def _match_item(state: NavState, name: str, loc: str) -> str:
    here = [i for i, where in state.items if where == loc]
    exact = [i for i in here if i == name or i.split()[-1] == name]
    if not name:
        raise ValueError("name the item")
    if len(exact) != 1:
        place = "you are not carrying" if loc == "inventory" else "there is no"
        raise ValueError(f"{place} {name!r} here" if not exact else f"which {name}? be more specific")
    return exact[0]


def describe(house: House, state: NavState) -> str:
    exits = []
    for d, nb in house.doors[state.room].items():
        exits.append(f"{d} (locked door)" if is_locked(house, state, state.room, nb) else f"{d} to the {nb}")
    here = [i for i, w in state.items if w == state.room]
    carry = [i for i, w in state.items if w == "inventory"]
    return (f"You are in the {state.room}. Exits: {', '.join(exits)}. "
            f"You see: {', '.join(('an ' if i[0] in 'aeiou' else 'a ') + i for i in here) or 'nothing'}. You carry: {', '.join(carry) or 'nothing'}.")


def solve(house: House, state: NavState) -> list[str]:
    """A shortest command sequence that delivers the item (distractors are never touched)."""
    relevant = {house.target_item, house.key}

    def moves(s: NavState):
        yield from (f"go {d}" for d in house.doors[s.room])
        for item in relevant:
            if s.where(item) == s.room:
                yield f"take {item}"
            if s.where(item) == "inventory":
                yield f"drop {item}"
        yield from (f"unlock {d}" for d, nb in house.doors[s.room].items() if is_locked(house, s, s.room, nb))

    prev: dict[NavState, tuple[NavState, str] | None] = {state: None}
    queue = deque([state])
    while queue:
        s = queue.popleft()
        if s.where(house.target_item) == house.target_room:
            path = []
            while prev[s] is not None:
                s, cmd = prev[s]
                path.append(cmd)
            return path[::-1]
        for cmd in moves(s):
            nxt, _ = apply(house, s, cmd)
            if nxt not in prev:
                prev[nxt] = (s, cmd)
                queue.append(nxt)
    return []


class TextNavEnv(TextEnv):
    """Navigate rooms by text commands to deliver an object (some doors need a key)."""

    default_tool_format = "text"

    def __init__(self, split: str = "train", variants: tuple[str, ...] = VARIANTS, n_tasks: int = 100, **kw: Any) -> None:
        """Args:
            split: ``train`` or ``test`` (different houses).
            variants: ``easy`` (no locks) and/or ``locked`` (the target room is locked; find the key).
            n_tasks: Houses per variant.
        """
        super().__init__(**kw)
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if set(variants) - set(VARIANTS):
            raise ValueError(f"variants must be among {VARIANTS}, got {variants}")
        self.task_ids = [f"{v}-{split}-{i:04d}" for v in variants for i in range(n_tasks)]
        self.house: House | None = None
        self.state: NavState | None = None

    def _build_tools(self) -> list[Tool]:
        def act(command: str) -> str:
            """Do one thing: go <direction>, take <item>, drop <item>, unlock <direction>, look, inventory.

            Args:
                command: the command, e.g. "go north" or "take red book"
            """
            self.state, msg = apply(self.house, self.state, command)
            return f"{msg} {describe(self.house, self.state)}".strip()

        return [Tool.from_function(act, timeout_s=None)]

    def _reset_task(self, task_id: str) -> list[Message]:
        self.house, self.state = build_house(task_id)
        goal = f"Your task: put the {self.house.target_item} in the {self.house.target_room}."
        rules = "You are exploring a house. Reply with one command per turn."
        return [Message("system", f"{rules}\n\n{self.format.render_tools(self.tools.specs)}"),
                Message("user", f"{goal}\n{describe(self.house, self.state)}")]

    def _won(self) -> bool:
        return self.state.where(self.house.target_item) == self.house.target_room

    def _step_outcome(self, parsed, results) -> StepOutcome:
        won = self._won()
        msgs = [Message("user", "Well done: the task is complete.")] if won else []
        return StepOutcome(reward=float(won), terminated=won, messages=msgs, info={"won": won})

    def outcome(self) -> float:
        return float(self._won())

    def state_key(self) -> str:
        s = self.state
        return f"{self._task_id}:{s.room}:{s.items}:{sorted(tuple(sorted(p)) for p in s.unlocked)}"

    def task_type(self, task_id: str) -> str:
        return task_id.split("-")[0]

    def oracle_action(self) -> str | None:
        plan = solve(self.house, self.state)
        return self.format.render_call(ToolCall("oracle", "act", {"command": plan[0]})) if plan else None

    def admissible_actions(self) -> list[str] | None:
        s, cmds = self.state, ["look"]
        cmds += [f"go {d}" for d, nb in self.house.doors[s.room].items() if not is_locked(self.house, s, s.room, nb)]
        cmds += [f"take {i}" for i, w in s.items if w == s.room]
        cmds += [f"drop {i}" for i, w in s.items if w == "inventory"]
        if s.where(self.house.key) == "inventory":
            cmds += [f"unlock {d}" for d, nb in self.house.doors[s.room].items() if is_locked(self.house, s, s.room, nb)]
        return [self.format.render_call(ToolCall("r", "act", {"command": c})) for c in cmds]
