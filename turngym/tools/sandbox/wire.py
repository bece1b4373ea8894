"""The host's end of the supervisor's wire format (``_runner.serve``), checked before it is believed.

An answer is one JSON head line, then ``stdout_len`` and ``stderr_len`` bytes. The real
supervisor caps both streams inside the sandbox, but the host cannot know that the bytes came
from it: a process that took over the channel (on Docker, a survivor that opened a restarted
supervisor's stdout) writes whatever it likes. So the host bounds the head line before it reads
it whole, checks the head's shape, and accepts no stream longer than what it asked for; anything
else is a ``MalformedAnswer``, which the backends turn into an error result, never an exception
out of a step.
"""

from __future__ import annotations

import json
import math

MAX_HEAD_BYTES = 1024  # a real head is ~150 bytes: seven numbers and two booleans
# Capture.value puts "\n...[N bytes of output truncated]...\n" between head and tail: at most 56 bytes.
TRUNCATION_MARKER_BYTES = 64
_MAX_COUNT = 2**62  # a byte count the host can still add up
_MAX_ELAPSED_S = 1e7


class MalformedAnswer(ValueError):
    """The sandbox's answer is not one its supervisor sends (too long, wrong shape, over the cap)."""


def max_stream_bytes(max_output: int) -> int:
    """The most bytes of one stream an answer to a request with ``max_output`` can hold."""
    return max(0, int(max_output)) + TRUNCATION_MARKER_BYTES


def parse_head(line: bytes, max_output: int) -> dict:
    """The checked head of an answer to a request that asked for at most ``max_output`` bytes.

    Returns:
        ``exit_code``, ``timed_out``, ``elapsed_s``, ``stdout_len``, ``stderr_len``,
        ``stdout_total`` and ``stderr_total``, each of its type and in its range.

    Raises:
        MalformedAnswer: Longer than ``MAX_HEAD_BYTES``, not a JSON object, a field missing, of
            the wrong type or out of range, or a stream longer than ``max_stream_bytes``.
    """
    if len(line) > MAX_HEAD_BYTES:
        raise MalformedAnswer(f"an answer head of more than {MAX_HEAD_BYTES} bytes")
    try:
        head = json.loads(line)
    except (ValueError, RecursionError):
        raise MalformedAnswer("an answer head that is not JSON") from None
    if type(head) is not dict:
        raise MalformedAnswer(f"an answer head that is a JSON {type(head).__name__}, not an object")
    cap = max_stream_bytes(max_output)
    return {
        "exit_code": _int(head, "exit_code", 1023),
        "timed_out": _bool(head, "timed_out"),
        "elapsed_s": _seconds(head, "elapsed_s"),
        "stdout_len": _int(head, "stdout_len", cap),
        "stderr_len": _int(head, "stderr_len", cap),
        "stdout_total": _int(head, "stdout_total", _MAX_COUNT),
        "stderr_total": _int(head, "stderr_total", _MAX_COUNT),
    }


def _int(head: dict, key: str, hi: int) -> int:
    v = head.get(key)
    if type(v) is not int or not 0 <= v <= hi:
        raise MalformedAnswer(f"an answer whose {key} is {_show(v)}, not an integer in [0, {hi}]")
    return v


def _bool(head: dict, key: str) -> bool:
    v = head.get(key)
    if type(v) is not bool:
        raise MalformedAnswer(f"an answer whose {key} is {_show(v)}, not a boolean")
    return v


def _seconds(head: dict, key: str) -> float:
    v = head.get(key)
    if type(v) not in (int, float) or not math.isfinite(v) or not 0 <= v <= _MAX_ELAPSED_S:
        raise MalformedAnswer(f"an answer whose {key} is {_show(v)}, not a number of seconds")
    return float(v)


def _show(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."
