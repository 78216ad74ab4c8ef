"""The tenant's storage cap while a batch runs: no line is sent once its answer could not be kept.

A batch's output file counts against the tenant's cap (TESSERA_FILES_TENANT_MAX_BYTES); finalize keeps
the output within what the cap leaves and fails the rest (output.py). Checked only there, lines past
the cap were still sent, answered and billed, and then dropped. So the runner keeps a running count:

- this batch's stored answers: each line's record size (`BatchLine.output_bytes`, set by the same
  UPDATE that stores its answer, so the count cannot drift from the answers a killed runner left),
  summed once when a run starts, then added to in memory as this run stores answers: no query per
  line. Per line rather than a counter on the batch's row: no second write per answer, and no lock
  on the batch row (finalize holds it while it updates lines) taken after the line's;
- everything else the tenant stores: its files, and its other running batches' answers as their
  runners publish them with their lease (`Batch.output_bytes`), read again every second.

Once they reach the cap, every line not yet sent fails `storage_quota_exceeded` (no request, nothing
billed; a line a dead runner's attempt was billed for, its answer lost, says so instead). Near the cap, the runner sends no more lines than the room left holds at the mean size of
the batch's answers so far (one line at a time once fewer than one fits: an answer's size is known
only once it is answered). Lines in flight finish and are billed; those that pass the cap are failed
by finalize, the exact check. So at most TESSERA_BATCH_CONCURRENCY lines of a batch are answered past
the cap (all of the first claim when the tenant is near its cap before any of the batch's answers is
known), mostly one; batches of one tenant running at once may each pass it by the answers stored in
the second before the others' counts are read.
"""

from __future__ import annotations

import dataclasses

from django.db.models import Count, Sum

from . import conf, files
from .models import Batch, BatchLine
from .output import QUOTA_EXCEEDED
from .services import TERMINAL

NO_ESTIMATE = 1 << 30  # lines the cap allows while no answer of the batch is known yet


def not_run_error(cap: int) -> dict:
    """A line not sent, or whose attempts were refused or failed unbilled, once the cap is reached."""
    return {"code": QUOTA_EXCEEDED,
            "message": f"The request was not run (nothing was billed): the batch's answers already stored, with "
                       f"the tenant's other files, reached its storage cap of {cap} bytes. Delete files you no "
                       "longer need and send it again in a new batch."}


@dataclasses.dataclass
class Gauge:
    """What counts against the tenant's cap while a batch runs, in bytes."""

    cap: int
    own: int  # this batch's stored answers (their records in the output file)
    answers: int  # how many they are
    elsewhere: int = 0  # the tenant's files and its other running batches' answers

    def add(self, size: int) -> None:
        if size:
            self.own += size
            self.answers += 1

    def reached(self) -> bool:
        """No later answer can be kept: finalize would fail it (output.write)."""
        return self.own + self.elsewhere >= self.cap

    def claimable(self, in_flight: int) -> int:
        """How many more lines to send with `in_flight` out: as many as the room left holds at the mean
        answer so far, the ones in flight counted; one when none is out, so that only answers actually
        stored, never an estimate, fail a line."""
        left = self.cap - self.own - self.elsewhere
        if left <= 0:
            return 0
        if not self.answers:
            return NO_ESTIMATE
        fit = left * self.answers // self.own - in_flight
        return max(fit, 0 if in_flight else 1)


def elsewhere(*, tenant_id: int, batch_id: str) -> int:
    """The tenant's files, and the stored answers of its other batches still running (not yet files:
    a batch's files are stored in the transaction that ends it)."""
    running = (Batch.objects.filter(tenant_id=tenant_id).exclude(pk=batch_id).exclude(status__in=TERMINAL)
               .aggregate(n=Sum("output_bytes"))["n"] or 0)
    return files.tenant_bytes(tenant_id=tenant_id) + running


def gauge_of(*, batch: Batch) -> Gauge:
    """The count when a run starts: the answers stored by earlier runs of the batch included."""
    stored = BatchLine.objects.filter(batch_id=batch.pk, state=BatchLine.State.SUCCEEDED, output_bytes__gt=0) \
        .aggregate(n=Sum("output_bytes"), k=Count("id"))
    return Gauge(cap=conf.tenant_max_bytes(), own=stored["n"] or 0, answers=stored["k"],
                 elsewhere=elsewhere(tenant_id=batch.tenant_id, batch_id=batch.pk))
