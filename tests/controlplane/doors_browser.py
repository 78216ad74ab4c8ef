"""Headless Chromium for the doors' browser tests (as tests/tenants/test_admin_browser.py drives the admin),
with the console kept so a Content-Security-Policy violation on a page fails the test."""

from __future__ import annotations

import os
import shutil

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture
def browser():
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip("headless Chromium not installed (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def csp_violations(driver) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if "Content Security Policy" in entry["message"]]


def submit(driver, fields: dict[str, str]) -> None:
    """Fill the page's form, submit it and wait for the answer's page to load."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    for name, value in fields.items():
        box = driver.find_element(By.NAME, name)
        box.clear()
        box.send_keys(value)
    page = driver.find_element(By.TAG_NAME, "html")
    driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    # click() returns before the POST's answer is loaded: wait for the old page to go, then the new one.
    WebDriverWait(driver, 30).until(lambda d: gone(page))
    WebDriverWait(driver, 30).until(lambda d: d.execute_script("return document.readyState") == "complete")


def gone(element) -> bool:
    """True once `element`'s document has been replaced. Selenium's staleness_of catches only
    StaleElementReferenceException, but while the old document is being torn down Chromium can answer
    "Node with given id does not belong to the document" as a plain WebDriverException: that, too,
    means the old page is gone (it failed this wait once in CI)."""
    from selenium.common.exceptions import WebDriverException

    try:
        element.is_enabled()
    except WebDriverException:
        return True
    return False


def sign_in(driver, base_url: str, username: str, password: str) -> None:
    driver.get(f"{base_url}/admin/login/?next=/admin/")
    submit(driver, {"username": username, "password": password})
