"""``openai:`` against a real ``transformers serve`` (the ``serve`` extra: FastAPI, uvicorn, openai).

That server returns text without token ids, so the client must say so once and keep playing with
text-only turns (they evaluate, and are not trainable). Skips when the extra is not installed.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import warnings

import pytest
from local_server import running_server

from turngym.agents.base import Conversation, SamplingParams
from turngym.types import Message

SERVE_DEPS = ("fastapi", "uvicorn", "openai")
pytestmark = pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in SERVE_DEPS),
                                reason="transformers serve needs pip install 'turngym[serve]'")


@pytest.fixture(scope="module")
def served_tiny(tiny_model, tmp_path_factory):
    """``transformers serve`` on the tiny model, started as a user starts it (its CLI, a subprocess)."""
    folder = tmp_path_factory.mktemp("tiny_served")
    tiny_model.model.save_pretrained(folder)
    tiny_model.tokenizer.save_pretrained(folder)
    cli = shutil.which("transformers", path=os.path.dirname(sys.executable)) or shutil.which("transformers")

    def cmd(port: int) -> list[str]:
        return [cli, "serve", str(folder), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
                "--log-level", "warning"]

    with running_server(cmd, folder / "server.log", name="transformers serve", startup_s=180, poll_s=0.5) as url:
        yield f"{url}/v1", str(folder)


def test_chat_turns_come_back_as_text_with_one_warning_that_ids_are_missing(served_tiny):
    from turngym.agents.http import OpenAIPolicy

    url, model = served_tiny
    client = OpenAIPolicy(url, model, timeout_s=120)
    convs = [Conversation([Message("user", f"Task {i}: go north.")]) for i in range(2)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = client.act(convs, SamplingParams(temperature=0.0, max_new_tokens=8))
        second = client.act(convs, SamplingParams(temperature=0.0, max_new_tokens=8))
    about_ids = [w for w in caught if "token ids" in str(w.message)]
    assert len(about_ids) == 1, [str(w.message) for w in caught]  # said once, not per request
    for u in first + second:
        assert isinstance(u.text, str) and u.action_ids == [] and u.logprobs == [] and u.prompt_ids == []
    assert [u.text for u in first] == [u.text for u in second]  # greedy: the server is deterministic


def test_an_episode_plays_to_its_end_through_the_server(served_tiny):
    from turngym.agents.http import OpenAIPolicy
    from turngym.bench.evaluate import evaluate

    url, model = served_tiny
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the text-only notice (tested above)
        res = evaluate("tests/Guess-v0", OpenAIPolicy(url, model, timeout_s=120), episodes=2, num_envs=2,
                       sampling=SamplingParams(temperature=0.0, max_new_tokens=8), progress=False)
    assert len(res.trajectories) == 2
    for traj in res.trajectories:
        assert traj.turns and (traj.terminated or traj.truncated)  # every turn answered; the env ended it
        assert traj.record is None and all(t.span is None for t in traj.turns)  # text only: evaluable, not trainable
