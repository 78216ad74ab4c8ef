"""The control plane as an operator runs it, for browser tests of what the test client cannot show.

`live_server` serves static files through Django's own test handler, so it would hide a production
server that serves none. Here: base settings (DEBUG off), a fresh SQLite var/, `migrate` and
`collectstatic` as `make run` does, a superuser, and uvicorn on the ASGI application.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
ADMIN_USER, ADMIN_PASSWORD = "operator", "a-long-local-password"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _environment(var: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")}
    env.update(TESSERA_VAR_DIR=str(var), DJANGO_SETTINGS_MODULE="controlplane.settings.base", DJANGO_DEBUG="0",
               DJANGO_SUPERUSER_PASSWORD=ADMIN_PASSWORD, PYTHONUNBUFFERED="1")
    return env


@contextlib.contextmanager
def served_control_plane(var: Path) -> Iterator[str]:
    env = _environment(var)
    manage = [sys.executable, "manage.py"]
    for command in (["migrate", "--noinput"], ["collectstatic", "--noinput"],
                    ["createsuperuser", "--noinput", "--username", ADMIN_USER, "--email", "ops@example.com"]):
        subprocess.run([*manage, *command], cwd=ROOT, env=env, check=True, capture_output=True, timeout=180)
    port = _free_port()
    log = open(var / "web.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "controlplane.asgi:application", "--host", "127.0.0.1",
                             "--port", str(port), "--log-level", "warning"], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (var / "web.log").read_text()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, (var / "web.log").read_text()
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def chromium(*flags: str):
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip("headless Chromium not installed (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage", *flags):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    return driver


# Every resource the page loaded, with its HTTP status (Chromium reports responseStatus).
RESOURCES_JS = """
return performance.getEntriesByType('resource').map(e => [e.name, e.responseStatus || 0])
    .concat([[location.href, performance.getEntriesByType('navigation')[0].responseStatus || 0]]);
"""


def console_errors(driver) -> list[str]:
    """Errors the page logged (the browser's own probe for /favicon.ico aside: no page asks for it)."""
    return [entry["message"] for entry in driver.get_log("browser")
            if entry["level"] == "SEVERE" and "/favicon.ico " not in entry["message"]]
