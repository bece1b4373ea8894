"""``VLLMPolicy``: a vLLM engine as a turngym policy (GPU; ``pip install turngym[vllm]``).

vLLM is imported lazily, so this module imports anywhere; constructing the policy needs vLLM and
a GPU. Prompts are the exact incremental token ids from ``ChatRenderer`` (the same record as
``HFPolicy``), passed as ``TokensPrompt`` so vLLM never re-tokenizes. vLLM's prefix cache plays the
role of ``HFPolicy``'s per-conversation KV reuse: turn k+1's prompt extends turn k's, so its
prefix blocks are cache hits.

Log-probs: ``SamplingParams(logprobs=0)`` returns the sampled token's log-prob. The engine is built
with ``logprobs_mode="raw_logprobs"`` where the installed vLLM knows that option, so
``Utterance.logprobs`` are raw temperature-1 model log-probs, like ``HFPolicy``'s.

Weights: ``load_weights(state_dict_or_model)`` pushes the trainer's weights into the running engine
(no restart) and resets the prefix cache, whose blocks were computed with the old weights. In-process
engines load directly into the model; multiprocess (V1) engines get the tensors through
``LLM.collective_rpc``.
"""

from __future__ import annotations

from typing import Any, Iterable

from turngym.agents.base import Conversation, SamplingParams
from turngym.agents.chat import ChatRenderer
from turngym.agents.sampling import row_seeds
from turngym.tools.base import ToolRegistry
from turngym.tools.formats import get_format
from turngym.types import Utterance


def _import_vllm():
    try:
        import vllm
    except ImportError as e:
        raise ImportError("VLLMPolicy needs vLLM on a CUDA machine: pip install 'turngym[vllm]'") from e
    return vllm


def _load_weights_rpc(worker, items) -> None:
    """Runs inside each vLLM worker (``collective_rpc``): load HF-named tensors into its model."""
    worker.model_runner.model.load_weights(weights=items)


class VLLMPolicy:
    """vLLM batched generation with exact tokens and log-probs.

    Args:
        model: Model folder or hub id.
        chat_template: As for ``HFPolicy`` (``"auto"``, ``"chatml_tools"``, a Jinja string, None).
        gpu_memory_utilization: Fraction of GPU memory vLLM may take (leave room for a trainer).
        **llm_kwargs: Passed to ``vllm.LLM`` (``dtype``, ``max_model_len``, ``enable_prefix_caching``...).

    Raises:
        ImportError: vLLM is not installed.
    """

    env_kwargs: dict[str, Any] = {}

    def __init__(self, model: str, *, chat_template: str | None = "auto", gpu_memory_utilization: float = 0.5, **llm_kwargs: Any) -> None:
        vllm = _import_vllm()
        from turngym.agents.hf import resolve_template

        kwargs = {"model": str(model), "gpu_memory_utilization": gpu_memory_utilization, "enable_prefix_caching": True}
        if "logprobs_mode" in _engine_fields():
            kwargs["logprobs_mode"] = "raw_logprobs"
        self.llm = vllm.LLM(**{**kwargs, **llm_kwargs})
        self._vllm = vllm
        self.tokenizer = self.llm.get_tokenizer()
        self.chat = ChatRenderer(self.tokenizer, resolve_template(self.tokenizer, chat_template))

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
        params = [self.sampling_params(sampling, list(sampling.stop) + _format_stops(c), s) for c, s in zip(conversations, seeds)]
        inputs = [{"prompt_token_ids": p} for p in prompts]
        outs = self.llm.generate(inputs, params, use_tqdm=False)
        return [self._utterance(c, p, o.outputs[0]) for c, p, o in zip(conversations, prompts, outs)]

    def _utterance(self, conv: Conversation, prompt: list[int], out) -> Utterance:
        ids = list(out.token_ids)
        lps = [float(d[t].logprob) for t, d in zip(ids, out.logprobs or [])] if out.logprobs else []
        self.chat.record(conv, ids)
        ended = bool(ids) and ids[-1] in self.chat.end_token_ids
        text = self.tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=False)
        finish = "length" if out.finish_reason == "length" else "stop"
        return Utterance(text, list(prompt), ids, lps, finish)

    def load_weights(self, weights: Any) -> None:
        """Replace the engine's weights with the trainer's, without a restart.

        Args:
            weights: A ``state_dict`` (HF parameter names), an iterable of ``(name, tensor)``, or a
                ``torch.nn.Module`` (its state dict).
        """
        items = _named_tensors(weights)
        model = self._inprocess_model()
        if model is not None:
            model.load_weights(weights=items)
        else:  # V1 multiprocess engine: ship CPU copies to every worker
            self.llm.collective_rpc(_load_weights_rpc, args=([(k, v.to("cpu")) for k, v in items],))
        self.llm.reset_prefix_cache()

    def _inprocess_model(self):
        executor = getattr(getattr(self.llm, "llm_engine", None), "model_executor", None)
        worker = getattr(executor, "driver_worker", None)
        for path in (("worker", "model_runner", "model"), ("model_runner", "model")):
            obj = worker
            for attr in path:
                obj = getattr(obj, attr, None)
            if obj is not None and hasattr(obj, "load_weights"):
                return obj
        return None


def _named_tensors(weights: Any) -> list[tuple[str, Any]]:
    if hasattr(weights, "state_dict") and callable(weights.state_dict):
        weights = weights.state_dict()
    pairs: Iterable = weights.items() if hasattr(weights, "items") else weights
    return [(str(k), v.detach()) for k, v in pairs]


def _format_stops(conv: Conversation) -> list[str]:
    if not conv.tools:
        return []
    return get_format(conv.tool_format).stop_strings(ToolRegistry.from_specs(list(conv.tools)))


def _engine_fields() -> set[str]:
    """The engine options this vLLM knows (``LLM`` takes them as ``**kwargs``)."""
    try:
        from vllm.engine.arg_utils import EngineArgs
    except ImportError:
        return set()
    return set(getattr(EngineArgs, "__dataclass_fields__", {}))
