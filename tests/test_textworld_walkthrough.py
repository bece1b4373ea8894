"""Walkthrough events recorded on TextWorld's logic are the ones its compiled game records.

TextWorld's ``GameMaker.set_walkthrough`` compiles the game and plays the commands in the
z-machine; ``turngym.envs.textworld.walkthrough`` plays them on the game's logic. Each test makes
the same game both ways and compares the serialized games (their quests hold the recorded events).
"""

from __future__ import annotations

import contextlib
import json

import pytest

pytest.importorskip("textworld")

import textworld  # noqa: E402
import textworld.challenges  # noqa: E402
from textworld.generator.maker import GameMaker  # noqa: E402

import turngym.envs.textworld.walkthrough as walkthrough  # noqa: E402
from turngym.envs.textworld.games import _make_game, get_suite  # noqa: E402


def _serialized(game) -> str:
    return json.dumps(game.serialize(), sort_keys=True)


def _both_ways(monkeypatch, level: str, c: int) -> tuple[dict, dict]:
    """Candidate ``c`` of ``level``'s train split, made with the logic replay and then compiled."""
    fast = _make_game(textworld, get_suite(level), level, "train", c, set())
    monkeypatch.setattr(walkthrough, "compile_free_walkthroughs", contextlib.nullcontext)
    compiled = _make_game(textworld, get_suite(level), level, "train", c, set())
    monkeypatch.undo()
    return fast, compiled


# easy 0-3: coin collector at four levels; medium 1: a cooking game; hard 0: cooking over 9 rooms,
# where a walkthrough may open a door the logic has no action for there (with PYTHONHASHSEED=0,
# as the generator runs, "open screen door"): then TextWorld's compiled path records it (None: either)
@pytest.mark.parametrize("level,c,certain", [("easy", 0, True), ("easy", 1, True), ("easy", 2, True),
                                             ("easy", 3, True), ("medium", 1, True), ("hard", 0, None)])
def test_the_replayed_walkthrough_makes_the_compiled_game(monkeypatch, level, c, certain):
    calls = []
    replay = walkthrough.replay_walkthrough

    def counted(maker, commands):
        calls.append(replay(maker, commands))
        return calls[-1]

    monkeypatch.setattr(walkthrough, "replay_walkthrough", counted)
    fast, compiled = _both_ways(monkeypatch, level, c)
    assert len(calls) == 1 and certain in (None, calls[0] is not None)
    if compiled is None:  # out of the suite's walkthrough range: both skip it
        assert fast is None
        return
    assert fast["content_hash"] == compiled["content_hash"]
    assert _serialized(fast["game"]) == _serialized(compiled["game"])
    assert fast["objective"] == compiled["objective"] and fast["walkthrough"] == compiled["walkthrough"]


def _one_room_maker() -> tuple[GameMaker, object]:
    maker = GameMaker()
    room = maker.new_room("kitchen")
    maker.set_player(room)
    apple = maker.new(type="o", name="apple")
    room.add(apple)
    maker.quests = [textworld.generator.Quest(win_events=[
        textworld.generator.Event(conditions={maker.new_fact("in", apple, maker.inventory)})])]
    return maker, apple


def test_events_match_the_compiled_recording_on_a_hand_made_game():
    fast, _ = _one_room_maker()
    compiled, _ = _one_room_maker()
    with walkthrough.compile_free_walkthroughs():
        fast.set_walkthrough(["take apple"])
    compiled.set_walkthrough(["take apple"])
    (event_fast,), (event_compiled,) = fast.quests[0].win_events, compiled.quests[0].win_events
    assert event_fast.commands == event_compiled.commands == ("take apple",)
    assert [a.name for a in event_fast.actions] == [a.name for a in event_compiled.actions] == ["take"]
    assert event_fast == event_compiled


def test_a_command_the_logic_cannot_place_takes_the_compiled_path():
    maker, _ = _one_room_maker()
    # no action of the game's logic is "jump": the z-machine runs it and records no action (None)
    assert walkthrough.replay_walkthrough(maker, ["jump", "take apple"]) is None
    fast, _ = _one_room_maker()
    compiled, _ = _one_room_maker()
    with walkthrough.compile_free_walkthroughs():
        fast.set_walkthrough(["jump", "take apple"])  # falls back to TextWorld's compile
    compiled.set_walkthrough(["jump", "take apple"])
    assert fast.quests[0].win_events == compiled.quests[0].win_events
    assert fast.quests[0].win_events[0].commands == ("jump", "take apple")
    assert fast.quests[0].win_events[0].actions[0] is None


def test_playing_on_after_the_game_is_won_is_the_same_error():
    maker, _ = _one_room_maker()
    with pytest.raises(ValueError, match="ended before"):
        walkthrough.replay_walkthrough(maker, ["take apple", "drop apple"])
