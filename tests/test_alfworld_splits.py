"""ALFWorld's training split, unpacked from the packed archive in ``shared_data`` with ``turngym data add``
as a user would, against valid_seen: sizes, held-out tasks, game order, the oracle's replies, and the
engine's PDDL translation memo (skipped without the data)."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

import turngym
from turngym.data.local import add_local
from turngym.envs.engine import EngineProcess
from turngym.envs.alfworld.games import TASK_TYPES, list_games

pytestmark = pytest.mark.data
ARCHIVE = "train_json_2.1.1.tar.xz"
TRAIN_COUNTS = {  # games per task type in ALFWorld's json_2.1.1/train
    "pick_and_place_simple": 790, "look_at_obj_in_light": 308, "pick_clean_then_place_in_recep": 650,
    "pick_heat_then_place_in_recep": 459, "pick_cool_then_place_in_recep": 533, "pick_two_obj_and_place": 813,
}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A data folder with train and valid_seen: the shared copy when its train is unpacked, else the
    archive unpacked and valid_seen copied into a temporary folder (about 3 s, 320 MB, removed after)."""
    from conftest import shared_data_dir

    shared = shared_data_dir()
    src = shared / "alfworld" if shared is not None else None
    if src is None or not (src / "json_2.1.1" / "valid_seen").is_dir():
        pytest.skip(f"no ALFWorld valid_seen in {shared}")
    if (src / "json_2.1.1" / "train").is_dir():
        yield src
        return
    if not (src / ARCHIVE).is_file():
        pytest.skip(f"no ALFWorld training split in {src} (neither json_2.1.1/train nor {ARCHIVE})")
    into = tmp_path_factory.mktemp("data")
    add_local("alfworld", src / ARCHIVE, into=into, log=lambda s: None)
    shutil.copytree(src / "json_2.1.1" / "valid_seen", into / "alfworld" / "json_2.1.1" / "valid_seen")
    yield into / "alfworld"
    shutil.rmtree(into, ignore_errors=True)


def test_train_split_holds_alfworld_s_games_less_those_of_eval_tasks(root):
    every = list_games(root, "train", order="id")
    assert len(every) == 3553 and Counter(g.task_type for g in every) == TRAIN_COUNTS
    seen = list_games(root, "valid_seen")
    # ALFWorld's valid_seen replays training tasks with the objects placed elsewhere: 134 of its
    # 140 task folders name a training task too, 218 training games in all
    shared = {g.task for g in seen} & {g.task for g in every}
    assert len(shared) == 134 and sum(g.task in shared for g in every) == 218
    train = list_games(root, "train", exclude_eval_tasks=True)
    assert len(train) == 3553 - 218
    assert not {g.task for g in train} & {g.task for g in seen}  # no held-out task is a training task
    assert not {g.task_id for g in every} & {g.task_id for g in seen}  # ids never were shared
    env = turngym.make("turngym/ALFWorld-v0", data_dir=str(root))  # split train: without them by default
    test = turngym.make("turngym/ALFWorld-v0", data_dir=str(root), split="test")
    assert env.unwrapped.task_ids == [g.task_id for g in train]
    content = lambda e: {e.unwrapped.task_content(t) for t in e.unwrapped.task_ids}  # noqa: E731
    assert len(content(test)) == 137 and not content(env) & content(test)
    env.close()
    test.close()
    env = turngym.make("turngym/ALFWorld-v0", data_dir=str(root), exclude_eval_tasks=False)
    assert len(env.unwrapped.task_ids) == 3553
    env.close()


def test_the_first_games_of_each_split_cover_every_task_type(root):
    for split, n in (("train", 6), ("valid_seen", 6)):
        games = list_games(root, split, exclude_eval_tasks=split == "train")
        assert [g.task_type for g in games[:n]] == list(TASK_TYPES)
        first = games[:64]  # 64 games: every type, and no room dominates
        assert min(Counter(g.task_type for g in first).values()) >= 10
        assert max(Counter(g.task.rsplit("-", 1)[1] for g in first).values()) <= 4
    by_id = list_games(root, "valid_seen", order="id")[:64]
    assert len({g.task_type for g in by_id}) == 3  # what the id order gave: three types of six


def test_oracle_replies_and_the_walkthrough_the_engine_plays(root):
    pytest.importorskip("alfworld")
    env = turngym.make("turngym/ALFWorld-v0", split="train", data_dir=str(root), tool_format="xml", max_games=3)
    replies = env.unwrapped.oracle_actions()
    assert replies[0].startswith("<act>") and len(replies[0]) >= len(replies[-1])
    every = turngym.make("turngym/ALFWorld-v0", split="train", data_dir=str(root), tool_format="text").unwrapped
    longest = every.oracle_actions()[0]
    assert len(longest) == 43 and longest.startswith("take ")  # the longest command in ALFWorld's walkthroughs
    game = env.unwrapped.games[1]
    env.reset(seed=0, options={"task_id": game.task_id})
    assert env.unwrapped.walkthrough() == list(game.plan)  # the file's plan is the one the engine plays
    every.close()
    env.close()


def test_memos_change_no_observation(root):
    """Three games played from their start (the first twice: a replay resets a loaded game) with the
    expert's moves and some that fail, once in an engine with ``memo.py``'s memos and once in a plain
    one, each in a fresh process: every observation, admissible list and state digest is the same."""
    pytest.importorskip("alfworld")
    games = list_games(root, "valid_seen")[:3]
    infos = {"won": True, "facts": True, "extras": ["walkthrough"], "admissible_commands": True,
             "policy_commands": False}

    def play(memo: bool) -> tuple[list, dict]:
        engine = EngineProcess("turngym.envs.alfworld.engine:AlfworldEngine", {"infos": infos, "memo": memo})
        seen = []
        try:
            for g in games:
                engine.call("load", str(g.path), deadline_s=120)
                for _ in range(2 if g == games[0] else 1):
                    start = engine.call("reset", deadline_s=120)
                    seen.append(start)
                    for c in ["look", "dance", "open fridge 1", "inventory", *start["walkthrough"]]:
                        seen.append(engine.call("step", c, deadline_s=60))
            return seen, engine.call("translation_stats", deadline_s=10)
        finally:
            engine.close()

    plain, none = play(False)
    kept, stats = play(True)
    assert kept == plain and plain[-1]["won"]
    assert none == {"calls": 0, "misses": 0}
    # two translations (plain, and for the replanner) at each load and reset; with the memos one a game
    assert stats == {"calls": 2 * (3 + 4), "misses": 3}
