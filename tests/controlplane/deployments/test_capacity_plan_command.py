"""A replica's ready report stores its load curve; `manage.py capacity_plan` plans from it."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from billing.services.worker_rates import worker_rate_create
from controlplane.deployments import reconciler, services
from controlplane.deployments.capacity.curve import LoadCurve as Curve
from controlplane.deployments.capacity.plan import Targets, plan_replicas
from controlplane.deployments.models import Deployment, LoadCurve, Replica
from tenants import services as tenants

from .test_capacity_model import curve_dict
from .test_internal_api import TOKEN, register, worker_client  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db


@pytest.fixture
def ready_replica(worker_client, make_model):  # noqa: F811
    def make(curve, name="w1", labels=None):
        body = {"name": name, "url": f"http://{name}:8100", "boot_id": "b1", "accelerator": "cpu",
                "memory_bytes": 2**34, "status": "ready", "labels": labels or {}}
        assert worker_client("post", "workers/register", body).status_code == 200
        if not Deployment.objects.filter(name="smollm2-135m-instruct").exists():
            services.deployment_create(model=make_model(), replicas=1, engine_args={"max_num_seqs": 16})
        reconciler.reconcile()
        replica = Replica.objects.get(worker__name=name)
        answer = worker_client("post", f"workers/{name}/replicas/{replica.pk}/status",
                               {"attempt": replica.attempt, "status": "ready", "load_seconds": 3.0,
                                "load_curve": curve}, boot="b1")
        assert answer.json() == {"applied": True, "status": "ready"}, answer.content
        return replica
    return make


def test_the_ready_report_keeps_the_curve_as_its_class_latest(ready_replica):
    ready_replica(curve_dict())
    record = LoadCurve.objects.get()
    assert (record.worker_class, record.worker, record.deployment.name) == ("cpu", "w1", "smollm2-135m-instruct")
    assert record.curve == {k: v for k, v in curve_dict().items() if k != "sweep_seconds"}
    assert Curve.from_dict(record.curve) == Curve.from_dict(curve_dict())
    assert record.engine_args == {"max_num_seqs": 16}
    assert timezone.now() - record.measured_at < dt.timedelta(seconds=30)


def test_only_the_parsed_curve_is_stored_no_extra_keys_and_no_nul(ready_replica):
    ready_replica({**curve_dict(device="cpu\x00x"), "note": "a\x00b", "padding": ["x"] * 1000})
    record = LoadCurve.objects.get()
    assert record.curve["device"] == "cpux" and "note" not in record.curve and "padding" not in record.curve


def test_a_second_class_gets_its_own_curve_and_a_malformed_one_is_dropped_but_the_replica_is_ready(
        ready_replica, caplog):
    ready_replica(curve_dict())
    services.deployment_update(deployment=Deployment.objects.get(), replicas=3)
    ready_replica(curve_dict(decode=[[1, 0.02]]), name="w2", labels={"worker_class": "fast-cpu"})
    bad = ready_replica({"version": 1, "decode": "\x00"}, name="w3")
    bad.refresh_from_db()
    assert bad.status == "ready"
    assert "load curve ignored" in caplog.text
    assert sorted(LoadCurve.objects.values_list("worker_class", "worker")) == [("cpu", "w1"), ("fast-cpu", "w2")]


def test_a_deleted_deployment_takes_its_curves_with_it(ready_replica):
    replica = ready_replica(curve_dict())
    assert LoadCurve.objects.count() == 1
    replica.deployment.delete()
    assert LoadCurve.objects.count() == 0


def _plan_args(**changes):
    args = {"deployment": "smollm2-135m-instruct", "rps": "30", "prompt_tokens": "128", "output_tokens": "32"}
    args.update(changes)
    out = []
    for k, v in args.items():
        out += [f"--{k.replace('_', '-')}", v] if v is not True else [f"--{k.replace('_', '-')}"]
    return out


def test_the_command_plans_per_class_at_the_tier_targets_with_the_class_rate(ready_replica, capsys):
    ready_replica(curve_dict())
    tenants.tier_create(name="gold", priority=0, slo_ttft_p95_ms=300, slo_itl_p95_ms=40)
    tenants.tier_create(name="bronze", priority=20, slo_ttft_p95_ms=2000, slo_itl_p95_ms=200)
    worker_rate_create(worker_class="cpu", hourly_cost=Decimal("2.40"), prefill_tokens_per_second=Decimal(1000),
                       decode_tokens_per_second=Decimal(100),
                       effective_from=timezone.now().replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=1))
    call_command("capacity_plan", *_plan_args(tier="gold", json=True))
    [got] = json.loads(capsys.readouterr().out)
    expected = plan_replicas(Curve.from_dict(curve_dict()), rps=30, prompt_tokens=128, output_tokens=32,
                             targets=Targets(0.3, 0.04), hourly_rate=Decimal("2.40"), currency="usd")
    assert got["worker_class"] == "cpu" and got["measured_by"] == "w1" and got["rated"]
    assert got["plan"]["replicas"] == expected.replicas >= 2
    assert Decimal(got["plan"]["hourly_cost"]) == Decimal("2.40") * expected.replicas
    assert Decimal(got["plan"]["cost_per_million_tokens"]) == expected.cost_per_million_tokens
    # The looser tier needs fewer (or as many); without --tier the strictest targets (gold's) are held.
    call_command("capacity_plan", *_plan_args(tier="bronze", json=True))
    assert json.loads(capsys.readouterr().out)[0]["plan"]["replicas"] <= expected.replicas
    call_command("capacity_plan", *_plan_args(json=True))
    assert json.loads(capsys.readouterr().out)[0]["plan"]["replicas"] == expected.replicas
    # The table names the replicas, the targets' source and the cost.
    call_command("capacity_plan", *_plan_args(tier="gold"))
    table = capsys.readouterr().out
    assert "targets from tier gold: TTFT p95 <= 300 ms, ITL p95 <= 40 ms" in table
    assert f"cpu                   {expected.replicas:8}" in table and "usd" in table


def test_an_unrated_class_is_planned_without_a_cost_and_says_so(ready_replica, capsys):
    ready_replica(curve_dict())
    call_command("capacity_plan", *_plan_args(ttft_ms="300", itl_ms="40"))
    out = capsys.readouterr().out
    assert "unrated" in out and "cpu has no hourly rate" in out and "targets from the command line" in out


def test_a_curve_file_plans_without_the_database(tmp_path, capsys):
    path = tmp_path / "curve.json"
    path.write_text(json.dumps(curve_dict()))
    call_command("capacity_plan", "--curve", str(path), "--rps", "30", "--prompt-tokens", "128",
                 "--output-tokens", "32", "--ttft-ms", "300", "--itl-ms", "40", "--json")
    [got] = json.loads(capsys.readouterr().out)
    assert got["worker_class"] == "file" and got["plan"]["replicas"] >= 2


@pytest.mark.parametrize("args, message", [
    (_plan_args(ttft_ms="300", itl_ms="40"), "no load curve for 'smollm2-135m-instruct'"),
    (_plan_args(deployment="nope", ttft_ms="300", itl_ms="40"), "deployment 'nope' does not exist"),
    (_plan_args(deployment="a\x00b", ttft_ms="300", itl_ms="40"), "deployment 'a\\x00b' does not exist"),
    (_plan_args(tier="missing"), "tier 'missing' does not exist"),
    (_plan_args(tier="plain"), "no TTFT and ITL p95 targets in tier plain"),
    (["--rps", "1", "--prompt-tokens", "8", "--output-tokens", "8", "--ttft-ms", "1", "--itl-ms", "1"],
     "give --deployment"),
])
def test_what_cannot_be_planned_is_a_clear_command_error(make_model, args, message):
    services.deployment_create(model=make_model(), replicas=1)
    tenants.tier_create(name="plain", priority=5)  # no SLO targets
    with pytest.raises(CommandError) as info:
        call_command("capacity_plan", *args)
    assert message in str(info.value)


@pytest.mark.parametrize("flag, value", [("--rps", "0"), ("--rps", "nan"), ("--rps", "-3"), ("--prompt-tokens", "1.5"),
                                         ("--output-tokens", "0"), ("--ttft-ms", "x")])
def test_bad_numbers_are_refused_by_the_parser(flag, value):
    args = {"--rps": "1", "--prompt-tokens": "8", "--output-tokens": "8", "--ttft-ms": "100", "--itl-ms": "10"}
    args[flag] = value
    with pytest.raises(CommandError):
        call_command("capacity_plan", "--curve", "x.json", *[x for kv in args.items() for x in kv])


def test_a_bad_curve_file_is_a_command_error(tmp_path):
    path = tmp_path / "curve.json"
    for text in ("{not json", json.dumps(curve_dict(version=7)), json.dumps(curve_dict(decode=[[1, -1]]))):
        path.write_text(text)
        with pytest.raises(CommandError):
            call_command("capacity_plan", "--curve", str(path), "--rps", "1", "--prompt-tokens", "8",
                         "--output-tokens", "8", "--ttft-ms", "300", "--itl-ms", "40")
