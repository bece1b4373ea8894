"""Update throughput: turngym's policy-gradient step against TRL's GRPOTrainer, in one run.

Both run the same loss family (PPO-clipped token-level surrogate, no KL) on the same model and the
same tokens; we time forward + backward + optimizer step and report policy tokens per second.

Two batches:
  single-turn  identical (prompt, completion) pairs for both: measures the step itself.
  multi-turn   E episodes of K turns. TRL trains (prompt, completion) pairs, so each turn is one
               sample that re-reads the whole history; turngym packs an episode into ONE sequence
               (turn k's prompt is a prefix of turn k+1's) and scores every turn's tokens in one pass.

Run:  python benchmarks/trainer_throughput.py [--model tiny|default] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def build_model(kind: str, tokenizer):
    if kind == "default":
        from turngym.agents.default_model import load_default_model

        return load_default_model()[0]  # (model, tokenizer)
    from fixtures_model import build_tiny_model

    return build_tiny_model(tokenizer)


def make_episodes(n_episodes: int, turns: int, prompt_len: int, obs_len: int, act_len: int, vocab: int, seed: int = 0):
    """Token-level episodes: (full ids, [(start, end) of each action]) with prefix-consistent turns."""
    g = torch.Generator().manual_seed(seed)
    eps = []
    for _ in range(n_episodes):
        ids = torch.randint(100, vocab, (prompt_len,), generator=g).tolist()
        spans = []
        for k in range(turns):
            if k:
                ids += torch.randint(100, vocab, (obs_len,), generator=g).tolist()
            start = len(ids)
            ids += torch.randint(100, vocab, (act_len,), generator=g).tolist()
            spans.append((start, len(ids)))
        eps.append((ids, spans))
    return eps


def ours_batch(episodes, pad_id):
    from turngym.trainers.sequences import pack_batch
    from turngym.types import TokenRecord, Trajectory, Turn

    trajs = []
    for ids, spans in episodes:
        rec = TokenRecord()
        turns = [Turn("x", span=rec.add_turn(ids[:s], ids[s:e], [-1.0] * (e - s))) for s, e in spans]
        trajs.append(Trajectory("t", turns, record=rec))
    return pack_batch(trajs, pad_id)


def trl_samples(episodes):
    """Every turn as its own (prompt, completion) pair, left-padded prompts as TRL expects."""
    return [(ids[:s], ids[s:e]) for ids, spans in episodes for s, e in spans]


def trl_inputs(samples, pad_id):
    P = max(len(p) for p, _ in samples)
    C = max(len(c) for _, c in samples)
    B = len(samples)
    prompt_ids = torch.full((B, P), pad_id)
    prompt_mask = torch.zeros((B, P), dtype=torch.long)
    comp_ids = torch.full((B, C), pad_id)
    comp_mask = torch.zeros((B, C), dtype=torch.long)
    for i, (p, c) in enumerate(samples):
        prompt_ids[i, P - len(p):] = torch.tensor(p)
        prompt_mask[i, P - len(p):] = 1
        comp_ids[i, : len(c)] = torch.tensor(c)
        comp_mask[i, : len(c)] = 1
    return {
        "prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": comp_ids,
        "completion_mask": comp_mask, "advantages": torch.linspace(-1, 1, B),
        "old_per_token_logps": torch.full((B, C), -1.0), "num_items_in_batch": comp_mask.sum(),
    }


def make_trl_trainer(model, tokenizer, batch_size: int, out: str):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir=out, per_device_train_batch_size=batch_size, num_generations=2,
                      max_completion_length=64, beta=0.0, report_to="none", use_cpu=True, logging_steps=1,
                      learning_rate=1e-5, loss_type="bnpo", bf16=False,
                      gradient_checkpointing=False)  # TRL defaults it on; off matches our step
    ds = Dataset.from_dict({"prompt": ["hi"] * 8})
    trainer = GRPOTrainer(model=model, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                          args=args, train_dataset=ds, processing_class=tokenizer)
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1  # normally set inside Trainer's train loop
    return trainer


def time_trl(trainer, inputs) -> float:
    model = trainer.model
    model.train()
    t0 = time.perf_counter()
    loss = trainer.compute_loss(model, inputs)  # GRPOTrainer's _compute_loss: logps, clipped surrogate
    trainer.accelerator.backward(loss)
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def time_ours(model, opt, batch) -> float:
    from turngym.trainers.actor import actor_update
    from turngym.trainers.trainer import OnlineConfig

    # fp32 like TRL's run (bf16=False): the ratio compares the update code, not the precision
    cfg = OnlineConfig(minibatch_size=batch.input_ids.shape[0], clip_coef=0.2, kl_coef=0.0, autocast="none")
    adv = torch.linspace(-1, 1, len(batch.turn_refs))[batch.token_turn]
    t0 = time.perf_counter()
    actor_update(model, opt, batch, adv, None, cfg, torch.Generator().manual_seed(0))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny", choices=["tiny", "default"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--episodes", type=int, default=4)
    ap.add_argument("--turns", type=int, default=5)
    args = ap.parse_args()
    from turngym.agents.default_model import load_default_tokenizer

    tok = load_default_tokenizer()
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ours_model = build_model(args.model, tok)
    trl_model = build_model(args.model, tok)
    trl_model.load_state_dict(ours_model.state_dict())
    ours_opt = torch.optim.AdamW([p for p in ours_model.parameters() if p.requires_grad], lr=1e-5)
    with tempfile.TemporaryDirectory() as out:
        trl = make_trl_trainer(trl_model, tok, batch_size=2, out=out)
        cases = {
            "single-turn": make_episodes(args.episodes * args.turns, 1, 200, 0, 24, len(tok)),
            "multi-turn": make_episodes(args.episodes, args.turns, 120, 60, 24, len(tok)),
        }
        print(f"model={args.model}  params={sum(p.numel() for p in ours_model.parameters()) / 1e6:.1f}M  "
              f"threads={torch.get_num_threads()}")
        print(f"{'batch':12s} {'policy tokens':>13s} {'turngym s':>10s} {'TRL s':>8s} {'turngym tok/s':>14s} "
              f"{'TRL tok/s':>10s} {'ratio':>6s}")
        for name, eps in cases.items():
            batch = ours_batch(eps, pad)
            inputs = trl_inputs(trl_samples(eps), pad)
            n_tok = batch.num_tokens
            assert n_tok == int(inputs["completion_mask"].sum())
            time_ours(ours_model, ours_opt, batch)  # warm-up both
            time_trl(trl, inputs)
            ours_t, trl_t = [], []
            for _ in range(args.repeats):  # interleaved, so drift in machine load hits both
                ours_t.append(time_ours(ours_model, ours_opt, batch))
                trl_t.append(time_trl(trl, inputs))
            o, t = statistics.median(ours_t), statistics.median(trl_t)
            print(f"{name:12s} {n_tok:13d} {o:10.3f} {t:8.3f} {n_tok / o:14.0f} {n_tok / t:10.0f} {t / o:6.2f}x")


if __name__ == "__main__":
    main()
