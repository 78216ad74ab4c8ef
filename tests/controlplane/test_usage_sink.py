"""TESSERA_USAGE_SINK, the one pluggable seam between the meter and a ledger (controlplane/gateway/usage/sink.py):
a name that does not import, or is not callable, is refused when the app starts, not at a request's end
(where usage used to be logged as NOT recorded and dropped)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from billing.services import usage_record_ingest
from controlplane.gateway.usage.sink import check_usage_sink, usage_sink


def test_the_default_sink_is_the_ledger(settings):
    settings.TESSERA_USAGE_SINK = "billing.services.usage_record_ingest"
    assert usage_sink() is usage_record_ingest
    assert check_usage_sink() == []


def test_a_sink_that_does_not_import_fails_the_check(settings):
    settings.TESSERA_USAGE_SINK = "billing.services.usage_record_ingets"  # a typo
    [problem] = check_usage_sink()
    assert problem.id == "gateway.E001" and "usage_record_ingets" in problem.msg
    with pytest.raises(SystemCheckError, match="gateway.E001"):
        call_command("check")


def test_a_sink_that_is_not_callable_fails_the_check(settings):
    settings.TESSERA_USAGE_SINK = "billing.money.ZERO"
    [problem] = check_usage_sink()
    assert problem.id == "gateway.E002"


def test_a_process_with_a_missing_sink_does_not_start(tmp_path):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings.base",
           "TESSERA_USAGE_SINK": "billing.nowhere.ingest", "TESSERA_VAR_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", "import django; django.setup(); print('served')"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "served" not in done.stdout
    assert "ImproperlyConfigured" in done.stderr and "billing.nowhere.ingest" in done.stderr
