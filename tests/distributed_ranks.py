"""Run a test's worker on several gloo ranks, each in its own spawned process."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Callable

import torch.multiprocessing as mp


def spawn_ranks(worker: Callable, tmp_path: Path, *args, world: int = 2, attempts: int = 2) -> Path:
    """Run ``worker(rank, init_file, out_dir, *args)`` on ``world`` ranks and return ``out_dir``.

    A rank killed by a signal is retried once, in a fresh directory with a fresh rendezvous: gloo
    has aborted a rank that had finished its work ("terminate called without an active exception",
    SIGABRT) on a loaded machine. A Python error in a worker is raised at once, never retried.
    """
    for attempt in itertools.count(1):
        out_dir = Path(tmp_path) / f"ranks{attempt}"
        out_dir.mkdir()
        try:
            mp.spawn(_run_then_exit, args=(worker, str(out_dir / "init"), str(out_dir), *args),
                     nprocs=world, join=True)
            return out_dir
        except mp.ProcessExitedException:
            if attempt >= attempts:
                raise


def _run_then_exit(rank: int, worker: Callable, init_file: str, out_dir: str, *args) -> None:
    worker(rank, init_file, out_dir, *args)
    os._exit(0)  # skip interpreter finalization, where gloo's threads can outlive the objects they use
