"""Run a benchmark suite, resumably.

For each suite entry: probe the env (missing data or sandbox -> the entry is skipped with the
reason), fix its episode specs (task id, seed), play the specs not yet in the out dir's
``episodes.jsonl`` in chunks, and append every finished episode to that file (flushed and
fsync'd after each chunk). A killed run loses at most the chunk in flight; running again with
the same ``--out`` plays only what is missing. The report (``results.json/.md/.png``) is built
from the whole log at the end.
"""

from __future__ import annotations

import json
import os
import pickle
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from turngym.agents.base import Policy, SamplingParams
from turngym.bench.suites import SuiteEntry, get_suite
from turngym.clock import Progress, bar
from turngym.rollout import Collector, EnvTarget, EpisodeSpec, env_info, episode_specs
from turngym.envs.info import check_reset
from turngym.rollout.handles import exit_with_parent

LOG_NAME, CONFIG_NAME = "episodes.jsonl", "config.json"
Record = dict[str, Any]
ChunkCallback = Callable[[SuiteEntry, list[Record]], None]


class BenchError(ValueError):
    """A run that cannot start: settings that clash with the out dir's run, nothing to resume, ..."""


@dataclass
class BenchConfig:
    """Knobs of ``turngym bench``; the defaults run the small ``lmrl`` suite with the oracle."""

    suite: str = "lmrl"  # suite name (see turngym.bench.suites)
    agent: str = "oracle"  # agent spec for turngym.agents.make_agent
    episodes: int | None = None  # override every entry's episode count
    seed: int = 0  # first reset seed; episode i of an entry uses seed + i
    workers: int = 4  # episodes in flight per env (the policy's batch)
    in_process: bool = False  # run envs in this process instead of subprocess workers
    jobs: int = 1  # suite entries played at once in a process pool (picklable agents only)
    chunk: int = 0  # episodes per appended chunk; 0 = 2 * workers
    step_timeout_s: float = 120.0  # limit for one env reset/step in a worker
    temperature: float = 0.0  # LLM agents: 0 = greedy
    max_new_tokens: int = 64  # LLM agents: length cap of one reply
    out: str | None = None  # output folder (default runs/bench/<suite>__<agent>__<time>)
    resume: bool = False  # without --out: continue the latest run of this suite and agent
    retry_errors: bool = False  # play again logged episodes that ended in an env error (crash, timeout)
    progress: bool = True  # tqdm bars

    def __post_init__(self) -> None:
        if self.workers < 1 or self.jobs < 1 or self.chunk < 0 or (self.episodes is not None and self.episodes < 1):
            raise BenchError("workers, jobs and episodes must be >= 1, chunk >= 0")

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, max_new_tokens=self.max_new_tokens, seed=self.seed)

    def identity(self, entries: list[SuiteEntry]) -> dict[str, Any]:
        """What must match for a resumed run to continue this one."""
        return {
            "suite": self.suite, "agent": self.agent, "seed": self.seed,
            "temperature": self.temperature, "max_new_tokens": self.max_new_tokens,
            "entries": [[e.key, e.split, e.episodes] for e in entries],
        }


@dataclass
class EntryPlan:
    """An entry ready to play (``specs``) or skipped (``skipped`` says what is missing)."""

    entry: SuiteEntry
    env_kwargs: dict[str, Any]
    specs: list[EpisodeSpec] | None = None
    skipped: str | None = None


class EpisodeLog:
    """The append-only JSONL of finished episodes, one ``Record`` per line.

    A record is ``{"env", "index", "task_id", "seed", "wall_share_s", "trajectory"}``; (env, index)
    is its key. A last line cut off by a kill is dropped (and cut from the file) on ``load``.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[tuple[str, int], Record]:
        """All complete records by (env, index); the later of two records with one key wins."""
        if not self.path.exists():
            return {}
        data = self.path.read_bytes()
        good_end = data.rfind(b"\n") + 1
        if good_end < len(data):  # a half-written last line: drop it so appends start clean
            with open(self.path, "r+b") as f:
                f.truncate(good_end)
        out: dict[tuple[str, int], Record] = {}
        for n, line in enumerate(data[:good_end].splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                out[(rec["env"], int(rec["index"]))] = rec
            except (ValueError, KeyError, TypeError):
                print(f"[bench] {self.path}:{n}: unreadable record dropped; that episode runs again")
        return out

    def append(self, records: list[Record]) -> None:
        """Append records and make them durable before returning."""
        if not records:
            return
        text = "".join(json.dumps(r) + "\n" for r in records)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())


def spread(task_ids: list[str], n: int) -> list[str]:
    """``n`` tasks evenly spaced over ``task_ids`` (so that every task type is covered), or all
    of them when ``n`` is at least their number."""
    if n >= len(task_ids):
        return list(task_ids)
    return [task_ids[i * len(task_ids) // n] for i in range(n)]


def _missing_errors() -> tuple[type[BaseException], ...]:
    from turngym.data.registry import DataNotFound
    from turngym.tools.sandbox.base import SandboxError

    return (DataNotFound, SandboxError, ImportError)


def plan_entry(entry: SuiteEntry, agent_env_kwargs: dict[str, Any], seed: int) -> EntryPlan:
    """Make the env and reset its first task once, to learn its tasks and whether it can run.

    Missing data (``DataNotFound``), no sandbox backend (``SandboxError``) or a missing optional
    package (``ImportError``) skip the entry with the error's message; any other error is a bug
    and propagates.
    """
    kwargs = {**entry.make_kwargs(), **agent_env_kwargs}
    missing = _missing_errors()
    try:
        task_ids = list(env_info(entry.env_id, **kwargs).task_ids)
        if not task_ids:
            return EntryPlan(entry, kwargs, skipped=f"split {entry.split!r} has no tasks")
        check_reset(entry.env_id, task_ids[0], seed, **kwargs)
    except missing as e:
        return EntryPlan(entry, kwargs, skipped=_why(e))
    specs = episode_specs(spread(task_ids, entry.episodes), entry.episodes, seed=seed)
    return EntryPlan(entry, kwargs, specs=specs)


def _why(e: BaseException) -> str:
    if isinstance(e, ImportError):
        return f"{type(e).__name__}: {e} (install the optional dependencies: pip install 'turngym[cpu]')"
    return f"{type(e).__name__}: {e}"


def play_chunk(policy: Policy, plan: EntryPlan, items: list[tuple[int, EpisodeSpec]], cfg: BenchConfig,
               shown: Progress | bool = False) -> list[Record]:
    """Play the ``(index, spec)`` items of one entry; one record per item, in order. ``shown``: the
    entry's progress, moved episode by episode."""
    t0 = time.perf_counter()
    with Collector(policy, workers=not cfg.in_process, step_timeout_s=cfg.step_timeout_s) as collector:
        trajs = collector.play(EnvTarget(plan.entry.env_id, plan.env_kwargs), [s for _, s in items], cfg.sampling(),
                               num_envs=cfg.workers, policy=policy, progress=shown,
                               metadata={"env_id": plan.entry.env_id, "agent": cfg.agent}, pooled=False)
    share = (time.perf_counter() - t0) / len(items)
    return [
        {"env": plan.entry.key, "index": i, "task_id": s.task_id, "seed": s.seed, "wall_share_s": share,
         "trajectory": t.to_dict()}
        for (i, s), t in zip(items, trajs)
    ]


def resolve_out_dir(cfg: BenchConfig, root: Path = Path("runs") / "bench") -> Path:
    """``--out``; else with ``--resume`` the latest run of this suite and agent; else a new folder.

    Raises:
        BenchError: ``--resume`` without ``--out`` and no earlier run to continue.
    """
    if cfg.out:
        return Path(cfg.out)
    prefix = f"{_safe(cfg.suite)}__{_safe(cfg.agent)}__"
    if cfg.resume:
        runs = sorted(p for p in root.glob(prefix + "*") if (p / CONFIG_NAME).exists())
        if not runs:
            raise BenchError(f"--resume: no earlier run under {root}/{prefix}*; pass --out DIR")
        return runs[-1]
    return root / (prefix + time.strftime("%Y%m%d-%H%M%S"))


def _safe(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in s)


def _check_config(out: Path, identity: dict[str, Any]) -> None:
    path = out / CONFIG_NAME
    if not path.exists():
        path.write_text(json.dumps(identity, indent=2))
        return
    old = json.loads(path.read_text())
    diff = sorted(k for k in set(old) | set(identity) if old.get(k) != identity.get(k))
    if diff:
        raise BenchError(
            f"{out} holds a run with a different {', '.join(diff)}; resume it with the same settings "
            "or choose another --out"
        )


def _check_records(plans: list[EntryPlan], done: dict[tuple[str, int], Record]) -> None:
    specs = {p.entry.key: p.specs for p in plans if p.specs is not None}
    for (key, i), rec in done.items():
        if key not in specs:
            continue  # an entry skipped this time (its data went missing): not reported
        s = specs[key][i] if i < len(specs[key]) else None
        if s is None or (rec["task_id"], rec["seed"]) != (s.task_id, s.seed):
            raise BenchError(f"logged episode {key}#{i} does not match this run's episode specs")


def run_bench(cfg: BenchConfig, policy: Policy | None = None, on_chunk: ChunkCallback | None = None) -> dict:
    """Run (or continue) a suite and write its report.

    Args:
        cfg: What to run and where.
        policy: The agent; built from ``cfg.agent`` when None.
        on_chunk: Called after each chunk is appended to the log (tests use it to simulate a kill).

    Returns:
        The results dict also written to ``results.json``.

    Raises:
        BenchError: every entry was skipped (nothing to play), the out dir holds a run with other
            settings, or ``jobs > 1`` with an agent that cannot be pickled.
    """
    from turngym.agents import make_agent
    from turngym.bench.report import build_results, write_outputs

    t0 = time.perf_counter()
    entries = get_suite(cfg.suite, cfg.episodes)
    policy = policy if policy is not None else make_agent(cfg.agent)  # a bad spec fails before any file is written
    plans = [plan_entry(e, dict(getattr(policy, "env_kwargs", {})), cfg.seed) for e in entries]
    for p in plans:
        if p.skipped:
            print(f"[bench] skipping {p.entry.key}: {p.skipped}")
    if all(p.skipped for p in plans):  # a report of nothing would read as a finished benchmark
        raise BenchError(f"nothing to play: every entry of suite {cfg.suite!r} was skipped "
                         f"({'; '.join(f'{p.entry.key}: {p.skipped}' for p in plans)})")
    out = resolve_out_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    _check_config(out, cfg.identity(entries))
    log = EpisodeLog(out / LOG_NAME)
    done = log.load()
    _check_records(plans, done)
    work = [(p, _todo(p, done, cfg.retry_errors)) for p in plans if p.specs is not None]
    chunk = cfg.chunk or 2 * cfg.workers
    if cfg.jobs > 1:
        _run_pool(policy, work, chunk, cfg, log, on_chunk)
    else:
        _run_serial(policy, work, chunk, cfg, log, on_chunk)
    results = build_results(cfg, plans, log.load(), wall_s=time.perf_counter() - t0, out_dir=out)
    write_outputs(results, out)
    return results


def _todo(plan: EntryPlan, done: dict, retry_errors: bool) -> list[tuple[int, EpisodeSpec]]:
    def finished(i: int) -> bool:
        rec = done.get((plan.entry.key, i))
        return rec is not None and not (retry_errors and "error" in rec["trajectory"].get("metadata", {}))

    return [(i, s) for i, s in enumerate(plan.specs or []) if not finished(i)]


def _chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _run_serial(policy, work, chunk, cfg, log, on_chunk) -> None:
    for plan, todo in work:
        n = len(plan.specs)
        with bar(n, plan.entry.key, "ep", initial=n - len(todo), disable=not cfg.progress) as shown:
            for items in _chunks(todo, chunk):
                records = play_chunk(policy, plan, items, cfg, shown)
                log.append(records)
                if on_chunk is not None:
                    on_chunk(plan.entry, records)


_POOL_POLICY: Policy | None = None


def _pool_init(blob: bytes, parent_pid: int) -> None:
    global _POOL_POLICY
    exit_with_parent(parent_pid)  # a SIGKILLed runner leaves no pool process (nor, in turn, env workers)
    _POOL_POLICY = pickle.loads(blob)


def _pool_play(plan: EntryPlan, items: list, cfg: BenchConfig) -> list[Record]:
    return play_chunk(_POOL_POLICY, plan, items, cfg)


def _run_pool(policy, work, chunk, cfg, log, on_chunk) -> None:
    """Chunks of all entries at once in ``cfg.jobs`` processes; only this process writes the log."""
    try:
        blob = pickle.dumps(policy)
    except Exception as e:
        raise BenchError(f"--jobs > 1 needs a picklable agent (scripted agents are): {e}") from e
    total = sum(len(t) for _, t in work)
    with ProcessPoolExecutor(cfg.jobs, initializer=_pool_init, initargs=(blob, os.getpid())) as pool, \
            bar(total, f"{cfg.suite} ({cfg.jobs} jobs)", "ep", disable=not cfg.progress) as shown:
        futures = {pool.submit(_pool_play, plan, items, cfg): plan for plan, todo in work for items in _chunks(todo, chunk)}
        try:
            for fut in as_completed(futures):
                records = fut.result()
                log.append(records)
                shown.update(len(records))
                shown.set_postfix_str(futures[fut].entry.key)
                if on_chunk is not None:
                    on_chunk(futures[fut].entry, records)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)  # chunks not started are simply not logged
            raise
