"""/api/v1/docs/ (Swagger UI) and /api/v1/redoc/ (ReDoc) render on an offline install.

Chromium resolves no host name but 127.0.0.1 (an air-gapped machine), and every resource the page
loaded must come from this server; the Content-Security-Policy must not have blocked anything.
"""

from __future__ import annotations

import pytest

from .served_site import RESOURCES_JS, chromium, console_errors, served_control_plane

pytestmark = [pytest.mark.slow]

TITLE = "Tessera management API"
OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"
# ReDoc's sidebar footer always asks for this logo (hard-coded in its bundle, hidden when it fails to
# load); the docs' policy (img-src 'self' data:) blocks it before any request is made.
REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    with served_control_plane(tmp_path_factory.mktemp("api-docs")) as base:
        yield base


@pytest.fixture
def browser():
    driver = chromium(OFFLINE)
    yield driver
    driver.quit()


def _assert_local_only(browser, base: str, blocked: tuple[str, ...] = ()) -> None:
    resources = browser.execute_script(RESOURCES_JS)
    outside = [url for url, _ in resources if not url.startswith(f"{base}/") and not url.startswith("blob:")]
    failed = [(url, status) for url, status in resources if url.startswith(base) and status != 200]
    assert set(outside) <= set(blocked) and failed == [], (outside, failed)
    errors = console_errors(browser)
    for url in blocked:  # refused by the policy, not merely unreachable
        assert any(url in e and "Content Security Policy" in e for e in errors) or url not in outside, errors
    assert [e for e in errors if not any(url in e for url in blocked)] == []


def test_swagger_ui_renders_offline(browser, site):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{site}/api/v1/docs/")
    WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".swagger-ui .info .title"))
    assert TITLE in browser.find_element(By.CSS_SELECTOR, ".swagger-ui .info .title").text
    # The operations were read from the schema and laid out by Swagger UI's stylesheet.
    WebDriverWait(browser, 30).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".opblock")) > 10)
    assert browser.execute_script(
        "return getComputedStyle(document.querySelector('.opblock')).borderStyle") == "solid"
    _assert_local_only(browser, site)


def test_redoc_renders_offline(browser, site):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{site}/api/v1/redoc/")
    WebDriverWait(browser, 30).until(lambda d: TITLE in (d.find_elements(By.TAG_NAME, "h1") or [None])[0].text
                                     if d.find_elements(By.TAG_NAME, "h1") else False)
    # ReDoc lists the operations in its menu once it has parsed the schema (in its blob: worker).
    WebDriverWait(browser, 30).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "li[data-item-id]")) > 10)
    _assert_local_only(browser, site, blocked=(REDOC_LOGO,))
