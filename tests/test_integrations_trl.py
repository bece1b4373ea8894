"""turngym envs through TRL's real ``GRPOTrainer(environment_factory=...)``.

The trainer runs on a tiny random Llama with SmolLM2's real tokenizer. A random model never writes
a tool call, so before GRPO it is taught (a few dozen Adam steps on the task's own conversations,
rendered by the same chat template TRL uses) to answer with one of two replies, about half the
time each: on Maze a valid move or a malformed one (a wrong argument name, which the env answers
with an error observation and ``invalid_action_penalty``); on SQL ``list_tables`` then ``submit``
with the gold query or a wrong one. GRPO samples at temperature 0.5, which keeps that even split
and sharpens the rest of each reply. Rollouts of one task then earn different rewards, GRPO gets
non-zero advantages, and the weights move.

The rewards TRL logged are checked against a replay: each rollout's executed tool calls, as TRL
recorded them in its completions, are played again on a fresh env in the ``hermes`` text format
(rendered and parsed, an independent path from the adapter's), and the env's summed rewards must
equal what TRL logged.
"""

from __future__ import annotations

import inspect
import math
import os

import pytest

pytest.importorskip("trl", reason='needs TRL: pip install "turngym[trl]"')

import torch  # noqa: E402
from fixtures_model import build_tiny_model  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

import turngym  # noqa: E402
from turngym.integrations.session import ToolCallSession, join  # noqa: E402
from turngym.integrations.trl import environment_factory, task_dataset, with_response_parser  # noqa: E402
from turngym.types import ToolCall  # noqa: E402

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

GENERATIONS = 4
CASES = {
    "maze": ("turngym/Maze-v0", {"invalid_action_penalty": -0.5}, "small-train-0000"),
    "sql": ("turngym/SQL-synthetic-v1", {}, "shop-easy-00"),
}


def oracle_call(session: ToolCallSession) -> ToolCall:
    """The env's expert move from the current state, as a ToolCall."""
    return session.base.format.parse(session.base.oracle_action(), session.base.tools).calls[0]


def replies(case: str, session: ToolCallSession) -> list[list[tuple[str, dict]]]:
    """The two first replies the tiny model is taught: a rewarded one and an unrewarded one."""
    gold = oracle_call(session)
    if case == "maze":
        return [[("move", gold.arguments)], [("move", {"dir": gold.arguments["direction"]})]]
    return [[("list_tables", {}), ("submit", gold.arguments)], [("list_tables", {}), ("submit", {"sql": "SELECT 0"})]]


def conversation(factory, task_id: str, calls: list[tuple[str, dict]]) -> tuple[list[dict], list]:
    """The conversation TRL would build for these calls (tool results from the env), and the tools."""
    env = factory()
    convo = [{"role": "user", "content": env.reset(task_id=task_id)}]
    convo.append({"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]})
    convo += [{"role": "tool", "name": n, "content": getattr(env, n)(**a)} for n, a in calls]
    convo.append({"role": "assistant", "content": "Done."})
    tools = [getattr(env, name) for name in sorted(s.name for s in env.session.specs)]  # TRL lists them sorted
    return convo, tools


def teach(model, tokenizer, convos: list[list[dict]], tools: list, steps: int = 200) -> tuple[float, float, float]:
    """Adam on the assistant tokens of two ``convos`` whose replies differ from one token on.

    Stops once the mean loss (nats per token) is within 0.005 of its floor (ln 2 at the branching
    token of each conversation) and the model gives the first reply's branching token a
    probability within 0.4-0.6, so rollouts split between the two replies.

    Returns:
        (loss, floor, probability of the first reply's branching token).
    """
    batch = []
    for convo in convos:
        text = tokenizer.apply_chat_template(convo, tools=tools, tokenize=False)
        spans = []
        for i, m in enumerate(convo):
            if m["role"] == "assistant":
                start = len(tokenizer.apply_chat_template(convo[:i], tools=tools, tokenize=False, add_generation_prompt=True))
                spans.append((start, len(tokenizer.apply_chat_template(convo[: i + 1], tools=tools, tokenize=False))))
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = torch.tensor(enc["input_ids"])
        targets = torch.tensor([any(a <= s < b for a, b in spans) for s, _ in enc["offset_mapping"]])
        batch.append((ids, targets.nonzero().squeeze(-1)))
    (a, _), (b, _) = batch
    branch = next(i for i in range(min(len(a), len(b))) if a[i] != b[i])
    floor = sum(math.log(2) / len(pos) for _, pos in batch) / len(batch)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        losses = []
        for ids, pos in batch:
            hidden = model.model(ids[None]).last_hidden_state[0]
            logits = model.lm_head(hidden[torch.cat([pos - 1, torch.tensor([branch - 1])])])  # t-1 predicts t
            losses.append(torch.nn.functional.cross_entropy(logits[:-1], ids[pos]))
        loss = torch.stack(losses).mean()
        p_first = logits[-1].softmax(-1)[a[branch]].item()
        if loss.item() < floor + 0.005 and 0.4 < p_first < 0.6:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item(), floor, p_first


class Record(TrainerCallback):
    """Per optimizer step: TRL's completions and logged env rewards, and the env instances' episodes."""

    def __init__(self, reward_name: str) -> None:
        self.trainer, self.reward_name, self.steps = None, reward_name, []

    def on_step_end(self, args, state, control, **kwargs):
        logs = self.trainer._logs  # what TRL's completions table shows (log_completions)
        self.steps.append({
            "completions": list(logs["completion"])[-GENERATIONS:],
            "rewards": list(logs["rewards"][self.reward_name])[-GENERATIONS:],
            "episodes": [(e.session.turn, e.session.episode_return) for e in self.trainer.environments],
        })


def replay(env_id: str, env_kwargs: dict, task_id: str, completion: list[dict]) -> tuple[float, list[str]]:
    """Play the completion's executed tool calls on a fresh env in the hermes format: (return, observations)."""
    env = turngym.make(env_id, tool_format="hermes", **env_kwargs)
    env.reset(seed=0, options={"task_id": task_id})
    base, total, observations = env.unwrapped, 0.0, []
    first = completion[0]
    executed = len([m for m in completion if m["role"] == "tool"])
    for tc in (first.get("tool_calls") or [])[:executed]:
        fn = tc["function"]
        obs, reward, *_ = env.step(base.format.render_call(ToolCall("r", fn["name"], fn["arguments"])))
        total += reward
        observations.append(join(obs))
    return total, observations


@pytest.mark.parametrize("case", sorted(CASES))
def test_grpo_trainer_runs_two_steps_through_environment_factory(case, tiny_tokenizer, tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    env_id, env_kwargs, task_id = CASES[case]
    factory = environment_factory(env_id, **env_kwargs)
    probe = factory()
    probe.reset(task_id=task_id)
    tokenizer = with_response_parser(tiny_tokenizer)
    model = build_tiny_model(tokenizer)
    convos, tools = zip(*(conversation(factory, task_id, calls) for calls in replies(case, probe.session)))
    loss, floor, p_first = teach(model, tokenizer, list(convos), tools[0])
    assert loss < floor + 0.005 and 0.4 < p_first < 0.6

    dataset = task_dataset(env_id, **env_kwargs).filter(lambda row: row["task_id"] == task_id)
    args = GRPOConfig(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=GENERATIONS, num_generations=GENERATIONS,
        max_completion_length=160, max_tool_calling_iterations=1, learning_rate=1e-3, temperature=0.5,
        logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, seed=0, dataloader_num_workers=0,
    )
    record = Record(reward_name=type(probe).__name__)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, train_dataset=dataset,
                          environment_factory=factory, args=args, callbacks=[record])
    record.trainer = trainer
    trainer.train()

    assert trainer.state.global_step == 2 and len(record.steps) == 2
    spread = []
    for step, logged in zip(record.steps, [h for h in trainer.state.log_history if "reward" in h]):
        assert len(step["completions"]) == len(step["rewards"]) == len(step["episodes"]) == GENERATIONS
        for completion, reward, (turns, ret) in zip(step["completions"], step["rewards"], step["episodes"]):
            calls = [m for m in completion if m["role"] == "tool"]
            assert len(calls) >= 1 and turns == len(calls)  # every rollout called the env's tools
            expected, observations = replay(env_id, env_kwargs, task_id, completion)
            assert reward == pytest.approx(expected) and ret == pytest.approx(expected)
            assert [m["content"] for m in calls] == observations  # the model saw the env's own observations
        mean = sum(step["rewards"]) / GENERATIONS
        assert logged[f"rewards/{type(probe).__name__}/mean"] == pytest.approx(mean, abs=1e-6)
        spread.append(max(step["rewards"]) - min(step["rewards"]))
    assert max(spread) > 0, "no group had different rewards, so GRPO had nothing to learn from"
    changed = [k for k, v in model.named_parameters() if not torch.equal(v.detach(), before[k])]
    assert changed and any(h.get("grad_norm", 0) > 0 for h in trainer.state.log_history)


# ----- the adapter itself, without a trainer ------------------------------------------------------------
SCHEMA_ENVS = ["turngym/Maze-v0", "turngym/SQL-synthetic-v1", "turngym/Search-synthetic-v0", "turngym/Wordle-v0"]


@pytest.mark.parametrize("env_id", SCHEMA_ENVS)
def test_tool_methods_describe_the_env_tools_to_trl(env_id):
    from transformers.utils import get_json_schema

    env = environment_factory(env_id)()
    tools = {n: getattr(env, n) for n, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
             if n not in ("reset", "get_reward") and not n.startswith("_")}  # what TRL collects
    assert sorted(tools) == sorted(s.name for s in env.session.specs)
    for spec in env.session.specs:
        fn = get_json_schema(tools[spec.name])["function"]
        assert fn["name"] == spec.name and fn["description"] == " ".join(spec.description.split())
        props = spec.parameters.get("properties", {})
        assert set(fn["parameters"]["properties"]) == set(props)
        for arg, schema in props.items():
            got = fn["parameters"]["properties"][arg]
            assert got["type"] == schema["type"] and got["description"] == " ".join(schema["description"].split())
        assert set(fn["parameters"].get("required", [])) == set(spec.parameters.get("required", []))


def test_malformed_calls_come_back_as_the_env_error_observation():
    env = environment_factory("turngym/Maze-v0", invalid_action_penalty=-0.5, reward="return")()
    assert env.move(direction="north").startswith("Error: there is no episode yet")  # before reset: no step
    env.reset(prompt=[{"role": "user", "content": ""}], task_id="small-train-0000")
    calls = [{"dir": "east"}, {}, {"direction": 3}, {"direction": "east", "speed": 2}, {"direction": "sideways"},
             {"direction": None}, {"direction": ["east"]}]
    for args in calls:  # exactly how TRL calls a tool: method(**arguments)
        text = env.move(**args)
        assert text.startswith("Error:"), (args, text)
    assert env.session.turn == len(calls) and env.get_reward() == pytest.approx(-0.5 * len(calls))
    assert "Open directions" in env.move(direction="east")  # and a valid call still works afterwards


def test_an_episode_ends_where_the_env_ends_it_and_rewards_come_from_the_env():
    for reward in ("return", "outcome"):
        env = environment_factory("turngym/Maze-v0", reward=reward, step_penalty=0.1)()
        env.reset(task_id="small-train-0000")
        moves, last = 0, ""
        while not env.session.done:
            last = env.move(**oracle_call(env.session).arguments)
            moves += 1
        assert "reached the goal" in last and env.session.outcome == 1.0 and moves == 10
        assert env.get_reward() == pytest.approx(1.0 - 0.1 * moves if reward == "return" else 1.0)
        assert env.move(direction="east").startswith("Error: the episode is over")
        assert env.session.turn == moves  # the late call was not a step


def test_turn_limit_and_reset_follow_the_env():
    env = environment_factory("turngym/Maze-v0", max_turns=2)()
    first = env.reset(task_id="small-train-0001")
    assert "You are in a maze" in first and "Reply with" not in first  # the tool-format block is cut
    env.move(direction="north")
    env.move(direction="north")
    assert env.session.done and env.move(direction="north").startswith("Error: the episode is over")
    assert env.reset(task_id="small-train-0001") == first and env.session.turn == 0
    with pytest.raises(KeyError):
        env.reset(task_id="no-such-task")


def test_task_dataset_has_one_row_per_task_and_routes_a_mix_of_envs(tiny_tokenizer, tmp_path):
    from datasets import concatenate_datasets
    from trl import GRPOConfig, GRPOTrainer

    maze = task_dataset("turngym/Maze-v0", environment="maze", split="test")
    assert maze["task_id"] == turngym.make("turngym/Maze-v0", split="test").unwrapped.task_ids
    assert set(maze["environment"]) == {"maze"} and maze[0]["prompt"] == [{"role": "user", "content": ""}]
    sql = task_dataset("turngym/SQL-synthetic-v1", environment="sql")
    factories = {"maze": environment_factory("turngym/Maze-v0", split="test"),
                 "sql": environment_factory("turngym/SQL-synthetic-v1")}
    tokenizer = with_response_parser(tiny_tokenizer)
    args = GRPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2, num_generations=2,
                      report_to="none", use_cpu=True)
    trainer = GRPOTrainer(model=build_tiny_model(tokenizer), processing_class=tokenizer, args=args,
                          train_dataset=concatenate_datasets([maze, sql]), environment_factory=factories)
    assert {k: sorted(t.__name__ for t in v) for k, v in trainer._env_tools.items()} == {
        "maze": ["move"], "sql": ["describe_table", "execute_sql", "list_tables", "submit"]}
    assert {"Maze_v0", "SQL_synthetic_v1"} <= set(trainer.reward_func_names)  # each env owns its reward


def test_with_response_parser_reads_hermes_tool_calls(tiny_tokenizer):
    tokenizer = with_response_parser(tiny_tokenizer)
    out = tokenizer.parse_response('<tool_call>\n{"name": "move", "arguments": {"direction": "east"}}\n</tool_call><|im_end|>', prefix="")
    assert out["tool_calls"] == [{"type": "function", "function": {"name": "move", "arguments": {"direction": "east"}}}]
    assert with_response_parser(tokenizer) is tokenizer


def test_a_tool_named_like_the_trl_hooks_is_refused():
    from turngym.integrations.trl import env_class
    from turngym.types import ToolSpec

    with pytest.raises(ValueError, match="reset"):
        env_class("x/Bad-v0", [ToolSpec("reset", "starts over", {"type": "object", "properties": {}})])
