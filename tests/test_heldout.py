"""Held-out means held out: ``turngym.bench.heldout``'s id and content checks, ``turngym train``
refusing (before it loads a model) what would fail late or claim a held-out gain on training tasks,
and the per-stage bar plot."""

from __future__ import annotations

import json

import pytest
from matplotlib.container import ErrorbarContainer
from toy_envs import GuessEnv

import turngym
from turngym.bench.heldout import check_splits, describe_overlap, plot_stages, stage_figure
from turngym.train import EvalConfig, TrainConfig, run
from turngym.trainers.pg import PGConfig
from turngym.trainers.sft import SFTConfig


class SplitGuess(GuessEnv):
    """The toy guessing game with splits made three ways: ``disjoint`` (train 1-6, test 7-8),
    ``ignore`` (both splits are 1-8: an env that ignores ``split``) and ``renamed`` (the same eight
    games under ``train-N`` and ``test-N`` ids)."""

    def __init__(self, split="train", mode="disjoint", oracle=True, **kw):
        super().__init__(n_tasks=8, **kw)
        self.has_oracle = oracle
        if mode == "disjoint":  # and no tasks in any other split
            self.task_ids = [str(i) for i in range(1, 9) if split in ("train", "test") and (i > 6) == (split == "test")]
        elif mode == "renamed":
            self.task_ids = [f"{split}-{i}" for i in range(1, 9)]

    def _reset_task(self, task_id):
        return super()._reset_task(task_id.rsplit("-", 1)[-1])

    def oracle_action(self):
        return super().oracle_action() if self.has_oracle else None


turngym.register("tests/SplitGuess-v0", entry_point=SplitGuess, max_turns=5)
ENV = "tests/SplitGuess-v0"


def _check(mode, episodes=2, **kw):
    return check_splits(ENV, {"split": "train", "mode": mode, **kw}, {"split": "test", "mode": mode, **kw}, episodes)


def test_disjoint_splits_are_clean_and_the_evaluated_tasks_are_the_first_of_the_split():
    c = _check("disjoint", episodes=1)
    assert c.clean and c.train_tasks == ["1", "2", "3", "4", "5", "6"] and c.test_tasks == ["7"] and c.split_size == 2
    assert c.content_checked == (1, 6) and c.content_note == "" and c.train_oracle


def test_an_env_that_ignores_split_overlaps_by_id():
    c = _check("ignore", episodes=8)
    assert c.id_overlap == [str(i) for i in range(1, 9)] and not c.content_overlap  # same id: not counted twice
    assert describe_overlap(c).startswith("8 of the 8 held-out task ids are training task ids (1, 2, 3, 4, 5, ...)")


def test_the_same_games_under_other_ids_overlap_by_content():
    c = _check("renamed", episodes=8)
    assert not c.id_overlap
    assert sorted(c.content_overlap) == [(f"test-{i}", f"train-{i}") for i in range(1, 9)]
    assert "8 held-out tasks open exactly like a training task (test-1 = train-1" in describe_overlap(c)


def test_openings_many_tasks_share_tell_nothing():
    # without an oracle move every game opens alike: equal fingerprints say nothing about overlap
    c = _check("renamed", episodes=8, oracle=False)
    assert c.clean and "openings are shared by several tasks" in c.content_note and not c.train_oracle


def test_the_content_check_keeps_to_its_budget_and_says_what_it_covered():
    c = check_splits(ENV, {"split": "train", "mode": "renamed"}, {"split": "test", "mode": "renamed"}, 8, budget_s=0)
    assert c.content_checked == (0, 0) and not c.content_overlap  # ids only
    c = check_splits(ENV, {"split": "train", "mode": "renamed"}, {"split": "test", "mode": "renamed"}, 8,
                     budget_s=1e-9)  # the first pair is hashed before the deadline is looked at
    assert c.content_checked == (1, 1) and "content checked on 1 of 8 test and 1 of 8 training tasks" in c.content_note


def _cfg(tmp_path, model="hf:/no/such/model", **kw):
    """A config whose model does not exist: a check that passes would fail loading it, so an error
    about anything else proves the check ran before any model was loaded."""
    fields = dict(model=model, algo="grpo", env_id=ENV, env_kwargs={"mode": "disjoint"}, output_dir=str(tmp_path),
                  sft=SFTConfig(episodes=2, epochs=1, batch_size=2, autocast="none"),
                  pg=PGConfig(iterations=0), eval=EvalConfig(episodes=2, num_envs=2, max_new_tokens=6))
    return TrainConfig(**{**fields, **kw})


def test_train_refuses_more_held_out_games_than_the_split_has_before_loading_anything(tmp_path):
    with pytest.raises(ValueError, match=r"eval.episodes=128: the held-out split 'test' of tests/SplitGuess-v0 has 2 "
                                         r"tasks.*--set eval.episodes=2"):
        run(_cfg(tmp_path, eval=EvalConfig(episodes=128)), progress=False)


def test_train_refuses_a_held_out_split_of_training_tasks(tmp_path):
    with pytest.raises(ValueError, match=r"not held out: 2 of the 2 held-out task ids are training task ids.*"
                                         r"eval.allow_train_overlap=true"):
        run(_cfg(tmp_path, env_kwargs={"mode": "ignore"}), progress=False)


@pytest.mark.parametrize("kw, match", [
    ({"env_kwargs": {"mode": "disjoint", "colour": "red"}}, r"env_kwargs.*rejects.*colour"),
    ({"train_split": "validation"}, r"train_split='validation': tests/SplitGuess-v0 has no tasks there"),
    ({"env_kwargs": {"mode": "disjoint", "oracle": False}}, r"sft.enabled: .* no oracle_action\(\).*sft.enabled=false"),
    ({"env_id": "tests/NoSuchEnv-v0"}, r"unknown env id 'tests/NoSuchEnv-v0'"),
])
def test_train_names_the_knob_and_the_fix_before_loading_anything(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        run(_cfg(tmp_path, **kw), progress=False)


def test_knob_values_fail_as_the_config_is_built_naming_their_section():
    from turngym.config import apply_overrides

    with pytest.raises(ValueError, match=r"^eval: episodes and num_envs must be >= 1"):
        apply_overrides(TrainConfig(), ["eval.episodes=0"])
    with pytest.raises(ValueError, match=r"^sft: episodes and batch_size"):
        apply_overrides(TrainConfig(), ["sft.batch_size=0"])
    with pytest.raises(ValueError, match=r"model must be default or hf:PATH"):
        apply_overrides(TrainConfig(), ["model=oracle"])


def test_allowed_overlap_warns_loudly_and_the_summary_lists_it(tmp_path, tiny_tokenizer, capsys):
    from fixtures_model import build_tiny_model

    model = tmp_path / "tiny"
    build_tiny_model(tiny_tokenizer).save_pretrained(model)
    tiny_tokenizer.save_pretrained(model)
    cfg = _cfg(tmp_path / "run", model=f"hf:{model}", env_kwargs={"mode": "ignore"},
               sft=SFTConfig(enabled=False), eval=EvalConfig(episodes=2, allow_train_overlap=True))
    summary = run(cfg, progress=False)
    assert "WARNING: the held-out evaluation is not fully held out: 2 of the 2" in capsys.readouterr().err
    assert summary["held_out_check"]["id_overlap"] == ["1", "2"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["held_out_check"]["id_overlap"] == ["1", "2"]


def test_the_stage_plot_has_a_bar_per_evaluated_stage_with_its_ci_and_n(tmp_path):
    table = {"sft": {"success": 0.5, "ci95": [0.4, 0.6], "n": 128},
             "final": {"success": 0.8, "ci95": [0.7, 0.875], "n": 128}}
    fig = stage_figure(table, "TextWorld-easy: held-out success per stage", "branch_bc")
    ax = fig.axes[0]
    assert [round(p.get_height(), 3) for p in ax.patches] == [0.5, 0.8]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["after SFT\nn=128", "after branch_bc\nn=128"]
    (errorbar,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    _, _, (bars,) = errorbar.lines  # the error bars span each stage's 95% CI
    spans = sorted((round(min(s[:, 1]), 3), round(max(s[:, 1]), 3)) for s in bars.get_segments())
    assert spans == [(0.4, 0.6), (0.7, 0.875)]
    assert "zero-shot" not in ax.get_title() and "95% CI" in ax.get_ylabel()
    assert plot_stages(table, tmp_path / "s.png", "t", "grpo").stat().st_size > 0
    assert plot_stages({}, tmp_path / "none.png", "t", "grpo") is None and not (tmp_path / "none.png").exists()
