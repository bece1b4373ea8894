"""HFPolicy on the tiny random Llama: exact log-probs, batching, KV reuse, seeds, stop strings.

Most tests run on both engines: packed forwards (the CPU default) and the padded batch, generating
in fp32 (``FP32``) so they can be checked against the model's own fp32 forward; the bf16 copy that
a bf16 CPU generates from by default has tests of its own."""

from __future__ import annotations

import copy

import pytest
import torch
import toy_envs

from turngym.agents.base import Conversation, SamplingParams
from turngym.agents.chat import STATE_KEY
from turngym.agents.hf import KV_KEY, HFPolicy
from turngym.agents.kvcache import supports_reuse
from turngym.rollout import episode_specs, make_env_factory, rollout
from turngym.tools.formats import TextFormat, register_format
from turngym.types import Message


FP32 = torch.float32
ENGINES = pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])


@pytest.fixture(scope="module", params=[True, False], ids=["packed", "padded"])
def policy(tiny_model, request):
    pol = HFPolicy(tiny_model.model, tiny_model.tokenizer, packed=request.param, generation_dtype=FP32)
    assert (pol.packed is not None) == request.param  # the tiny Llama passes the packed probe
    return pol


def _convs(n: int, tools=None) -> list[Conversation]:
    return [
        Conversation([Message("system", "Play well."), Message("user", f"Task {i}: " + "go north. " * (i + 1))], tools or [])
        for i in range(n)
    ]


def _extend(convs, utts, turn: int) -> None:
    for c, u in zip(convs, utts):
        c.messages += [Message("assistant", u.text), Message("user", f"You see room {turn}. " * (turn % 3 + 1))]


GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)


@ENGINES
def test_rescoring_reproduces_recorded_logprobs_over_a_rollout(tiny_model, packed):
    """Done-criterion: score(prompt, action) == recorded logprobs within 1e-4 (fp32), every turn of
    a multi-turn tool episode played through the real rollout loop, with KV reuse on."""
    pol = HFPolicy(tiny_model.model, tiny_model.tokenizer, packed=packed, generation_dtype=FP32)
    trajs = rollout(
        pol, make_env_factory("tests/Guess-v0", n_tasks=4), episode_specs(["1", "2", "3"], 3),
        sampling=SamplingParams(temperature=1.0, max_new_tokens=12, seed=3), num_envs=3, progress=False,
    )
    turns = [(tr.prompt_ids(k), tr.action_ids(k), tr.action_logprobs(k)) for tr in trajs for k in range(len(tr.turns))]
    assert len(turns) == 15  # max_turns=5 per episode: the random model never guesses right
    assert pol.stats["reused_tokens"] > 0
    for prompt, action, lps in turns:
        assert len(action) == len(lps) > 0
        rescored = pol.score(prompt, action)
        torch.testing.assert_close(torch.tensor(rescored), torch.tensor(lps), atol=1e-4, rtol=0)
    # Batched scoring of whole turns agrees too.
    batch = pol.score_batch([p for p, _, _ in turns], [a for _, a, _ in turns])
    for (_, _, lps), lp in zip(turns, batch):
        torch.testing.assert_close(torch.tensor(lp), torch.tensor(lps), atol=1e-4, rtol=0)
    # Each episode is one token segment: prompts extend each other across all five turns.
    assert all(tr.record.starts == [0] for tr in trajs)


@ENGINES
def test_kv_reuse_and_batching_match_naive_one_by_one(tiny_model, packed):
    reuse = HFPolicy(tiny_model.model, tiny_model.tokenizer, packed=packed, generation_dtype=FP32)
    naive = HFPolicy(tiny_model.model, tiny_model.tokenizer, reuse_cache=False, generation_dtype=FP32)
    a, b = _convs(3), _convs(3)
    for turn in range(4):
        ua = reuse.act(a, GREEDY)
        ub = [naive.act([c], GREEDY)[0] for c in b]
        for x, y in zip(ua, ub):
            assert x.prompt_ids == y.prompt_ids
            assert x.action_ids == y.action_ids
            torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=0)
        _extend(a, ua, turn)
        _extend(b, ub, turn)
    assert reuse.stats["prefill_tokens"] < naive.stats["prefill_tokens"] / 2
    assert naive.stats["reused_tokens"] == 0
    # The cache holds exactly the tokens run through the model: prompt + action minus its last token.
    for c in a:
        owner, cache = c.state[KV_KEY]
        st = c.state[STATE_KEY]
        assert owner == id(reuse) and cache.ids == st.ids[:-1]
        if packed:  # one buffer per layer with room to grow, owned by this conversation
            assert cache.owner == id(c) and cache.capacity >= len(cache.ids)
        else:
            assert all(k.shape[1] == len(cache.ids) for k, _ in cache.layers)


def test_seeded_sampling_is_reproducible_and_independent_of_batching(policy):
    sp = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=10, seed=7)
    first = policy.act(_convs(3), sp)
    again = policy.act(_convs(3), sp)
    alone = [policy.act([c], sp)[0] for c in _convs(3)]
    other = policy.act(_convs(3), SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=10, seed=8))
    assert [u.action_ids for u in first] == [u.action_ids for u in again] == [u.action_ids for u in alone]
    assert [u.action_ids for u in first] != [u.action_ids for u in other]
    # Identical prompts in one batch (a GRPO group) still get different samples.
    group = policy.act([_convs(1)[0] for _ in range(4)], sp)
    assert len({tuple(u.action_ids) for u in group}) == 4


def test_logprobs_are_raw_and_sampling_logprobs_are_kept(policy):
    conv = _convs(1)
    u = policy.act(conv, SamplingParams(temperature=0.5, top_p=0.8, max_new_tokens=6, seed=1))[0]
    raw = policy.score(u.prompt_ids, u.action_ids)
    torch.testing.assert_close(torch.tensor(u.logprobs), torch.tensor(raw), atol=1e-4, rtol=0)
    samp = conv[0].state[STATE_KEY].sampling_logprobs[-1]
    assert len(samp) == len(u.action_ids)
    # T=0.5 and top-p sharpen the distribution: the sampled tokens are likelier under it.
    assert sum(samp) > sum(u.logprobs)


def test_greedy_equals_top_p_near_zero_and_argmax(policy):
    g = policy.act(_convs(2), GREEDY)
    tiny_p = policy.act(_convs(2), SamplingParams(temperature=1.0, top_p=1e-6, max_new_tokens=8, seed=0))
    assert [u.action_ids for u in g] == [u.action_ids for u in tiny_p]
    for u in g:  # each greedy token is the argmax of the model's next-token distribution
        ids = torch.tensor([u.prompt_ids + u.action_ids])
        with torch.no_grad():
            logits = policy.model(ids).logits[0, len(u.prompt_ids) - 1 : -1]
        assert logits.argmax(-1).tolist() == u.action_ids


def test_stop_string_ends_the_action_and_stays_in_it(policy):
    full = policy.act(_convs(1), SamplingParams(temperature=0.0, max_new_tokens=12))[0]
    tok = policy.tokenizer
    pieces = [tok.decode(full.action_ids[: i + 1]) for i in range(len(full.action_ids))]
    stop = pieces[4][len(pieces[2]) + 1 :]  # spans the end of token 3 through token 5
    assert stop and stop not in pieces[3]
    cut = policy.act(_convs(1), SamplingParams(temperature=0.0, max_new_tokens=12, stop=[stop]))[0]
    assert cut.action_ids == full.action_ids[:5]
    assert cut.text.endswith(stop) and cut.finish_reason == "stop"
    assert full.finish_reason == "length"


def test_the_env_formats_stop_strings_apply(policy):
    """Stop strings also come from the env's tool format (``ToolFormat.stop_strings``)."""
    full = policy.act(_convs(1), GREEDY)[0]
    word = policy.tokenizer.decode(full.action_ids[2:3]).strip()
    assert word

    class StopAtWord(TextFormat):
        name = "test-stop-at-word"

        def stop_strings(self, tools):
            return [word]

    register_format(StopAtWord())
    env = toy_envs.GuessEnv(n_tasks=8)
    conv = _convs(1, env.tools.specs)[0]
    conv.tool_format = "test-stop-at-word"
    u = policy.act([conv], GREEDY)[0]
    assert word in u.text and len(u.action_ids) <= 3 and u.finish_reason == "stop"


def test_eos_ends_the_turn_and_is_not_repeated_in_the_next_prompt(tiny_model):
    """A model that emits <|im_end|>: it is the last action id, not in the text, and the next
    prompt continues with the template's text after it (so no second <|im_end|>)."""
    tok = tiny_model.tokenizer
    model = copy.deepcopy(tiny_model.model)
    probe = HFPolicy(model, tok, generation_dtype=FP32).act(_convs(1), GREEDY)[0]
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():  # make <|im_end|> outrank the 3rd greedy token wherever that one leads
        model.lm_head.weight[im_end] = 1.5 * model.lm_head.weight[probe.action_ids[2]]
    pol = HFPolicy(model, tok, generation_dtype=FP32)
    conv = _convs(1)
    u = pol.act(conv, GREEDY)[0]
    assert u.action_ids[-1] == im_end and u.finish_reason == "stop"
    assert "<|im_end|>" not in u.text and len(u.action_ids) <= 3
    _extend(conv, [u], 0)
    nxt = pol.act(conv, GREEDY)[0]
    after = nxt.prompt_ids[len(u.prompt_ids) + len(u.action_ids):]
    assert tok.decode(after).startswith("\n<|im_start|>user\n")


def test_context_limit_gives_an_empty_utterance(tiny_model):
    pol = HFPolicy(tiny_model.model, tiny_model.tokenizer, generation_dtype=FP32)
    pol.max_len = 40  # as if the model's context were 40 tokens
    short, long = _convs(1)[0], Conversation([Message("user", "word " * 60)])
    out = pol.act([short, long], SamplingParams(temperature=0.0, max_new_tokens=50))
    assert out[1].text == "" and out[1].action_ids == [] and out[1].finish_reason == "length"
    assert len(out[0].prompt_ids) + len(out[0].action_ids) == 40 and out[0].finish_reason == "length"


def test_invalidate_caches_forces_a_full_prefill(tiny_model):
    pol = HFPolicy(tiny_model.model, tiny_model.tokenizer, generation_dtype=FP32)
    conv = _convs(1)
    u = pol.act(conv, GREEDY)
    _extend(conv, u, 0)
    pol.invalidate_caches()
    before = dict(pol.stats)
    u2 = pol.act(conv, GREEDY)[0]
    assert pol.stats["reused_tokens"] == before["reused_tokens"]
    assert pol.stats["prefill_tokens"] - before["prefill_tokens"] == len(u2.prompt_ids)


def test_loads_from_a_path_and_other_architectures(tiny_model, tmp_path):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = tiny_model.tokenizer
    torch.manual_seed(1)
    qwen = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
    )).eval()
    with torch.no_grad():
        qwen.lm_head.weight.normal_(0.0, 0.5)
    qwen.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    from_path = HFPolicy(str(tmp_path), device="cpu", generation_dtype=FP32)
    assert from_path.reuse_cache and from_path.model.config.model_type == "qwen2"
    naive = HFPolicy(qwen, tok, reuse_cache=False, generation_dtype=FP32)
    a, b = _convs(2), _convs(2)
    for turn in range(3):
        ua, ub = from_path.act(a, GREEDY), naive.act(b, GREEDY)
        assert [u.action_ids for u in ua] == [u.action_ids for u in ub]
        _extend(a, ua, turn)
        _extend(b, ub, turn)


def test_sliding_window_models_do_not_reuse_caches():
    from transformers import MistralConfig

    assert not supports_reuse(MistralConfig(sliding_window=16, num_hidden_layers=2))
    assert supports_reuse(MistralConfig(sliding_window=None, num_hidden_layers=2))


def test_top_p_filter_by_hand_and_fast_path_agrees_with_reference():
    from turngym.agents.sampling import top_p_filter, top_p_filter_reference

    logits = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]]).log()
    inf = float("-inf")
    # p=0.7: row 0 keeps 0.5 and 0.3 (0.5 < 0.7 before 0.3); row 1 keeps 0.6 and 0.3.
    kept = top_p_filter_reference(logits, 0.7)
    assert torch.equal(kept.isinf(), torch.tensor([[False, False, True], [True, False, False]]))
    assert kept[0, 2] == inf
    # p=0.5 keeps only the top token when it alone reaches p (row 0: exactly 0.5).
    assert top_p_filter_reference(logits, 0.5).isfinite().sum(-1).tolist() == [1, 1]
    gen = torch.Generator().manual_seed(0)
    big = torch.randn(4, 5000, generator=gen) * 3
    for p in (0.3, 0.9, 0.999):
        for k in (16, 256, 5000):
            assert torch.equal(top_p_filter(big, p, k=k), top_p_filter_reference(big, p))


def test_exponential_race_samples_with_the_right_frequencies():
    from turngym.agents.sampling import make_generators, sample_next

    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = probs.log().expand(4000, 3).contiguous()
    tokens, raw, samp = sample_next(logits, 1.0, 1.0, make_generators(range(4000), "cpu"))
    freq = torch.bincount(tokens, minlength=3).float() / 4000
    torch.testing.assert_close(freq, probs, atol=0.03, rtol=0)
    torch.testing.assert_close(raw, probs.log()[tokens])
    torch.testing.assert_close(samp, raw)  # T=1, top-p=1: the two kinds coincide
    t2, raw2, samp2 = sample_next(logits[:2], 2.0, 1.0, make_generators([0, 1], "cpu"))
    tempered = (probs.log() / 2).log_softmax(-1)
    torch.testing.assert_close(samp2, tempered[t2])
    torch.testing.assert_close(raw2, probs.log()[t2])


def test_a_fresh_conversation_is_prefilled_apart_from_continuing_ones(tiny_model):
    """A batch mixing episodes that just started (whole prompt to prefill) with continuing ones (a
    short observation on top of their KV cache) is split in two, and answers as each would alone."""
    pol = HFPolicy(tiny_model.model, tiny_model.tokenizer, packed=False, generation_dtype=FP32)
    old = _convs(3)
    _extend(old, pol.act(old, GREEDY), 1)
    fresh = [Conversation([Message("system", "Play well."), Message("user", "A long task. " * 60)], [])]
    mixed = old + fresh
    prompts = [pol.chat.prompt_ids(c) for c in mixed]
    assert pol._buckets([pol._cache(c) for c in mixed], prompts) == [[0, 1, 2], [3]]
    for c in mixed:  # undo the prompt bookkeeping of the probe above: act asks again
        pol.chat.state(c).n_msgs = 0
    together = [u.action_ids for u in pol.act(copy.deepcopy(mixed), GREEDY)]
    alone = [pol.act([copy.deepcopy(c)], GREEDY)[0].action_ids for c in mixed]
    assert together == alone


def _system_convs(tasks: list[str]) -> list[Conversation]:
    system = "You play a text game. Send one command a turn, such as go north or take coin. " * 3
    return [Conversation([Message("system", system), Message("user", t)], []) for t in tasks]


@ENGINES
def test_new_episodes_start_from_one_shared_prefix_and_answer_as_alone(tiny_model, packed):
    """Episodes that start together prefill their common system prompt once; each then answers
    exactly as it does alone from scratch, and a later new episode reuses the kept prefix."""
    pol = HFPolicy(tiny_model.model, tiny_model.tokenizer, packed=packed, generation_dtype=FP32)
    naive = HFPolicy(tiny_model.model, tiny_model.tokenizer, reuse_cache=False, generation_dtype=FP32)
    tasks = ["Find the coin.", "Open the chest and take the key.", "Go east twice."]
    together = pol.act(_system_convs(tasks), GREEDY)
    alone = [naive.act(_system_convs([t]), GREEDY)[0] for t in tasks]
    shared = pol.shared_prefix
    prompt = together[0].prompt_ids
    assert shared is not None and len(shared.ids) >= 30 and prompt[: len(shared.ids)] == shared.ids
    for x, y in zip(together, alone):
        assert x.prompt_ids == y.prompt_ids and x.action_ids == y.action_ids
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=0)
    # prefix once + each row's own tail, instead of every whole prompt
    tails = sum(len(u.prompt_ids) - len(shared.ids) for u in together)
    assert pol.stats["prefill_tokens"] == len(shared.ids) + tails
    assert pol.stats["reused_tokens"] == 3 * len(shared.ids)
    before = dict(pol.stats)
    late = pol.act(_system_convs(["Take the apple."]), GREEDY)[0]  # one new episode: reuses, no new prefix
    assert pol.shared_prefix is shared
    assert pol.stats["reused_tokens"] - before["reused_tokens"] == len(shared.ids)
    assert late.action_ids == naive.act(_system_convs(["Take the apple."]), GREEDY)[0].action_ids
    pol.invalidate_caches()  # new weights: the kept prefix is stale
    before = dict(pol.stats)
    pol.act(_system_convs(["Take the apple."]), GREEDY)
    assert pol.stats["reused_tokens"] == before["reused_tokens"]


def test_packed_and_padded_engines_play_the_same_tokens(tiny_model):
    """Rows of different lengths, some finishing early: the packed engine samples what the padded
    batch samples (seeded T=1), with the same raw log-probs, turn after turn."""
    sp = SamplingParams(temperature=1.0, max_new_tokens=9, seed=11)
    runs = {}
    for packed in (True, False):
        pol = HFPolicy(tiny_model.model, tiny_model.tokenizer, packed=packed, generation_dtype=FP32)
        convs, out = _convs(4), []
        for turn in range(3):
            utts = pol.act(convs, sp)
            out.append(utts)
            _extend(convs, utts, turn)
        runs[packed] = out
    for a, b in zip(runs[True], runs[False]):
        assert [u.action_ids for u in a] == [u.action_ids for u in b]
        for x, y in zip(a, b):
            torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4, rtol=0)


def test_a_copied_conversation_never_writes_into_its_originals_cache(tiny_model):
    """Packed caches grow in place, so only their owner appends: a copy of a conversation (a fork)
    copies the cache first, and both continue exactly as they would alone."""
    pol = HFPolicy(tiny_model.model, tiny_model.tokenizer, packed=True, generation_dtype=FP32)
    conv = _convs(1)
    _extend(conv, pol.act(conv, GREEDY), 0)
    fork = copy.deepcopy(conv)
    fork[0].messages[-1] = Message("user", "A different room.")
    a, b = pol.act(conv, GREEDY)[0], pol.act(fork, GREEDY)[0]
    naive = HFPolicy(tiny_model.model, tiny_model.tokenizer, reuse_cache=False, generation_dtype=FP32)
    assert a.action_ids == naive.act(copy.deepcopy(conv), GREEDY)[0].action_ids
    assert b.action_ids == naive.act(copy.deepcopy(fork), GREEDY)[0].action_ids


def test_a_model_the_packed_loop_does_not_match_falls_back_to_padded(tiny_model):
    """The packed probe compares logits with the model's own forward: a layer computing something
    else (here, a decoder layer that scales its input) fails it, and the policy uses the padded batch."""
    from turngym.agents.packed import PackedLM

    model = copy.deepcopy(tiny_model.model)
    assert PackedLM.build(model) is not None
    layer = model.model.layers[0]
    plain = type(layer).forward
    type_ = type("ScaledLayer", (type(layer),), {"forward": lambda self, h, *a, **k: plain(self, 2 * h, *a, **k)})
    layer.__class__ = type_
    assert PackedLM.build(model) is None
    assert PackedLM.build(model, torch.bfloat16) is None  # a bf16 engine is probed on the fp32 weights
    pol = HFPolicy(model, tiny_model.tokenizer, packed=True, generation_dtype=FP32)
    assert pol.packed is None
    u = pol.act(_convs(1), GREEDY)[0]
    with torch.no_grad():
        logits = model(torch.tensor([u.prompt_ids + u.action_ids])).logits[0, len(u.prompt_ids) - 1 : -1]
    assert logits.argmax(-1).tolist() == u.action_ids


def test_a_bf16_engine_over_fp32_weights_is_probed_exactly_in_fp32(tiny_model, monkeypatch):
    """bf16 rounding noise must not decide whether the packed path is used: the probe runs on the
    fp32 model itself (no copy), where the loop agrees with the forward to ~1e-5."""
    from turngym.agents.packed import PackedLM

    probed = []
    real = PackedLM.probe
    monkeypatch.setattr(PackedLM, "probe", lambda self: probed.append((self.dtype, self.runner)) or real(self))
    model = copy.deepcopy(tiny_model.model)
    packed = PackedLM.build(model, torch.bfloat16)
    assert packed is not None and packed.dtype == torch.bfloat16 and packed.runner is not model
    assert probed == [(torch.float32, model)]


def test_bf16_generation_copies_the_weights_and_follows_training(tiny_model):
    """generation_dtype=bf16: greedy tokens are the argmax of a bf16 copy of the model, the copy is
    refreshed by invalidate_caches after the fp32 weights change, and the fp32 weights never change."""
    model = copy.deepcopy(tiny_model.model)
    pol = HFPolicy(model, tiny_model.tokenizer, packed=True, generation_dtype=torch.bfloat16)
    assert pol.packed is not None and pol.packed.dtype == torch.bfloat16
    assert next(model.parameters()).dtype == torch.float32

    def argmax_of_bf16_copy(u):
        ref = copy.deepcopy(model).to(torch.bfloat16)
        with torch.no_grad():
            logits = ref(torch.tensor([u.prompt_ids + u.action_ids])).logits[0, len(u.prompt_ids) - 1 : -1]
        return logits.float().argmax(-1).tolist()

    conv = _convs(1)
    u = pol.act(conv, GREEDY)[0]
    assert u.action_ids == argmax_of_bf16_copy(u)
    _extend(conv, [u], 0)
    before = pol.stats["reused_tokens"]
    u2 = pol.act(conv, GREEDY)[0]  # the next turn continues from the conversation's cache
    assert pol.stats["reused_tokens"] - before == len(u.prompt_ids) + len(u.action_ids) - 1
    assert u2.action_ids == argmax_of_bf16_copy(u2)
    with torch.no_grad():  # a "training step" on the fp32 weights
        model.lm_head.weight.mul_(-1.0)
    pol.invalidate_caches()
    v = pol.act(_convs(1), GREEDY)[0]
    assert v.action_ids != u.action_ids and v.action_ids == argmax_of_bf16_copy(v)


def test_a_trainer_generates_in_its_update_precision(tiny_model, tmp_path):
    from turngym.trainers.pg import PGConfig, PGTrainer

    for autocast, want in (("none", None), ("bf16", torch.bfloat16)):
        pol = HFPolicy(copy.deepcopy(tiny_model.model), tiny_model.tokenizer, packed=True)
        PGTrainer(pol, "tests/Guess-v0", PGConfig(algo="rloo", group_size=2, episodes_per_iter=2, autocast=autocast),
                  out_dir=tmp_path / autocast).setup()
        assert pol.generation_dtype == want


def test_a_cache_passed_back_under_the_installed_name_continues_the_sequence_without_a_warning():
    """``cache_arg``/``returned_cache`` hand the KV cache to and from the model under whichever name
    the installed transformers uses: a prompt then one token on its cache gives the hidden state of
    the whole sequence at once, with no deprecation warning."""
    import warnings

    from transformers import LlamaConfig, LlamaModel

    from turngym.agents.kvcache import cache_arg, returned_cache

    torch.manual_seed(0)
    model = LlamaModel(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1)).eval()
    ids = torch.tensor([[3, 7, 11, 5]])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        whole = model(input_ids=ids).last_hidden_state[0, -1]
        cache = returned_cache(model(input_ids=ids[:, :3], use_cache=True))
        step = model(input_ids=ids[:, 3:], position_ids=torch.tensor([[3]]), use_cache=True,
                     **{cache_arg(model): cache}).last_hidden_state[0, -1]
    assert cache_arg(model) in ("cache", "past_key_values")
    assert torch.allclose(step, whole, atol=1e-5)
