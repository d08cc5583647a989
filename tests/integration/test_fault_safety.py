"""Nothing the plugin does may stop GPUStack from starting or serving."""

import httpx
import pytest

from gpustack_dspark import backend
from tests.conftest import admin_api, dspark_status, wait_backend_registered, wait_for

pytestmark = pytest.mark.integration


def _assert_gpustack_serves(server, api):
    assert httpx.get(f"{server.url}/healthz", timeout=5).status_code == 200
    assert isinstance(api.items("/v2/workers"), list)
    names = [b["backend_name"] for b in api.items("/v2/inference-backends")]
    assert "vLLM" in names
    return names


def test_unsupported_gpustack_version_disables_features_not_the_server(start_server):
    server = start_server(fault="gpustack-version")
    api = admin_api(server)
    key = api.api_key
    status = dspark_status(server, key)
    assert status["gpustack"] == {"version": "2.2.0", "supported_version": "2.3.0", "supported": False}
    reason = "GPUStack 2.2.0 is not the supported GPUStack 2.3.0"
    for feature in ("backend_registration", "vllm_resource_fit"):
        assert status["features"][feature] == {"state": "disabled", "reason": reason}
    assert status["features"]["status_api"]["state"] == "enabled"
    assert status["features"]["console"] == {"state": "disabled", "reason": reason}
    _assert_stock_index(server)
    assert backend.BACKEND_NAME not in _assert_gpustack_serves(server, api)
    server.stop()


def _assert_stock_index(server):
    """The console is off: GPUStack's own page, no script added, no console page."""
    index = httpx.get(f"{server.url}/", timeout=5)
    assert index.status_code == 200 and "umi." in index.text and "/dspark/ui/menu.js" not in index.text
    assert httpx.get(f"{server.url}/dspark/console", timeout=5).status_code == 404


def test_unreachable_database_for_registration_is_reported(start_server):
    server = start_server(fault="database-unreachable")
    api = admin_api(server)
    key = api.api_key
    feature = wait_for(
        lambda: (f := dspark_status(server, key)["features"]["backend_registration"])["state"] == "disabled" and f,
        60, "the registration to give up")
    assert "registering the DSpark-custom backend failed: ConnectionRefusedError" in feature["reason"]
    assert dspark_status(server, key)["features"]["vllm_resource_fit"]["state"] == "enabled"
    # The console's sampler cannot read the deployments: it says why, its page still answers.
    console = wait_for(lambda: (f := dspark_status(server, key)["features"]["console"]).get("reason") and f,
                       30, "the console's sampling error")
    assert console["state"] == "enabled" and "ConnectionRefusedError" in console["reason"], console
    data = httpx.get(f"{server.url}/v2/dspark/console", headers={"Authorization": f"Bearer {key}"}, timeout=5).json()
    assert "ConnectionRefusedError" in data["sampler"]["error"] and data["deployments"] == []
    assert "/dspark/ui/menu.js" in httpx.get(f"{server.url}/", timeout=5).text
    _assert_gpustack_serves(server, api)
    assert "gave up after 2 attempts" in server.log_path.read_text()
    server.stop()


def test_crash_while_wiring_leaves_gpustack_running(start_server):
    server = start_server(fault="init-crash")
    api = admin_api(server)
    _assert_gpustack_serves(server, api)
    assert "wiring exploded (injected by the tests)" in server.log_path.read_text()
    server.stop()


def test_disable_switch_turns_features_off(start_server):
    server = start_server(extra_args=["--dspark-disable"])
    api = admin_api(server)
    key = api.api_key
    status = dspark_status(server, key)
    assert status["settings"]["disabled"] is True
    for feature in ("backend_registration", "vllm_resource_fit"):
        assert status["features"][feature] == {"state": "disabled", "reason": "turned off by --dspark-disable"}
    assert status["features"]["console"] == {"state": "disabled", "reason": "turned off by --dspark-disable"}
    _assert_stock_index(server)
    assert backend.BACKEND_NAME not in _assert_gpustack_serves(server, api)
    server.stop()


def test_config_file_settings_reach_the_plugin(start_server, tmp_path):
    """Also: the node-label sync configured with a kubeconfig that is not one turns off that
    feature only (this server start serves both checks)."""
    config = tmp_path / "gpustack.yaml"
    bad_kubeconfig = tmp_path / "kubeconfig"
    bad_kubeconfig.write_text("clusters: [this is not a kubeconfig\n")
    config.write_text("dspark_json_label: pool=json\ndspark_cpu_image: localhost/dspark-worker:from-file\n"
                      "dspark_node_label_sync_selector: gpustack-dspark.io/json-inference=true\n"
                      f"dspark_node_label_sync_kubeconfig: {bad_kubeconfig}\n")
    server = start_server(extra_args=["--config-file", str(config)])
    api = admin_api(server)
    status = dspark_status(server, api.api_key)
    assert status["settings"]["json_label"] == "pool=json"
    assert status["settings"]["cpu_image"] == "localhost/dspark-worker:from-file"
    assert status["settings"]["node_label_sync_selector"] == "gpustack-dspark.io/json-inference=true"
    sync = status["features"]["node_label_sync"]
    assert sync["state"] == "disabled" and "\n" not in sync["reason"]
    assert sync["reason"].startswith(f"cannot load the kubeconfig {bad_kubeconfig}: ParserError: ")
    assert status["node_label_sync"] is None
    for other in ("placement_policy", "routing", "metrics_collection", "admission"):
        assert status["features"][other]["state"] == "enabled", other
    wait_backend_registered(server, api.api_key)  # GPUStack and the rest of the plugin carry on
    _assert_gpustack_serves(server, api)
    server.stop()
