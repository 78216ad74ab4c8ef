"""The usage spool: where the usage path writes while the database does not answer.

Each gateway process owns one append-only file in TESSERA_USAGE_SPOOL_DIR, held under an exclusive
`flock` for the life of the process. While PostgreSQL is away, the usage writer (usage_writer.py)
appends what it would have committed: journal rows of requests about to be sent to a worker
(`admit`, `moved` when a retry picks another worker), usage events of finished ones (`event`) and
failed limiter settlements (`unsettled`), one
JSON line each, and `fsync`s the batch before anything waits on it returns: a journal row is on
disk before its request goes to a worker, as it would be in the database.

Replay (`replay_file`) applies a file's records in order, in transactions of REPLAY_CHUNK records,
idempotently on the request id: events through the ledger's idempotent ingest, journal rows with
`ignore_conflicts`, and a journal row whose event is in the same file is not written at all (the
request is already finished). A crash mid-replay replays again: nothing is billed twice. The owner
replays its own file when the database answers again; a file whose lock nobody holds belongs to a
dead process and any gateway (or `manage.py usage_spool_replay`) replays and removes it.

Full: a file that would grow past TESSERA_USAGE_SPOOL_MAX_BYTES, or a disk that refuses the write,
raises SpoolFull: new requests are refused (503) rather than served unbilled.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import errno
import fcntl
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
from django.db import transaction

from billing.events import UsageEvent
from controlplane.gateway.dependencies import dependency_of
from controlplane.gateway.usage import journal
from controlplane.gateway.usage.journal import Admission
from controlplane.gateway.usage.sink import usage_sink

log = logging.getLogger("tessera.gateway")

ADMIT, EVENT, UNSETTLED, MOVED = "admit", "event", "unsettled", "moved"
SUFFIX = ".spool"
REPLAY_CHUNK = 500


class SpoolFull(OSError):
    """The spool cannot take more: the caller refuses new work."""


@dataclasses.dataclass(frozen=True, slots=True)
class Unsettled:
    """A request whose limiter settlement failed, with its final counts (journal.mark_unsettled)."""

    request_id: str
    prompt: int
    cached: int
    completion: int


@dataclasses.dataclass(frozen=True, slots=True)
class Moved:
    """A request sent to another worker after the first failed to connect (journal.move)."""

    request_id: str
    worker_url: str


def _encode(kind: str, item) -> bytes:
    return orjson.dumps({"k": kind, "v": dataclasses.asdict(item), "at": time.time()}) + b"\n"


def _decode(line: bytes):
    record = orjson.loads(line)
    kind, value = record["k"], record["v"]
    if kind == ADMIT:
        value["created_at"] = dt.datetime.fromisoformat(value["created_at"])
        value["period_start"] = dt.date.fromisoformat(value["period_start"])
        return kind, Admission(**value), record.get("at", 0.0)
    if kind == EVENT:
        value["created_at"] = dt.datetime.fromisoformat(value["created_at"])
        fields = {f.name for f in dataclasses.fields(UsageEvent)}
        return kind, UsageEvent(**{k: v for k, v in value.items() if k in fields}), record.get("at", 0.0)
    if kind == UNSETTLED:
        return kind, Unsettled(**value), record.get("at", 0.0)
    if kind == MOVED:
        return kind, Moved(**value), record.get("at", 0.0)
    raise ValueError(f"unknown spool record kind {kind!r}")


def read_records(path: Path) -> Iterator[tuple[str, object, float]]:
    """The file's records in order. A torn last line (the process died inside a write, before its
    fsync returned, so nothing waited on it) is skipped; any other unreadable line is logged and skipped."""
    data = path.read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1]:
        log.warning("spool file ends in a torn record; ignoring it", extra={"path": str(path)})
    for line in lines[:-1]:
        if not line:
            continue
        try:
            yield _decode(line)
        except (ValueError, TypeError, KeyError) as exc:
            log.error("unreadable spool record skipped", extra={"path": str(path), "error": repr(exc),
                                                                "record": line[:2000].decode("utf-8", "replace")})


class _File:
    """One spool file, held open and locked by this process."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        name = f"usage-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        # Locked under a name replayers do not list, then renamed: no replayer can ever take a live
        # process's file for a dead one's (the lock is ours while we live).
        staging = directory / f".{name}.new"
        self.fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.path = directory / f"{name}{SUFFIX}"
        os.rename(staging, self.path)
        _fsync_dir(directory)  # the file's name is durable before any record in it is relied on
        self.size = 0
        self.records = 0

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        _fsync_dir(self.path.parent)
        os.close(self.fd)


class Spool:
    """This process's spool: the file being appended to, and sealed files being replayed, oldest first.

    Replay goes a chunk at a time (`replay_step`), so the usage writer keeps taking new work between
    chunks (spooled behind the backlog) instead of making requests wait for the whole backlog."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.current: _File | None = None
        self.sealed: list[_File] = []
        self._pass: _Pass | None = None

    @property
    def path(self) -> Path | None:
        return self.current.path if self.current is not None else None

    @property
    def paths(self) -> list[Path]:
        return [f.path for f in self.sealed] + ([self.current.path] if self.current is not None else [])

    @property
    def size(self) -> int:
        return sum(f.size for f in self.sealed) + (self.current.size if self.current is not None else 0)

    @property
    def records(self) -> int:
        return sum(f.records for f in self.sealed) + (self.current.records if self.current is not None else 0)

    @property
    def pending(self) -> bool:
        return bool(self.sealed) or (self.current is not None and self.current.size > 0)

    def append(self, items: list[tuple[str, object]]) -> None:
        """Write and fsync; SpoolFull when the spool would pass its cap or the disk refuses."""
        data = b"".join(_encode(kind, item) for kind, item in items)
        if self.size + len(data) > self.max_bytes:
            raise SpoolFull(errno.ENOSPC, f"usage spool is full ({self.size} of {self.max_bytes} bytes)")
        try:
            if self.current is None:
                self.current = _File(self.directory)
            view = memoryview(data)
            while view:
                written = os.write(self.current.fd, view)
                view = view[written:]
            os.fsync(self.current.fd)
        except OSError as exc:
            # Cut a short write off again, so the next append starts on a line of its own; what waited
            # on this batch is told it failed (its requests are refused).
            if self.current is not None:
                try:
                    os.ftruncate(self.current.fd, self.current.size)
                except OSError:
                    log.exception("could not cut a failed spool write off", extra={"path": str(self.current.path)})
            raise SpoolFull(exc.errno or errno.EIO, f"usage spool write failed: {exc}") from exc
        self.current.size += len(data)
        self.current.records += len(items)

    def replay_step(self, chunk: int = REPLAY_CHUNK) -> bool:
        """Apply the next `chunk` records to the database; True once nothing is left. Raises (the
        database is away) with nothing lost: a sealed file is replayed from its start again."""
        if not self.sealed:
            if self.current is None or not self.current.size:
                return True
            self.sealed.append(self.current)  # new records go to a new file, replayed after this one
            self.current = None
        if self._pass is None:
            self._pass = _Pass(self.sealed[0].path)
        done = self._pass.step(chunk)  # raises with its position kept: the chunk is tried again
        if done:
            self.sealed.pop(0).remove()
            self._pass = None
        return not self.pending

    def replay(self) -> int:
        """Replay everything now (tests, and the CLI); returns the records applied."""
        applied = self.records
        while not self.replay_step():
            pass
        return applied


class _Pass:
    """Replaying one file: its records, read once, applied a chunk at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records = list(read_records(path))
        self.finished = {item.request_id for kind, item, _ in self.records if kind == EVENT}
        self.owed = {item.request_id for kind, item, _ in self.records if kind == UNSETTLED}
        self.position = 0

    def step(self, chunk: int) -> bool:
        records = self.records[self.position:self.position + chunk]
        _apply_chunk(self.path, records, self.finished, self.owed)
        self.position += len(records)
        if self.position >= len(self.records) and self.records:
            log.info("usage spool replayed", extra={"path": str(self.path), "records": len(self.records)})
        return self.position >= len(self.records)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _apply_chunk(path: Path, records: list, finished: set[str], owed: set[str]) -> None:
    """Apply records in one transaction; a record the ledger refuses is dead-lettered, the rest applied.
    Raises when the database is away (nothing of the chunk is applied then)."""
    sink = usage_sink()

    def apply(chunk) -> None:
        with transaction.atomic():
            # A finished request needs no journal row, unless its settlement is owed (the sweeper's).
            journal.insert([item for kind, item, _ in chunk if kind == ADMIT
                            and (item.request_id not in finished or item.request_id in owed)], ignore_conflicts=True)
            for kind, item, _ in chunk:
                if kind == UNSETTLED:
                    journal.mark_unsettled_sync(item.request_id, item.prompt, item.cached, item.completion)
                elif kind == MOVED:
                    journal.move_sync(item.request_id, item.worker_url)
            events = [item for kind, item, _ in chunk if kind == EVENT]
            for event in events:
                sink(event=event)
            journal.forget(event.request_id for event in events)

    try:
        apply(records)
        return
    except Exception as exc:
        if dependency_of(exc) is not None:
            raise  # the database is away again: replayed later (idempotent)
    for record in records:  # one record is refused (a bug, a version skew): set it aside, go on
        try:
            apply([record])
        except Exception as exc:
            if dependency_of(exc) is not None:
                raise
            _dead_letter(path.parent, record, exc)


def replay_file(path: Path) -> int:
    """Apply a spool file's records in order (idempotent); returns how many were applied."""
    replay = _Pass(path)
    while not replay.step(REPLAY_CHUNK):
        pass
    return len(replay.records)


def _dead_letter(directory: Path, record: tuple, exc: BaseException) -> None:
    kind, item, at = record
    log.error("spooled usage record refused by the ledger; dead-lettered",
              extra={"kind": kind, "request_id": getattr(item, "request_id", ""), "error": repr(exc)})
    line = orjson.dumps({"k": kind, "v": dataclasses.asdict(item), "at": at, "reason": f"{type(exc).__name__}: {exc}"})
    with (directory / "dead-letter.jsonl").open("ab") as handle:
        handle.write(line + b"\n")
        handle.flush()
        os.fsync(handle.fileno())


def replay_abandoned(directory: Path, *, exclude: Path | None = None) -> int:
    """Replay and remove the spool files of dead processes (their lock is free). Returns records applied."""
    directory = Path(directory)
    if not directory.is_dir():
        return 0
    applied = 0
    for path in sorted(directory.glob(f"*{SUFFIX}")):
        if exclude is not None and path == exclude:
            continue
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:  # another replayer took it
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its process is alive: it replays its own file
            if not path.exists():  # replayed and removed between our listing and our lock
                continue
            applied += replay_file(path)
            path.unlink()
            _fsync_dir(directory)
        finally:
            os.close(fd)
    return applied


def directory_state(directory: Path) -> dict[str, float]:
    """Bytes, files and the oldest file's age in the spool directory (for the metrics)."""
    directory = Path(directory)
    now = time.time()
    total, count, oldest = 0, 0, 0.0
    for path in directory.glob(f"*{SUFFIX}") if directory.is_dir() else ():
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        if stat.st_size:
            total += stat.st_size
            count += 1
            oldest = max(oldest, now - _first_record_time(path, stat.st_mtime))
    return {"bytes": float(total), "files": float(count), "oldest_seconds": oldest}


def _first_record_time(path: Path, fallback: float) -> float:
    try:
        with path.open("rb") as handle:
            return float(orjson.loads(handle.readline()).get("at", fallback))
    except (OSError, ValueError):
        return fallback
