"""Start an OpenAI-compatible server as a user would (its CLI, a subprocess) and wait until healthy."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(cmd_for_port: Callable[[int], list[str]], log_path: Path, *, name: str, startup_s: float,
                   env: dict | None = None, poll_s: float = 1.0) -> Iterator[str]:
    """Run ``cmd_for_port(port)`` until its ``/health`` answers 200; yield its base URL; stop it.

    ``startup_s`` is a hang guard for start-up, not a timing assertion. A server that exits or
    never becomes healthy fails the test with the tail of its log.
    """
    import httpx

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd_for_port(port), stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + startup_s
        try:
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"{name} exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    pytest.fail(f"{name} did not become healthy within {startup_s:g} s")
                time.sleep(poll_s)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
