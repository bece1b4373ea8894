"""Multi-process data-parallel training with ``torch.distributed`` (under ``torchrun`` or
``accelerate launch``; gloo on CPU, nccl on GPU).

Every rank holds a full copy of the policy, plays its own shard of an iteration's episodes, and
averages gradients with the others after ``backward`` and before clipping, so every rank takes the
same optimizer step. Outside a distributed launch, ``DistContext.from_env()`` is a single-process
context whose methods are no-ops, so a trainer calls them unconditionally.

Why not ``DistributedDataParallel``: DDP reduces gradients from hooks armed by the wrapped
module's ``forward``. Our scorer (``trainers.sequences.score``) calls the model's backbone and
``lm_head`` submodules directly, never the top-level ``forward``, so DDP's hooks would not fire.
The reduction is therefore explicit (``all_reduce_grads``), in buckets like DDP's.

Ranks run in lockstep: every collective here must be called by every rank, the same number of
times. An iteration must give every rank the same number of optimizer steps (``shard`` is strict
about equal shares for that reason), and a decision such as "skip the update, no signal" must be
taken jointly (``any_rank``).
"""

from __future__ import annotations

import datetime
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.tensor import DTensor


@dataclass(frozen=True)
class DistContext:
    """Where this process sits in a data-parallel job.

    Attributes:
        rank: This process's global rank (0 is the main process).
        world_size: Processes in the job (1: not distributed).
        local_rank: Rank on this machine (picks the GPU).
        device: Where this rank's model lives (``cuda:<local_rank>`` under nccl, else CPU).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    # ----- construction ----------------------------------------------------------------------
    @classmethod
    def from_env(cls, backend: str | None = None, timeout_s: float = 1800.0) -> DistContext:
        """The context a launcher set up through ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_*``
        (torchrun and ``accelerate launch`` both set them); initialises the process group if needed.

        Args:
            backend: ``"nccl"`` or ``"gloo"``; default nccl when CUDA is available, else gloo.
            timeout_s: How long a collective waits for the other ranks before failing.

        Returns:
            A single-process context (world size 1, no process group) when not launched distributed.
        """
        world = int(os.environ.get("WORLD_SIZE", "1"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        device = cls._device(backend, local)
        if world > 1 and not dist.is_initialized():
            dist.init_process_group(backend, init_method="env://", timeout=datetime.timedelta(seconds=timeout_s))
        if dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size(), local, device)
        return cls(0, 1, 0, device)

    @classmethod
    def init(cls, rank: int, world_size: int, init_method: str, backend: str = "gloo",
             local_rank: int | None = None, timeout_s: float = 1800.0) -> DistContext:
        """Join a process group explicitly (tests, custom launchers).

        Args:
            rank: This process's rank.
            world_size: Processes in the job.
            init_method: ``"file:///tmp/x"`` or ``"tcp://host:port"``, as for ``init_process_group``.
            backend: ``"gloo"`` (CPU) or ``"nccl"`` (GPU).
            local_rank: GPU index on this machine (default: ``rank``).
            timeout_s: Collective timeout.
        """
        local = rank if local_rank is None else local_rank
        device = cls._device(backend, local)
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        return cls(rank, world_size, local, device)

    @staticmethod
    def _device(backend: str, local_rank: int) -> torch.device:
        if backend == "nccl":
            torch.cuda.set_device(local_rank)  # object collectives under nccl use the current device
            return torch.device("cuda", local_rank)
        return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")

    def close(self) -> None:
        """Leave the process group (no-op when not distributed)."""
        if dist.is_initialized():
            dist.destroy_process_group()

    # ----- who does what ---------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        """True in a multi-process job."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """True on rank 0: the one that logs, checkpoints and writes reports."""
        return self.rank == 0

    def shard(self, specs: Sequence, group_size: int = 1, strict: bool = True) -> list:
        """This rank's contiguous share of an iteration's episodes (the same on every call).

        Shares are contiguous runs of whole groups (``group_size`` consecutive specs that a group
        method compares), so concatenating them in rank order gives back ``specs``.

        Args:
            specs: The iteration's full, identical-on-every-rank list of episode specs.
            group_size: Keep runs of this many specs together on one rank.
            strict: Require equal shares. Unequal shares give ranks different numbers of optimizer
                steps, which deadlocks the gradient all-reduce.

        Raises:
            ValueError: ``len(specs)`` is not a multiple of ``group_size`` (or, when strict, of
                ``group_size * world_size``).
        """
        r = self.shard_range(len(specs), group_size, strict)
        return list(specs[r.start : r.stop])

    def shard_range(self, n: int, group_size: int = 1, strict: bool = True) -> range:
        """The indices of this rank's share of ``n`` items (what ``shard`` returns), e.g. to pick this
        rank's rows out of results computed on every rank's gathered data.

        Raises:
            ValueError: as ``shard``.
        """
        if n % group_size:
            raise ValueError(f"{n} specs do not split into groups of {group_size}")
        if strict and n % (group_size * self.world_size):
            raise ValueError(f"{n} episodes (groups of {group_size}) do not split evenly over "
                             f"{self.world_size} ranks; use a multiple of {group_size * self.world_size}")
        k, extra = divmod(n // group_size, self.world_size)
        start = (self.rank * k + min(self.rank, extra)) * group_size
        return range(start, start + (k + (self.rank < extra)) * group_size)

    def rank_seed(self, seed: int | None) -> int | None:
        """A per-rank sampling seed, so two ranks that play the same prompt do not sample alike."""
        return None if seed is None else seed + self.rank * 1_000_000_007

    # ----- collectives -----------------------------------------------------------------------
    def barrier(self) -> None:
        """Wait for every rank."""
        if self.enabled:
            dist.barrier()

    def broadcast_params(self, module: torch.nn.Module, src: int = 0) -> None:
        """Copy ``src``'s parameters and buffers into every rank's ``module`` (once, at start)."""
        if not self.enabled:
            return
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, src)

    def all_reduce_grads(self, params: Iterable[torch.nn.Parameter], bucket_mb: float = 64.0) -> None:
        """Average gradients over ranks, in place; call between ``backward`` and ``clip_grad_norm_``.
        Parameters sharded by FSDP (DTensors) are skipped: their backward already averaged them.

        A parameter whose grad is None on some ranks but not others counts as zero there; one that
        no rank produced a grad for stays None (so the optimizer skips it, as in one process).

        Args:
            params: The trainable parameters, in the same order on every rank.
            bucket_mb: Size of the flat buffers reduced in one call.
        """
        if not self.enabled:
            return
        params = [p for p in params if p.requires_grad and not isinstance(p, DTensor)]  # FSDP reduced those
        if not params:
            return
        has = torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=self.device)
        dist.all_reduce(has, op=dist.ReduceOp.MAX)
        grads = []
        for p, h in zip(params, has.tolist()):
            if h and p.grad is None:
                p.grad = torch.zeros_like(p)
            if h:
                grads.append(p.grad)
        for bucket in _buckets(grads, int(bucket_mb * 2**20)):
            flat = _flatten_dense_tensors(bucket)
            dist.all_reduce(flat)  # SUM, then / world: the mean of the ranks' gradients
            flat.div_(self.world_size)
            for g, synced in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
                g.copy_(synced)

    def all_reduce_metrics(self, metrics: dict[str, float], weight: float = 1.0,
                           sum_keys: Sequence[str] = ()) -> dict[str, float]:
        """Combine every rank's metrics: a weighted mean per key, or a sum for ``sum_keys``.

        Args:
            metrics: This rank's scalar metrics (keys may differ between ranks; a key is combined
                over the ranks that report it).
            weight: This rank's weight in the means, e.g. its number of episodes, so that the
                result is the mean over the union of the data.
            sum_keys: Keys to add up instead (counts such as ``rollout/env_steps``).

        Returns:
            The combined metrics, identical on every rank.
        """
        if not self.enabled:
            return dict(metrics)
        rows: list[Any] = [None] * self.world_size
        dist.all_gather_object(rows, ({k: float(v) for k, v in metrics.items()}, float(weight)))
        keys = sorted({k for m, _ in rows for k in m})
        out = {}
        for k in keys:
            have = [(m[k], w) for m, w in rows if k in m]
            if k in sum_keys:
                out[k] = sum(v for v, _ in have)
            else:
                total = sum(w for _, w in have)
                out[k] = sum(v * w for v, w in have) / total if total else 0.0
        return out

    def any_rank(self, flag: bool) -> bool:
        """True if ``flag`` is true on any rank (a joint decision, e.g. whether to update)."""
        if not self.enabled:
            return bool(flag)
        t = torch.tensor([float(bool(flag))], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def gather_trajectories(self, trajs: Sequence, all_ranks: bool = False) -> list:
        """Every rank's trajectories, concatenated in rank order (= spec order after ``shard``).

        Args:
            trajs: This rank's trajectories (any picklable objects).
            all_ranks: Give the union to every rank (e.g. so each trains an identical critic);
                otherwise only rank 0 gets it (logging, reports).

        Returns:
            The union on rank 0 (and on every rank if ``all_ranks``), else an empty list.
        """
        if not self.enabled:
            return list(trajs)
        parts: list[Any] = [None] * self.world_size
        # all_gather_object works under gloo and nccl alike (gather_object is gloo-only in some versions)
        dist.all_gather_object(parts, list(trajs))
        return [t for part in parts for t in part] if (all_ranks or self.is_main) else []


def _buckets(tensors: list[torch.Tensor], cap_bytes: int) -> list[list[torch.Tensor]]:
    """Consecutive runs of same-dtype, same-device tensors of at most ``cap_bytes`` (at least one each)."""
    out: list[list[torch.Tensor]] = []
    size = 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        last = out[-1] if out else None
        if last is None or size + nbytes > cap_bytes or (last[0].dtype, last[0].device) != (t.dtype, t.device):
            out.append([t])
            size = nbytes
        else:
            last.append(t)
            size += nbytes
    return out


# ----- FSDP2-sharded models --------------------------------------------------------------------
def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` is an FSDP2 root (``fully_shard`` was applied to it)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def model_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()``; for a sharded model, the full (unsharded) state dict on CPU, the same
    keys and shapes as the unsharded model's. Collective when sharded: every rank must call it (rank 0
    gets the tensors, the others an empty dict)."""
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_model_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """``model.load_state_dict(state)``; a sharded model takes each rank's slices of the full ``state``
    (every rank passes the full state dict; collective when sharded)."""
    if not is_sharded(model):
        model.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    # a copy: the call replaces the dict's values with this rank's shards
    set_model_state_dict(model, dict(state), options=StateDictOptions(full_state_dict=True))


def optimizer_state_dict(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``optimizer.state_dict()``; for a sharded model, the full state keyed by parameter name, on
    CPU (collective when sharded; rank 0 gets the tensors)."""
    if not is_sharded(model):
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_optimizer_state_dict(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """The inverse of ``optimizer_state_dict`` (every rank passes the full state, which may be modified
    in place; collective when sharded)."""
    if not is_sharded(model):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


@contextmanager
def full_params(model: torch.nn.Module) -> Iterator[None]:
    """Hold every FSDP unit of ``model`` unsharded for the duration (no-op when not sharded).

    For generation: ranks play different episodes and make different numbers of forwards, which
    must not each all-gather the blocks. This all-gathers once, on every rank together (so enter it
    on every rank), and the forwards inside then run on the full local weights with no collective.
    Memory inside is that of an unsharded model.
    """
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not units:
        yield
        return
    for unit in units:
        unit.unshard()
    model.set_reshard_after_forward(False)
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
        model.set_reshard_after_forward(True)  # as ``trainers.actor.shard_model`` set every unit
