"""Held out in content, over the full splits: the split check (``turngym.bench.heldout``) compares
every held-out task's ``content_keys`` with every training task's (SQL: the database's tables; SWE:
the bug templates and the package; Maze: the maze) and its opening with theirs, and finds nothing
shared in any family whose tasks are generated here. A toy env shows what it reports when there is."""

from __future__ import annotations

import pytest
from toy_envs import GuessEnv

import turngym
from turngym.bench.heldout import check_splits, describe_overlap

pytestmark = pytest.mark.filterwarnings("ignore::turngym.tools.sandbox.local_backend.UnsafeSandboxWarning")


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("TURNGYM_CACHE", str(tmp_path_factory.getbasetemp() / "sql-cache"))


def _full_check(env_id: str, budget_s: float = 120.0, **kw):
    test = turngym.make(env_id, split="test", **kw)
    try:
        n = len(test.unwrapped.task_ids)
    finally:
        test.close()
    return check_splits(env_id, {"split": "train", **kw}, {"split": "test", **kw}, n, budget_s=budget_s), n


@pytest.mark.parametrize("env_id, train_n, test_n", [
    ("turngym/SQL-synthetic-v2", 1200, 360),
    ("turngym/Maze-v0", 200, 200),
    ("turngym/Maze-partial-v0", 200, 200),
    ("turngym/SQL-synthetic-v1", 59, 16),
])
def test_no_held_out_task_shares_content_with_training(env_id, train_n, test_n):
    check, n = _full_check(env_id)
    assert (len(check.train_tasks), n) == (train_n, test_n)
    assert check.keys_checked == (test_n, train_n)  # every task's keys, both splits whole
    assert check.content_checked == (test_n, train_n), check.content_note  # every opening too
    assert check.clean, describe_overlap(check)


def test_swe_held_out_tasks_share_no_template_or_package_with_training():
    # Resetting a SWE task starts a sandbox, so openings are hashed for one pair only; the keys,
    # which need no reset, cover both splits whole.
    check, n = _full_check("turngym/SWE-synthetic-v1", budget_s=1e-9, sandbox="local", pool_size=0)
    assert n == 144 and len(check.train_tasks) == 600
    assert check.keys_checked == (144, 600) and check.clean, describe_overlap(check)


def test_the_maze_that_repeated_a_training_maze_is_drawn_again():
    from turngym.envs.games.maze import make_task

    assert make_task("small-test-0044") != make_task("small-train-0071")
    train = {repr(make_task(f"small-train-{i:04d}")) for i in range(1000)}
    assert not [i for i in range(300) if repr(make_task(f"small-test-{i:04d}")) in train]


class KeyedGuess(GuessEnv):
    """The toy guessing game with disjoint ids per split whose tasks are made of a colour: test task
    7 is painted like training task 2. With ``twin``, task 7 has a colour of its own but opens
    exactly like task 3 (it plays game 3)."""

    COLOURS = {1: "red", 2: "blue", 3: "green", 4: "grey", 5: "pink", 6: "teal", 7: "blue", 8: "gold"}

    def __init__(self, split="train", twin=False, **kw):
        super().__init__(n_tasks=8, **kw)
        self.task_ids = [str(i) for i in range(1, 9) if (i > 6) == (split == "test")]
        self.twin = twin

    def _reset_task(self, task_id):
        return super()._reset_task("3" if self.twin and task_id == "7" else task_id)

    def content_keys(self, task_id):
        return {"colour:amber"} if self.twin and task_id == "7" else {f"colour:{self.COLOURS[int(task_id)]}"}


turngym.register("tests/KeyedGuess-v0", entry_point=KeyedGuess, max_turns=5)


def test_shared_content_keys_are_reported_and_make_the_check_unclean():
    c = check_splits("tests/KeyedGuess-v0", {"split": "train"}, {"split": "test"}, 2)
    assert not c.id_overlap and c.keys_checked == (2, 6)
    assert c.key_overlap == [("7", "2", "colour:blue")] and not c.clean
    assert "1 held-out tasks are made of what training tasks are made of (7 and 2 share colour:blue)" in describe_overlap(c)
    assert c.to_dict()["key_overlap"] == [["7", "2", "colour:blue"]]
    ids_only = check_splits("tests/KeyedGuess-v0", {"split": "train"}, {"split": "test"}, 2, budget_s=0)
    assert ids_only.keys_checked == (0, 0) and ids_only.clean  # budget 0: ids only, as before


def test_tasks_that_open_alike_but_are_made_of_different_content_are_not_an_overlap():
    kw = {"twin": True}
    opened = check_splits("tests/KeyedGuess-v0", {"split": "train"}, {"split": "test"}, 2)
    assert opened.key_overlap  # without the twin, 7 is painted like 2
    c = check_splits("tests/KeyedGuess-v0", {"split": "train", **kw}, {"split": "test", **kw}, 2)
    assert c.clean and not c.content_overlap and not c.key_overlap
    assert "1 held-out tasks open like a training task but are made of different content" in c.content_note
