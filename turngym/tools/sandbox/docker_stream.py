"""The host's end of ``docker exec`` streams: Docker multiplexes an exec's stdout and stderr on one
socket in frames (an 8-byte header: stream id, 3 pad bytes, big-endian size). ``read_frames``
reads a whole exec, capped; ``Server`` reads answers from a long-lived supervisor exec."""

from __future__ import annotations

import os
import select
import socket
import struct
import time

from turngym.tools.sandbox._runner import Capture


def close_hijacked(sock, raw) -> None:
    """Close an exec's hijacked connection for good (closing the SDK's SocketIO wrapper alone
    leaves the socket open until garbage collection)."""
    for obj in (getattr(sock, "_response", None), sock, raw):
        try:
            if obj is not None:
                obj.close()
        except (OSError, ValueError):  # ValueError: a wrapper whose file was closed under it
            pass


def read_frames(sock, deadline: float, max_output: int) -> tuple[Capture, Capture, bool, int]:
    """Read Docker's multiplexed exec stream (8-byte header: stream id, 3 pad, big-endian size):
    both streams (capped), whether the deadline passed first, and the bytes read."""
    caps = {1: Capture(max_output), 2: Capture(max_output)}
    buf = bytearray()
    n = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([sock], [], [], left)[0]:
            return caps[1], caps[2], True, n
        chunk = sock.recv(1 << 16)
        if not chunk:
            return caps[1], caps[2], False, n
        n += len(chunk)
        buf += chunk
        while len(buf) >= 8:
            stream, size = buf[0], struct.unpack(">I", buf[4:8])[0]
            if len(buf) < 8 + size:
                break
            caps.get(stream, caps[1]).add(bytes(buf[8:8 + size]))
            del buf[:8 + size]


class Server:
    """The host's end of a supervisor exec: a demultiplexed stdout, read up to a deadline."""

    def __init__(self, sock) -> None:
        self.sock, self.raw = sock, getattr(sock, "_sock", sock)
        self.frames = bytearray()  # raw multiplexed bytes not yet parsed
        self.out = bytearray()  # the supervisor's stdout
        self.count = 0
        self.pid = os.getpid()  # the process that owns the socket

    def alive(self) -> bool:
        """False when the supervisor has exited (its stream is at EOF); nothing is pending between requests."""
        if not select.select([self.raw], [], [], 0)[0]:
            return True
        try:
            return bool(self.raw.recv(1 << 16, socket.MSG_PEEK))
        except OSError:
            return False

    def take_count(self) -> int:
        n, self.count = self.count, 0
        return n

    def _fill(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([self.raw], [], [], left)[0]:
            raise TimeoutError("no answer from the sandbox supervisor")
        chunk = self.raw.recv(1 << 16)
        if not chunk:
            raise EOFError("the sandbox supervisor exited")
        self.count += len(chunk)
        self.frames += chunk
        while len(self.frames) >= 8:
            stream, size = self.frames[0], struct.unpack(">I", self.frames[4:8])[0]
            if len(self.frames) < 8 + size:
                break
            if stream == 1:  # stderr (stream 2) holds only the supervisor's own crash, if any
                self.out += self.frames[8:8 + size]
            del self.frames[:8 + size]

    def read_line(self, deadline: float) -> bytes:
        while b"\n" not in self.out:
            self._fill(deadline)
        line, _, rest = bytes(self.out).partition(b"\n")
        self.out = bytearray(rest)
        return line

    def read_n(self, n: int, deadline: float) -> bytes:
        while len(self.out) < n:
            self._fill(deadline)
        data = bytes(self.out[:n])
        del self.out[:n]
        return data

    def close(self) -> None:
        close_hijacked(self.sock, self.raw)
