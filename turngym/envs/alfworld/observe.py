"""What the agent reads in ALFWorld: the system prompt, and the admissible commands appended to each
observation.

The field's ALFWorld prompts (verl-agent's and GiGPO's ``ALFWORLD_TEMPLATE``, SPA-RL's) list every
admissible command at every step. Most of that list is the same every turn: one ``go to X`` per
receptacle of the room (50 of a kitchen's 55 commands at the start), about 200 tokens a step in
SmolLM2's tokenizer. An episode here is one growing conversation, so a 50-turn episode would carry
50 copies of it (over 10,000 tokens, beyond SmolLM2's 8,192-token context), and on a CPU a policy's
time goes by the tokens it reads. ``compact`` lists the same commands in fewer tokens:

- the ``go to`` commands folded into one entry naming the receptacles left out (the intro lists the
  room's receptacles);
- the objects of ``take`` commands from one receptacle, and of ``examine`` commands, listed once:
  ``take bowl 2, mug 1 from diningtable 1`` stands for ``take bowl 2 from diningtable 1`` and
  ``take mug 1 from diningtable 1``;
- ``help`` dropped (it prints the verbs the system prompt names);
- no list after a step that left it as it was (a refused command, ``look``, ``examine``): the last
  one shown still holds. Most steps of a failing episode are such repeats.
"""

from __future__ import annotations

import re

ADMISSIBLE_STYLES = ("compact", "all", "none")

SYSTEM_PROMPT = (
    "You are a household robot in a room, given a task. Explore, then act with one short command per turn, such "
    "as 'go to desk 1', 'open drawer 2', 'close drawer 2', 'take mug 1 from desk 1', 'move mug 1 to shelf 1', "
    "'heat mug 1 with microwave 1', 'cool mug 1 with fridge 1', 'clean mug 1 with sinkbasin 1', 'use desklamp 1', "
    "'examine mug 1', 'inventory' or 'look'.{listed} {how}"
)
LISTED = {"all": " Each observation ends with the commands admissible now.",
          "compact": " An observation ends with the commands admissible now when they changed."}
HOW = {
    "text": "Reply with exactly one command per turn, on a single line, and nothing else.",
    "default": "Send each command by calling the `act` tool, one call per turn.",
}
GO_TO = "go to "
_TAKE = re.compile(r"^take (.+) from (.+)$")
_EXAMINE = "examine "


def system_prompt(tool_format: str, style: str) -> str:
    """The system message for a tool format (``text`` or a tool-call format) and admissible style."""
    return SYSTEM_PROMPT.format(listed=LISTED.get(style, ""),
                                how=HOW["text"] if tool_format == "text" else HOW["default"])


def room_places(commands: list[str]) -> tuple[str, ...]:
    """The receptacles a ``go to`` reaches, from the opening's admissible commands (the agent starts
    in the middle of the room, where every receptacle is one ``go to`` away)."""
    return tuple(c[len(GO_TO):] for c in commands if c.startswith(GO_TO))


def admissible_text(commands: list[str], style: str, places: tuple[str, ...] = (),
                    previous: list[str] | None = None) -> str:
    """The line appended to an observation (``""`` for style ``none``, and for ``compact`` when the
    commands are the ``previous`` ones).

    Args:
        commands: The admissible commands now, as the engine gives them (sorted).
        style: ``all`` (every command, as ALFWorld lists them), ``compact`` (see the module
            docstring) or ``none``.
        places: The room's receptacles (``room_places``), for ``compact``.
        previous: The admissible commands the agent was last shown, for ``compact``.

    Raises:
        ValueError: an unknown style.
    """
    if style not in ADMISSIBLE_STYLES:
        raise ValueError(f"admissible must be one of {', '.join(ADMISSIBLE_STYLES)}, got {style!r}")
    if style == "none":
        return ""
    if style == "all":
        return "Admissible commands: " + ", ".join(commands) + "."
    if previous is not None and list(commands) == list(previous):
        return ""
    targets = [c[len(GO_TO):] for c in commands if c.startswith(GO_TO)]
    rest = [c for c in commands if not c.startswith(GO_TO) and c != "help"]
    return "Admissible commands: " + ", ".join(_fold_go_to(targets, places) + _group_objects(rest)) + "."


def _fold_go_to(targets: list[str], places: tuple[str, ...]) -> list[str]:
    """The ``go to`` entries: one for the whole room, or the room but one or two receptacles; each
    command written out where the targets are not such a set."""
    missing = [p for p in places if p not in set(targets)]
    if places and set(targets) <= set(places) and len(missing) <= 2 and len(targets) > 2:
        but = f" but {' or '.join(missing)}" if missing else ""
        return [f"go to (any receptacle of the room{but})"]
    return [GO_TO + t for t in targets]


def _group_objects(commands: list[str]) -> list[str]:
    """``take`` commands from one receptacle, and ``examine`` commands, as one entry each listing
    their objects (in the engine's order), where the group's first command stood."""
    groups: dict[str, list[str]] = {}
    slots: list[str] = []
    for c in commands:
        m = _TAKE.match(c)
        key, obj = (f"take|{m.group(2)}", m.group(1)) if m else (("examine|", c[len(_EXAMINE):])
                                                                 if c.startswith(_EXAMINE) else (c, ""))
        if key not in groups:
            groups[key] = []
            slots.append(key)
        if obj:
            groups[key].append(obj)
    out = []
    for key in slots:
        verb, _, target = key.partition("|")
        if not groups[key]:
            out.append(key)
        elif verb == "take":
            out.append(f"take {', '.join(groups[key])} from {target}")
        else:
            out.append(f"examine {', '.join(groups[key])}")
    return out
