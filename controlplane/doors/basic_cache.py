"""A short memory of passwords the management API's HTTP Basic sign-in has already verified.

Django stores passwords as PBKDF2 with a million iterations: about 0.4 s of CPU on a 2-core AVX2 EPYC
(1 s under load), paid on every Basic-authenticated call, since Basic has no session. An
operator's script of a few calls a second, or a fuzzer, then keeps the control plane's cores busy
hashing. After a full check succeeds, the pair (username, password) is remembered for
TTL_SECONDS as an HMAC under a key that lives only in this process's memory, beside the user's
primary key and stored hash. A later call with the same pair costs a hash and three indexed reads.

What a remembered pair still has to pass on every call (doors/drf.py checks it):
- the user row as it is now: active, and the same stored hash (a changed password, or a password
  set unusable, forgets it at once);
- password sign-in still on (TESSERA_ADMIN_PASSWORD_LOGIN), the lockout (doors/lockout.py), and the
  second-factor rule (doors/drf.py).
Only successes are remembered: every wrong password still runs the full check and counts toward the
lockout. The memory holds at most MAX_ENTRIES pairs; the HMAC key is new in each process, so nothing
remembered is useful outside it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass

TTL_SECONDS = 60.0
MAX_ENTRIES = 4096

_KEY = secrets.token_bytes(32)
_lock = threading.Lock()


@dataclass(frozen=True)
class Remembered:
    user_pk: int
    stored_hash: str
    until: float  # time.monotonic()


_memory: dict[bytes, Remembered] = {}


def _digest(username: str, password: str) -> bytes:
    return hmac.new(_KEY, f"{username}\x00{password}".encode("utf-8", "surrogatepass"), hashlib.sha256).digest()


def recall(username: str, password: str) -> Remembered | None:
    digest = _digest(username, password)
    with _lock:
        found = _memory.get(digest)
        if found is not None and found.until <= time.monotonic():
            del _memory[digest]
            return None
    return found


def remember(username: str, password: str, *, user_pk: int, stored_hash: str) -> None:
    digest = _digest(username, password)
    now = time.monotonic()
    with _lock:
        if len(_memory) >= MAX_ENTRIES:
            for old in [d for d, r in _memory.items() if r.until <= now] or list(_memory)[: MAX_ENTRIES // 4]:
                del _memory[old]
        _memory[digest] = Remembered(user_pk, stored_hash, now + TTL_SECONDS)


def forget_all() -> None:
    with _lock:
        _memory.clear()
