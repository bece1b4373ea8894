import pytest

from turngym.bench.metrics import bootstrap_ci, format_summary, summarize, wilson_interval
from turngym.types import Trajectory, Turn


def test_wilson_interval_hand_values():
    # 0/10: centre = half = (z^2/2n)/(1+z^2/n) = 0.19208/1.38416 = 0.13877 -> (0, 0.27754)
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.27754, abs=1e-5)
    # 8/10: known textbook value (0.4902, 0.9433)
    lo, hi = wilson_interval(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-4) and hi == pytest.approx(0.9433, abs=1e-4)
    assert wilson_interval(20, 20)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_bootstrap_ci_brackets_the_mean():
    lo, hi = bootstrap_ci([1.0, 2.0, 3.0, 4.0] * 10)
    assert lo < 2.5 < hi and hi - lo < 1.0
    assert bootstrap_ci([5.0] * 8) == (5.0, 5.0)


def test_summarize_counts_and_groups():
    def traj(outcome, valid, kind):
        turns = [Turn("a", info={"action_valid": v}, span=(2 * i, 2 * i + 2)) for i, v in enumerate(valid)]
        return Trajectory("t", turns, outcome=outcome, metadata={"task_type": kind})

    s = summarize([traj(1.0, [True, False], "a"), traj(0.0, [True], "a"), traj(1.0, [True, True, True], "b")])
    assert s["episodes"] == 3 and s["success"] == pytest.approx(2 / 3)
    assert s["invalid_action_rate"] == pytest.approx(1 / 6)
    assert s["mean_turns"] == 2.0 and s["action_tokens"] == 12
    assert s["by_task_type"]["a"]["success"] == 0.5 and s["by_task_type"]["b"]["success"] == 1.0
    text = format_summary(s, "title")
    assert "66.7%" in text and "task type" in text
