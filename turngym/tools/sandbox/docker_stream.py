"""The host's end of ``docker exec`` streams: Docker multiplexes an exec's stdout and stderr on one
socket in frames (an 8-byte header: stream id, 3 pad bytes, big-endian size). ``read_frames``
reads a whole exec, capped; ``Server`` reads answers from a long-lived supervisor exec. Both
parse frames as bytes arrive (``Demux``) and keep only what the caller asked for, so the host's
memory stays bounded whatever arrives on the socket."""

from __future__ import annotations

import os
import select
import socket
import struct
import time

from turngym.tools.sandbox._runner import Capture
from turngym.tools.sandbox.wire import MalformedAnswer


def close_hijacked(sock, raw) -> None:
    """Close an exec's hijacked connection for good (closing the SDK's SocketIO wrapper alone
    leaves the socket open until garbage collection)."""
    for obj in (getattr(sock, "_response", None), sock, raw):
        try:
            if obj is not None:
                obj.close()
        except (OSError, ValueError):  # ValueError: a wrapper whose file was closed under it
            pass


class Demux:
    """Docker's multiplexed stream, parsed as it arrives: each frame's payload goes to ``sink(stream,
    bytes)`` piece by piece, so a frame is never held whole, whatever size its header claims."""

    def __init__(self, sink) -> None:
        self.sink = sink
        self.header = bytearray()
        self.stream, self.left = 0, 0  # the current frame's stream and its bytes still to come

    def feed(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        while view:
            if self.left == 0:
                take = 8 - len(self.header)
                self.header += view[:take]
                view = view[take:]
                if len(self.header) == 8:
                    self.stream, self.left = self.header[0], struct.unpack(">I", self.header[4:8])[0]
                    self.header.clear()
                continue
            part = view[:self.left]
            view = view[len(part):]
            self.left -= len(part)
            self.sink(self.stream, bytes(part))


def read_frames(sock, deadline: float, max_output: int) -> tuple[Capture, Capture, bool, int]:
    """Read Docker's multiplexed exec stream: both streams (capped), whether the deadline passed
    first, and the bytes read."""
    caps = {1: Capture(max_output), 2: Capture(max_output)}
    demux = Demux(lambda stream, data: caps.get(stream, caps[1]).add(data))
    n = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([sock], [], [], left)[0]:
            return caps[1], caps[2], True, n
        chunk = sock.recv(1 << 16)
        if not chunk:
            return caps[1], caps[2], False, n
        n += len(chunk)
        demux.feed(chunk)


class Server:
    """The host's end of a supervisor exec: a demultiplexed stdout, read up to a deadline and a
    size the caller sets (never more than one recv past it)."""

    def __init__(self, sock) -> None:
        self.sock, self.raw = sock, getattr(sock, "_sock", sock)
        self.out = bytearray()  # the supervisor's stdout, read but not yet taken
        self.demux = Demux(self._take)
        self.count = 0
        self.pid = os.getpid()  # the process that owns the socket

    def _take(self, stream: int, data: bytes) -> None:
        if stream == 1:  # stderr (stream 2) holds only the supervisor's own crash, if any
            self.out += data

    def alive(self) -> bool:
        """False when the supervisor has exited (its stream is at EOF); nothing is pending between requests."""
        if not select.select([self.raw], [], [], 0)[0]:
            return True
        try:
            return bool(self.raw.recv(1 << 16, socket.MSG_PEEK))
        except OSError:
            return False

    def unasked(self) -> bool:
        """Whether bytes came that no request asked for (the supervisor sends none between requests)."""
        if self.out:
            return True
        if not select.select([self.raw], [], [], 0)[0]:
            return False
        try:
            return bool(self.raw.recv(1, socket.MSG_PEEK))
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
        self.demux.feed(chunk)

    def read_line(self, deadline: float, limit: int) -> bytes:
        """One line (without its newline) of at most ``limit`` bytes.

        Raises:
            MalformedAnswer: ``limit`` bytes came and no newline among them.
        """
        while b"\n" not in self.out[:limit + 1]:
            if len(self.out) > limit:
                raise MalformedAnswer(f"an answer head of more than {limit} bytes")
            self._fill(deadline)
        i = self.out.index(b"\n")
        line = bytes(self.out[:i])
        del self.out[:i + 1]
        return line

    def read_n(self, n: int, deadline: float) -> bytes:
        while len(self.out) < n:
            self._fill(deadline)
        data = bytes(self.out[:n])
        del self.out[:n]
        return data

    def pending(self) -> int:
        """Bytes received past the last answer (the supervisor sends none between requests)."""
        return len(self.out)

    def close(self) -> None:
        close_hijacked(self.sock, self.raw)
