"""``turngym bench``: run a suite (resumable), list suites, or compare two runs.

    turngym bench --suite lmrl --agent oracle
    turngym bench --suite all --agent random --out runs/bench/all_random   # run again to resume
    turngym bench --compare runs/bench/A/results.json runs/bench/B/results.json
    turngym bench --env my_package.my_envs:mine/Guess-v0 --agent random            # one env of your own
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``bench`` options to ``parser``."""
    parser.add_argument("--suite", default=None, help="suite name (--list shows them)")
    parser.add_argument("--env", default=None, help="bench one env instead of a suite (pkg.module:ns/Name-v0 "
                                                    "imports pkg.module from the current folder first)")
    parser.add_argument("--split", default="test", help="with --env: the task split ('' for the env's default)")
    parser.add_argument("--agent", default="oracle", help="oracle | random | default | hf:PATH | openai:URL#MODEL")
    parser.add_argument("--episodes", type=int, default=None, help="episodes per env (overrides the suite's)")
    parser.add_argument("--workers", type=int, default=4, help="episodes in flight per env, each env in a subprocess worker")
    parser.add_argument("--in-process", action="store_true", help="run envs in this process (no subprocess workers)")
    parser.add_argument("--jobs", type=int, default=1, help="suite entries run at once in a process pool (scripted agents)")
    parser.add_argument("--chunk", type=int, default=0, help="episodes logged per chunk (default 2 x workers)")
    parser.add_argument("--out", default=None, help="output folder (default runs/bench/<suite>__<agent>__<time>)")
    parser.add_argument("--resume", action="store_true", help="continue the latest run of this suite and agent")
    parser.add_argument("--retry-errors", action="store_true",
                        help="when resuming, play again episodes that ended in an env error (crash, timeout, sandbox)")
    parser.add_argument("--seed", type=int, default=0, help="reset seed of the first episode of each env")
    parser.add_argument("--temperature", type=float, default=0.0, help="LLM agents: 0 = greedy")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="LLM agents: reply length cap")
    parser.add_argument("--step-timeout", type=float, default=120.0, help="seconds for one env step in a worker")
    parser.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"), help="print B - A per env with significance")
    parser.add_argument("--list", action="store_true", help="list the suites and their entries")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def _list() -> int:
    from turngym.bench.suites import get_suite, list_suites

    for name in list_suites():
        entries = get_suite(name)
        print(f"{name} ({len(entries)} envs, {sum(e.episodes for e in entries)} episodes)")
        for e in entries:
            print(f"  {e.key:45s} split={e.split or 'default'} episodes={e.episodes}")
    return 0


def main(args: argparse.Namespace) -> int:
    """Run the ``bench`` command; returns the exit code."""
    if args.list:
        return _list()
    if args.compare:
        from turngym.bench.compare import compare_files

        print(compare_files(*args.compare))
        return 0
    if not args.suite and not getattr(args, "env", None):
        print("error: --suite NAME or --env ID is required (or --compare A B, or --list)", file=sys.stderr)
        return 2
    import turngym  # noqa: F401  (registers the built-in envs)
    from turngym.agents import make_agent
    from turngym.bench.report import markdown
    from turngym.bench.runner import BenchConfig, BenchError, resolve_out_dir, run_bench
    from turngym.bench.suites import get_suite, register_suite

    if getattr(args, "env", None):  # a suite of one entry, named after the env
        register_suite(args.env, [(args.env, args.split, args.episodes or 30)])
        args.suite = args.env

    try:
        get_suite(args.suite)
        cfg = BenchConfig(
            suite=args.suite, agent=args.agent, episodes=args.episodes, seed=args.seed, workers=args.workers,
            in_process=args.in_process, jobs=args.jobs, chunk=args.chunk, step_timeout_s=args.step_timeout,
            temperature=args.temperature, max_new_tokens=args.max_new_tokens, out=args.out, resume=args.resume,
            retry_errors=args.retry_errors,
            progress=not args.quiet,
        )
        cfg.out = str(resolve_out_dir(cfg))  # fixed once, so the message below names the folder
        policy = make_agent(args.agent)
    except (KeyError, ValueError) as e:  # unknown suite or agent, bad numbers, nothing to resume
        print(f"error: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    try:
        results = run_bench(cfg, policy)
    except BenchError as e:
        print(f"error: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    print(markdown(results))
    print(f"wrote {cfg.out}/results.json, results.md, results.png (episodes in episodes.jsonl)")
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="turngym bench")
    add_arguments(ap)
    sys.exit(main(ap.parse_args()))
