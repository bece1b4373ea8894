"""Data-loading warnings, printed once per process.

Every env instance loads its data (a trainer may run dozens at once), and a warning about the
data ("10 of 411 tasks left out", "a record without an id") says the same thing each time.
``warn_once`` prints a message the first time only; ``forget_warnings`` re-arms them (tests).
"""

from __future__ import annotations

import logging
import threading
import warnings

_seen: set[str] = set()
_lock = threading.Lock()


def warn_once(message: str, *, logger: logging.Logger | None = None, stacklevel: int = 2) -> bool:
    """Warn about data once per process; the same message again is silent.

    Args:
        message: The complete text (two messages that differ are both printed).
        logger: Log it with ``logger.warning``; default: ``warnings.warn`` (a ``UserWarning``).
        stacklevel: As for ``warnings.warn``, counted from the caller.

    Returns:
        Whether the message was printed now.
    """
    with _lock:
        if message in _seen:
            return False
        _seen.add(message)
    if logger is not None:
        logger.warning("%s", message)
    else:
        warnings.warn(message, UserWarning, stacklevel=stacklevel + 1)
    return True


def forget_warnings() -> None:
    """Print every data warning again the next time it comes up."""
    with _lock:
        _seen.clear()
