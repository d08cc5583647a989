"""Routing to real DSpark replicas: GPUStack's `/v1` proxy -> real CPU worker -> two real
`dspark-serve` processes (real vLLM on CPU). The instances are pointed at the replicas by
hand (no container runtime here to let GPUStack's worker start them; the end-to-end issue
does that with Podman), everything on the request path is real."""

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from gpustack_dspark.devstack.replica import SERVED_NAME, start_replica
from tests.conftest import admin_api, dspark_status
from tests.integration.test_routing import models_on_real_replicas

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(start_server, tmp_path_factory):
    base = tmp_path_factory.mktemp("routing-dspark")
    replicas = [start_replica(base / f"replica-{i}.log", ["--enable-dspark", "--dspark-warmup-requests", "2"])
                for i in range(2)]
    server = start_server()
    api = admin_api(server)
    # The GPUStack model's name is what the replicas serve (--served-model-name).
    with models_on_real_replicas(server, api, "route-real-w1", base, replicas,
                                 {SERVED_NAME: ([r.port for r in replicas], 180)}):
        yield server, api, replicas


def test_json_through_gpustack_reaches_both_real_replicas_least_connections(stack):
    server, api, replicas = stack
    before = [r.info()["requests"]["json_injected"] for r in replicas]
    headers = {"Authorization": f"Bearer {api.api_key}"}

    def one(i):
        return httpx.post(f"{server.url}/v1/chat/completions", headers=headers, timeout=120, json={
            "model": SERVED_NAME, "max_tokens": 128, "temperature": 0,
            "messages": [{"role": "user", "content": f"Create an order record for user {200 + i}: buy {i + 1.5}."}]})

    with ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(one, range(16)))
    assert [r.status_code for r in responses] == [200] * 16
    for r in responses:  # no response_format: the replicas made it JSON
        json.loads(r.json()["choices"][0]["message"]["content"])
        assert r.json()["usage"]["dspark_stats"]["drafted_tokens"] >= 0
    served = [r.info()["requests"]["json_injected"] - b for r, b in zip(replicas, before)]
    assert sum(served) == 16 and min(served) >= 4, served  # both replicas took a fair share

    routing = dspark_status(server, api.api_key)["routing"]
    assert routing["in_flight_total"] == 0 and routing["unmatched_releases"] == 0
