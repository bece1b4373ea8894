"""Find ALFWorld games on disk: ``json_2.1.1/<split>/<task-type>-<args>/<trial>/game.tw-pddl``.

Each ``game.tw-pddl`` is self-contained (PDDL domain and problem, text grammar, walkthrough).
The task type is the folder name's prefix, one of the six ALFWorld types.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
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


@dataclass(frozen=True)
class AlfworldGame:
    """One game: ``task_id`` is ``<task folder>/<trial folder>`` (unique within a split)."""

    task_id: str
    path: Path
    task_type: str


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


def list_games(root: Path, split: str, *, solvable_only: bool = True) -> list[AlfworldGame]:
    """Every game of ``split`` under ``root``, sorted by task id.

    Args:
        root: The ALFWorld data folder.
        split: ``train``, ``valid_seen``, ``valid_unseen`` or ``test`` (= ``valid_seen``).
        solvable_only: Skip games whose file says ``"solvable": false`` (as ALFWorld does).

    Raises:
        ValueError: Unknown split.
        FileNotFoundError: The split's folder is not in this copy.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown ALFWorld split {split!r}; choose from {', '.join(SPLITS)}")
    folder = root / "json_2.1.1" / SPLITS[split]
    if not folder.is_dir():
        raise FileNotFoundError(missing_split_message(root, split))
    games = []
    for path in sorted(folder.glob("*/*/game.tw-pddl")):
        task_dir, trial_dir = path.parent.parent.name, path.parent.name
        if solvable_only and not _solvable(path):
            continue
        games.append(AlfworldGame(f"{task_dir}/{trial_dir}", path, task_type_of(task_dir)))
    return games


def _solvable(path: Path) -> bool:
    try:
        return bool(json.loads(path.read_text()).get("solvable", True))
    except (OSError, ValueError):
        return False


def missing_split_message(root: Path, split: str) -> str:
    """Why ``split`` cannot load from ``root``, naming the splits this copy does hold (e.g. a copy of
    only ``valid_unseen``: ``--split valid_unseen``) and how to get the rest."""
    folder = root / "json_2.1.1" / SPLITS[split]
    present = sorted({name for name, sub in SPLITS.items() if (root / "json_2.1.1" / sub).is_dir()} - {"test"})
    if "valid_seen" in present:
        present.append("test")  # test is valid_seen under its other name
    have = ("; this copy holds " + ", ".join(f"`--split {p}`" for p in present) + " (`split=` in Python)"
            if present else "")
    return f"no ALFWorld split {SPLITS[split]!r} at {folder}{have}; `turngym data download alfworld` fetches every split"
