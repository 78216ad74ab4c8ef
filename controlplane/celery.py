"""The Celery app (minimal; created by billing, the first app with tasks).

Configured from Django settings (CELERY_* names); tasks are discovered in each app's tasks.py.

A broker outage is an event the processes ride out, not a failure (docs/reliability.md):
- workers retry the broker forever (Celery gives up after 100 attempts, ~50 minutes, by default and
  exits, which under a supervisor is a crash loop that reconnects no sooner), at most 5 s apart;
- a Redis broker that hangs instead of refusing fails a publish in seconds, so a management API call
  whose commit queued a message answers instead of hanging (the decision is in the database; the
  reconciler sends it again);
- beat logs one line when the broker goes, one a minute while it stays away and one when it is back,
  instead of a traceback per tick (its due tasks are skipped meanwhile, as before: the reconcile
  entry expires, the next tick after the outage runs it).
"""

import logging
import os

from celery import Celery
from celery.app.amqp import AMQP
from celery.beat import PersistentScheduler
from kombu import Connection

import fsbroker
from controlplane.deployments.outage_log import OutageLog

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings.base")

RECONNECT_MAX_SECONDS = 5.0


class QuickReconnectConnection(Connection):
    """Reconnect attempts 1, 2, ... 5 s apart instead of kombu's 2, 4, ... 30 s: the consumer that runs the
    reconciler finds the broker within 5 s of its return (a 60 s outage was followed by 12 s of nothing;
    test_broker_outage.py). The cost: Celery's own reconnect line every 5 s while the broker is away."""

    def ensure_connection(self, errback=None, max_retries=None, interval_start=1, interval_step=1,
                          interval_max=RECONNECT_MAX_SECONDS, *args, **kwargs):
        return super().ensure_connection(errback, max_retries, interval_start, interval_step,
                                         min(interval_max, RECONNECT_MAX_SECONDS), *args, **kwargs)


class QuickReconnectAMQP(AMQP):
    Connection = QuickReconnectConnection


fsbroker.install()  # `filesystem://`: kombu's transport with messages that appear whole (make run's broker)
app = Celery("tessera", amqp=QuickReconnectAMQP)
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.broker_connection_retry_on_startup = True
app.conf.broker_connection_max_retries = None  # forever
app.conf.beat_scheduler = "controlplane.celery:QuietScheduler"
app.autodiscover_tasks()

# Above the Redis transport's 1 s BRPOP wait (consumers), far below an HTTP client's patience (publishers).
REDIS_SOCKET_OPTIONS = {"socket_connect_timeout": 2.0, "socket_timeout": 2.0}


@app.on_after_configure.connect
def _redis_socket_timeouts(sender: Celery, **kwargs) -> None:
    if str(sender.conf.broker_url or "").startswith(("redis://", "rediss://")):
        sender.conf.broker_transport_options = {**REDIS_SOCKET_OPTIONS, **(sender.conf.broker_transport_options or {})}


class QuietScheduler(PersistentScheduler):
    """Beat's scheduler, with a broker outage logged as an outage (see the module's docstring)."""

    broker = OutageLog(logging.getLogger("tessera.celery.beat"), "the Celery broker (beat)")

    def apply_entry(self, entry, producer=None):  # noqa: ANN001 - celery's signature
        try:
            self.apply_async(entry, producer=producer, advance=False)
        except Exception as exc:  # noqa: BLE001 - beat's own handler logs the same, with a traceback
            self.broker.failed(exc, task=entry.task)
        else:
            self.broker.succeeded()
