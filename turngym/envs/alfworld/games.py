"""Find ALFWorld games on disk: ``json_2.1.1/<split>/<task-type>-<args>/<trial>/game.tw-pddl``.

Each ``game.tw-pddl`` is self-contained (PDDL domain and problem, text grammar, walkthrough).
The task type is the folder name's prefix, one of the six ALFWorld types. The task folder names
the task itself (type, object, its container if any, receptacle, room); a trial folder is one
placement of the room's objects for it.

ALFWorld's ``valid_seen`` games are new trials of tasks its training split also holds: 134 of its
140 task folders name a training task too (218 of the 3,553 training games), in the same room
with the objects placed elsewhere. ``list_games(..., exclude_eval_tasks=True)`` leaves those
training games out, so a held-out game is a task the policy never trained on, not only a new
placement (``split="train"`` does this by default; see ``ALFWorldEnv``).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
# "test" is ALFWorld's in-distribution eval split (held-out games in seen rooms); its
# out-of-distribution split is asked for by name, "valid_unseen".
SPLITS = {"train": "train", "valid_seen": "valid_seen", "valid_unseen": "valid_unseen", "test": "valid_seen"}
EVAL_SPLITS = ("valid_seen", "valid_unseen")


@dataclass(frozen=True)
class AlfworldGame:
    """One game: ``task_id`` is ``<task folder>/<trial folder>`` (unique within a split); ``plan``
    is the expert's walkthrough as the game file stores it; ``solvable`` what the file says."""

    task_id: str
    path: Path
    task_type: str
    plan: tuple[str, ...] = field(default=(), compare=False)
    solvable: bool = field(default=True, compare=False)

    @property
    def task(self) -> str:
        """The task folder: type, object, container, receptacle and room (shared by its trials)."""
        return self.task_id.split("/", 1)[0]


def task_type_of(folder_name: str) -> str:
    """The task type named by a task folder (``pick_two_obj_and_place-Apple-None-Fridge-1``).

    Raises:
        ValueError: The folder name starts with no known task type.
    """
    prefix = folder_name.split("-", 1)[0]
    if prefix not in TASK_TYPES:
        raise ValueError(f"{folder_name!r} does not start with an ALFWorld task type ({', '.join(TASK_TYPES)})")
    return prefix


def alfworld_root(data_dir: str | Path | None = None) -> Path:
    """The ALFWorld data folder (holding ``json_2.1.1/``).

    Raises:
        turngym.data.DataNotFound: No copy; the message says to run ``turngym data download
            alfworld`` or to point ``TURNGYM_DATA`` at a copy.
    """
    from turngym.data import dataset_path

    return dataset_path("alfworld", data_dir)


def list_games(root: Path, split: str, *, solvable_only: bool = True, exclude_eval_tasks: bool = False,
               order: str = "mixed") -> list[AlfworldGame]:
    """Every game of ``split`` under ``root``.

    Args:
        root: The ALFWorld data folder.
        split: ``train``, ``valid_seen``, ``valid_unseen`` or ``test`` (= ``valid_seen``).
        solvable_only: Skip games whose file says ``"solvable": false`` (as ALFWorld does).
        exclude_eval_tasks: Leave out the games whose task folder is also one of an eval split's
            (``EVAL_SPLITS`` found under ``root``); for the training split.
        order: ``mixed``: task types in turn (one game of each type, then the next of each), and
            within a type a fixed pseudo-random order (a hash of the id), so the first N games of
            a split cover every type and many rooms; ``id``: sorted by task id.

    Raises:
        ValueError: Unknown split or order.
        FileNotFoundError: The split's folder is not in this copy.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown ALFWorld split {split!r}; choose from {', '.join(SPLITS)}")
    if order not in ("mixed", "id"):
        raise ValueError(f"order must be mixed or id, got {order!r}")
    folder = root / "json_2.1.1" / SPLITS[split]
    if not folder.is_dir():
        raise FileNotFoundError(missing_split_message(root, split))
    games = [g for g in _scan(folder, folder.stat().st_mtime_ns) if g.solvable or not solvable_only]
    if exclude_eval_tasks:
        held = eval_tasks(root, exclude=SPLITS[split])
        if not held:
            from turngym.data import warn_once

            warn_once(f"no ALFWorld eval split under {root / 'json_2.1.1'}: the {split} split keeps the games of "
                      "tasks an eval split may hold (get valid_seen to leave them out)")
        games = [g for g in games if g.task not in held]
    return mixed_order(games) if order == "mixed" else games


def eval_tasks(root: Path, exclude: str = "") -> set[str]:
    """The task folders of the eval splits present under ``root`` (``exclude``: one to skip)."""
    out: set[str] = set()
    for sub in EVAL_SPLITS:
        folder = root / "json_2.1.1" / sub
        if sub != exclude and folder.is_dir():
            out |= {p.name for p in folder.iterdir() if p.is_dir()}
    return out


def mixed_order(games: list[AlfworldGame]) -> list[AlfworldGame]:
    """Task types in turn, ``TASK_TYPES`` order; within a type by a hash of the id (stable across
    machines and Python versions). A type that runs out drops from the turn."""
    by_type: dict[str, list[AlfworldGame]] = {}
    for g in sorted(games, key=lambda g: hashlib.sha1(g.task_id.encode()).hexdigest()):
        by_type.setdefault(g.task_type, []).append(g)
    queues = [by_type[t] for t in sorted(by_type, key=lambda t: (TASK_TYPES + (t,)).index(t))]
    out: list[AlfworldGame] = []
    for i in range(max((len(q) for q in queues), default=0)):
        out += [q[i] for q in queues if i < len(q)]
    return out


@functools.lru_cache(maxsize=16)
def _scan(folder: Path, mtime_ns: int) -> tuple[AlfworldGame, ...]:
    """Every game file under a split folder, sorted by id, with its plan and solvability. Cached by
    the folder and its modification time (a task added changes it): every env of a run lists its
    split, and the training split's 3,553 files take seconds to read."""
    games = []
    for path in sorted(folder.glob("*/*/game.tw-pddl")):
        task_dir, trial_dir = path.parent.parent.name, path.parent.name
        solvable, plan = _solvable_and_plan(path)
        games.append(AlfworldGame(f"{task_dir}/{trial_dir}", path, task_type_of(task_dir), plan, solvable))
    return tuple(games)


def _solvable_and_plan(path: Path) -> tuple[bool, tuple[str, ...]]:
    """What a game file says of itself (an unreadable file is unsolvable). ALFWorld writes the keys
    ``solvable`` and ``walkthrough`` last, so only that tail is parsed (a tenth of the time)."""
    try:
        text = path.read_text()
        i = text.rfind('"solvable"')
        try:
            data = json.loads("{" + text[i:]) if i > 0 else json.loads(text)
        except ValueError:
            data = json.loads(text)
    except (OSError, ValueError):
        return False, ()
    return bool(data.get("solvable", True)), tuple(str(c) for c in data.get("walkthrough") or ())


def missing_split_message(root: Path, split: str) -> str:
    """Why ``split`` cannot load from ``root``, naming the splits this copy does hold (e.g. a copy of
    only ``valid_unseen``: ``--split valid_unseen``) and how to get the rest."""
    folder = root / "json_2.1.1" / SPLITS[split]
    present = sorted({name for name, sub in SPLITS.items() if (root / "json_2.1.1" / sub).is_dir()} - {"test"})
    if "valid_seen" in present:
        present.append("test")  # test is valid_seen under its other name
    have = ("; this copy holds " + ", ".join(f"`--split {p}`" for p in present) + " (`split=` in Python)"
            if present else "")
    hint = "`turngym data download alfworld` fetches every split"
    if split == "train":
        hint += " (a packed copy of the training split: `turngym data unpack alfworld FILE`)"
    return f"no ALFWorld split {SPLITS[split]!r} at {folder}{have}; {hint}"
