"""Production's single sign-on choices, read by importing controlplane.settings.production in a child process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

_READ = ("import json, django; from django.conf import settings as s; django.setup(); "
         "print(json.dumps([s.TESSERA_ADMIN_PASSWORD_LOGIN, s.TESSERA_OIDC_ISSUER]))")


def _production(**env_vars: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("TESSERA_OIDC_", "TESSERA_ADMIN_PASSWORD_LOGIN"))}
    env.update({"DJANGO_SETTINGS_MODULE": "controlplane.settings.production", "DJANGO_SECRET_KEY": "x" * 50,
                **env_vars})
    return subprocess.run([sys.executable, "-c", _READ], env=env, capture_output=True, text=True, timeout=60)


def _read(**env_vars: str) -> list:
    out = _production(**env_vars)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


SSO = {"TESSERA_OIDC_ISSUER": "https://id.example.com/realms/tessera", "TESSERA_OIDC_CLIENT_ID": "tessera",
       "TESSERA_OIDC_CLIENT_SECRET": "s3cret"}


def test_with_an_issuer_production_turns_passwords_off():
    assert _read(**SSO) == [False, SSO["TESSERA_OIDC_ISSUER"]]
    assert _read(**SSO, TESSERA_ADMIN_PASSWORD_LOGIN="")[0] is False  # compose passes unset variables empty


def test_the_break_glass_switch_turns_them_back_on():
    assert _read(**SSO, TESSERA_ADMIN_PASSWORD_LOGIN="true")[0] is True


def test_without_an_issuer_passwords_stay_on():
    assert _read() == [True, ""]


@pytest.mark.parametrize("env_vars, message", [
    ({**SSO, "TESSERA_OIDC_ISSUER": "http://id.example.com"}, "must be an https:// URL"),
    ({**SSO, "TESSERA_OIDC_CLIENT_SECRET": ""}, "TESSERA_OIDC_CLIENT_SECRET"),
])
def test_unsafe_sso_settings_stop_production(env_vars, message):
    out = _production(**env_vars)
    assert out.returncode != 0 and message in out.stderr


def test_deploy_passes_the_sso_settings_and_keeps_the_secret_in_a_secret():
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[2]
    compose = yaml.safe_load((root / "deploy" / "compose.yaml").read_text())
    env = compose["services"]["web"]["environment"]
    for name in ("TESSERA_OIDC_ISSUER", "TESSERA_OIDC_CLIENT_ID", "TESSERA_OIDC_CLIENT_SECRET",
                 "TESSERA_OIDC_ROLE_MAP", "TESSERA_ADMIN_PASSWORD_LOGIN"):
        assert env[name] == "${" + name + ":-}"  # a reference to deploy/.env, never a value
    config = yaml.safe_load((root / "deploy" / "k8s" / "config.yaml").read_text())["data"]
    assert config["TESSERA_OIDC_ISSUER"] == "" and "TESSERA_OIDC_CLIENT_SECRET" not in config
    assert set(json.loads(config["TESSERA_OIDC_ROLE_MAP"]).values()) == {"operator", "finance"}
    secrets = [d for d in yaml.safe_load_all((root / "deploy" / "k8s" / "secret.example.yaml").read_text()) if d]
    (main,) = [d for d in secrets if d["metadata"]["name"] == "tessera-secrets"]
    assert main["stringData"]["TESSERA_OIDC_CLIENT_SECRET"] == ""
    example = dict(line.split("=", 1) for line in (root / "deploy" / "env.example").read_text().splitlines()
                   if line and not line.startswith("#"))
    assert set(json.loads(example["TESSERA_OIDC_ROLE_MAP"]).values()) == {"operator", "finance"}
