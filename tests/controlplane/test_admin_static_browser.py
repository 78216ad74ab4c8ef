"""The admin under the production server (uvicorn, DEBUG off) looks like Django's admin: its stylesheets
and scripts load from this server, and the page is laid out by them, not by the browser's defaults."""

from __future__ import annotations

import pytest

from .served_site import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    RESOURCES_JS,
    chromium,
    console_errors,
    served_control_plane,
)

pytestmark = [pytest.mark.slow]

# base.css parsed with its rules (a 404 or a wrong content type leaves none), the header laid out by
# it (the admin's header is a dark-blue flex bar; unstyled it is a transparent block).
STYLE_JS = """
const sheets = Array.from(document.styleSheets).filter(s => s.href && s.href.includes('/static/admin/css/'));
const base = sheets.find(s => s.href.endsWith('/admin/css/base.css'));
const header = getComputedStyle(document.getElementById('header'));
return {sheets: sheets.map(s => s.href), baseRules: base ? base.cssRules.length : 0,
        headerBackground: header.backgroundColor, headerDisplay: header.display,
        bodyFont: getComputedStyle(document.body).fontFamily};
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    with served_control_plane(tmp_path_factory.mktemp("admin-static")) as base:
        yield base


@pytest.fixture
def browser():
    driver = chromium()
    yield driver
    driver.quit()


def _assert_styled(browser, base: str, page: str) -> None:
    style = browser.execute_script(STYLE_JS)
    assert style["baseRules"] > 50, (page, style)
    assert style["headerBackground"] not in ("rgba(0, 0, 0, 0)", "transparent"), (page, style)
    assert style["headerDisplay"] == "flex" and "Times" not in style["bodyFont"], (page, style)
    static = [(url, status) for url, status in browser.execute_script(RESOURCES_JS) if "/static/" in url]
    assert static and all(url.startswith(f"{base}/static/") and status == 200 for url, status in static), static
    assert console_errors(browser) == [], page


def test_admin_is_styled_and_its_scripts_load(browser, site):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{site}/admin/login/")
    _assert_styled(browser, site, "login")
    browser.find_element(By.NAME, "username").send_keys(ADMIN_USER)
    browser.find_element(By.NAME, "password").send_keys(ADMIN_PASSWORD)
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    WebDriverWait(browser, 30).until(lambda d: "/admin/login/" not in d.current_url)
    assert "Site administration" in browser.page_source
    _assert_styled(browser, site, "index")

    browser.get(f"{site}/admin/tenants/tenant/")
    _assert_styled(browser, site, "changelist")
    loaded = {url.rsplit("/", 1)[-1] for url, _ in browser.execute_script(RESOURCES_JS)}
    assert {"changelists.css", "actions.js"} <= loaded, loaded
    # The admin's own JavaScript ran, not only arrived: jquery.init.js set up the admin's jQuery.
    assert browser.execute_script("return !!(window.django && window.django.jQuery && django.jQuery.fn.jquery)")
