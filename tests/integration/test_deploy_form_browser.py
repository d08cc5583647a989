"""GPUStack's own web UI, in headless Chromium: the stock deploy form offers the DSpark
backend and pre-fills its knobs (the plugin ships no UI code for this), and shows the
plugin's knob refusal inline (GPUStack's compatibility check, `POST /v2/model-evaluations`);
"Submit Anyway" is refused too. Screenshots go to test-artifacts/ (DSPARK_TEST_ARTIFACTS)."""

import time

import pytest

from gpustack_dspark import knobs
from tests.conftest import admin_api, wait_for
from tests.integration.browser_support import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, log_in

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(shared_stack):
    """The session's shared GPUStack server (tests/integration/shared_stack.py)."""
    return shared_stack.gpustack()[0]


@pytest.fixture(scope="module")
def page(server):
    playwright_api = pytest.importorskip("playwright.sync_api")
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        tab = browser.new_page(viewport={"width": 1400, "height": 1000})
        tab.set_default_timeout(20_000)
        log_in(playwright_api, tab, server.url, server.admin_password)
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
    # The console's hint (ui-patches/menu.js), shown once DSpark is the chosen backend.
    hint = page.locator("#dspark-deploy-hint")
    hint.wait_for()
    assert hint.locator("a").get_attribute("href") == "/dspark/console"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    hint.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "console-deploy-form-hint.png"))


@pytest.fixture(scope="module")
def worker(shared_stack):
    """GPUStack's form runs its compatibility check only once the cluster has a worker: the
    shared platform's, labelled role=json-inference."""
    return shared_stack.json_worker()[0]


def test_deploy_form_shows_a_bad_knob_inline_and_submit_is_refused(page, server, worker, tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}')
    page.reload()
    try:
        page.get_by_text("Skip for Now").click(timeout=5_000)
    except Exception:
        pass  # the cluster has a worker now: GPUStack may not ask again
    page.get_by_role("link", name="Deployments").click()
    page.get_by_role("button", name="Deploy Model").click()
    page.get_by_text("Local Path", exact=True).click()
    page.locator("#deployModel_name").fill("form-bad-knob")
    page.locator("#deployModel_local_path").fill(str(model_dir))
    page.locator(".ant-select").filter(has_text="vLLM").first.click()
    page.locator(".ant-select-item-option").filter(has_text="DSpark").first.click()
    page.get_by_text("Advanced", exact=True).last.click()
    page.get_by_text("Backend Parameters").wait_for()
    field = wait_for(lambda: _input_holding(page, "--dspark-method=auto"), 30,
                     "the DSpark defaults in Backend Parameters")  # the form fills them a moment later
    field.fill("--dspark-method=bogus")
    page.locator("#deployModel_name").click()  # leave the field: the form re-checks
    expected = "--dspark-method: 'bogus' is not allowed; allowed: auto|dspark|mtp|suffix|ngram|draft_model|eagle3"
    message = page.get_by_text(expected)
    message.wait_for()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "deploy-form-knob-error.png"))
    assert "DSpark backend parameters" in message.inner_text()

    page.get_by_role("button", name="Submit Anyway").click()
    page.locator(".ant-message, .ant-notification").filter(has_text="is not allowed").first.wait_for()
    page.screenshot(path=str(ARTIFACTS / "deploy-form-submit-refused.png"))
    api = admin_api(server)
    try:
        time.sleep(1)
        assert [m for m in api.items("/v2/models") if m["name"] == "form-bad-knob"] == []
    finally:
        api.close()


def _input_holding(page, value):
    """The form's input that holds `value` now, or None (inputs the form re-renders meanwhile are
    read again on the next look)."""
    from playwright.sync_api import Error

    for field in page.locator("input").all():
        try:
            if field.input_value(timeout=1_000) == value:
                return field
        except Error:
            continue
    return None
