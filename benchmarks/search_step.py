"""Benchmark: one turngym search step (``search`` through ``turngym.make``) against raw ``bm25s``.

Both sides search the same corpus (the synthetic encyclopedia, or HotpotQA with ``--data-dir``)
for the same queries (each question's text), top 3. turngym parses the tool call, tokenises,
retrieves and formats titles and snippets; the raw side is ``bm25s.tokenize`` + ``retrieve`` on
an index built the same way. Order alternates per query.

    python benchmarks/search_step.py --reps 3
    python benchmarks/search_step.py --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import json
import time

import bm25s

import turngym


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir", default=None, help="use HotpotQA from this local data folder")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    kw = {"suite": "hotpotqa", "data_dir": args.data_dir} if args.data_dir else {"suite": "synthetic"}
    env = turngym.make("turngym/Search-synthetic-v0", split="all", **kw)
    qa = env.unwrapped.qa
    raw = bm25s.BM25()
    raw.index(bm25s.tokenize([f"{d.title}. {d.text}" for d in qa.docs], stopwords="en", show_progress=False), show_progress=False)
    t_gym = t_raw = 0.0
    n = 0
    for rep in range(args.reps):
        for i, task in enumerate(qa.tasks):
            env.reset(seed=0, options={"task_id": task.task_id})
            action = "<search>" + json.dumps({"query": task.question, "k": 3}) + "</search>"
            for side in ((0, 1) if (i + rep) % 2 == 0 else (1, 0)):
                t0 = time.perf_counter()
                if side == 0:
                    env.step(action)
                    t_gym += time.perf_counter() - t0
                else:
                    toks = bm25s.tokenize([task.question], stopwords="en", show_progress=False)
                    raw.retrieve(toks, k=3, show_progress=False)
                    t_raw += time.perf_counter() - t0
            n += 1
    print(f"{kw['suite']}: {len(qa.docs)} documents, {n} searches")
    print(f"turngym search step: {1e3 * t_gym / n:.3f} ms   raw bm25s: {1e3 * t_raw / n:.3f} ms   ratio {t_gym / t_raw:.2f}x")


if __name__ == "__main__":
    main()
