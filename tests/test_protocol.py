"""The learning protocol: its statistics against hand-computed numbers, and a tiny end-to-end run
(SFT, an RL arm, SFT-continued) on the tiny model and the toy env, with resume."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from fixtures_model import build_tiny_model

from turngym.bench.metrics import (bootstrap_diff, cluster_bootstrap_diff, mcnemar_exact, paired_comparison,
                                   seed_t_interval)
from turngym.bench.protocol import compare_arms, markdown_report, release_memory, steps_to_target



def test_mcnemar_exact_by_hand():
    # 3 games only b solved, 1 only a: n=4, P(X <= 1) = (1 + 4) / 16, p = 2 * 5/16 = 0.625
    a = [1, 0, 0, 0, 1, 1]
    b = [0, 1, 1, 1, 1, 0][:5] + [1]
    m = mcnemar_exact(a, b)
    assert (m["n01"], m["n10"]) == (3, 1)
    torch.testing.assert_close(m["p"], 0.625)
    # 6 discordant pairs all one way: p = 2 / 2**6 = 0.03125
    torch.testing.assert_close(mcnemar_exact([0] * 6 + [1], [1] * 7)["p"], 0.03125)
    assert mcnemar_exact([1, 0], [1, 0]) == {"n01": 0, "n10": 0, "p": 1.0}  # no discordant pair
    assert mcnemar_exact([0, 1, 0], [1, 0, 0])["p"] == 1.0  # balanced: 2 * P(X <= 1 | n=2) = 1.5, capped
    with pytest.raises(ValueError, match="0/1"):
        mcnemar_exact([0.5], [1])
    with pytest.raises(ValueError, match="length"):
        mcnemar_exact([0, 1], [1])


def test_paired_comparison_by_hand():
    c = paired_comparison([0, 0, 1, 1], [1, 1, 1, 1])
    # diff = 1 - 0.5; per-game differences 1, 1, 0, 0 -> every resample's mean in [0, 1]
    assert c["diff"] == 0.5 and c["n"] == 4 and (c["n01"], c["n10"]) == (2, 0)
    torch.testing.assert_close(c["p_mcnemar"], 0.5)  # 2 * (1/2)**2
    assert 0.0 <= c["ci"][0] <= 0.5 <= c["ci"][1] <= 1.0
    frac = paired_comparison([0.5, 0.0], [1.0, 0.5])  # per-game means of samples: no McNemar
    assert frac["diff"] == 0.5 and frac["ci"] == [0.5, 0.5] and frac["p_mcnemar"] is None


def test_seed_t_interval_by_hand():
    # diffs 0.1, 0.2, 0.3: mean 0.2, sd 0.1, se 0.1 / sqrt(3), t(2) = 4.303
    t = seed_t_interval([0.1, 0.2, 0.3])
    half = 4.303 * 0.1 / 3 ** 0.5
    torch.testing.assert_close(t["ci"], [0.2 - half, 0.2 + half])
    assert t["seeds"] == 3 and seed_t_interval([0.4])["seeds"] == 1
    with pytest.raises(ValueError):
        seed_t_interval([])


def test_cluster_bootstrap_keeps_a_games_seeds_together():
    # every game's seed-mean difference is 0.5 -> every resample's mean is 0.5
    c = cluster_bootstrap_diff([[0, 0], [1, 1]], [[1, 1], [1, 1]])
    assert c["diff"] == 0.5 and c["ci"] == [0.5, 0.5] and (c["games"], c["seeds"]) == (2, 2)
    # three seeds that replay the same 32 outcomes: pooling their 96 pairs as independent narrows
    # the interval by about sqrt(3); resampling games (clusters) does not
    a = [[0] * 16 + [1] * 16] * 3
    b = [[1] * 8 + [0] * 8 + [1] * 16] * 3
    clustered = cluster_bootstrap_diff(a, b)
    naive = bootstrap_diff(sum(a, []), sum(b, []), paired=True)
    width = lambda r: r["ci"][1] - r["ci"][0]
    assert clustered["diff"] == naive["diff"] == 0.25
    assert width(clustered) > 1.5 * width(naive)
    with pytest.raises(ValueError, match="S x G"):
        cluster_bootstrap_diff([[0, 1]], [[0, 1, 1]])


def _rec(greedy, temp=None, groups=None):
    n = len(greedy)
    return {"success": sum(greedy) / n, "success_ci95": [0.0, 1.0], "episodes": n, "per_episode_success": greedy,
            "games": [[str(i), i] for i in range(n)], "groups": groups or ["g"] * n,
            "temp_success": None if temp is None else sum(temp) / n, "temp_ci95": None,
            "per_episode_temp_success": temp or []}


def test_compare_arms_per_seed_mean_and_pooled():
    finals = {"sft": {0: _rec([0, 0, 1, 1], groups=["a", "b", "a", "b"]), 1: _rec([0, 0, 0, 1])},
              "rl": {0: _rec([1, 1, 1, 1]), 1: _rec([0, 0, 0, 1])}}
    t = compare_arms(finals)
    assert t["rl"]["per_seed"][0]["vs_sft"]["greedy"]["diff"] == 0.5
    assert t["rl"]["per_seed"][1]["vs_sft"]["greedy"]["diff"] == 0.0
    m = t["rl"]["mean"]
    assert m["success"] == 0.625 and m["vs_sft"] == 0.25 and m["n"] == 8
    pooled = m["pooled_vs_sft"]["greedy"]  # games' seed-mean differences 0.5, 0.5, 0, 0: diff 0.25
    assert (pooled["games"], pooled["seeds"], pooled["diff"]) == (4, 2, 0.25) and 0 <= pooled["ci"][0] <= 0.25
    seed_t = m["seed_t_vs_sft"]  # seeds' differences 0.5 and 0: mean 0.25, se 0.25, t(1) = 12.706
    torch.testing.assert_close(seed_t["ci"], [0.25 - 12.706 * 0.25, 0.25 + 12.706 * 0.25])
    assert "vs_sft" not in t["sft"]["per_seed"][0]
    assert t["sft"]["by_group"]["a"] == {"success": 0.5, "ci95": pytest.approx([0.0945, 0.9055], abs=1e-3), "n": 2}


def test_a_second_sft_continued_arm_is_a_baseline_with_its_own_column():
    finals = {"sft": {0: _rec([0, 0, 1, 1])}, "rl": {0: _rec([1, 1, 1, 1])}, "sft_cont_2r": {0: _rec([0, 1, 1, 1])}}
    t = compare_arms(finals, ("sft", "sft_cont_2r"))
    assert t["rl"]["per_seed"][0]["vs_sft_cont_2r"]["greedy"]["diff"] == 0.25  # 1 of 4 games won, none lost
    md = markdown_report(t, baselines=("sft", "sft_cont_2r"))
    assert "vs sft_cont_2r: diff [95% CI], McNemar p" in md and "vs sft_continued" not in md


def test_steps_to_target_by_hand():
    pt = lambda steps, success: {"env_steps": steps, "success": success}
    curves = {"sft": {0: [pt(0, 0.5)], 1: [pt(0, 0.4)]},
              "rl": {0: [pt(0, 0.5), pt(100, 0.55), pt(200, 0.7)], 1: [pt(0, 0.4), pt(300, 0.6), pt(500, 0.65)]},
              "flat": {0: [pt(0, 0.5), pt(400, 0.5)]},
              "sft_continued": {0: [pt(None, 0.5), {"env_steps": None, "success": 0.9}]}}
    got = steps_to_target(curves, 0.6)
    assert got["rl"] == {"per_seed": {0: 200, 1: 300}, "reached": 2, "seeds": 2, "mean_steps": 250.0,
                         "final_env_steps": 350.0}
    assert got["flat"]["per_seed"] == {0: None} and got["flat"]["mean_steps"] is None
    assert got["sft"]["reached"] == 0 and got["sft"]["final_env_steps"] == 0.0
    assert "sft_continued" not in got  # no env steps: not comparable on this axis
    md = markdown_report(compare_arms({"sft": {0: _rec([0, 1])}}), to_target=got, target=0.6)
    assert "| rl | 200, 300 | 2/2 | 250 | 350 |" in md


def test_time_budgets_and_hooks(tmp_path, tiny_tokenizer):
    from turngym.agents.hf import HFPolicy
    from turngym.trainers.pg import PGConfig, PGTrainer
    from turngym.trainers.sft import SFTConfig, sft

    def trainer():
        cfg = PGConfig(algo="rloo", iterations=5, episodes_per_iter=2, group_size=2, num_envs=2, max_new_tokens=4,
                       autocast="none", time_budget_s=1e-6)
        return PGTrainer(HFPolicy(build_tiny_model(tiny_tokenizer), tiny_tokenizer), "tests/Guess-v0", cfg,
                         out_dir=tmp_path / "pg")

    seen = []
    first = trainer()
    first.train(progress=False, on_iteration=lambda t, m: seen.append((t.iteration, m["train_seconds"])))
    assert first.iteration == 1 and first.done() and seen == [(1, pytest.approx(seen[0][1]))] and seen[0][1] > 0
    resumed = trainer()  # the budget is spent: a resumed run only reloads, with its training seconds
    resumed.train(progress=False, on_iteration=lambda t, m: seen.append(t.iteration))
    assert resumed.iteration == 1 and len(seen) == 1 and 0 < resumed.train_seconds <= first.train_seconds
    steps = []
    res = sft(first.policy, "tests/Guess-v0", SFTConfig(episodes=2, epochs=1000, batch_size=1, autocast="none",
                                                        time_budget_s=1e-6), progress=False, on_step=steps.append)
    assert res["sft/steps"] == 1 and [m["sft/step"] for m in steps] == [1] and res["sft/train_seconds"] > 0


def test_a_killed_sft_goes_on_from_its_checkpoint_to_the_same_weights(tmp_path, tiny_tokenizer):
    from turngym.agents.hf import HFPolicy
    from turngym.trainers.sft import SFTConfig, sft

    cfg = SFTConfig(episodes=3, epochs=3, batch_size=1, autocast="none")  # 9 steps, epochs end at 3 and 6

    steps = []

    def fit(kill_at: int | None = None):
        policy = HFPolicy(build_tiny_model(tiny_tokenizer), tiny_tokenizer)

        def on_step(m: dict) -> None:
            steps.append(m["sft/step"])
            if m["sft/step"] == kill_at:
                raise KeyboardInterrupt  # as a kill arriving after the step, before its save
        return policy, sft(policy, "tests/Guess-v0", cfg, progress=False, on_step=on_step,
                           checkpoint_dir=tmp_path / "ckpt", checkpoint_every_s=0.0)

    for kill_at in (3, 5, 7):  # the last saves before each kill: step 2, mid-epoch; 4, mid-epoch; 6, an epoch's end
        with pytest.raises(KeyboardInterrupt):
            fit(kill_at)
    resumed, res = fit()
    assert steps == [1, 2, 3, 3, 4, 5, 5, 6, 7, 7, 8, 9]  # each run goes on from the save before its kill
    shutil.rmtree(tmp_path / "ckpt")
    whole, ref = fit()
    assert res["sft/steps"] == ref["sft/steps"] == 9
    torch.testing.assert_close(res["sft/loss"], ref["sft/loss"])
    for (name, a), b in zip(resumed.model.state_dict().items(), whole.model.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)


def test_a_time_budgeted_trainer_bar_counts_seconds_not_the_iteration_cap(tmp_path, tiny_tokenizer, capsys, monkeypatch):
    monkeypatch.setenv("TURNGYM_PROGRESS", "always")  # as on a terminal
    from turngym.agents.hf import HFPolicy
    from turngym.trainers.pg import PGConfig, PGTrainer

    cfg = PGConfig(algo="rloo", iterations=1000, episodes_per_iter=2, group_size=2, num_envs=2, max_new_tokens=4,
                   autocast="none", time_budget_s=1.0, checkpoint_every=0)
    t = PGTrainer(HFPolicy(build_tiny_model(tiny_tokenizer), tiny_tokenizer), "tests/Guess-v0", cfg,
                  out_dir=tmp_path / "pg")
    t.train(progress=True)
    bar = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert t.done() and t.train_seconds >= 1.0
    assert "1/1 s [" in bar and f"it={t.iteration}" in bar and "/1000" not in bar, bar  # seconds of the budget


def _protocol(argv: list[str]) -> dict:
    """``turngym protocol ARGV``, returning its report."""
    from turngym.cli import build_parser
    from turngym.protocol import run_protocol

    return run_protocol(build_parser().parse_args(["protocol", *argv]))


def _tiny_base(tmp_path, tiny_tokenizer, algo: str, section: str) -> Path:
    """A base config of the tiny model on the toy env, with the RL ``section`` given as YAML."""
    model_dir = tmp_path / "tiny"
    build_tiny_model(tiny_tokenizer).save_pretrained(model_dir)
    tiny_tokenizer.save_pretrained(model_dir)
    cfg = tmp_path / "base.yaml"
    cfg.write_text(f"""
model: hf:{model_dir}
algo: {algo}
env_id: tests/Guess-v0
env_kwargs: {{}}
train_split: ''
sft: {{episodes: 2, epochs: 1, batch_size: 2, autocast: none}}
{section}
eval: {{split: '', max_new_tokens: 6, num_envs: 4, allow_train_overlap: true}}  # the toy env has no splits
""")
    return cfg


def test_protocol_end_to_end_and_resume(tmp_path, tiny_tokenizer, capsys):
    cfg = _tiny_base(tmp_path, tiny_tokenizer, "rloo", "pg: {iterations: 2, episodes_per_iter: 2, group_size: 2, "
                                                        "num_envs: 2, max_new_tokens: 6, autocast: none}")
    out = tmp_path / "protocol"
    argv = ["--config", str(cfg), "--arm", "rloo", "--arm", "sft_continued", "--seeds", "0", "--games", "3",
            "--samples", "1", "--eval-every", "1", "--out", str(out), "--quiet"]
    report = _protocol(argv)
    first = capsys.readouterr().out
    assert set(report["finals"]) == {"sft", "rloo", "sft_continued"}
    games = report["finals"]["sft"][0]["games"]
    for arm, by_seed in report["finals"].items():
        assert by_seed[0]["games"] == games and len(by_seed[0]["per_episode_success"]) == 3, arm
        assert len(by_seed[0]["temp_samples"]) == 3
    table = report["table"]
    assert "vs_sft" in table["rloo"]["per_seed"][0] and "vs_sft_continued" in table["rloo"]["per_seed"][0]
    assert table["rloo"]["per_seed"][0]["vs_sft"]["greedy"]["p_mcnemar"] is not None
    curve = report["curves"]["rloo"][0]  # start (SFT), after iteration 1, final
    assert [p["iteration"] for p in curve] == [0, 1, 2] and curve[-1]["train_seconds"] > 0
    assert report["curves"]["sft_continued"][0][-1]["env_steps"] is None
    assert json.loads((out / "protocol.json").read_text())["games"] == 3
    assert (out / "protocol.png").stat().st_size > 0 and "vs sft_continued" in (out / "protocol.md").read_text()
    weights = [(out / "seed0" / arm / "sft_model.pt").stat() for arm in ("sft", "rloo", "sft_continued")]
    assert len({w.st_ino for w in weights}) == 1  # every arm links the seed's SFT weights, none copies them
    # sft; rloo after iteration 1 and at its end; sft_continued at rloo's iteration-1 time and at its end
    assert first.count("[protocol]") == 5

    # delete the RL arm's final entry: a rerun re-evaluates only that
    stages_path = out / "seed0" / "rloo" / "stages.json"
    stages = json.loads(stages_path.read_text())
    del stages["eval_final"]
    stages_path.write_text(json.dumps(stages))
    again = _protocol(argv)
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[protocol]")]
    assert len(lines) == 1 and "rloo final" in lines[0]
    assert again["finals"]["rloo"][0]["per_episode_success"] == report["finals"]["rloo"][0]["per_episode_success"]

    # a finished arm needs neither its weights nor its checkpoints (deleted to save disk): a rerun skips it
    for arm in ("rloo", "sft_continued"):
        (out / "seed0" / arm / "sft_model.pt").unlink()
    shutil.rmtree(out / "seed0" / "rloo" / "checkpoint", ignore_errors=True)
    shutil.rmtree(out / "seed0" / "rloo" / "final_model", ignore_errors=True)
    third = _protocol(argv)
    assert not [x for x in capsys.readouterr().out.splitlines() if x.startswith("[protocol]")]
    assert third["finals"]["rloo"][0]["per_episode_success"] == report["finals"]["rloo"][0]["per_episode_success"]

    # --report-only trains nothing and leaves out what has not finished (here a seed never run)
    partial = _protocol([*argv, "--seeds", "0", "1", "--report-only"])
    assert not [x for x in capsys.readouterr().out.splitlines() if x.startswith("[protocol]")]
    assert set(partial["finals"]["rloo"]) == {0} and partial["table"]["rloo"]["mean"]["seeds"] == 1

    # --baseline pairs every arm with one more: SFT continued against the RL arm, on the same games
    versus = _protocol([*argv, "--report-only", "--baseline", "rloo"])["table"]["sft_continued"]["per_seed"][0]
    cont, rl = (report["finals"][a][0]["per_episode_success"] for a in ("sft_continued", "rloo"))
    assert versus["vs_rloo"]["greedy"]["diff"] == pytest.approx((sum(cont) - sum(rl)) / 3)
    assert "vs rloo: diff" in (out / "protocol.md").read_text()
    with pytest.raises(SystemExit, match="--baseline archer: not an arm"):
        _protocol([*argv, "--report-only", "--baseline", "archer"])


def test_sft_continued_with_given_seconds(tmp_path, tiny_tokenizer, capsys):
    # matching an RL arm trained in another run: its seconds are given, so no RL arm is needed
    cfg = _tiny_base(tmp_path, tiny_tokenizer, "rloo", "pg: {iterations: 1, episodes_per_iter: 2, group_size: 2, "
                                                        "num_envs: 2, max_new_tokens: 6, autocast: none}")
    argv = ["--config", str(cfg), "--seeds", "0", "--games", "3", "--samples", "0", "--quiet",
            "--out", str(tmp_path / "protocol")]
    with pytest.raises(SystemExit, match="add an RL arm, or give its seconds"):
        _protocol([*argv, "--arm", "sft_continued"])
    with pytest.raises(SystemExit, match="must be > 0 seconds"):
        _protocol([*argv, "--arm", "sft_continued:sft.time_budget_s=0"])
    with pytest.raises(SystemExit, match="must be > 0 seconds, got 2h"):
        _protocol([*argv, "--arm", "sft_continued:sft.time_budget_s=2h"])
    report = _protocol([*argv, "--arm", "cont=sft_continued:sft.time_budget_s=0.3"])
    assert set(report["finals"]) == {"sft", "cont"}
    stages = json.loads((tmp_path / "protocol" / "seed0" / "cont" / "stages.json").read_text())
    trained = stages["sft_continued"]["sft/train_seconds"]
    assert trained >= 0.3 and stages["sft_continued"]["sft/steps"] >= 1  # the step crossing the budget is the last
    assert [p["train_seconds"] for p in report["curves"]["cont"][0]] == [0.0, trained]
    assert capsys.readouterr().out.count("[protocol]") == 2  # sft, and the arm at its end

    # with an RL arm of this run that trained for less, it is also evaluated where that arm ended
    _protocol([*argv, "--arm", "rloo"])
    rl_s = _protocol([*argv, "--arm", "rloo", "--report-only"])["curves"]["rloo"][0][-1]["train_seconds"]
    capsys.readouterr()
    longer = _protocol([*argv, "--arm", "rloo", "--arm", f"cont2=sft_continued:sft.time_budget_s={rl_s + 0.5}"])
    points = longer["curves"]["cont2"][0]
    assert points[1]["train_seconds"] >= rl_s and points[-1]["train_seconds"] >= rl_s + 0.5
    assert len(points) == 3 and capsys.readouterr().out.count("[protocol]") == 2  # where rloo ended, and at its end


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim is glibc's")
def test_release_memory_gives_freed_heap_pages_back():
    def rss_mb() -> float:
        return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20

    blocks = [bytearray(4096) for _ in range(50_000)]  # 200 MB of heap (glibc malloc, not mmap)
    survivor = bytearray(4096)  # above them: the heap cannot shrink from its top
    loaded = rss_mb()
    del blocks
    kept = rss_mb()
    assert release_memory()
    released = rss_mb()
    assert kept - released > 50, (loaded, kept, released)  # MB; about 160 here
    assert len(survivor) == 4096


def test_demo_draws_choose_different_training_tasks_and_the_rl_stage_replays_the_same():
    from turngym.train import TrainConfig
    from turngym.rollout.schedule import demo_task_ids
    from turngym.trainers.sft import SFTConfig

    tasks = [f"t{i}" for i in range(64)]
    assert demo_task_ids(tasks, 8) == tasks  # -1: the first tasks, cycled by episode_specs
    subsets = [demo_task_ids(tasks, 8, s) for s in (0, 1, 2)]
    assert all(len(set(s)) == 8 for s in subsets) and len({tuple(s) for s in subsets}) == 3
    assert demo_task_ids(tasks, 8, 1) == subsets[1]  # deterministic
    # one seed: the run's seed draws the demonstrations, and the RL stage replays what SFT chose
    cfg = TrainConfig(seed=2, sft=SFTConfig(demos="drawn")).with_seeds()
    assert cfg.sft.demo_choice() == {"seed": 2, "demo_seed": 2, "pool": 0}
    assert TrainConfig().with_seeds().sft.demo_choice() == {"seed": 0, "demo_seed": -1, "pool": 0}
    with pytest.raises(ValueError, match="demos"):
        SFTConfig(demos="random")


def test_a_demo_pool_keeps_the_demonstrations_of_a_grown_training_split():
    from turngym.rollout.schedule import demo_task_ids
    from turngym.train import TrainConfig, train_env_kwargs
    from turngym.trainers.sft import SFTConfig

    tasks = [f"t{i}" for i in range(128)]
    grown = tasks + [f"u{i}" for i in range(384)]  # the same split asked for 512 tasks: a prefix is kept
    assert demo_task_ids(grown, 96, 0) != demo_task_ids(tasks, 96, 0)  # the shuffle sees the new tasks
    assert demo_task_ids(grown, 96, 0, pool=128) == demo_task_ids(tasks, 96, 0)
    assert demo_task_ids(grown, 8, -1, pool=128) == tasks  # -1: the pool's tasks in order
    cfg = TrainConfig(train_env_kwargs={"num_games": 512})
    assert train_env_kwargs(cfg) == {"tool_format": "xml", "num_games": 512, "split": "train"}
    assert cfg.env_kwargs == {"tool_format": "xml"}  # the held-out evaluation keeps its own
    # the branch stage replays the SFT stage's choice: one knob, nothing to keep in agreement
    assert TrainConfig(sft=SFTConfig(demo_pool=128)).with_seeds().sft.demo_choice()["pool"] == 128
    with pytest.raises(ValueError, match="demo_pool must be >= 0"):
        SFTConfig(demo_pool=-1)


def test_an_arm_acting_with_its_critic_is_reported_beside_its_actor(tmp_path, tiny_tokenizer):
    cfg = _tiny_base(tmp_path, tiny_tokenizer, "archer", "archer: {iterations: 1, episodes_per_iter: 2, num_envs: 2, "
                     "max_new_tokens: 6, critic_epochs: 2, critic_states: 4, actor_states: 2, warmup_iters: 0, critic_encoder: reference, autocast: none}")
    out = tmp_path / "protocol"
    report = _protocol(["--config", str(cfg), "--arm", "sft", "--arm", "archer:acting.k=2", "--seeds", "0",
                        "--games", "3", "--samples", "0", "--baseline", "archer", "--out", str(out), "--quiet"])
    assert set(report["finals"]) == {"sft", "archer", "archer+critic"}
    guided, actor = report["finals"]["archer+critic"][0], report["finals"]["archer"][0]
    assert guided["games"] == actor["games"] and len(guided["per_episode_success"]) == 3
    assert guided["acting/turns"] > 0 and 0 <= guided["acting/moved"] <= guided["acting/turns"]
    assert "vs_archer" in report["table"]["archer+critic"]["per_seed"][0]  # paired with the actor alone
    curve = report["curves"]["archer+critic"][0]
    assert curve[-1]["iteration"] == 1 and curve[-1]["success"] == guided["success"]
    with pytest.raises(SystemExit, match="--arm rloo: acting.k=2: algo=rloo trains no utterance critic"):
        _protocol(["--config", str(cfg), "--arm", "sft", "--arm", "rloo:acting.k=2", "--seeds", "0",
                   "--games", "3", "--samples", "0", "--out", str(tmp_path / "bad"), "--quiet"])


def test_an_arm_with_a_time_budget_is_named_before_it_trains(tmp_path, tiny_tokenizer, capsys):
    # the pg section's defaults are the quickstart's (a 420 s budget): an arm that keeps it would stop
    # at a time, not at the episode budget the other arms play
    from turngym.cli import build_parser
    from turngym.protocol import Protocol

    cfg = _tiny_base(tmp_path, tiny_tokenizer, "rloo", "pg: {iterations: 2, episodes_per_iter: 2, group_size: 2}")
    argv = ["protocol", "--config", str(cfg), "--seeds", "0", "--games", "3", "--out", str(tmp_path / "p")]
    Protocol(build_parser().parse_args([*argv, "--arm", "rloo", "--arm", "grpo:pg.time_budget_s=0"]))
    err = capsys.readouterr().err
    assert "warning: arm rloo stops after 420 training seconds (pg.time_budget_s)" in err
    assert "arm grpo" not in err


def test_the_protocols_evaluations_cap_replies_as_the_run_fitted_them(tmp_path):
    from turngym.config import apply_overrides
    from turngym.protocol import _with_fitted_caps
    from turngym.train import TrainConfig

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    left = TrainConfig()  # eval.max_new_tokens 0: the run fits it to the env
    assert _with_fitted_caps(left, run_dir).eval.max_new_tokens == 0  # no run yet: nothing to read
    (run_dir / "config.json").write_text(json.dumps({"eval": {"max_new_tokens": 18}}))
    assert _with_fitted_caps(left, run_dir).eval.max_new_tokens == 18
    given = apply_overrides(left, ["eval.max_new_tokens=5"])
    assert _with_fitted_caps(given, run_dir).eval.max_new_tokens == 5  # a cap set by hand stays
