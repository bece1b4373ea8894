"""``turngym`` command line: ``envs | eval | train | protocol | bench | data | mcp | openenv``.

Each subcommand lives in the module that owns its work; this file only parses arguments and
dispatches, and imports heavy modules lazily so ``turngym envs`` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml


def _kv(items: list[str] | None) -> dict[str, Any]:
    """``["split=test", "num_games=4"]`` -> ``{"split": "test", "num_games": 4}`` (YAML-typed values)."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: expected KEY=VALUE, got {item!r}")
        out[key.replace("-", "_")] = yaml.safe_load(value)
    return out


def cmd_envs(args: argparse.Namespace) -> int:
    import turngym

    envs = turngym.list_envs(args.namespace)
    if not envs:
        print("no environments registered")
        return 1
    width = max(len(i) for i in envs)
    for env_id, desc in envs.items():
        print(f"{env_id.ljust(width)}  {desc}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    import turngym  # noqa: F401  (registers the built-in envs)
    from turngym.agents import SamplingParams, make_agent
    from turngym.bench.evaluate import evaluate
    from turngym.bench.metrics import format_summary

    env_kwargs = _kv(args.env_arg)
    if args.split:
        env_kwargs["split"] = args.split
    policy = make_agent(args.agent)
    sampling = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed)
    result = evaluate(
        args.env,
        policy,
        agent_name=args.agent,
        episodes=args.episodes,
        seed=args.seed,
        env_kwargs=env_kwargs,
        sampling=sampling,
        num_envs=args.num_envs,
        workers=args.workers,
        max_turns=args.max_turns,
        progress=not args.quiet,
    )
    out = Path(args.out) if args.out else _default_out(args.env, args.agent)
    result.save(out)
    print(format_summary(result.summary, f"{args.env}  agent={args.agent}  split={env_kwargs.get('split', 'default')}"))
    print(f"wrote {out}")
    if args.print_json:
        print(json.dumps(result.summary, indent=2))
    return 0


def _default_out(env_id: str, agent: str) -> Path:
    safe = lambda s: "".join(c if c.isalnum() or c in "-_." else "_" for c in s)  # noqa: E731
    return Path("runs") / "eval" / f"{safe(env_id)}__{safe(agent)}__{time.strftime('%Y%m%d-%H%M%S')}.json"


def cmd_mcp(args: argparse.Namespace) -> int:
    from turngym.envs.mcp_server import serve_stdio

    env_kwargs = _kv(args.env_arg)
    if args.split:
        env_kwargs["split"] = args.split
    serve_stdio(args.env, env_kwargs, max_turns=args.max_turns)
    return 0


def cmd_openenv(args: argparse.Namespace) -> int:
    try:
        from turngym.integrations.openenv import serve
    except ImportError as e:  # the extra is missing: say which, without a traceback
        raise SystemExit(f"error: {e}") from None

    env_kwargs = _kv(args.env_arg)
    if args.split:
        env_kwargs["split"] = args.split
    serve(args.env, args.host, args.port, args.max_sessions, args.max_turns, env_kwargs)
    return 0


def _delegate(module: str) -> Any:
    """Subcommands owned by other modules: ``module.add_arguments(parser)`` and ``module.main(args)``."""
    if importlib.util.find_spec(module) is None:
        return None
    return importlib.import_module(module)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="turngym", description="Multi-turn agentic RL gym and trainer.")
    sub = p.add_subparsers(dest="command", required=True)

    e = sub.add_parser("envs", help="list registered environments")
    e.add_argument("--namespace", default=None, help="only ids in this namespace (e.g. turngym)")
    e.set_defaults(func=cmd_envs)

    ev = sub.add_parser("eval", help="evaluate an agent on an environment")
    ev.add_argument("--env", required=True, help="env id, e.g. turngym/TextWorld-easy-v0")
    ev.add_argument("--agent", default="oracle", help="oracle | random | default | hf:PATH | openai:URL#MODEL")
    ev.add_argument("--episodes", type=int, default=20)
    ev.add_argument("--split", default="test", help="task split (train/test); '' for the env's default")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--num-envs", type=int, default=8, help="episodes in flight (the policy's batch)")
    ev.add_argument("--workers", action="store_true", help="run envs in subprocess workers with step timeouts")
    ev.add_argument("--max-turns", type=int, default=None, help="override the env's turn limit")
    ev.add_argument("--temperature", type=float, default=0.0, help="LLM agents: 0 = greedy")
    ev.add_argument("--max-new-tokens", type=int, default=64)
    ev.add_argument("--env-arg", action="append", metavar="KEY=VALUE", help="env constructor override")
    ev.add_argument("--out", default=None, help="JSON output path (default runs/eval/...)")
    ev.add_argument("--print-json", action="store_true", help="also print the summary as JSON")
    ev.add_argument("--quiet", action="store_true", help="no progress bar")
    ev.set_defaults(func=cmd_eval)

    mc = sub.add_parser("mcp", help="serve an env's tools as an MCP server over stdio (reset + step semantics)")
    mc.add_argument("env", help="env id, e.g. turngym/Maze-v0 (pkg.module:ns/Name-v0 imports pkg.module first)")
    mc.add_argument("--split", default=None, help="task split (default: the env's own)")
    mc.add_argument("--max-turns", type=int, default=None, help="override the env's turn limit")
    mc.add_argument("--env-arg", action="append", metavar="KEY=VALUE", help="env constructor override")
    mc.set_defaults(func=cmd_mcp)

    oe = sub.add_parser("openenv", help="serve an env over OpenEnv's protocol (HTTP + WebSocket sessions)")
    oe.add_argument("env", help="env id, e.g. turngym/Maze-v0 (pkg.module:ns/Name-v0 imports pkg.module first)")
    oe.add_argument("--host", default="127.0.0.1")
    oe.add_argument("--port", type=int, default=8000)
    oe.add_argument("--max-sessions", type=int, default=8, help="concurrent WebSocket sessions, one env each")
    oe.add_argument("--split", default=None, help="task split (default: the env's own)")
    oe.add_argument("--max-turns", type=int, default=None, help="override the env's turn limit")
    oe.add_argument("--env-arg", action="append", metavar="KEY=VALUE", help="env constructor override")
    oe.set_defaults(func=cmd_openenv)

    for name, module, help_ in (
        ("train", "turngym.train", "train a policy (SFT warm start, ArCHer, GRPO, ...)"),
        ("protocol", "turngym.protocol", "measure a learning claim: arms x seeds on shared held-out games, paired CIs"),
        ("bench", "turngym.bench.cli", "run a benchmark suite"),
        ("data", "turngym.data.cli", "download or locate external task data"),
    ):
        mod = _delegate(module)
        if mod is not None:
            sp = sub.add_parser(name, help=help_)
            mod.add_arguments(sp)
            sp.set_defaults(func=mod.main)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
