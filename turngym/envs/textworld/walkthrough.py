"""Recording a generated game's walkthrough events on TextWorld's own logic, without a compile.

TextWorld's challenge generators call ``GameMaker.set_walkthrough(commands)``, which compiles the
game (an Inform 7 and an Inform 6 run, about half of a game's generation time), plays the commands
in the z-machine, and stores in each quest event the actions and commands that led to it. Then the
final game is compiled again, from a source that differs in its objective text, so the first
compile cannot be reused.

``replay_walkthrough`` plays the same commands on the game's logic instead (``GameProgression``,
what TextWorld's own state tracking runs beside the z-machine): each command is the action whose
command text it is among the valid actions, picked as TextWorld picks it from the compiled game's
report. Where that is not certain (a command matches no valid action, or actions the game would
report differently), it returns ``None`` and the compiled path runs as before.
``tests/test_textworld_walkthrough.py`` compares both ways' serialized games, and
``benchmarks/game_generation.py`` the quickstart's games' hashes. ``compile_free_walkthroughs``
installs it around a generator call.
"""

from __future__ import annotations

import contextlib
from typing import Any


def replay_walkthrough(maker: Any, commands: list[str]) -> list[tuple[Any, list, list[str]]] | None:
    """What ``set_walkthrough`` would write: ``(event, actions, commands)`` for each quest event the
    commands trigger, or ``None`` where the game's logic cannot say for certain.

    Mirrors ``set_walkthrough``: builds the game (``maker.build()``, as its compile does, with the
    same side effects on the maker) and writes its Inform 7 source (which settles the objective
    text the final build keeps), then steps ``GameProgression`` command by command. Events are
    keyed as there: by equality, the maker's first such event standing for the equal ones.
    """
    from textworld.generator.game import GameProgression
    from textworld.generator.inform7 import Inform7Game, generate_inform7_source

    game = maker.build()
    maker._working_game = game
    generate_inform7_source(game)  # the compiled path's side effects: the objective, the names
    inform7 = Inform7Game(game)
    progression = GameProgression(game, track_quests=True)
    keys = {event: event for quest in maker.quests for event in quest.win_events}
    watched = [ep for qp in progression.quest_progressions for ep in qp.win_events]
    recorded = {}
    actions = []
    for i, command in enumerate(commands):
        if progression.completed or progression.failed:
            raise ValueError("Game has ended before finishing playing all commands.")  # as set_walkthrough
        valid = progression.valid_actions
        matches = [a for a, c in zip(valid, inform7.gen_commands_from_actions(valid)) if c == command.strip()]
        # The compiled game runs the command and reports its Inform 7 event; TextWorld takes the
        # valid action that event names (``detect_action``: most preconditions first). Where the
        # actions this command can be share one event, that is the one; else the parser decides.
        events = {_event_text(inform7, a) for a in matches}
        if len(events) != 1:
            return None  # no action, or the z-machine's parser decides: leave it to the compiled path
        action = inform7.detect_action(events.pop(), valid)
        if action is None:
            return None
        before = [ep.triggered for ep in watched]
        progression.update(action)
        actions.append(action)
        for was, ep in zip(before, watched):
            if not was and ep.triggered:
                recorded[keys[ep.event]] = (list(actions), commands[: i + 1])
    return [(event, *hit) for event, hit in recorded.items()]


def _event_text(inform7: Any, action: Any) -> str:
    """The Inform 7 event the compiled game reports for ``action`` (as ``Inform7Game.detect_action`` reads it)."""
    return inform7.kb.inform7_events[action.name].format(**inform7._get_name_mapping(action))


def _set_walkthrough(original):
    def set_walkthrough(self, commands):
        recorded = replay_walkthrough(self, commands)
        if recorded is None:
            return original(self, commands)
        for event, actions, played in recorded:  # looked up first, written after: an event hashes its actions
            event.actions, event.commands = actions, played
    return set_walkthrough


@contextlib.contextmanager
def compile_free_walkthroughs():
    """While inside, ``GameMaker.set_walkthrough`` records on the game's logic where it is certain."""
    from textworld.generator.maker import GameMaker

    original = GameMaker.set_walkthrough
    GameMaker.set_walkthrough = _set_walkthrough(original)
    try:
        yield
    finally:
        GameMaker.set_walkthrough = original
