"""The trainers under data parallelism: 2 CPU ranks over gloo play disjoint shards of each
iteration, average gradients, and must end every iteration with identical actor (and critic)
weights that differ from the start; rank 0 alone writes logs and checkpoints."""

from __future__ import annotations

import json

import pytest
import torch
from distributed_ranks import spawn_ranks

WORLD = 2
ENV = "tests/Guess-v0"


class _LengthReward:
    """A per-turn reward that varies between a random model's samples (the toy env's own reward
    is 0 for all of them, which would leave GRPO nothing to learn from)."""

    def __call__(self, trajectories):
        return [[(sum(t.action_ids(k)) % 7) / 10 for k in range(len(t.turns))] for t in trajectories]


def _worker(rank: int, init_file: str, out_dir: str, algo: str) -> None:
    import toy_envs  # noqa: F401  (registers tests/Guess-v0 in the spawned process)
    from fixtures_model import build_tiny_model
    from turngym.agents.default_model import load_default_tokenizer
    from turngym.agents.hf import HFPolicy
    from turngym.trainers.archer import ArcherConfig, ArcherTrainer
    from turngym.trainers.distributed import DistContext
    from turngym.rewards import register_reward
    from turngym.trainers.pg import PGConfig, PGTrainer

    register_reward("test_length", _LengthReward)

    ctx = DistContext.init(rank, WORLD, f"file://{init_file}", backend="gloo")
    try:
        torch.set_num_threads(1)
        tok = load_default_tokenizer()
        policy = HFPolicy(build_tiny_model(tok, seed=rank), tok)  # different inits: setup must align them
        start = {k: v.clone() for k, v in build_tiny_model(tok, seed=0).state_dict().items()}
        common = dict(iterations=2, episodes_per_iter=8, num_envs=4, max_new_tokens=8, minibatch_size=3,
                      actor_lr=1e-2, checkpoint_every=1, autocast="none")
        if algo == "archer":
            trainer = ArcherTrainer(policy, ENV, ArcherConfig(**{k: v for k, v in common.items() if k != "minibatch_size"},
                                                                  critic_epochs=3, critic_states=4, actor_states=3,
                                                                  warmup_iters=0, critic_encoder="reference"),
                                    out_dir=f"{out_dir}/run", ctx=ctx)
        else:
            trainer = PGTrainer(policy, ENV, PGConfig(**common, algo="grpo", group_size=2, reward=["env", "test_length"]), out_dir=f"{out_dir}/run", ctx=ctx)
        rows = trainer.train(progress=False)
        state = {"model": trainer.model.state_dict(), "start": start, "rows": rows}
        if algo == "archer":
            state["critic"] = trainer.critic.state_dict()
        torch.save(state, f"{out_dir}/rank{rank}.pt")
        ctx.barrier()
    finally:
        ctx.close()


@pytest.mark.parametrize("algo", ["grpo", "archer"])
def test_two_ranks_train_in_lockstep(tmp_path, algo, tiny_tokenizer):
    out = spawn_ranks(_worker, tmp_path, algo, world=WORLD)
    r0, r1 = (torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD))
    changed = 0
    for k, v in r0["model"].items():
        torch.testing.assert_close(v, r1["model"][k], rtol=0, atol=0, msg=f"ranks disagree on {k}")
        changed += int(not torch.equal(v, r0["start"][k]))
    assert changed > 0, "training did not move the weights"
    if algo == "archer":
        for k, v in r0["critic"].items():
            torch.testing.assert_close(v, r1["critic"][k], rtol=0, atol=0)
    # metrics are combined over ranks: both see the same numbers, and env steps count both shards
    assert [r["env_steps"] for r in r0["rows"]] == [r["env_steps"] for r in r1["rows"]]
    assert r0["rows"][0]["rollout/success"] == r1["rows"][0]["rollout/success"]
    logged = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in logged] == [1, 2]  # one writer: no duplicated rows
    assert (out / "run" / "checkpoint").exists()
