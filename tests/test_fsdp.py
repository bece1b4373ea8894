"""FSDP2 sharding of the actor (``sharding: fsdp``): an actor update over 2 gloo CPU ranks, each
holding half of the sequences and half of every parameter, must give the parameters one process
gets from the same update on the full batch. The same run checks the full state dicts behind
checkpoints and generation on the sharded model with unequal work per rank; a second test runs the
GRPO trainer sharded, resumes it from its checkpoint, writes the final HF folder and plays on rank 0."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from distributed_ranks import spawn_ranks

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="needs torch.distributed with gloo")

WORLD = 2
B, T, VOCAB = 4, 12, 96
SETUPS = {"all": dict(tie_word_embeddings=True), "top:1": dict(tie_word_embeddings=False)}


def _model(tie_word_embeddings: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=tie_word_embeddings, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():  # larger weights than the default init, so gradients are not tiny
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    return model


def _batch():
    """``B`` sequences with 6 scored tokens each (equal counts: the mean of the ranks' mean losses
    is then the full batch's mean loss), old log-probs near the model's, and token advantages."""
    from turngym.trainers.sequences import PackedBatch

    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, VOCAB, (B, T), generator=g)
    score_mask = torch.zeros(B, T, dtype=torch.bool)
    score_mask[:, 4:10] = True
    targets = torch.zeros_like(ids)
    targets[:, :-1] = ids[:, 1:]
    M = int(score_mask.sum())
    batch = PackedBatch(
        input_ids=ids, attention_mask=torch.ones_like(ids), score_mask=score_mask, targets=targets,
        old_logprobs=torch.zeros(M), token_turn=torch.arange(B).repeat_interleave(6),
        state_pos=torch.tensor([[r, 3] for r in range(B)]), action_pos=torch.tensor([[r, 9] for r in range(B)]),
        turn_refs=[(r, 0) for r in range(B)],
    )
    return batch, torch.randn(M, generator=g), torch.randn(M, generator=g) * 0.1


def _cfg(trainable: str, minibatch_size: int):
    return SimpleNamespace(actor_epochs=2, minibatch_size=minibatch_size, max_grad_norm=0.5, clip_coef=0.2,
                           kl_coef=0.0, ent_coef=0.01, actor_lr=0.5, actor_warmup_steps=0, autocast="none",
                           trainable=trainable, old_logprobs="sampled", micro_batch_size=0)


def _update(model, batch, adv, cfg, ctx=None):
    """Two epochs, each one minibatch of this process's whole share (the same steps whatever the
    shuffle), with SGD so the step is proportional to the (clipped) averaged gradient."""
    from turngym.trainers.actor import actor_update
    from turngym.trainers.sequences import score

    with torch.no_grad():
        model.eval()
        batch.old_logprobs = score(model, batch).logprobs + adv[1]  # near-on-policy: some ratios clip
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=cfg.actor_lr)
    return actor_update(model, opt, batch, adv[0], None, cfg, torch.Generator().manual_seed(0), ctx)


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    from turngym.trainers.actor import prepare_trainable, shard_model
    from turngym.trainers.distributed import DistContext, full_params, load_model_state_dict, model_state_dict

    torch.set_num_threads(1)
    ctx = DistContext.init(rank, WORLD, f"file://{init_file}", backend="gloo")
    try:
        out = {}
        full, tok_adv, noise = _batch()
        rows = list(ctx.shard_range(B))
        mine, keep = full.select_rows(rows)
        for trainable, kw in SETUPS.items():
            model = shard_model(prepare_trainable(_model(**kw), trainable), ctx)
            metrics = _update(model, mine, (tok_adv[keep], noise[keep]), _cfg(trainable, len(rows)), ctx)
            state = model_state_dict(model)  # collective: rank 0 gets the full tensors
            # resume: a fresh sharded model loads the full state dict and holds the same weights
            again = shard_model(prepare_trainable(_model(**kw), trainable), ctx)
            load_model_state_dict(again, _bcast(state))
            reloaded = model_state_dict(again)
            # generation: unequal work per rank (rank 0 two calls, rank 1 one) inside full_params
            prompts = full.input_ids[:1, :5] if rank else full.input_ids[:2, :5]
            with torch.no_grad(), full_params(model):
                gens = [model.generate(p[None], max_new_tokens=4 + 2 * i, do_sample=False, pad_token_id=0,
                                          synced_gpus=False)  # HF would sync the ranks of an FSDP model
                        for i, p in enumerate(prompts)]
            out[trainable] = {"state": state, "reloaded": reloaded, "grad_norm": metrics["actor/grad_norm"],
                              "gens": [g.tolist() for g in gens]}
        torch.save(out, f"{out_dir}/rank{rank}.pt")
        ctx.barrier()
    finally:
        ctx.close()


def _bcast(state: dict) -> dict:
    """Rank 0's full state dict on every rank (as every rank reads the checkpoint file)."""
    box = [state]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def test_fsdp_actor_update_over_two_ranks_matches_one_process(tmp_path):
    from turngym.trainers.actor import prepare_trainable

    out = spawn_ranks(_worker, tmp_path, world=WORLD)
    r0, r1 = (torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD))
    full, tok_adv, noise = _batch()
    for trainable, kw in SETUPS.items():
        single = prepare_trainable(_model(**kw), trainable)
        start = {k: v.clone() for k, v in single.state_dict().items()}
        metrics = _update(single, full, (tok_adv, noise), _cfg(trainable, B))
        want = single.state_dict()
        got = r0[trainable]["state"]
        assert set(got) == set(want), f"{trainable}: full state dict keys differ from the unsharded model's"
        assert r1[trainable]["state"] == {}  # cpu_offload: rank 0 alone holds the gathered tensors
        moved = 0
        for k, v in want.items():
            torch.testing.assert_close(got[k], v, rtol=0, atol=1e-5, msg=f"{trainable}: {k}")
            torch.testing.assert_close(r0[trainable]["reloaded"][k], got[k], rtol=0, atol=0)
            moved += int(not torch.equal(v, start[k]))
        assert moved > 0
        if trainable.startswith("top:"):  # frozen blocks stayed put under sharding too
            torch.testing.assert_close(got["model.layers.0.mlp.up_proj.weight"], start["model.layers.0.mlp.up_proj.weight"])
        assert r0[trainable]["grad_norm"] == pytest.approx(metrics["actor/grad_norm"], rel=1e-5)
        # generation on the sharded model equals generation on the same weights unsharded
        with torch.no_grad():
            for rank_out, n in ((r0, 2), (r1, 1)):
                for i in range(n):
                    ref = single.generate(full.input_ids[i : i + 1, :5], max_new_tokens=4 + 2 * i, do_sample=False, pad_token_id=0)
                    assert rank_out[trainable]["gens"][i] == ref.tolist()


def _trainer_worker(rank: int, init_file: str, out_dir: str) -> None:
    import toy_envs  # noqa: F401  (registers tests/Guess-v0 in the spawned process)
    from fixtures_model import build_tiny_model
    from transformers import AutoModelForCausalLM

    from turngym.agents.default_model import load_default_tokenizer
    from turngym.agents.hf import HFPolicy
    from turngym.rollout import episode_specs, make_env_factory, rollout
    from turngym.train import save_final_model
    from turngym.trainers.distributed import DistContext, full_params, model_state_dict
    from turngym.trainers.pg import PGConfig, PGTrainer

    torch.set_num_threads(1)
    ctx = DistContext.init(rank, WORLD, f"file://{init_file}", backend="gloo")
    try:
        tok = load_default_tokenizer()
        common = dict(episodes_per_iter=4, num_envs=2, max_new_tokens=6, minibatch_size=2, actor_lr=1e-2,
                      autocast="none", algo="grpo", group_size=2, sharding="fsdp", trainable="top:1")
        run = PGTrainer(HFPolicy(build_tiny_model(tok, seed=rank), tok), "tests/Guess-v0", PGConfig(iterations=1, **common),
                        out_dir=f"{out_dir}/run", ctx=ctx)
        run.train(progress=False)
        # a new process resumes the sharded run from its full-state checkpoint and continues
        policy = HFPolicy(build_tiny_model(tok, seed=5), tok)
        again = PGTrainer(policy, "tests/Guess-v0", PGConfig(iterations=2, **common), out_dir=f"{out_dir}/run", ctx=ctx)
        resumed_rows = again.train(progress=False)
        full = model_state_dict(policy.model)
        if ctx.is_main:
            save_final_model(policy, Path(out_dir) / "final_model", full)
        with full_params(policy.model):  # rank 0 plays alone, as the held-out evaluation does
            if ctx.is_main:
                specs = episode_specs(["1"], episodes=2)
                trajs = rollout(policy, make_env_factory("tests/Guess-v0"), specs, num_envs=2, progress=False)
                saved = AutoModelForCausalLM.from_pretrained(f"{out_dir}/final_model").state_dict()
                torch.save({"full": full, "saved": saved, "turns": sum(len(t.turns) for t in trajs),
                            "iteration": again.iteration, "rows": len(resumed_rows)}, f"{out_dir}/trainer.pt")
            ctx.barrier()
    finally:
        ctx.close()


def test_fsdp_trainer_checkpoints_resume_and_final_model(tmp_path, tiny_tokenizer):
    out = torch.load(spawn_ranks(_trainer_worker, tmp_path, world=WORLD) / "trainer.pt", weights_only=False)
    assert out["iteration"] == 2 and out["rows"] == 1, "the second trainer did not resume at iteration 1"
    assert out["turns"] > 0
    for k, v in out["full"].items():  # the HF folder holds the gathered weights, in bf16
        torch.testing.assert_close(out["saved"][k], v.to(torch.bfloat16), rtol=0, atol=0)
