"""Data-parallel helpers: 2 CPU processes over gloo must take exactly the step one process takes on
the union of their data; metrics, shards and trajectory gathering are checked on the same run."""

from __future__ import annotations

import pytest
import torch
from distributed_ranks import spawn_ranks

from turngym.rollout import EpisodeSpec
from turngym.trainers.distributed import DistContext, _buckets
from turngym.types import Trajectory

WORLD = 2


class _Net(torch.nn.Module):
    """A tiny MLP; ``extra`` only sees flagged rows (rank 0 has some, rank 1 none); ``never`` is unused."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        self.extra = torch.nn.Linear(4, 1)
        self.never = torch.nn.Linear(4, 1)

    def loss(self, x: torch.Tensor, y: torch.Tensor, flag: torch.Tensor) -> torch.Tensor:
        pred = self.body(x).squeeze(-1)
        if flag.any():
            pred = pred + flag * self.extra(x).squeeze(-1)
        return ((pred - y) ** 2).mean()


def _data():
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 4, generator=g), torch.randn(8, generator=g)
    flag = torch.tensor([1.0, 0, 1, 0, 0, 0, 0, 0])  # flagged rows fall in rank 0's half only
    return x, y, flag


def _step(model: _Net, x, y, flag, ctx: DistContext | None = None) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    opt.zero_grad(set_to_none=True)
    model.loss(x, y, flag).backward()
    if ctx is not None:
        ctx.all_reduce_grads(model.parameters(), bucket_mb=1e-4)  # tiny buckets: exercise the splitting
    torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
    opt.step()


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    ctx = DistContext.init(rank, WORLD, f"file://{init_file}", backend="gloo")
    try:
        torch.manual_seed(100 + rank)  # different inits per rank: broadcast_params must align them
        model = _Net()
        ctx.broadcast_params(model)
        x, y, flag = _data()
        rows = ctx.shard(list(range(8)))
        _step(model, x[rows], y[rows], flag[rows], ctx)
        specs = [EpisodeSpec(str(i // 2), i // 2) for i in range(12)]  # 6 groups of 2
        mine = ctx.shard(specs, group_size=2)
        trajs = [Trajectory(s.task_id, metadata={"seed": s.seed, "rank": rank}) for s in mine]
        metrics = {"a": 0.5 + rank, "n": 3.0 * (rank + 1), **({"only0": 7.0} if rank == 0 else {})}
        torch.save({
            "state": model.state_dict(), "never_grad": model.never.weight.grad, "rows": rows, "mine": mine,
            "metrics": ctx.all_reduce_metrics(metrics, weight=1.0 + rank, sum_keys=("n",)),
            "gathered": ctx.gather_trajectories(trajs), "gathered_all": ctx.gather_trajectories(trajs, all_ranks=True),
            "any": (ctx.any_rank(rank == 1), ctx.any_rank(False)),
        }, f"{out_dir}/rank{rank}.pt")
        ctx.barrier()
    finally:
        ctx.close()


def test_two_gloo_ranks_match_one_process_on_the_union(tmp_path):
    out = spawn_ranks(_worker, tmp_path, world=WORLD)
    r0, r1 = (torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD))
    torch.manual_seed(100)  # rank 0's init, which broadcast_params gave both ranks
    single = _Net()
    _step(single, *_data())
    for k, v in single.state_dict().items():
        assert torch.equal(r0["state"][k], r1["state"][k]), k  # ranks agree bit for bit
        torch.testing.assert_close(r0["state"][k], v, atol=1e-6, rtol=0)  # and equal the union step
    assert r0["never_grad"] is None and r1["never_grad"] is None  # no rank produced one: still None
    # shards: disjoint, contiguous, complete, groups kept whole
    assert r0["rows"] + r1["rows"] == list(range(8))
    assert [s.seed for s in r0["mine"]] == [0, 0, 1, 1, 2, 2] and [s.seed for s in r1["mine"]] == [3, 3, 4, 4, 5, 5]
    # metrics: weighted means (weights 1 and 2), sums for sum_keys, keys from any rank
    want = {"a": (0.5 * 1 + 1.5 * 2) / 3, "n": 3.0 + 6.0, "only0": 7.0}
    assert r0["metrics"] == want and r1["metrics"] == want
    # trajectories: rank 0 gets the union in spec order; with all_ranks, everyone does
    assert [t.metadata["seed"] for t in r0["gathered"]] == [i // 2 for i in range(12)]
    assert [t.metadata["rank"] for t in r0["gathered"]] == [0] * 6 + [1] * 6
    assert r1["gathered"] == [] and len(r1["gathered_all"]) == 12
    assert r0["any"] == (True, False) and r1["any"] == (True, False)


def test_single_process_context_is_a_no_op(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ctx = DistContext.from_env()
    assert (ctx.rank, ctx.world_size, ctx.is_main, ctx.enabled) == (0, 1, True, False)
    specs = list(range(5))
    assert ctx.shard(specs) == specs
    m = torch.nn.Linear(2, 1)
    m(torch.ones(1, 2)).sum().backward()
    before = m.weight.grad.clone()
    ctx.all_reduce_grads(m.parameters())
    ctx.broadcast_params(m)
    ctx.barrier()
    assert torch.equal(m.weight.grad, before)
    assert ctx.all_reduce_metrics({"x": 1.5}) == {"x": 1.5} and ctx.gather_trajectories([1, 2]) == [1, 2]
    assert ctx.any_rank(True) and not ctx.any_rank(False)
    assert ctx.rank_seed(5) == 5 and ctx.rank_seed(None) is None


def test_shard_covers_every_spec_once_and_checks_evenness():
    specs = list(range(24))
    for world in (1, 2, 3, 4):
        parts = [DistContext(rank=r, world_size=world).shard(specs, group_size=2) for r in range(world)]
        assert sum(parts, []) == specs
        assert len({len(p) for p in parts}) == 1
        ranges = [DistContext(rank=r, world_size=world).shard_range(24, group_size=2) for r in range(world)]
        assert [specs[i] for r in ranges for i in r] == specs
    uneven = [DistContext(rank=r, world_size=3).shard(list(range(10)), strict=False) for r in range(3)]
    assert sum(uneven, []) == list(range(10)) and [len(p) for p in uneven] == [4, 3, 3]
    with pytest.raises(ValueError, match="do not split evenly over 3 ranks"):
        DistContext(rank=0, world_size=3).shard(list(range(10)))
    with pytest.raises(ValueError, match="groups of 4"):
        DistContext(rank=0, world_size=3).shard(list(range(6)), group_size=4)
    assert DistContext(rank=1, world_size=2).rank_seed(5) != DistContext(rank=0, world_size=2).rank_seed(5)


def test_buckets_split_by_size_and_dtype():
    ts = [torch.zeros(4), torch.zeros(4), torch.zeros(4, dtype=torch.float64), torch.zeros(100)]
    sizes = [[t.numel() for t in b] for b in _buckets(ts, cap_bytes=40)]
    assert sizes == [[4, 4], [4], [100]]  # 16+16 fit, a new dtype starts a bucket, an oversize tensor stands alone
