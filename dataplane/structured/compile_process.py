"""Grammar compiles with a deadline: first in a child process that is killed when it overruns it.

Why a process: xgrammar (0.2.8) has no timeout or interrupt for compiling, and a Python thread
cannot be stopped, so a hostile schema compiled in-process burns a core until it is done (a
64 KiB schema of ~1,400 string properties with distinct maxLength compiles for ~10 minutes at
~0.45 s each, and needs GBs). A child compiles it first; at the deadline the child is killed
(SIGKILL) and the next compile starts a fresh one.

The child's grammar is not shipped back: xgrammar's serialization costs more than compiling
(a 7.6 MB grammar that compiles in 1.8 s serializes to 87 MB of JSON in 3.6 s and deserializes in
0.9 s: 8.7 s end to end). The child is a probe: once it has compiled within the deadline, the
backend compiles the same grammar in-process (the same deterministic work, so it takes as long),
for ~2x the compile time on a first compile (cached after) instead of ~5x.

`CompilePool` holds `size` children; a compile waits for a free one (at most `wait` seconds, then
CompileBusy, which the worker answers 429) and then has its own deadline, so a runaway compile
delays later ones by at most the deadline and never takes more than one child's core.
"""

from __future__ import annotations

import json
import os
import queue
import select
import struct
import subprocess
import sys
import time
import weakref
from pathlib import Path

from dataplane.errors import QueueFullError

_LEN = struct.Struct("!Q")
_CHILD = Path(__file__).with_name("compile_child.py")
# Starting a child imports xgrammar (which imports torch): ~1.5 s; not charged to a request's deadline.
START_TIMEOUT = 120.0


class CompileTimeout(Exception):
    """The compile did not finish within its deadline; the child that ran it was killed."""


class CompileFailed(Exception):
    """xgrammar refused the grammar (the message is xgrammar's) or the child died compiling it."""


class CompileBusy(QueueFullError):
    """Every compile child stayed busy for as long as a request may wait for one."""


class _Child:
    def __init__(self, tokenizer_info_json: bytes, max_threads: int) -> None:
        self.proc = subprocess.Popen([sys.executable, str(_CHILD), str(max_threads)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, close_fds=True)
        # Reaped with its handle (an engine dropped without close(), interpreter exit).
        self._finalizer = weakref.finalize(self, _stop, self.proc)
        self._send(tokenizer_info_json)
        try:
            ready = self._recv(time.monotonic() + START_TIMEOUT)
        except CompileTimeout:
            ready = None
        if ready != b"R":
            self.kill()
            raise CompileFailed(f"the grammar compiler did not start (exit status {self.proc.returncode})")

    def compile(self, kind: str, text: str, timeout: float) -> None:
        self._send(json.dumps({"kind": kind, "text": text}).encode())
        reply = self._recv(time.monotonic() + timeout)
        if reply is None:
            self.kill()
            raise CompileFailed(f"the grammar compiler exited (status {self.proc.returncode})")
        if reply[:1] == b"E":
            raise CompileFailed(reply[1:].decode(errors="replace"))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        self._finalizer()

    def _send(self, payload: bytes) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(_LEN.pack(len(payload)) + payload)
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # the child died; the read below sees EOF

    def _recv(self, deadline: float) -> bytes | None:
        head = self._read(_LEN.size, deadline)
        return None if head is None else self._read(_LEN.unpack(head)[0], deadline)

    def _read(self, n: int, deadline: float) -> bytes | None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        buf = bytearray()
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.kill()
                raise CompileTimeout
            chunk = os.read(fd, min(n - len(buf), 1 << 20))
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()


class CompilePool:
    def __init__(self, tokenizer_info_json: str, size: int = 1, max_threads: int = 2) -> None:
        if size < 1:
            raise ValueError(f"grammar_compile_processes: must be >= 1, got {size}")
        self._info = tokenizer_info_json.encode()
        self._max_threads = max_threads
        self._idle: queue.SimpleQueue[_Child | None] = queue.SimpleQueue()
        for _ in range(size):
            self._idle.put(None)  # a slot; its child starts on first use
        self.num_killed = 0

    def compile(self, kind: str, text: str, timeout: float, wait: float) -> None:
        """Returns once a child has compiled the grammar. CompileTimeout past `timeout` s of compiling,
        CompileBusy if no child frees up within `wait` s, CompileFailed if xgrammar refuses it."""
        try:
            child = self._idle.get(timeout=wait)
        except queue.Empty:
            raise CompileBusy(f"every grammar compiler stayed busy for {wait:g} s") from None
        try:
            if child is None or not child.alive():
                child = _Child(self._info, self._max_threads)
            try:
                child.compile(kind, text, timeout)
            except CompileTimeout:
                self.num_killed += 1
                raise
        except BaseException:
            if child is not None and not child.alive():
                child = None
            raise
        finally:
            self._idle.put(child)

    def close(self) -> None:
        while True:
            try:
                child = self._idle.get_nowait()
            except queue.Empty:
                return
            if child is not None:
                child.kill()
