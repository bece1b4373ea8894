"""Engines for tests/test_engine.py; ``EngineProcess`` imports them in its child by name."""

import os
import time


class ToyEngine:
    """Answers, sleeps, raises, floods stdout or dies on request."""

    def __init__(self, greeting: str = "hi") -> None:
        self.greeting, self.calls = greeting, 0

    def echo(self, x):
        self.calls += 1
        return (self.greeting, x, self.calls)

    def load(self, path: str) -> None:
        # Hangs the first time a "<marker>:hang-once" path is loaded (the marker file remembers).
        marker, _, mode = path.partition(":")
        if mode == "hang-once" and not os.path.exists(marker):
            open(marker, "w").close()
            time.sleep(3600)
        self.path = path

    def reset(self) -> str:
        return self.path

    def step(self, seconds: float) -> str:
        time.sleep(seconds)
        return self.path

    def raw(self) -> object:
        return object()  # not JSON: the child must say so, not crash

    def pid(self) -> int:
        return os.getpid()

    def sleep(self, seconds: float) -> str:
        time.sleep(seconds)
        return "awake"

    def boom(self) -> None:
        raise ValueError("the engine refuses")

    def flood(self) -> None:
        line = b"x" * 65536
        while True:  # like Jericho on "\help": endless output, never returns
            os.write(1, line)
            os.write(2, line)

    def die(self) -> None:
        os._exit(3)
