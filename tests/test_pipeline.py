"""``turngym train``'s whole path on the tiny model and the toy env: zero-shot eval, SFT, ArCHer,
final eval, the saved model, and a rerun that resumes instead of training again."""

from __future__ import annotations

import json

from fixtures_model import build_tiny_model
from safetensors import safe_open

from turngym.bench.protocol import held_out_table
from turngym.train import EvalConfig, TrainConfig, run
from turngym.trainers.archer import ArcherConfig
from turngym.trainers.sft import SFTConfig


def test_train_path_end_to_end_and_resume(tmp_path, tiny_tokenizer):
    model_dir = tmp_path / "tiny"
    build_tiny_model(tiny_tokenizer).save_pretrained(model_dir)
    tiny_tokenizer.save_pretrained(model_dir)
    cfg = TrainConfig(
        model=f"hf:{model_dir}", algo="archer", env_id="tests/Guess-v0", env_kwargs={}, train_split="",
        output_dir=str(tmp_path / "run"),
        sft=SFTConfig(episodes=2, epochs=1, batch_size=2, autocast="none"),
        archer=ArcherConfig(iterations=1, episodes_per_iter=2, num_envs=2, max_new_tokens=6, critic_epochs=2,
                            critic_states=4, actor_states=2, warmup_iters=0, critic_encoder="reference", autocast="none"),
        eval=EvalConfig(episodes=2, split="", max_new_tokens=6, num_envs=2, zero_shot=True,
                        allow_train_overlap=True),  # the toy env has no splits: held-out tasks are training tasks
    )
    summary = run(cfg, progress=False)
    out = tmp_path / "run"
    assert set(summary["success"]) == {"zero_shot", "sft", "final"}
    final = summary["held_out"]["final"]
    assert final["n"] == 2 and final["vs_sft"]["n"] == 2 and "vs_sft" not in summary["held_out"]["sft"]
    assert json.loads((out / "summary.json").read_text())["success"] == summary["success"]
    for f in ("eval_zero_shot.json", "eval_sft.json", "eval_final.json", "sft_model.pt", "stages.png",
              "archer/metrics.jsonl", "final_model/config.json"):
        assert (out / f).exists(), f
    from turngym.agents import make_agent

    assert make_agent(f"hf:{out / 'final_model'}").model.config.num_hidden_layers == 2  # the trained model loads
    with safe_open(str(out / "final_model" / "model.safetensors"), framework="pt") as f:  # in bf16: half the disk
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    stages = (out / "stages.json").read_text()
    again = run(cfg, progress=False)  # everything is recorded: nothing re-runs, same results
    assert again["success"] == summary["success"] and (out / "stages.json").read_text() == stages


def test_held_out_table_pairs_each_stage_with_sft():
    def stage(per_episode):
        n = len(per_episode)
        return {"success": sum(per_episode) / n, "success_ci95": [0.0, 1.0], "episodes": n,
                "per_episode_success": per_episode}

    table = held_out_table({"eval_zero_shot": stage([0.0] * 4), "eval_sft": stage([0.0, 1.0, 0.0, 1.0]),
                            "eval_final": stage([1.0, 1.0, 1.0, 1.0]), "sft": {"sft/loss": 1.0}})
    assert table["sft"] == {"success": 0.5, "ci95": [0.0, 1.0], "n": 4}
    # final - sft per game: 1, 0, 1, 0 -> mean 0.5; every paired resample lies in [0, 1]
    d = table["final"]["vs_sft"]
    assert d["diff"] == 0.5 and d["n"] == 4 and 0.0 <= d["ci95"][0] <= 0.5 <= d["ci95"][1] <= 1.0
    assert table["zero_shot"]["vs_sft"]["diff"] == -0.5


def test_reply_caps_left_at_0_come_from_the_envs_oracle_and_short_ones_are_warned(tiny_tokenizer, capsys):
    import math

    from turngym.agents.hf import HFPolicy
    from turngym.config import apply_overrides
    from turngym.rollout import Collector, EnvTarget
    from turngym.train import fit_reply_caps

    cfg = apply_overrides(TrainConfig(), ["algo=grpo", "env_id=tests/Guess-v0", "env_kwargs={}", "train_split=",
                                          "sft.episodes=2", "pg.expert_replay=0"]).with_seeds()
    assert cfg.eval.max_new_tokens == 0 and cfg.pg.max_new_tokens == 0  # the pipeline's defaults: from the env
    policy = HFPolicy(build_tiny_model(tiny_tokenizer), tiny_tokenizer)
    said = []
    with Collector(policy) as collector:
        demos = collector.demonstrations(EnvTarget("tests/Guess-v0", {}), 2)
        longest = max(t.num_tokens for d in demos for t in d.turns)
        fitted = fit_reply_caps(cfg, collector, said.append)
        assert fitted.eval.max_new_tokens == fitted.pg.max_new_tokens == max(16, math.ceil(1.25 * longest))
        assert len(said) == 2 and cfg.eval.max_new_tokens == 0  # a copy: the given config is left as it was
        kept = fit_reply_caps(apply_overrides(cfg, ["eval.max_new_tokens=1", "pg.max_new_tokens=64"]), collector)
    assert kept.eval.max_new_tokens == 1 and kept.pg.max_new_tokens == 64  # set by hand: kept, and a short one warned
    assert "eval.max_new_tokens=1 is shorter than the env's oracle's longest reply" in capsys.readouterr().err
