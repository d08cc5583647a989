"""The DSpark console in GPUStack's web UI, in headless Chromium, against a real GPUStack
server + PostgreSQL and two real `dspark-serve` replicas (vLLM on CPU; the session's shared
platform, tests/integration/shared_stack.py) behind GPUStack's
`/v1` (instances pointed at them by hand, as in test_routing_dspark_replicas.py): GPUStack's
login, the menu entry, the deployment with live figures that move after traffic, a bad knob
refused in the editor with the field's message and nothing changed, a good one previewed as
a diff, no session -> GPUStack's login and 401, GPUStack's own pages free of errors from the
injected script. The rolling change itself needs replicas GPUStack's worker starts: it is
tested on the Podman stack (test_e2e_podman.py). Screenshots go to test-artifacts/."""

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from gpustack_dspark.bench import workloads
from gpustack_dspark.devstack.replica import SERVED_NAME
from tests.conftest import wait_for
from tests.integration.browser_support import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, log_in

pytestmark = pytest.mark.integration

GPUSTACK_PAGES = ["#/dashboard", "#/models/deployments", "#/models/backends", "#/resources/workers",
                  "#/access-control/api-keys", "#/playground/chat"]


@pytest.fixture(scope="module")
def stack(shared_stack, tmp_path_factory):
    """The shared platform's server and two replicas under this module's model."""
    base = tmp_path_factory.mktemp("console")
    server, api = shared_stack.up()
    replicas = shared_stack.replicas()
    with shared_stack.models_on(base, {SERVED_NAME: ([r.port for r in replicas], 180)}) as models:
        yield server, api, models[SERVED_NAME]


@pytest.fixture(scope="module")
def browser(stack):
    playwright_api = pytest.importorskip("playwright.sync_api")
    with playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield playwright_api, chromium
        chromium.close()


@pytest.fixture(scope="module")
def tab(stack, browser):
    """One logged-in tab; every JavaScript error and console error it sees is kept."""
    playwright_api, chromium = browser
    server, _, _ = stack
    page = chromium.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(30_000)
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(f"pageerror: {e}"))
    page.on("console", lambda m: page.errors.append(f"console.{m.type}: {m.text} {m.location}")
            if m.type == "error" else None)
    log_in(playwright_api, page, server.url, server.admin_password)
    yield page
    page.close()


def _shot(page, name):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"console-{name}.png"), full_page=True)


def _console(server, api):
    r = httpx.get(f"{server.url}/v2/dspark/console", headers={"Authorization": f"Bearer {api.api_key}"}, timeout=10)
    r.raise_for_status()
    return r.json()


def test_without_a_session_the_page_goes_to_login_and_the_endpoints_answer_401(stack, browser):
    server, _, model = stack
    page = httpx.get(f"{server.url}/dspark/console", timeout=10)
    assert page.status_code == 302 and page.headers["location"] == "/#/login"
    for method, path in (("GET", "/v2/dspark/console"), ("POST", f"/v2/dspark/console/models/{model['id']}/preview"),
                         ("POST", f"/v2/dspark/console/models/{model['id']}/apply")):
        answer = httpx.request(method, server.url + path, json={"knobs": {}}, timeout=10)
        assert answer.status_code == 401, (path, answer.text)
    bad_cookie = httpx.get(f"{server.url}/v2/dspark/console", cookies={"gpustack_session": "forged"}, timeout=10)
    assert bad_cookie.status_code == 401
    _, chromium = browser
    fresh = chromium.new_page()  # its own context: no cookie
    try:
        fresh.goto(f"{server.url}/dspark/console")
        fresh.wait_for_url("**/#/login**")
        fresh.locator("input[type=password]").wait_for()
        _shot(fresh, "no-session-login")
    finally:
        fresh.close()


def test_a_user_who_is_not_an_admin_sees_the_console_but_cannot_change_settings(stack):
    server, api, model = stack
    api.post("/v2/users", {"username": "console-viewer", "password": "Viewer-pass-1!", "is_admin": False,
                           "full_name": "Console Viewer"})
    with httpx.Client(base_url=server.url, timeout=30) as viewer:
        viewer.post("/auth/login", data={"username": "console-viewer", "password": "Viewer-pass-1!"}).raise_for_status()
        assert viewer.get("/v2/dspark/console").status_code == 200
        assert viewer.get("/dspark/console").status_code == 200
        for action in ("preview", "apply"):
            answer = viewer.post(f"/v2/dspark/console/models/{model['id']}/{action}",
                                 json={"knobs": {"--dspark-speculative-length": "4"}})
            assert answer.status_code == 403, (action, answer.text)


def test_the_menu_entry_leads_to_the_console_listing_the_deployment(stack, tab):
    server, _, model = stack
    entry = tab.locator("a[data-dspark=menu]")
    entry.wait_for()
    assert entry.inner_text().strip() == "DSpark"
    assert tab.get_by_role("link", name="Inference Backends").is_visible()  # GPUStack's own entries stay
    _shot(tab, "menu-entry")
    entry.click()
    tab.wait_for_url("**/dspark/console")
    card = tab.locator(f"[data-testid='deployment-{model['name']}']")
    card.wait_for()
    wait_for(lambda: "2 / 2 warm" in card.locator("h2").inner_text(), 60, "both replicas shown warm")
    rows = card.locator("tbody tr[data-testid^=replica-]")
    assert rows.count() == 2
    for i in range(2):
        text = rows.nth(i).inner_text()
        assert "running" in text and "warm" in text, text
        assert re.search(r"\d+\.\d s", text), text  # the warmup duration
    assert tab.locator("[data-testid=features]").get_by_text("console").count() >= 1
    _shot(tab, "deployment")


def test_live_figures_change_after_traffic(stack, tab):
    server, api, model = stack
    card = tab.locator(f"[data-testid='deployment-{model['name']}']")
    tokens = card.locator("[data-testid=figure-output_tokens_per_s] .value")
    before_points = [p for p in _console(server, api)["deployments"][0]["series"]["output_tokens_per_s"]
                     if p[1] is not None and p[1] > 0]

    def one(i):
        body = workloads.order_body(400 + i, max_tokens=96, temperature=0.0, model=SERVED_NAME)
        return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=180,
                          headers={"Authorization": f"Bearer {api.api_key}"})

    in_flight_seen = []
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(one, i) for i in range(8)]
        deadline = time.monotonic() + 60
        while not all(f.done() for f in futures) and time.monotonic() < deadline and not in_flight_seen:
            in_flight_seen += [d["in_flight"] for d in _console(server, api)["deployments"] if d["in_flight"] > 0]
            time.sleep(0.3)
        answers = [f.result() for f in futures]
    assert [a.status_code for a in answers] == [200] * 8
    assert in_flight_seen, "the console never showed a request in flight"
    # The sampler takes a point every 5 s: the next one after the traffic shows it.
    wait_for(lambda: tokens.inner_text() not in ("–", "0.0"), 40, "output tokens/s on the page")
    assert float(tokens.inner_text()) > 0
    data = wait_for(lambda: (d := _console(server, api)["deployments"][0])["figures"]["latency_p50_s"] is not None
                    and d, 30, "latency figures")
    after_points = [p for p in data["series"]["output_tokens_per_s"] if p[1] is not None and p[1] > 0]
    assert len(after_points) > len(before_points)
    assert data["figures"]["latency_p99_s"] >= data["figures"]["latency_p50_s"] > 0
    assert card.locator("[data-testid=figure-output_tokens_per_s] svg path").count() == 1  # a chart, not "no data"
    # Each replica's affinity cell: the replica's own prefix-cache hit rate and grammar compiles.
    assert any((r["affinity"]["prefix_cache_queries"] or 0) > 0 for r in data["instances"]), data["instances"]
    wait_for(lambda: any("prefix cache" in c and "grammar compiles" in c
                         for c in card.locator("[data-testid=affinity]").all_inner_texts()),
             30, "the replicas' prefix-cache figures on the page")
    _shot(tab, "live-figures")


def test_a_bad_knob_shows_the_fields_message_and_changes_nothing(stack, tab):
    server, api, model = stack
    before = api.get(f"/v2/models/{model['id']}")["backend_parameters"]
    card = tab.locator(f"[data-testid='deployment-{model['name']}']")
    card.locator("[data-testid='knob--dspark-speculative-length']").fill("99")
    card.get_by_role("button", name="Preview change").click()
    message = "--dspark-speculative-length: '99' is not allowed; allowed: auto or an integer 1-16"
    error = card.locator("[data-testid='error--dspark-speculative-length']")
    wait_for(lambda: error.inner_text() == message, 20, "the field's message")
    assert card.get_by_role("button", name="Apply as rolling change").is_disabled()
    assert "nothing was changed" in card.locator("[data-testid=editor-error]").inner_text()
    _shot(tab, "bad-knob")
    # The apply endpoint refuses it the same way, even sent by hand, and changes nothing.
    answer = tab.request.post(f"{server.url}/v2/dspark/console/models/{model['id']}/apply",
                              data=json.dumps({"knobs": {"--dspark-speculative-length": "99"}}),
                              headers={"Content-Type": "application/json"})
    assert answer.status == 400 and answer.json()["errors"] == {"--dspark-speculative-length": message}
    assert api.get(f"/v2/models/{model['id']}")["backend_parameters"] == before
    assert _console(server, api)["deployments"][0].get("rollout") is None


def test_a_good_knob_is_previewed_as_a_diff(stack, tab):
    server, api, model = stack
    card = tab.locator(f"[data-testid='deployment-{model['name']}']")
    card.locator("[data-testid='knob--dspark-speculative-length']").fill("4")
    card.get_by_role("button", name="Preview change").click()
    diff = card.locator("[data-testid=diff]")
    diff.wait_for()
    assert "--dspark-speculative-length: (default) → 4" in diff.inner_text()
    assert card.locator("[data-testid='error--dspark-speculative-length']").inner_text() == ""
    assert card.get_by_role("button", name="Apply as rolling change").is_enabled()
    _shot(tab, "preview-diff")


def test_the_injected_script_does_not_break_gpustacks_pages(stack, tab):
    server, _, _ = stack
    tab.errors.clear()
    for page in GPUSTACK_PAGES:
        tab.goto(f"{server.url}/{page}")
        tab.locator("a[data-dspark=menu]").wait_for()
        tab.get_by_role("link", name="Deployments").wait_for()
        time.sleep(1.0)
    _shot(tab, "gpustack-pages")
    # No JavaScript error at all on these pages, and no console error naming our script.
    ours = [e for e in tab.errors if "pageerror" in e or "dspark" in e.lower()]
    assert ours == [], ours
