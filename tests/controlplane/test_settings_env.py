"""Settings the code reads with getattr(settings, ...) come from the environment, and deploy/ passes them."""

from __future__ import annotations

import runpy
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "controlplane" / "settings" / "base.py"
STRIPE = ("STRIPE_API_KEY", "STRIPE_WEBHOOK_SECRET")


def load_settings() -> dict:
    return runpy.run_path(str(BASE))


def test_stripe_and_billing_settings_come_from_the_environment(monkeypatch):
    env = {
        "STRIPE_API_KEY": "sk_test_from_env", "STRIPE_API_BASE": "http://stripe.local", "STRIPE_WEBHOOK_SECRET": "whsec_x",
        "STRIPE_WEBHOOK_TOLERANCE": "120", "STRIPE_MAX_NETWORK_RETRIES": "5",
        "STRIPE_METER_EVENT_NAMES": '{"input": "in_tokens"}', "STRIPE_COLLECTION_METHOD": "charge_automatically",
        "STRIPE_DAYS_UNTIL_DUE": "14", "BILLING_ROUNDING": "ROUND_HALF_EVEN", "BILLING_DEFAULT_CURRENCY": "eur",
        "TESSERA_MAX_REQUEST_BYTES": "1000", "TESSERA_CHAT_TEMPLATE_TOKENS": "7",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    loaded = load_settings()
    assert loaded["STRIPE_API_KEY"] == "sk_test_from_env" and loaded["STRIPE_API_BASE"] == "http://stripe.local"
    assert loaded["STRIPE_WEBHOOK_SECRET"] == "whsec_x" and loaded["STRIPE_WEBHOOK_TOLERANCE"] == 120
    assert loaded["STRIPE_MAX_NETWORK_RETRIES"] == 5 and loaded["STRIPE_METER_EVENT_NAMES"] == {"input": "in_tokens"}
    assert (loaded["STRIPE_COLLECTION_METHOD"], loaded["STRIPE_DAYS_UNTIL_DUE"]) == ("charge_automatically", 14)
    assert (loaded["BILLING_ROUNDING"], loaded["BILLING_DEFAULT_CURRENCY"]) == ("ROUND_HALF_EVEN", "eur")
    assert loaded["TESSERA_MAX_REQUEST_BYTES"] == loaded["DATA_UPLOAD_MAX_MEMORY_SIZE"] == 1000
    assert loaded["TESSERA_CHAT_TEMPLATE_TOKENS"] == 7


def test_without_the_environment_stripe_is_off_with_the_documented_defaults(monkeypatch):
    for name in ("STRIPE_API_KEY", "STRIPE_WEBHOOK_SECRET", "STRIPE_METER_EVENT_NAMES", "STRIPE_WEBHOOK_TOLERANCE",
                 "TESSERA_MAX_REQUEST_BYTES"):
        monkeypatch.delenv(name, raising=False)
    loaded = load_settings()
    assert loaded["STRIPE_API_KEY"] == "" and loaded["STRIPE_WEBHOOK_SECRET"] == ""
    assert loaded["STRIPE_METER_EVENT_NAMES"] == {} and loaded["STRIPE_WEBHOOK_TOLERANCE"] == 300
    assert loaded["TESSERA_MAX_REQUEST_BYTES"] == 4 * 1024 * 1024


def test_the_code_reads_the_settings_the_environment_sets(monkeypatch, settings):
    """billing's getattr(settings, ...) sees what base.py read from the environment."""
    from billing import stripe_sync

    monkeypatch.setenv("STRIPE_API_KEY", "sk_test_live_path")
    settings.STRIPE_API_KEY = load_settings()["STRIPE_API_KEY"]
    assert stripe_sync.stripe_enabled()


def test_compose_and_kubernetes_pass_stripe_secrets_by_reference():
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    env = compose["services"]["web"]["environment"]
    for name in STRIPE:
        assert env[name] == "${" + name + ":-}"  # a reference to the host's environment, never a value
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "k8s" / "controlplane.yaml").read_text()) if d]
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    for name in ("tessera-web", "tessera-celery-worker"):
        (container,) = deployments[name]["spec"]["template"]["spec"]["containers"]
        refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]}
        for key in STRIPE:
            assert refs[key] == {"name": "tessera-stripe", "key": key, "optional": True}
    examples = [d for d in yaml.safe_load_all((ROOT / "deploy" / "k8s" / "secret.example.yaml").read_text()) if d]
    (stripe,) = [d for d in examples if d["metadata"]["name"] == "tessera-stripe"]
    assert stripe["stringData"] == dict.fromkeys(STRIPE, "")
