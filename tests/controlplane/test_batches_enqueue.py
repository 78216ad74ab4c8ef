"""Batch services announce a wanted run; the Celery layer (connected at app start) enqueues it."""

import logging

from controlplane.batches import signals, tasks
from controlplane.batches.models import Batch


def test_a_wanted_run_is_enqueued_by_the_connected_receiver(monkeypatch):
    sent: list[str] = []
    monkeypatch.setattr(tasks.batch_run, "delay", sent.append)
    signals.batch_run_wanted.send(sender=Batch, batch_id="batch_abc")
    assert sent == ["batch_abc"]


def test_a_broker_outage_is_logged_not_raised(monkeypatch, caplog):
    def broker_down(batch_id):
        raise ConnectionError("broker unreachable")

    monkeypatch.setattr(tasks.batch_run, "delay", broker_down)
    with caplog.at_level(logging.WARNING, logger="tessera.batches"):
        signals.batch_run_wanted.send(sender=Batch, batch_id="batch_abc")
    assert "resume sweep" in caplog.text
