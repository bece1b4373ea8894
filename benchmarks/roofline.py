"""Roofline: this machine's matmul peak, and the fraction of it that generation, the actor update
and the SFT step reach on the embedded SmolLM2-135M, in one run.

1. **Peak.** The best GFLOP/s of ``torch.matmul`` over a few large shapes, fp32, and bf16 where the
   CPU computes it natively (``agents.packed.native_bf16``: AVX512-BF16 or AMX), on the threads
   this process may use.
2. **SFT step.** The quickstart's SFT (8 walkthroughs, top 8 of 30 blocks trainable, bf16 autocast
   where native) for ``--sft-epochs`` epochs on the base model: its update-loop seconds.
3. **Generation.** A held-out evaluation as ``turngym train`` plays it (TextWorld-easy test games,
   greedy, xml tools, 16 tokens a turn, 32 in flight) with the quickstart's SFT weights. Every packed
   forward is timed and counted: a call that feeds one token per row, or that checks drafted tokens
   (``agents/lookahead.py``: logits at every fed position), is decode; any other prefill (a turn's new
   prompt tokens). Cached tokens are not counted: they are not recomputed. Rejected drafts are
   counted: they are computed.
4. **Actor update.** Branch BC's clone update (``BranchBCTrainer.clone``, minibatches of 4
   episodes, top 8 blocks) for ``--update-epochs`` passes over the evaluation's episodes.

5. **Why not more.** Two ceilings that no scheduling removes, measured the same way:
   - *the model's own matmuls*: the GFLOP/s of one block's 7 projections (``F.linear`` at the
     model's widths) over as many token rows as a decode forward, a turn's prefill and a clone
     minibatch feed them: at 576 hidden units a small matmul reaches a fraction of the large-shape peak;
   - *memory*: the best GB/s of reading a buffer far larger than the caches, against the bytes each
     generation forward must read (every weight once, and every row's cached keys and values).
     ``intensity x bandwidth`` is the FLOP/s a forward cannot exceed however fast the arithmetic.

FLOPs come from the model's shape (a multiply-add is 2 FLOPs): per token the 7 projections of each
block, per (query, key) pair of causal attention ``4 * heads * head_dim`` per block, and
``2 * hidden * vocab`` per row that gets logits. Only real tokens count (padding is waste, not work).
An update is the forward of every block it computes plus twice the forward of the trainable blocks
(gradients of activations and of weights) and the input gradient of the LM head; frozen blocks
whose outputs an implementation computes once per fit (``sequences.frozen_prefix``, where it exists)
count once per fit, not once per epoch.

    python benchmarks/roofline.py                           # this checkout
    python benchmarks/roofline.py --compare /tmp/before     # before (a checkout) vs this one, A B A B
    python benchmarks/roofline.py --compare /tmp/before --docs docs/benchmarks.md

``--weights`` caches the SFT weights the generation and update phases start from (made by the first
pass when missing). Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from checkout import check_imports_from, checkout_env

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # idle OpenMP threads must not spin on a shared machine

HERE = Path(__file__).resolve().parent.parent


# ----- FLOPs of a Llama-style decoder ---------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """What the FLOP count needs of a decoder's config."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, config) -> Shape:
        c = config.get_text_config(decoder=True)
        hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return cls(c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads or
                   c.num_attention_heads, hd, c.intermediate_size, c.vocab_size)

    @property
    def block_token(self) -> int:
        """FLOPs of one block's projections for one token: q, o (hidden x heads*hd), k, v
        (hidden x kv_heads*hd), and the gated MLP's three matrices."""
        h, a, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return 2 * (2 * h * a + 2 * h * kv + 3 * h * self.intermediate)

    @property
    def block_pair(self) -> int:
        """FLOPs of one block's attention for one (query, key) pair: q.k and the weighted v, per head."""
        return 4 * self.heads * self.head_dim

    @property
    def head_row(self) -> int:
        return 2 * self.hidden * self.vocab


def forward_flops(s: Shape, tokens: int, pairs: int, logit_rows: int, blocks: int | None = None) -> int:
    """FLOPs of a forward over ``tokens`` new tokens with ``pairs`` attended (query, key) pairs,
    through ``blocks`` blocks (default all), with logits on ``logit_rows`` rows."""
    n = s.layers if blocks is None else blocks
    return n * (tokens * s.block_token + pairs * s.block_pair) + logit_rows * s.head_row


def update_flops(s: Shape, tokens: int, pairs: int, scored: int, trainable: int, frozen_forward: bool = True) -> int:
    """FLOPs of one forward + backward: the forward of every block (only the trainable ones when
    ``frozen_forward`` is False: the frozen blocks' outputs were computed earlier), the head on the
    ``scored`` positions, and a backward twice the forward of the trainable blocks plus the head's
    input gradient (the head is tied to the frozen embeddings: no weight gradient)."""
    fwd = forward_flops(s, tokens, pairs, scored, None if frozen_forward else trainable)
    bwd = 2 * forward_flops(s, tokens, pairs, 0, trainable) + scored * s.head_row
    return fwd + bwd


def causal_pairs(lengths: list[int]) -> int:
    """(query, key) pairs of causal attention over whole sequences of these lengths."""
    return sum(n * (n + 1) // 2 for n in lengths)


def cached_pairs(past: int, new: int) -> int:
    """Pairs when ``new`` tokens follow ``past`` cached ones: token j sees past + j + 1 keys."""
    return new * past + new * (new + 1) // 2


# ----- measuring -------------------------------------------------------------------------------
def matmul_peak(dtype, seconds: float = 1.0) -> float:
    """Best GFLOP/s of ``torch.matmul`` over a few large shapes in ``dtype``."""
    import torch

    best = 0.0
    for m, k, n in ((2048, 2048, 2048), (4096, 576, 1536), (1024, 4096, 1024)):
        a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
        for _ in range(3):
            a @ b  # warm up (oneDNN picks and JITs its kernel)
        reps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            a @ b
            reps += 1
        best = max(best, 2 * m * k * n * reps / (time.perf_counter() - t0) / 1e9)
    return best


def memory_bandwidth(seconds: float = 1.0, gib: float = 1.0) -> float:
    """Best GB/s of reading ``gib`` GiB of fp32 (a sum: one read of every byte, next to no arithmetic),
    far larger than any cache, on the threads this process may use."""
    import torch

    x = torch.ones(int(gib * 2**30) // 4)
    x.sum()  # warm up (page faults)
    best, t_end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        x.sum()
        best = max(best, x.numel() * 4 / (time.perf_counter() - t0) / 1e9)
    return best


def block_matmul_gflops(s: Shape, tokens: int, dtype, seconds: float = 0.5) -> float:
    """GFLOP/s of one block's 7 projections (q, k, v, o, gate, up, down) at the model's widths over
    ``tokens`` rows: the best the model's own linear layers can do at that batch, in ``dtype``."""
    import torch
    import torch.nn.functional as F

    h, a, kv = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim
    x, y = torch.randn(tokens, h).to(dtype), torch.randn(tokens, s.intermediate).to(dtype)
    weights = [(x, torch.randn(o, h).to(dtype)) for o in (a, kv, kv, s.intermediate, s.intermediate)]
    weights += [(torch.randn(tokens, a).to(dtype), torch.randn(h, a).to(dtype)), (y, torch.randn(h, s.intermediate).to(dtype))]
    for inp, w in weights:
        F.linear(inp, w)  # warm up
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for inp, w in weights:
            F.linear(inp, w)
        reps += 1
    return tokens * s.block_token * reps / (time.perf_counter() - t0) / 1e9


class ForwardMeter:
    """Times and counts every ``PackedLM.forward`` call (prefill vs decode) while installed."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.rows = {k: {"calls": 0, "tokens": 0, "pairs": 0, "logit_rows": 0, "bytes": 0, "seconds": 0.0}
                     for k in ("prefill", "decode")}

    def install(self):
        from turngym.agents import packed

        original = packed.PackedLM.forward
        meter = self

        def forward(engine, caches, new, tail=None):
            past = [len(c.ids) for c in caches]
            lens = [len(x) for x in new]
            t0 = time.perf_counter()
            out = original(engine, caches, new, tail)
            drafted = tail is not None and list(tail) == lens  # a greedy step checking drafts (agents/lookahead.py)
            row = meter.rows["decode" if max(lens) == 1 or drafted else "prefill"]
            row["seconds"] += time.perf_counter() - t0
            row["calls"] += 1
            row["tokens"] += sum(lens)
            row["pairs"] += sum(cached_pairs(p, n) for p, n in zip(past, lens))
            row["logit_rows"] += sum(min(t, n) for t, n in zip(tail or [1] * len(new), lens))
            row["bytes"] += forward_bytes(engine, past, lens, caches[0].keys[0].dtype)
            return out

        packed.PackedLM.forward = forward
        return lambda: setattr(packed.PackedLM, "forward", original)

    def summary(self) -> dict:
        out = {}
        for k, r in self.rows.items():
            flops = forward_flops(self.shape, r["tokens"], r["pairs"], r["logit_rows"])
            out[k] = {**r, "gflop": flops / 1e9, "gflops": flops / 1e9 / r["seconds"] if r["seconds"] else 0.0,
                      "gbps": r["bytes"] / 1e9 / r["seconds"] if r["seconds"] else 0.0,
                      "flop_per_byte": flops / max(1, r["bytes"])}
        return out


def forward_bytes(engine, past: list[int], lens: list[int], kv_dtype) -> int:
    """The bytes a packed forward must read at least: every weight once (a tied embedding counts
    once: the LM head reads all of it), and each row's cached plus new keys and values (kept in
    ``kv_dtype``) in every layer."""
    runner = getattr(engine, "runner", engine.model)  # older versions generate from the model itself
    weights = {p.data_ptr(): p.numel() * p.element_size() for p in runner.parameters()}
    per_token = 2 * len(engine.layers) * engine.n_kv * engine.head_dim * kv_dtype.itemsize
    return sum(weights.values()) + per_token * (sum(past) + sum(lens))


def batch_flops(shape: Shape, trajs, pad_id: int, trainable: int, epochs: int, cached: bool) -> float:
    """FLOPs of ``epochs`` update passes over ``trajs`` (one row per record segment), counting the
    frozen blocks' forward once when ``cached`` (the implementation computes it once per fit)."""
    from turngym.trainers.sequences import pack_batch

    batch = pack_batch(trajs, pad_id)
    lengths = batch.attention_mask.sum(1).tolist()
    tokens, pairs, scored = sum(lengths), causal_pairs(lengths), int(batch.score_mask.sum())
    if not cached:
        return epochs * update_flops(shape, tokens, pairs, scored, trainable)
    frozen = forward_flops(shape, tokens, pairs, 0, shape.layers - trainable)
    return frozen + epochs * update_flops(shape, tokens, pairs, scored, trainable, frozen_forward=False)


def _tokens(trajs, pad_id: int) -> int:
    from turngym.trainers.sequences import pack_batch

    return int(pack_batch(trajs, pad_id).attention_mask.sum())


def measure(args) -> dict:
    """One version's numbers (this process imports the turngym on ``PYTHONPATH``)."""
    import torch

    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    from turngym.agents.packed import native_bf16

    res: dict = {"threads": threads, "load": os.getloadavg()[0], "peak_gflops": {"fp32": matmul_peak(torch.float32)}}
    if native_bf16("cpu"):
        res["peak_gflops"]["bf16"] = matmul_peak(torch.bfloat16)
    res["sft"] = measure_sft(args)
    res.update(measure_generation_and_update(args))
    res["bandwidth_gbps"] = memory_bandwidth()
    res["block_matmul"] = block_matmul_rates(res)
    res["load_end"] = os.getloadavg()[0]
    return res


def block_matmul_rates(res: dict) -> dict:
    """The model's own matmul GFLOP/s (``block_matmul_gflops``) at the token rows of an average decode
    forward, prefill forward and clone minibatch of this run, in the dtype each of them computes in."""
    import torch

    from turngym.agents.default_model import load_default
    from turngym.agents.packed import native_bf16

    shape = Shape.of(load_default().model.config)
    dtype = torch.bfloat16 if native_bf16("cpu") else torch.float32
    g = res["generation"]
    rows = {"decode": g["decode"]["tokens"] / max(1, g["decode"]["calls"]),
            "prefill": g["prefill"]["tokens"] / max(1, g["prefill"]["calls"]),
            "update": res["update"].get("tokens_per_step", 0)}
    return {k: {"tokens": int(n), "gflops": block_matmul_gflops(shape, int(n), dtype)} for k, n in rows.items() if n >= 1}


def _quickstart():
    from turngym.train import TrainConfig

    return TrainConfig()


def _frozen_prefix_supported() -> bool:
    from turngym.trainers import sequences

    return hasattr(sequences, "frozen_prefix")


def measure_sft(args) -> dict:
    import dataclasses

    from turngym.agents.default_model import load_default
    from turngym.trainers.sft import sft

    cfg = _quickstart()
    policy = load_default()
    shape = Shape.of(policy.model.config)
    kwargs = {**cfg.env_kwargs, "split": cfg.train_split}
    demos = _demonstrations(policy, cfg, kwargs)
    sft_cfg = dataclasses.replace(cfg.sft, epochs=args.sft_epochs)
    out = sft(policy, cfg.env_id, sft_cfg, env_kwargs=kwargs, progress=False)
    k = int(sft_cfg.trainable.split(":")[1])
    flops = batch_flops(shape, demos, policy.pad_id, k, args.sft_epochs, _frozen_prefix_supported())
    s = out["sft/train_seconds"]
    return {"seconds": s, "epochs": args.sft_epochs, "gflop": flops / 1e9, "gflops": flops / 1e9 / s}


def _demonstrations(policy, cfg, kwargs) -> list:
    """The demonstrations ``sft()`` will clone (deterministic), to count their tokens; versions
    before the ``Collector`` (2026-11-26) made them with ``sft.expert_data``."""
    try:
        from turngym.rollout import Collector, EnvTarget
    except ImportError:
        from turngym.trainers.sft import expert_data

        return expert_data(policy, cfg.env_id, cfg.sft.episodes, kwargs, cfg.sft.seed)
    with Collector(policy) as c:
        d = cfg.sft.demo_choice()
        return c.demonstrations(EnvTarget(cfg.env_id, kwargs), cfg.sft.episodes, d["seed"], d["demo_seed"], pool=d["pool"])


def _clone(trainer, data) -> None:
    """Branch BC's clone update over ``data``; versions before ``BranchBCTrainer.clone`` (2026-11-26)
    ran the same update inline in ``step``: ``actor_update`` with A = 1 on valid turns."""
    if hasattr(trainer, "clone"):
        trainer.clone(data)
        return
    import torch

    from turngym.rewards.format import action_status
    from turngym.trainers import functional as Fn
    from turngym.trainers.actor import actor_update
    from turngym.trainers.sequences import pack_batch

    batch = pack_batch(data, trainer.policy.pad_id)
    adv = torch.tensor([float(action_status(data[ti].turns[k]) == "valid") for ti, k in batch.turn_refs])
    actor_update(trainer.model, trainer.actor_opt, batch, Fn.broadcast_to_tokens(adv, batch.token_turn), None,
                 trainer.cfg, trainer.gen, trainer.ctx)


def _sft_weights(args, policy) -> None:
    """Load the quickstart's SFT weights, making them first (a full SFT stage) when missing."""
    import torch

    from turngym.trainers.sft import sft

    path = Path(args.weights)
    if not path.exists():
        cfg = _quickstart()
        sft(policy, cfg.env_id, cfg.sft, env_kwargs={**cfg.env_kwargs, "split": cfg.train_split}, progress=False)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(policy.model.state_dict(), path)
    policy.model.load_state_dict(torch.load(path))
    policy.invalidate_caches()


def measure_generation_and_update(args) -> dict:
    import dataclasses

    from turngym.agents.base import SamplingParams
    from turngym.agents.default_model import load_default
    from turngym.agents.hf import HFPolicy
    from turngym.bench.evaluate import evaluate
    from turngym.trainers.branch_bc import BranchBCTrainer

    cfg = _quickstart()
    policy = load_default()
    _sft_weights(args, policy)
    shape = Shape.of(policy.model.config)
    meter = ForwardMeter(shape)
    uninstall = meter.install()
    act_s = [0.0]
    original_act = HFPolicy.act

    def act(self, convs, sampling=None):
        t0 = time.perf_counter()
        try:
            return original_act(self, convs, sampling)
        finally:
            act_s[0] += time.perf_counter() - t0

    HFPolicy.act = act
    try:
        t0 = time.perf_counter()
        res = evaluate(cfg.env_id, policy, episodes=args.games, seed=10_000, distinct=True, progress=False,
                       env_kwargs={**cfg.env_kwargs, "split": cfg.eval.split}, num_envs=cfg.eval.num_envs,
                       sampling=SamplingParams(temperature=0.0, max_new_tokens=cfg.eval.max_new_tokens, seed=0))
        wall = time.perf_counter() - t0
    finally:
        HFPolicy.act = original_act
        uninstall()
    gen = meter.summary()
    gen_flops = (gen["prefill"]["gflop"] + gen["decode"]["gflop"])
    generation = {**gen, "eval_wall_s": wall, "act_s": act_s[0], "success": res.summary["success"],
                  "sampled_tokens": policy.stats.get("sampled_tokens", 0), "drafted": policy.stats.get("drafted", 0),
                  "accepted": policy.stats.get("accepted", 0),
                  "forward_gflops": gen_flops / max(1e-9, gen["prefill"]["seconds"] + gen["decode"]["seconds"]),
                  "act_gflops": gen_flops / act_s[0]}

    bcfg = dataclasses.replace(cfg.branch, actor_epochs=args.update_epochs, expert_replay=0)
    trainer = BranchBCTrainer(policy, cfg.env_id, bcfg, env_kwargs={**cfg.env_kwargs, "split": cfg.train_split},
                              out_dir=Path(args.tmp) / "bc")
    trainer.setup()
    data = [t for t in res.trajectories if t.turns]
    t0 = time.perf_counter()
    _clone(trainer, data)
    s = time.perf_counter() - t0
    trainer.close()
    k = int(bcfg.trainable.split(":")[1])
    flops = batch_flops(shape, data, policy.pad_id, k, args.update_epochs, _frozen_prefix_supported())
    update = {"seconds": s, "epochs": args.update_epochs, "episodes": len(data), "gflop": flops / 1e9,
              "gflops": flops / 1e9 / s, "tokens_per_step": _tokens(data, policy.pad_id) * bcfg.minibatch_size / len(data)}
    out = {"generation": generation, "update": update}
    if args.profile:  # where the time goes inside: the top operators of an evaluation and of a clone pass
        out["profile"] = {
            "generation": top_ops(lambda: evaluate(cfg.env_id, policy, episodes=8, seed=10_000, distinct=True,
                                                   progress=False, env_kwargs={**cfg.env_kwargs, "split": cfg.eval.split},
                                                   num_envs=8, sampling=SamplingParams(temperature=0.0, max_new_tokens=16))),
            "update": top_ops(lambda: _clone(trainer, data[:8]))}
    return out


def top_ops(fn, n: int = 8) -> list[tuple[str, float]]:
    """``fn``'s top ``n`` torch operators by their own CPU time, as (name, share of all operator time)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in rows) or 1
    return [(e.key, e.self_cpu_time_total / total) for e in rows[:n]]


# ----- the report --------------------------------------------------------------------------------
def rows_of(r: dict) -> list[tuple[str, float, str]]:
    """(what, GFLOP/s, detail) rows of one measurement."""
    g = r["generation"]
    return [
        ("peak matmul fp32", r["peak_gflops"]["fp32"], ""),
        *([("peak matmul bf16", r["peak_gflops"]["bf16"], "")] if "bf16" in r["peak_gflops"] else []),
        ("generation: prefill (forward)", g["prefill"]["gflops"],
         f"{g['prefill']['tokens']} tokens in {g['prefill']['calls']} calls, {g['prefill']['seconds']:.1f} s"),
        ("generation: decode (forward)", g["decode"]["gflops"],
         f"{g['decode']['tokens']} tokens in {g['decode']['calls']} calls, {g['decode']['seconds']:.1f} s"),
        ("generation: prefill + decode (forwards)", g["forward_gflops"], ""),
        ("generation: whole act() calls", g["act_gflops"],
         f"act {g['act_s']:.1f} s of a {g['eval_wall_s']:.1f} s evaluation, success {g['success']:.1%}"),
        ("actor update (clone, top 8 blocks)", r["update"]["gflops"],
         f"{r['update']['episodes']} episodes x {r['update']['epochs']} epochs in {r['update']['seconds']:.1f} s"),
        ("SFT step (top 8 blocks)", r["sft"]["gflops"], f"{r['sft']['epochs']} epochs in {r['sft']['seconds']:.1f} s"),
    ]


def table(results: dict[str, dict]) -> str:
    """A markdown table: a column per version (GFLOP/s and % of that run's bf16, else fp32, peak)."""
    names = list(results)
    head = "| | " + " | ".join(f"{n}: GFLOP/s (% of peak)" for n in names) + " | detail |"
    lines = [head, "|---" * (len(names) + 2) + "|"]
    per = {n: rows_of(r) for n, r in results.items()}
    for i, (what, _, _) in enumerate(per[names[0]]):
        cells = []
        for n in names:
            r = results[n]
            peak = r["peak_gflops"].get("bf16", r["peak_gflops"]["fp32"])
            v = per[n][i][1]
            cells.append(f"{v:.0f}" if what.startswith("peak") else f"{v:.1f} ({100 * v / peak:.1f}%)")
        lines.append(f"| {what} | " + " | ".join(cells) + f" | {per[names[-1]][i][2]} |")
    loads = ", ".join(f"{n}: load {results[n]['load']:.1f}-{results[n]['load_end']:.1f}, {results[n]['threads']} thread(s)"
                      for n in names)
    return "\n".join(lines) + f"\n\n({loads})"


def ceiling_rows(r: dict) -> list[tuple[str, str, str]]:
    """(what, value, detail) rows of one measurement's two ceilings: memory and the model's matmuls."""
    peak = r["peak_gflops"].get("bf16", r["peak_gflops"]["fp32"])
    bw, g, mm = r["bandwidth_gbps"], r["generation"], r["block_matmul"]
    rows = [("memory bandwidth, read (GB/s)", f"{bw:.1f}", "a sum over 1 GiB of fp32")]
    for k in ("decode", "prefill"):
        x = g[k]
        rows += [(f"{k}: bytes read (GB/s, % of bandwidth)", f"{x['gbps']:.1f} ({100 * x['gbps'] / bw:.0f}%)",
                  "every weight once a forward, plus each row's cached keys and values"),
                 (f"{k}: memory ceiling (GFLOP/s)",
                  f"{_memory_ceiling(x['flop_per_byte'] * bw, peak)}, {x['flop_per_byte']:.0f} FLOP/byte",
                  "FLOP a byte read x the bandwidth")]
    for k, x in mm.items():
        rows.append((f"{k}: the model's matmuls at as many rows (GFLOP/s, % of peak)",
                     f"{x['gflops']:.0f} ({100 * x['gflops'] / peak:.1f}%) at {x['tokens']} rows",
                     f"one block's 7 projections (F.linear) over an average {k} {'minibatch' if k == 'update' else 'forward'}'s tokens"))
    return rows


def _memory_ceiling(gflops: float, peak: float) -> str:
    return f"{gflops:.0f} ({gflops / peak:.1f}x the peak: not memory-bound)" if gflops >= peak else \
        f"{gflops:.0f} ({100 * gflops / peak:.1f}% of peak)"


def ceiling_table(results: dict[str, dict]) -> str:
    """A markdown table of the ceilings, a column per version (runs without them are left out)."""
    names = [n for n, r in results.items() if "bandwidth_gbps" in r]
    if not names:
        return ""
    per = {n: ceiling_rows(results[n]) for n in names}
    lines = ["| ceiling | " + " | ".join(names) + " | what |", "|---" * (len(names) + 2) + "|"]
    for i, (what, _, detail) in enumerate(per[names[-1]]):
        cells = [per[n][i][1] if i < len(per[n]) and per[n][i][0] == what else "" for n in names]
        lines.append(f"| {what} | " + " | ".join(cells) + f" | {detail} |")
    return "\n".join(lines)


def child(args) -> None:
    print("ROOFLINE " + json.dumps(measure(args)), flush=True)


def run_version(tree: str, args) -> dict:
    """Measure the turngym in ``tree`` in a fresh process."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--games", str(args.games), "--weights", args.weights,
           "--sft-epochs", str(args.sft_epochs), "--update-epochs", str(args.update_epochs), "--tmp", args.tmp]
    cmd += ["--profile"] if args.profile else []
    check_imports_from(tree)
    out = subprocess.run(cmd, env=checkout_env(tree), cwd=tree, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(next(line for line in out.splitlines() if line.startswith("ROOFLINE "))[9:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--games", type=int, default=64, help="held-out games the generation phase plays")
    p.add_argument("--sft-epochs", type=int, default=2)
    p.add_argument("--update-epochs", type=int, default=2)
    p.add_argument("--weights", default=str(Path.home() / ".cache" / "turngym" / "roofline_sft.pt"))
    p.add_argument("--compare", default=None, help="a checkout of the version to compare against (measured first)")
    p.add_argument("--rounds", type=int, default=1, help="with --compare: A B rounds")
    p.add_argument("--tmp", default="/tmp/turngym-roofline")
    p.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True,
                   help="also the top operators of generation and the update")
    p.add_argument("--docs", default=None, help="also write the table into this markdown file (between markers)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    versions = {"before": args.compare, "after": str(HERE)} if args.compare else {"this": str(HERE)}
    runs: dict[str, list[dict]] = {n: [] for n in versions}
    for _ in range(args.rounds):
        for name, tree in versions.items():  # interleaved: A B A B
            runs[name].append(run_version(tree, args))
            print(name, json.dumps(runs[name][-1]), flush=True)
    # each version's best round: the machine is shared, and other jobs only ever slow a round down
    best = {n: max(rs, key=lambda r: r["generation"]["forward_gflops"]) for n, rs in runs.items()}
    text = table(best)
    ceilings = ceiling_table(best)
    text += f"\n\n{ceilings}" if ceilings else ""
    for name, r in best.items():
        for part, ops in r.get("profile", {}).items():
            text += f"\n\n{name}, {part}: " + ", ".join(f"{k} {share:.0%}" for k, share in ops)
    print(text)
    if args.docs:
        write_section(Path(args.docs), text)


def write_section(path: Path, text: str) -> None:
    """Replace the text between ``<!-- roofline -->`` and ``<!-- /roofline -->`` in ``path``."""
    doc = path.read_text()
    start, end = "<!-- roofline -->", "<!-- /roofline -->"
    if start in doc and end in doc:
        doc = doc[: doc.index(start) + len(start)] + "\n" + text + "\n" + doc[doc.index(end):]
    else:
        doc += f"\n{start}\n{text}\n{end}\n"
    path.write_text(doc)


if __name__ == "__main__":
    main()
