"""TextWorld game suites: what each level holds, and the on-disk cache of generated games.

Games are made offline with TextWorld's own challenge generators (the ones ``tw-make`` runs) from
fixed seeds, compiled to ``.z8`` (+ ``.json``) and cached under
``$TURNGYM_CACHE/textworld/<level>/<split>/`` (default ``~/.cache/turngym``). Each split draws its
seeds from its own range, so train and test never share a seed; ``content_hash`` lets tests check
that they never share a game either.

Generation runs in a child process with ``PYTHONHASHSEED=0`` (and its worker processes, one per
core, inherit it): TextWorld's generators iterate over Python sets, so under hash randomisation the
same seed gives different games in different runs.
A file lock makes it safe for many processes (subprocess env workers) to ask for the same split
at once: one generates, the others wait and read its index.

``python -m turngym.envs.textworld.games --level easy --split test --num-games 32`` pre-generates.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from turngym.clock import CLOCK, bar

SPLITS = ("train", "test")
INDEX = "index.json"
# Seeds are split_base + level_base + candidate; each range holds 10**6 candidates, so no seed is
# ever shared between splits or levels.
_SPLIT_SEED_BASE = {"train": 10_000_000, "test": 20_000_000}
_LEVEL_SEED_BASE = {"easy": 0, "medium": 1_000_000, "hard": 2_000_000}


@dataclass(frozen=True)
class Variant:
    """One kind of game in a suite: a TextWorld challenge and its settings."""

    challenge: str
    task_type: str
    settings: dict[str, Any]


@dataclass(frozen=True)
class Suite:
    """A rung of the complexity ladder.

    Args:
        level: ``easy`` | ``medium`` | ``hard``.
        variants: Game kinds, cycled over in candidate order.
        min_moves / max_moves: Candidates whose walkthrough length falls outside are skipped.
        max_turns: The registered turn limit (room for mistakes beyond ``max_moves``).
        default_games: Games per split when ``num_games`` is not given.
    """

    level: str
    variants: tuple[Variant, ...]
    min_moves: int
    max_moves: int
    max_turns: int
    default_games: dict[str, int] = field(default_factory=dict)

    @property
    def fingerprint(self) -> str:
        """Changes whenever the recipe changes, so stale caches are rebuilt."""
        blob = json.dumps([asdict(v) for v in self.variants] + [self.min_moves, self.max_moves], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _coin(level: int) -> Variant:
    return Variant("tw-coin_collector", "coin", {"level": level})


def _treasure(level: int) -> Variant:
    return Variant("tw-treasure_hunter", "treasure", {"level": level})


def _cooking(recipe: int, take: int, go: int, cook: bool = False, cut: bool = False) -> Variant:
    settings = {"recipe": recipe, "take": take, "go": go, "open": True, "cook": cook, "cut": cut, "drop": False}
    return Variant("tw-cooking", "cooking", settings)


SUITES: dict[str, Suite] = {
    # Coin collector: a chain of 2-5 rooms, some with dead-end side rooms; the objective spells
    # out the route, so a small model can learn to read and follow it.
    "easy": Suite(
        "easy",
        tuple(_coin(lv) for lv in (2, 3, 4, 5, 102, 103, 104, 105)),
        min_moves=2, max_moves=5, max_turns=10,
        default_games={"train": 64, "test": 128},  # 128 distinct held-out games: the protocol's minimum
    ),
    # Treasure hunter (10 rooms, closed doors and containers, a wrong object that loses the game)
    # and one-room-recipe cooking games over 6 rooms: about 10 moves.
    "medium": Suite(
        "medium",
        (_treasure(16), _cooking(1, 1, 6), _treasure(18), _cooking(2, 2, 6), _treasure(20)),
        min_moves=6, max_moves=14, max_turns=30,
        default_games={"train": 128, "test": 128},  # the protocol's 128 held-out games
    ),
    # Cooking with 9-12 rooms, 2-3 ingredients to find, cook and cut.
    "hard": Suite(
        "hard",
        (_cooking(2, 2, 9, True, True), _cooking(3, 3, 9, True, True), _cooking(2, 2, 12, True, True)),
        min_moves=15, max_moves=40, max_turns=60,
        default_games={"train": 32, "test": 16},
    ),
}


@dataclass
class GameRecord:
    """One generated game, as listed in a split's ``index.json``."""

    task_id: str
    file: str  # the .z8 file name, relative to the split folder
    task_type: str
    challenge: str
    settings: dict[str, Any]
    seed: int
    walkthrough: list[str]
    objective: str
    max_score: int
    content_hash: str


def get_suite(level: str) -> Suite:
    """The suite for ``level``.

    Raises:
        ValueError: unknown level.
    """
    try:
        return SUITES[level]
    except KeyError:
        raise ValueError(f"unknown TextWorld level {level!r}; choose from {sorted(SUITES)}") from None


def cache_root() -> Path:
    """``$TURNGYM_CACHE`` (default ``~/.cache/turngym``) + ``/textworld``."""
    base = os.environ.get("TURNGYM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "turngym")
    return Path(base) / "textworld"


def split_dir(level: str, split: str, root: str | Path | None = None) -> Path:
    return Path(root or cache_root()) / level / split


def content_hash(game_json: dict) -> str:
    """Hash of a game's content (world, quests, text), ignoring its metadata (seeds, uuid)."""
    body = {k: v for k, v in game_json.items() if k != "metadata"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def candidate_seed(level: str, split: str, candidate: int) -> int:
    if not 0 <= candidate < 1_000_000:
        raise ValueError(f"candidate {candidate} is outside the seed range of a split")
    return _SPLIT_SEED_BASE[split] + _LEVEL_SEED_BASE[level] + candidate


def read_index(folder: Path) -> dict | None:
    try:
        return json.loads((folder / INDEX).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _write_json_atomic(path: Path, obj: Any) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f)
    os.chmod(tmp, 0o644)  # mkstemp makes it private; a cache is shared like any other file
    os.replace(tmp, path)


def ensure_games(level: str, split: str, num_games: int | None = None, root: str | Path | None = None) -> list[GameRecord]:
    """The first ``num_games`` games of a split, generating the missing ones (in a child process).

    The games of a split form one fixed sequence, so asking for fewer games gives a prefix of what
    asking for more gives. Safe to call from many processes at once.

    Args:
        level: ``easy`` | ``medium`` | ``hard``.
        split: ``train`` | ``test``.
        num_games: How many games (default: the suite's default for this split).
        root: Cache folder (default ``cache_root()``).

    Returns:
        The games' records, in order.

    Raises:
        ValueError: bad level, split or count.
        RuntimeError: the generator process failed.
    """
    suite = get_suite(level)
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    n = suite.default_games[split] if num_games is None else int(num_games)
    if n < 1:
        raise ValueError(f"num_games must be >= 1, got {num_games}")
    folder = split_dir(level, split, root)
    index = read_index(folder)
    if not _index_ok(index, suite, n):  # only take the lock when there is work to do
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            index = read_index(folder)
            if not _index_ok(index, suite, n):
                with CLOCK.kind("game_generation"):
                    _run_generator(level, split, n, folder, lock.fileno())
                index = read_index(folder)
    if not _index_ok(index, suite, n):
        raise RuntimeError(f"TextWorld game generation left an incomplete index in {folder}")
    return [GameRecord(**g) for g in index["games"][:n]]


def _index_ok(index: dict | None, suite: Suite, n: int) -> bool:
    return bool(index) and index.get("fingerprint") == suite.fingerprint and len(index.get("games", [])) >= n


def _run_generator(level: str, split: str, n: int, folder: Path, lock_fd: int) -> None:
    """Run the generator child. It inherits the split's lock (``lock_fd``): a lock is held while any
    process keeps its file open, so a child that outlives a killed parent keeps the folder to itself
    until it exits, and the next caller waits for it instead of generating beside it."""
    index = read_index(folder)
    have = len(index["games"]) if _index_ok(index, get_suite(level), 0) else 0
    print(
        f"turngym: generating {n - have} TextWorld {level}/{split} games into {folder} "
        "(once; about 0.4-1 s a game)...",
        file=sys.stderr,
        flush=True,
    )
    cmd = [sys.executable, "-m", "turngym.envs.textworld.games", "--level", level, "--split", split,
           "--num-games", str(n), "--dir", str(folder)]
    package_root = str(Path(__file__).resolve().parents[3])  # so the child imports this turngym
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": path}
    limit = 120 + 60 * (n - have)  # a game takes seconds; a hung compiler should not hang us
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True, pass_fds=(lock_fd,))
        try:
            code = _wait_with_progress(proc, folder, have, n, limit)
        except BaseException:  # Ctrl-C: the child goes too (the games it finished are kept)
            proc.kill()
            proc.wait()
            raise
        err.seek(0)
        stderr = err.read()
    if code is None:
        raise RuntimeError(f"TextWorld game generation took over {limit}s; progress so far is kept")
    if code != 0:
        raise RuntimeError(f"TextWorld game generation failed (exit {code}):\n{stderr[-3000:]}")


def _wait_with_progress(proc: subprocess.Popen, folder: Path, have: int, n: int, limit: float) -> int | None:
    """The child's exit code, with a progress bar fed by the index it writes after every game;
    ``None`` (the child killed) past ``limit`` seconds."""
    deadline = time.monotonic() + limit
    with bar(n - have, f"generating {folder.parent.name}/{folder.name} games", "game") as progress:
        while True:
            try:
                code = proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                code = None
            index = read_index(folder) or {}
            done = len(index.get("games", [])) or have
            progress.update(max(0, min(n, done) - have - progress.n))
            if code is not None:
                return code
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                return None


# ----- the generator (runs in the child process, under the split's lock) ------------------------
def generate(level: str, split: str, n: int, folder: Path, workers: int | None = None) -> dict:
    """Extend ``folder``'s index to ``n`` games. Needs ``PYTHONHASHSEED=0`` to be deterministic.

    Candidates are made and compiled in ``workers`` processes (default: one per usable core, at
    most 4): a game costs one Inform 7 compile, about half a second of CPU (TextWorld's maker would
    compile it once more to record the walkthrough's events; ``walkthrough`` records them on the
    game's logic instead, the same events, tested). Each candidate's
    game depends only on its seed, and results join the index in candidate order (a duplicate of
    an earlier game is dropped there), so the sequence is the one a single process makes.
    """
    import multiprocessing

    if os.environ.get("PYTHONHASHSEED") != "0":
        raise RuntimeError("TextWorld generation is only deterministic with PYTHONHASHSEED=0")
    suite = get_suite(level)
    folder.mkdir(parents=True, exist_ok=True)
    index = read_index(folder)
    for leftover in folder.glob(".gen-*"):  # temp folders of an interrupted run
        shutil.rmtree(leftover, ignore_errors=True)
    if not index or index.get("fingerprint") != suite.fingerprint:
        for stale in [*folder.glob("*.z8"), *folder.glob("*.json")]:  # a changed recipe: start over
            stale.unlink()
        index = {"level": level, "split": split, "fingerprint": suite.fingerprint, "next_candidate": 0, "games": []}
    seen = {g["content_hash"] for g in index["games"]}
    workers = workers or max(1, min(4, len(os.sched_getaffinity(0))))
    pending: collections.deque = collections.deque()
    c = index["next_candidate"]
    # spawn: fresh workers (PYTHONHASHSEED=0 from our environment), never a fork of this process
    pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    try:
        while len(index["games"]) < n:
            while len(pending) < 2 * workers:  # every worker busy, a few candidates ahead
                pending.append(pool.submit(_make_and_compile, level, split, c, str(folder)))
                c += 1
            _keep(pending.popleft().result(), index, seen, folder, f"{level}-{split}")
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # candidates made past the n-th game are not needed
        for leftover in folder.glob(".gen-*"):
            shutil.rmtree(leftover, ignore_errors=True)
    return index


def _keep(job: dict | None, index: dict, seen: set, folder: Path, prefix: str) -> None:
    """Add one candidate's game to the index (or its skip record, or nothing for a candidate out of
    range or a duplicate), in candidate order, and write the index."""
    if job is None:
        return
    if "skipped" in job:
        index.setdefault("skipped", []).append(job)
        return
    tmp = Path(job.pop("dir"))
    candidate = job.pop("candidate")
    if job["content_hash"] in seen:
        shutil.rmtree(tmp, ignore_errors=True)
        return
    seen.add(job["content_hash"])
    name = f"{len(index['games']):04d}"
    os.replace(tmp / "game.json", folder / f"{name}.json")
    os.replace(tmp / "game.z8", folder / f"{name}.z8")
    shutil.rmtree(tmp, ignore_errors=True)
    index["games"].append(asdict(GameRecord(task_id=f"{prefix}-{name}", file=f"{name}.z8", **job)))
    index["next_candidate"] = candidate + 1  # an interrupted run restarts after the last game kept
    _write_json_atomic(folder / INDEX, index)  # progress survives an interrupted run


def _make_and_compile(level: str, split: str, c: int, folder: str) -> dict | None:
    """In a worker: candidate ``c``'s record fields with its game compiled into a private temp
    folder (``dir``), a skip record, or ``None`` (walkthrough length out of range)."""
    import textworld  # heavy: only the generator's workers import it
    import textworld.challenges
    from textworld.generator import compile_game

    if os.environ.get("PYTHONHASHSEED") != "0":
        raise RuntimeError("TextWorld generation is only deterministic with PYTHONHASHSEED=0")
    job = _make_game(textworld, get_suite(level), level, split, c, set())
    if job is None or "skipped" in job:
        return job
    game, options = job.pop("game"), job.pop("options")
    tmp = Path(tempfile.mkdtemp(dir=folder, prefix=".gen-"))
    options.path = str(tmp / "game.z8")
    options.file_ext = ".z8"
    options.force_recompile = True
    compile_game(game, options)
    return {**job, "dir": str(tmp)}


def _make_game(textworld, suite: Suite, level: str, split: str, c: int, seen: set) -> dict | None:
    """Candidate ``c``'s game and its record fields, or ``None`` when it is skipped (walkthrough
    length outside the suite's range, or the same content as a game already kept), or a
    ``{"skipped": c, ...}`` record when TextWorld cannot generate it at all."""
    from textworld.generator import QuestGenerationError

    from turngym.envs.textworld.walkthrough import compile_free_walkthroughs

    variant = suite.variants[c % len(suite.variants)]
    seed = candidate_seed(level, split, c)
    settings = dict(variant.settings)
    if variant.challenge == "tw-cooking":  # cooking keeps its own food split: use it too
        settings.update(recipe_seed=seed, split=split)
    options = textworld.GameOptions()
    options.seeds = seed
    try:
        with compile_free_walkthroughs():  # the walkthrough's events without a first compile
            game = textworld.challenges.CHALLENGES[variant.challenge][1](settings, options)
    except QuestGenerationError:
        # Some seeds admit no quest (e.g. treasure hunter, medium test candidate 44): TextWorld
        # raises on every try, so the candidate is skipped, and the index records it.
        return {"skipped": c, "seed": seed, "reason": "QuestGenerationError"}
    moves = len(game.walkthrough or [])
    if not suite.min_moves <= moves <= suite.max_moves:
        return None
    digest = content_hash(json.loads(json.dumps(game.serialize())))
    if digest in seen:
        return None
    seen.add(digest)
    return {"game": game, "options": options, "candidate": c, "task_type": variant.task_type,
            "challenge": variant.challenge, "settings": settings, "seed": seed, "walkthrough": list(game.walkthrough),
            "objective": game.objective, "max_score": int(game.max_score), "content_hash": digest}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Generate (or extend) a cached TextWorld game split.")
    p.add_argument("--level", required=True, choices=sorted(SUITES))
    p.add_argument("--split", required=True, choices=SPLITS)
    p.add_argument("--num-games", type=int, default=None)
    p.add_argument("--root", default=None, help="cache folder (default: $TURNGYM_CACHE/textworld)")
    p.add_argument("--dir", default=None, help=argparse.SUPPRESS)  # internal: the locked split folder
    args = p.parse_args(argv)
    if args.dir is None:  # by hand: take the lock and run the generator as a child
        t0 = time.perf_counter()
        games = ensure_games(args.level, args.split, args.num_games, args.root)
        print(f"{len(games)} games ready in {split_dir(args.level, args.split, args.root)} "
              f"({time.perf_counter() - t0:.1f}s)")
        return
    n = args.num_games or get_suite(args.level).default_games[args.split]
    generate(args.level, args.split, n, Path(args.dir))


if __name__ == "__main__":
    main()
