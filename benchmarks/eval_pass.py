"""One held-out evaluation pass as ``turngym train`` plays it, with each saving turned on in turn.

The quickstart's evaluation (greedy, xml tools, 16 tokens a turn, 32 games in flight) spends its
time prefilling prompts and starting envs. This script plays the same games in one run:

1. **before**: ``HFPolicy(share_prefix=False, packed=False)`` in fp32, envs opened for this pass and
   closed after it (as every evaluation and collection did until 2026-11-24);
2. **shared prefix**: the system prompt and tool instructions that every new episode starts with
   are prefilled once and reused;
3. **+ kept envs**: the envs of an earlier pass kept open (``EnvPools``): a TextWorld env's first
   reset starts its engine, later ones only load a game;
4. **+ packed**: a batch's new tokens run unpadded, each conversation attending to its own KV
   buffer (``agents/packed.py``, the CPU default since 2026-11-24);
5. **+ bf16 weights** (``generation_dtype="auto"``, the default on a CPU with native bf16): the
   packed engine multiplies with a bf16 copy of the weights; keys, values and attention stay fp32.

Passes 1-4 compute in fp32 and must play identical tokens (checked and printed), so their wall time
ratio is a pure speed ratio. Pass 5 rounds differently and can choose other tokens: its success is
printed next to its time. The raw engine (``model.generate``) is not in this table: the per-turn
comparison with it is ``benchmarks/rollout_tokens.py``.

    python benchmarks/eval_pass.py --weights runs/quickstart/sft_model.pt          # 32 games
    python benchmarks/eval_pass.py --weights runs/quickstart/sft_model.pt --games 128
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as rollout_tokens.py: torch is imported first

import torch  # noqa: E402

from turngym.agents.base import SamplingParams  # noqa: E402
from turngym.agents.default_model import load_default_model  # noqa: E402
from turngym.agents.hf import HFPolicy  # noqa: E402
from turngym.rollout import EnvPools, episode_specs, make_env_factory, rollout  # noqa: E402


def one_pass(policy, make_env, specs, args, pools=None):
    policy.invalidate_caches()
    before = dict(policy.stats)
    t0 = time.perf_counter()
    trajs = rollout(policy, make_env, specs, sampling=SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens),
                    num_envs=args.num_envs, progress=False, pools=pools)
    wall = time.perf_counter() - t0
    prefill = policy.stats["prefill_tokens"] - before["prefill_tokens"]
    return trajs, wall, prefill


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="turngym/TextWorld-easy-v0")
    p.add_argument("--split", default="test")
    p.add_argument("--games", type=int, default=32, help="distinct held-out games")
    p.add_argument("--num-envs", type=int, default=32, help="games in flight (the quickstart's eval.num_envs)")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--tool-format", default="xml")
    p.add_argument("--weights", default=None, help="a state dict to play, e.g. a run's sft_model.pt")
    args = p.parse_args()

    model, tok = load_default_model()
    if args.weights:
        model.load_state_dict(torch.load(args.weights, map_location="cpu"))
    make_env = make_env_factory(args.env, split=args.split, tool_format=args.tool_format)
    probe = make_env()
    specs = episode_specs(list(probe.unwrapped.task_ids)[: args.games], args.games, seed=10_000)
    probe.close()
    print(f"{args.env} ({args.split}), {args.games} games, {args.num_envs} in flight, greedy, "
          f"{args.max_new_tokens} tokens a turn, torch threads {torch.get_num_threads()}, weights {args.weights}")

    fp32 = dict(generation_dtype=torch.float32)
    plain = HFPolicy(model, tok, share_prefix=False, packed=False, **fp32)
    shared = HFPolicy(model, tok, packed=False, **fp32)
    packed = HFPolicy(model, tok, packed=True, **fp32)
    bf16 = HFPolicy(model, tok, packed=True)  # generation_dtype="auto"
    rows = []
    trajs_old, wall, pre = one_pass(plain, make_env, specs, args)
    rows.append(("before: no shared prefix, envs opened per pass", wall, pre, trajs_old))
    trajs, wall, pre = one_pass(shared, make_env, specs, args)
    rows.append(("shared prefix, envs opened per pass", wall, pre, trajs))
    with EnvPools() as pools:
        one_pass(shared, make_env, specs[: args.num_envs], args, pools)  # opens the envs (an earlier evaluation)
        for name, policy in (("shared prefix + envs kept open", shared), ("+ packed", packed),
                             (f"+ packed, {bf16.generation_dtype or 'fp32'} weights", bf16)):
            trajs, wall, pre = one_pass(policy, make_env, specs, args, pools)
            rows.append((name, wall, pre, trajs))

    actions = lambda trs: [[x.action_ids(k) for k in range(len(x.turns))] for x in trs]  # noqa: E731
    tokens = actions(trajs_old)
    turns = sum(len(tr.turns) for tr in trajs_old)
    print(f"turns played (before): {turns}")
    print(f"{'pass':48s} {'wall s':>8s} {'prefilled tokens':>17s} {'speedup':>8s}  same tokens  success")
    for name, wall, pre, tr in rows:
        same = actions(tr) == tokens
        won = sum(t.success for t in tr)
        print(f"{name:48s} {wall:8.1f} {pre:17d} {rows[0][1] / wall:7.2f}x  {str(same):11s}  {won}/{len(tr)}")


if __name__ == "__main__":
    main()
