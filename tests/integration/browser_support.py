"""Headless Chromium (Debian's `chromium`, driven by Playwright) against a real GPUStack
server: the launch flags for a closed network, GPUStack's own login, the artefacts folder."""

import os
import shutil
from pathlib import Path

from gpustack_dspark.devstack.server import ADMIN_USER

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Closed network: without these Chromium keeps trying to reach Google's services.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(os.environ.get("DSPARK_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"))


def log_in(playwright_api, tab, url: str, password: str) -> None:
    """GPUStack's login form as a user fills it; past the first-cluster prompt if it shows."""
    tab.goto(f"{url}/")
    tab.locator("input").first.fill(ADMIN_USER)
    tab.locator("input[type=password]").fill(password)
    tab.keyboard.press("Enter")
    tab.wait_for_url("**/#/**")
    skip = tab.get_by_text("Skip for Now")  # a fresh GPUStack asks for a first cluster / worker
    try:
        skip.click(timeout=20_000)  # it can take a while on a loaded machine
    except playwright_api.TimeoutError:
        pass
