"""ALFWorld's observation text and game order, and adding a local copy of a dataset: no game data needed."""

from __future__ import annotations

import argparse
import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from turngym.data import cli as data_cli
from turngym.data import dataset_path
from turngym.data.local import add_local
from turngym.data.registry import COMPLETE_STAMP, download_dir
from turngym.envs.alfworld.games import TASK_TYPES, AlfworldGame, mixed_order
from turngym.envs.alfworld.observe import admissible_text, room_places, system_prompt

KITCHEN = ["cabinet 1", "cabinet 2", "countertop 1", "fridge 1", "microwave 1"]
START = [f"go to {p}" for p in KITCHEN] + ["help", "inventory", "look"]


def at(place: str, *more: str) -> list[str]:
    """The admissible commands at ``place`` (ALFWorld sorts them)."""
    return sorted([f"go to {p}" for p in KITCHEN if p != place] + ["help", "inventory", "look",
                                                                    f"examine {place}", *more])


def test_compact_folds_go_to_and_objects_drops_help_and_repeats_nothing():
    places = room_places(START)
    assert places == tuple(KITCHEN)
    assert admissible_text(START, "compact", places) == "Admissible commands: go to (any receptacle of the room), inventory, look."
    here = at("fridge 1", "open fridge 1")
    assert admissible_text(here, "compact", places, previous=START) == (
        "Admissible commands: go to (any receptacle of the room but fridge 1), examine fridge 1, inventory, look, "
        "open fridge 1.")
    assert admissible_text(here, "compact", places, previous=here) == ""  # unchanged: the last list holds
    table = at("countertop 1", "take apple 1 from countertop 1", "take mug 2 from countertop 1", "examine mug 2")
    assert admissible_text(table, "compact", places) == (
        "Admissible commands: go to (any receptacle of the room but countertop 1), examine countertop 1, mug 2, "
        "inventory, look, take apple 1, mug 2 from countertop 1.")
    # targets that are not the room less one or two receptacles are written out, each one
    odd = ["go to cabinet 1", "go to fridge 1", "look"]
    assert admissible_text(odd, "compact", places) == "Admissible commands: go to cabinet 1, go to fridge 1, look."


def test_all_lists_every_command_as_alfworld_does_and_none_lists_nothing():
    here = at("fridge 1", "open fridge 1")
    assert admissible_text(here, "all", room_places(START), previous=here) == "Admissible commands: " + ", ".join(here) + "."
    assert admissible_text(here, "none") == ""
    with pytest.raises(ValueError, match="compact, all, none"):
        admissible_text(here, "verbose")


def test_system_prompt_names_alfworld_verbs_and_the_listing():
    text = system_prompt("text", "compact")
    assert "'move mug 1 to shelf 1'" in text and "put" not in text  # ALFWorld's grammar says move, not put
    assert "admissible now when they changed" in text and "single line" in text
    assert "Each observation ends with the commands admissible now" in system_prompt("text", "all")
    assert "admissible" not in system_prompt("xml", "none") and "`act` tool" in system_prompt("xml", "none")


def test_mixed_order_takes_task_types_in_turn_and_is_fixed():
    games = [AlfworldGame(f"{t}-X-None-Y-{i}/trial_{i}", Path("."), t) for t in TASK_TYPES for i in range(3)]
    games += [AlfworldGame(f"{TASK_TYPES[0]}-Z-None-Y-9/trial_{i}", Path("."), TASK_TYPES[0]) for i in range(3, 6)]
    order = mixed_order(list(reversed(games)))
    assert [g.task_type for g in order[:6]] == list(TASK_TYPES)
    assert [g.task_type for g in order[6:12]] == list(TASK_TYPES)
    assert [g.task_type for g in order[-3:]] == [TASK_TYPES[0]] * 3  # the type with more games ends the list
    assert order == mixed_order(games) and sorted(order, key=lambda g: g.task_id) == sorted(games, key=lambda g: g.task_id)


# ----- turngym data add -------------------------------------------------------------------------------
def _game_bytes() -> bytes:
    return b'{"pddl_domain": "", "grammar": "", "pddl_problem": "", "solvable": true, "walkthrough": ["look"]}'


def _tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:xz") as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TURNGYM_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TURNGYM_DATA", raising=False)
    return tmp_path


def test_add_unpacks_a_packed_split_beside_a_copied_folder(cache):
    train = "json_2.1.1/train/look_at_obj_in_light-Book-None-DeskLamp-1/trial_1/game.tw-pddl"
    archive = _tar(cache / "train.tar.xz", {train: _game_bytes()})
    seen = cache / "copy" / "json_2.1.1" / "valid_seen" / "pick_two_obj_and_place-Pen-None-Desk-1" / "trial_2"
    seen.mkdir(parents=True)
    (seen / "game.tw-pddl").write_bytes(_game_bytes())
    logs: list[str] = []
    folder = add_local("alfworld", archive, log=logs.append)
    assert folder == download_dir("alfworld") and (folder / train).read_bytes() == _game_bytes()
    assert "a local archive" in logs[0] and "sha256=" in logs[0]
    add_local("alfworld", cache / "copy", log=logs.append)
    assert (folder / "json_2.1.1" / "valid_seen").is_dir() and (folder / train).exists()
    assert (folder / COMPLETE_STAMP).exists() and dataset_path("alfworld") == folder


def test_add_refuses_unsafe_archives_and_other_files_and_reports_missing_markers(cache):
    bad = cache / "bad.zip"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("../evil.txt", "x")
    with pytest.raises(ValueError, match="unsafe path"):
        add_local("alfworld", bad, log=lambda s: None)
    assert not (cache / "evil.txt").exists()
    (cache / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match="neither"):
        add_local("alfworld", cache / "notes.txt", log=lambda s: None)
    with pytest.raises(FileNotFoundError):
        add_local("alfworld", cache / "missing.tar.xz", log=lambda s: None)
    logs: list[str] = []
    other = _tar(cache / "other.tar.xz", {"readme.txt": b"x"})
    folder = add_local("alfworld", other, into=cache / "data", log=logs.append)
    assert folder == cache / "data" / "alfworld" and not (folder / COMPLETE_STAMP).exists()
    assert "does not hold json_2.1.1 yet" in logs[-1]


def test_cli_add(cache, capsys):
    archive = _tar(cache / "t.tar.xz", {"json_2.1.1/train/pick_and_place_simple-A-None-B-1/t/game.tw-pddl": _game_bytes()})
    ap = argparse.ArgumentParser()
    data_cli.add_arguments(ap)
    assert data_cli.main(ap.parse_args(["add", "alfworld", str(archive), "--into", str(cache / "d")])) == 0
    assert capsys.readouterr().out.strip() == str(cache / "d" / "alfworld")
    assert data_cli.main(ap.parse_args(["add", "alfworld", str(cache / "nope.zip")])) == 1
    assert "does not exist" in capsys.readouterr().err


def test_training_games_of_eval_tasks_are_left_out_and_a_missing_eval_split_is_said(tmp_path):
    from turngym.data import forget_warnings
    from turngym.envs.alfworld.games import list_games

    def game(split: str, task: str, trial: str) -> None:
        folder = tmp_path / "json_2.1.1" / split / task / trial
        folder.mkdir(parents=True)
        (folder / "game.tw-pddl").write_bytes(_game_bytes())

    game("train", "pick_and_place_simple-Mug-None-Desk-301", "trial_1")
    game("train", "pick_and_place_simple-Mug-None-Desk-302", "trial_2")
    forget_warnings()
    with pytest.warns(UserWarning, match="no ALFWorld eval split"):
        assert len(list_games(tmp_path, "train", exclude_eval_tasks=True)) == 2
    game("valid_seen", "pick_and_place_simple-Mug-None-Desk-301", "trial_3")  # another trial of a training task
    kept = list_games(tmp_path, "train", exclude_eval_tasks=True)
    assert [g.task for g in kept] == ["pick_and_place_simple-Mug-None-Desk-302"]
    assert len(list_games(tmp_path, "train")) == 2 and kept[0].plan == ("look",)
