"""Memory of one recorded 40-turn episode: what a trajectory holds once it is played.

A tiny random Llama (SmolLM2's real tokenizer and chat template) plays TextWorld-easy for 40 turns
(xml tool calls, up to 16 tokens a reply), through the normal rollout. The trajectory is then
deep-copied under ``tracemalloc``: the bytes allocated are the Python memory that one episode's
record takes (token ids, masks, log-probs, messages, infos). Its JSON size is printed beside it.

    python benchmarks/record_memory.py [--turns 40] [--episodes 4] [--env turngym/TextWorld-easy-v0]

It runs against any turngym version (it only plays a rollout and copies what comes back), so one
script measures the record before and after a change to it (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import copy
import json
import tracemalloc


def tiny_policy():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from turngym.agents.default_model import load_default_tokenizer
    from turngym.agents.hf import HFPolicy

    tok = load_default_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                      tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():  # a peaked distribution, like a trained model's (see tests/fixtures_model.py)
        model.model.embed_tokens.weight.normal_(0.0, 1.0)
        model.lm_head.weight.normal_(0.0, 0.5)
    return HFPolicy(model, tok)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="turngym/TextWorld-easy-v0")
    p.add_argument("--turns", type=int, default=40)
    p.add_argument("--episodes", type=int, default=4)
    a = p.parse_args()
    from turngym.agents.base import SamplingParams
    from turngym.rollout import episode_specs, make_env_factory, rollout

    kwargs = {"tool_format": "xml", "split": "train", "max_turns": a.turns}
    policy = tiny_policy()
    make_env = make_env_factory(a.env, **kwargs)
    env = make_env()
    tasks = list(env.unwrapped.task_ids)[: a.episodes]
    env.close()
    trajs = rollout(policy, make_env, episode_specs(tasks, a.episodes), progress=False,
                    sampling=SamplingParams(temperature=1.0, max_new_tokens=16, seed=0), num_envs=a.episodes)
    rows = []
    for t in trajs:
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        held = copy.deepcopy(t)
        size = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        del held
        rows.append((len(t.turns), size, len(json.dumps(t.to_dict()))))
    for turns, size, js in rows:
        print(f"episode: {turns} turns, {size / 1024:.0f} KiB in memory, {js / 1024:.0f} KiB as JSON")
    n = len(rows)
    print(f"mean over {n} episodes: {sum(r[1] for r in rows) / n / 1024:.0f} KiB in memory, "
          f"{sum(r[2] for r in rows) / n / 1024:.0f} KiB as JSON")


if __name__ == "__main__":
    main()
