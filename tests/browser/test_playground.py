"""The playground page (GET /) in a real headless browser: Debian's Chromium driven by Selenium
through chromedriver, against the HTTP app served by uvicorn on localhost (in-process stages,
the real embedder, the offline extractive answerer). A screenshot of each step is written to
test-artifacts/ (LLMFRAME_ARTIFACTS to change it)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from llmframe_ray.api.auth import ApiKeys
from llmframe_ray.api.http import create_app
from llmframe_ray.api.local import LocalStages
from llmframe_ray.api.service import RagService
from llmframe_ray.config import load_settings
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.ingest.build import build_index
from llmframe_ray.retrieve.pipeline import Pipeline
from tests.serving import uvicorn_in_thread
from tests.unit.test_http_api import DOCS

KEY = "browser-test-key-0123456789"
CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
ARTIFACTS = Path(os.environ.get("LLMFRAME_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"))
WAIT_S = 30


@pytest.fixture(scope="module")
def server(tmp_path_factory, embedder):
    settings = load_settings(api_secret_key=KEY, llm_providers="extractive", chunk_size=64, chunk_overlap=8)
    root = tmp_path_factory.mktemp("playground") / "index"
    build_index(DOCS, root, settings.params().index, embedder)
    pipeline = Pipeline.open(root, embedder, settings.params().retrieval)
    stages = LocalStages(root, pipeline, IndexDirectory(root).current_version())
    app = create_app(RagService(stages, settings.params().service), ApiKeys.from_settings(settings))
    with uvicorn_in_thread(app) as url:
        yield url


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    missing = [p for p in (CHROMIUM, DRIVER) if not shutil.which(p)]
    assert not missing, f"{missing} not installed: `make browser` installs Debian's chromium and chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1200,900",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(DRIVER))
    driver.set_page_load_timeout(WAIT_S)
    yield driver
    driver.quit()


def wait_for(driver, condition, message):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S).until(lambda d: condition(d), message)


def shot(driver, name):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"playground-{name}.png"
    assert driver.save_screenshot(str(path)) and path.stat().st_size > 0
    return path


def save_key(driver, key):
    from selenium.webdriver.common.by import By

    field = driver.find_element(By.ID, "api-key")
    field.clear()
    field.send_keys(key)
    driver.find_element(By.ID, "save-key").click()
    wait_for(driver, lambda d: d.find_element(By.ID, "key-state").text == "key saved in this browser", "the key was not saved")


def test_page_search_answer_citations_and_a_wrong_key(server, browser):
    from selenium.webdriver.common.by import By

    browser.get(server + "/")
    assert browser.title == "llmframe-ray playground"
    assert browser.find_element(By.ID, "key-state").text == "no key"
    save_key(browser, KEY)

    browser.find_element(By.ID, "query").send_keys("What pulls the ocean tides?")
    browser.find_element(By.ID, "search-button").click()
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#hits li"), "no hits appeared")
    hits = browser.find_elements(By.CSS_SELECTOR, "#hits li")
    assert hits[0].get_attribute("data-doc-id") == "tides"
    badges = [b.text for b in hits[0].find_elements(By.CSS_SELECTOR, ".rank")]
    assert any(b.startswith("bm25 #") for b in badges) and any(b.startswith("dense #") for b in badges)
    assert browser.find_element(By.ID, "search-state").text.startswith(f"{len(hits)} hits, hybrid, ")
    shot(browser, "search")

    browser.find_element(By.ID, "question").send_keys("What drives ocean tides?")
    browser.find_element(By.ID, "ask-button").click()
    wait_for(browser, lambda d: d.find_element(By.ID, "answer-state").text.startswith("extractive"), "the answer did not finish")
    assert "Moon" in browser.find_element(By.ID, "answer").text
    links = browser.find_elements(By.CSS_SELECTOR, "#citations a.cite")
    assert links and links[0].text.startswith("[1] ")
    assert not browser.find_element(By.ID, "chunk").is_displayed()
    links[0].click()
    wait_for(browser, lambda d: d.find_element(By.ID, "chunk").is_displayed(), "the cited chunk did not open")
    assert browser.find_element(By.ID, "chunk-where").text.endswith(links[0].get_attribute("data-chunk-id"))
    assert browser.find_element(By.ID, "chunk-text").text
    shot(browser, "answer")

    save_key(browser, "not-the-key-0123456789")
    browser.find_element(By.ID, "search-button").click()
    wait_for(browser, lambda d: d.find_element(By.ID, "error").is_displayed(), "no error was shown")
    assert browser.find_element(By.ID, "error").text == (
        "401 unauthorized: a valid API key is required (X-API-Key header or Authorization: Bearer)")
    shot(browser, "wrong-key")
