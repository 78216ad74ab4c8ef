"""The non-HTTP doors: every manage.py command and every Celery task runs with its own audit origin.

Commands are wrapped at `BaseCommand.execute`, once, so Django's own (createsuperuser,
changepassword) and every future command are covered without each author remembering; a command
run inside another context (a task calling call_command) keeps the outer actor. The OS user and
host are kept in `via`: "system:manage.py key_revoke" alone would not say who ran it.
"""

from __future__ import annotations

import getpass
import socket

from celery.signals import task_postrun, task_prerun
from django.core.management.base import BaseCommand

from . import context
from .models import Channel

_task_tokens: dict[str, object] = {}


def _os_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in some containers
        return "?"


def command_origin(name: str) -> context.Origin:
    return context.Origin(
        channel=Channel.CLI, via=f"manage.py {name} (os user {_os_user()} on {socket.gethostname()})"[:300],
        request_id=context.new_request_id(), system_actor=f"system:manage.py {name}",
    )


def install_command_hook() -> None:
    if getattr(BaseCommand.execute, "_audited", False):
        return
    original = BaseCommand.execute

    def execute(self, *args, **options):
        if context.is_set():
            return original(self, *args, **options)
        name = self.__class__.__module__.rsplit(".", 1)[-1]
        with context.acting(command_origin(name)):
            return original(self, *args, **options)

    execute._audited = True
    BaseCommand.execute = execute


def _task_started(sender=None, task_id=None, task=None, **kwargs) -> None:
    name = getattr(task, "name", None) or getattr(sender, "name", "task")
    origin = context.Origin(channel=Channel.TASK, via=f"task {name}"[:300], request_id=str(task_id or "")[:64],
                            system_actor=f"system:task {name}")
    _task_tokens[task_id] = context.push(origin)


def _task_finished(sender=None, task_id=None, **kwargs) -> None:
    token = _task_tokens.pop(task_id, None)
    if token is not None:
        try:
            context.pop(token)
        except ValueError:  # reset from another context (should not happen): leave it to the next task
            pass


def install_task_hooks() -> None:
    task_prerun.connect(_task_started, weak=False, dispatch_uid="audit_task_started")
    task_postrun.connect(_task_finished, weak=False, dispatch_uid="audit_task_finished")
