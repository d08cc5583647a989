"""GPUStack's own web UI, in headless Chromium: the stock deploy form offers the DSpark
backend and pre-fills its knobs (the plugin ships no UI code for this)."""

import shutil

import pytest

from gpustack_dspark import knobs
from gpustack_dspark.devstack.server import ADMIN_USER

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Closed network: without these Chromium keeps trying to reach Google's services.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def page(start_server):
    playwright_api = pytest.importorskip("playwright.sync_api")
    server = start_server()
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        tab = browser.new_page(viewport={"width": 1400, "height": 1000})
        tab.set_default_timeout(20_000)
        tab.goto(f"{server.url}/")
        tab.locator("input").first.fill(ADMIN_USER)
        tab.locator("input[type=password]").fill(server.admin_password)
        tab.keyboard.press("Enter")
        tab.wait_for_url("**/#/**")
        skip = tab.get_by_text("Skip for Now")  # a fresh GPUStack asks for a first cluster
        try:
            skip.click(timeout=5_000)
        except playwright_api.TimeoutError:
            pass
        yield tab
        browser.close()


def test_backends_page_lists_dspark_with_both_frameworks(page, tmp_path):
    page.get_by_role("link", name="Inference Backends").click()
    card = page.locator(".ant-card, [class*=card]").filter(has_text="DSpark").first
    card.wait_for()
    text = card.inner_text()
    page.screenshot(path=str(tmp_path / "backends.png"))
    assert "cuda" in text and "cpu" in text, text


def test_deploy_form_prefills_the_dspark_knobs(page, tmp_path):
    page.get_by_role("link", name="Deployments").click()
    page.get_by_role("button", name="Deploy Model").click()
    page.get_by_text("Local Path", exact=True).click()
    page.locator(".ant-select").filter(has_text="vLLM").first.click()
    page.locator(".ant-select-item-option").filter(has_text="DSpark").first.click()
    page.get_by_text("Advanced", exact=True).last.click()
    page.get_by_text("Backend Parameters").wait_for()
    page.screenshot(path=str(tmp_path / "deploy-form.png"))
    values = [field.input_value() for field in page.locator("input").all()]
    assert [v for v in values if v.startswith("--")] == list(knobs.form_defaults())
