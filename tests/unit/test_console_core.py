"""The console's pure cores: bounded series, figures from /metrics text, the page's JSON,
the knob editor (the CLI's and the API's messages), the rolling-change planner, the index
rewrite."""

import pytest

from gpustack_dspark.admission.check import refusals
from gpustack_dspark.backend_ids import BACKEND_NAME
from gpustack_dspark.console import editor, figures, index_inject, rollout, view
from gpustack_dspark.console.series import SeriesStore

METRICS = """# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{model_name="m"}} {gen}
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{{model_name="m"}} {acc}
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{{model_name="m"}} {draft}
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{model_name="m"}} {drafts}
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{{le="0.5",model_name="m"}} {b1}
vllm:e2e_request_latency_seconds_bucket{{le="1.0",model_name="m"}} {b2}
vllm:e2e_request_latency_seconds_bucket{{le="+Inf",model_name="m"}} {b2}
vllm:e2e_request_latency_seconds_count{{model_name="m"}} {b2}
vllm:e2e_request_latency_seconds_sum{{model_name="m"}} 1.0
# TYPE dspark_schema_violations_total counter
dspark_schema_violations_total{{model_name="m"}} {withheld}
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{{model_name="m"}} {queries}
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{{model_name="m"}} {hits}
# TYPE dspark_grammar_compiles counter
dspark_grammar_compiles_total{{model_name="m"}} {compiles}
"""


def _metrics(**kw):
    values = dict(gen=0, acc=0, draft=0, drafts=0, b1=0, b2=0, withheld=0, queries=0, hits=0, compiles=0)
    values.update(kw)
    return figures.parse_metrics(METRICS.format(**values))


def test_series_are_bounded_in_points_and_keys_and_windowed():
    store = SeriesStore(window_s=60, interval_s=10, max_keys=2)
    for t in range(0, 200, 10):
        store.add("a", float(t), {"x": t})
    points = store.get("a", now=190.0)["x"]
    assert len(points) <= store.max_points == 7
    assert points[0][0] >= 130 and points[-1] == (190.0, 190.0)
    store.add("b", 0.0, {"x": 1})
    store.add("c", 0.0, {"x": 1})  # a third key: the least recently written one goes
    assert store.keys() == ["b", "c"]
    store.keep_only(["c"])
    assert store.keys() == ["c"]
    with pytest.raises(ValueError):
        SeriesStore(window_s=0)


def test_figures_between_two_samples_match_the_recording_rules():
    prev = _metrics(gen=100, acc=10, draft=40, drafts=10, b1=2, b2=4, withheld=1)
    cur = _metrics(gen=300, acc=70, draft=140, drafts=30, b1=6, b2=14, withheld=3)
    got = figures.rates(figures.increase(prev, cur), 10.0)
    assert got["output_tokens_per_s"] == 20.0
    assert got["acceptance_rate"] == 0.6           # 60 accepted / 100 drafted
    assert got["tokens_per_forward"] == 4.0        # 1 + 60 / 20 drafts
    assert got["requests_per_s"] == 1.0 and got["withheld"] == 2
    # 10 requests: 4 under 0.5 s, 6 in (0.5, 1.0]: P50 = 0.5 + 0.5 * (5 - 4) / 6
    assert got["latency_p50_s"] == pytest.approx(0.5 + 0.5 / 6)
    assert 0.95 < got["latency_p99_s"] <= 1.0
    assert got["prefix_cache_hit_rate"] is None and got["grammar_compiles"] == 0  # no prompts looked up
    got = figures.rates(figures.increase(_metrics(queries=1000, hits=100, compiles=3),
                                         _metrics(queries=3000, hits=1700, compiles=5)), 10.0)
    assert got["prefix_cache_hit_rate"] == 0.8 and got["grammar_compiles"] == 2  # 1600 / 2000 prompt tokens


def test_figures_without_drafts_or_history_are_none_and_a_restart_counts_from_zero():
    assert set(figures.rates(None, 5.0).values()) == {None}
    got = figures.rates(figures.increase(_metrics(gen=1000), _metrics(gen=50)), 5.0)  # the replica restarted
    assert got["output_tokens_per_s"] == 10.0 and got["acceptance_rate"] is None
    assert got["tokens_per_forward"] is None and got["latency_p50_s"] is None
    # Two replicas, one restarted: the other's cumulative count is not taken as new.
    steady = figures.increase(_metrics(gen=5000), _metrics(gen=5100))
    restarted = figures.increase(_metrics(gen=800), _metrics(gen=20))
    assert figures.rates(figures.sum_counters([steady, restarted]), 10.0)["output_tokens_per_s"] == 12.0
    assert figures.increase(None, _metrics(gen=7)).values["output_tokens"] == 7  # a new replica
    with pytest.raises(ValueError):
        figures.parse_metrics("not prometheus { text")


def test_format_errors_are_summed_per_model_from_the_proxy_checks():
    checks = {("m", "1", "ok"): 5, ("m", "1", "not_json"): 2, ("m", "2", "schema_mismatch"): 1,
              ("other", "3", "truncated"): 4}
    assert figures.format_errors_by_model(checks) == {"m": 3}


def test_the_page_json_shapes_replicas_figures_and_in_flight():
    model = {"id": 7, "name": "orders", "replicas": 2,
             "backend_parameters": ["--enable-dspark", "--dspark-speculative-length", "3", "--max-model-len=512",
                                    "--dspark-speculative-length=4"]}
    instances = [{"id": 2, "name": "orders-b", "state": "starting", "worker_name": "w"},
                 {"id": 1, "name": "orders-a", "state": "running", "worker_name": "w"}]
    infos = {1: {"phase": "ready", "reason": "warm", "warmup": {"duration_s": 2.5}, "method": "ngram",
                 "speculative_length": 4, "drafting": {"budget": None}}}
    series = {"output_tokens_per_s": [(1.0, 3.0), (6.0, 5.0)]}
    routing = {1: {"in_flight": 3, "model_id": 7, "affinity_keys": 4, "affinity_home": 40, "affinity_spilled_in": 2}}
    out = view.deployment_view(model, instances, infos, {2: "not reachable: ConnectError"}, routing, series,
                               {"format_errors": 1}, {1: _metrics(queries=200, hits=150, compiles=4)})
    assert [r["name"] for r in out["instances"]] == ["orders-a", "orders-b"]
    a, b = out["instances"]
    assert (a["phase"], a["warmup_s"], a["in_flight"], a["speculative_length"]) == ("warm", 2.5, 3, 4)
    assert (b["phase"], b["info_error"], b["in_flight"]) == (None, "not reachable: ConnectError", 0)
    assert out["replicas_warm"] == 1 and out["in_flight"] == 3
    assert out["knobs"] == {"--enable-dspark": "", "--dspark-speculative-length": "4"}
    assert out["figures"]["output_tokens_per_s"] == 5.0 and out["figures"]["acceptance_rate"] is None
    assert out["series"]["output_tokens_per_s"] == [[1.0, 3.0], [6.0, 5.0]]
    assert a["affinity"] == {"keys": 4, "home": 40, "spilled_in": 2, "prefix_cache_hit_rate": 0.75,
                             "prefix_cache_queries": 200.0, "grammar_compiles": 4.0}
    assert b["affinity"]["prefix_cache_hit_rate"] is None and b["affinity"]["keys"] is None


def test_the_editor_refuses_with_the_cli_and_api_message_and_changes_nothing():
    params = ["--enable-dspark", "--dspark-speculative-length=3"]
    edit = editor.edit_knobs(params, {"--dspark-speculative-length": "99", "--dspark-accept-threshold": "0.5"})
    assert edit.backend_parameters == params and edit.changes == []
    api = refusals(BACKEND_NAME, ["--enable-dspark", "--dspark-speculative-length=99"])
    assert edit.errors == {"--dspark-speculative-length": str(api[0])}
    assert edit.errors["--dspark-speculative-length"] == (
        "--dspark-speculative-length: '99' is not allowed; allowed: auto or an integer 1-16")
    other = editor.edit_knobs(params, {"--dspark-method": "ngram"})
    assert "not editable here" in other.errors["--dspark-method"]


def test_the_editor_rewrites_in_place_drops_duplicates_and_previews_the_diff():
    params = ["--enable-dspark", "--dspark-speculative-length", "3", "--max-model-len", "512",
              "--dspark-accept-threshold=0.3", "--dspark-accept-threshold=0.4"]
    edit = editor.edit_knobs(params, {"--dspark-speculative-length": "auto", "--dspark-accept-threshold": None,
                                      "--dspark-warmup-requests": "2"})
    assert edit.errors == {}
    assert edit.backend_parameters == ["--enable-dspark", "--dspark-speculative-length=auto", "--max-model-len",
                                       "512", "--dspark-warmup-requests=2"]
    assert edit.changes == [{"flag": "--dspark-speculative-length", "from": "3", "to": "auto"},
                            {"flag": "--dspark-accept-threshold", "from": "0.4", "to": None},
                            {"flag": "--dspark-warmup-requests", "from": None, "to": "2"}]
    assert editor.edit_knobs(params, {"--dspark-speculative-length": "3"}).changes == []


def _replicas(*spec):
    return [rollout.Replica(i, warm) for i, warm in spec]


def test_the_rollout_restarts_one_old_replica_at_a_time_and_never_goes_below_n_minus_1_warm():
    old = [1, 2, 3]
    assert rollout.next_step(_replicas((1, True), (2, True), (3, True)), 3, old) == rollout.Step(
        rollout.RESTART, 1, "replica 1 runs the old settings")
    # 1 deleted, its replacement (4) not warm yet: wait, whatever is old
    assert rollout.next_step(_replicas((2, True), (3, True), (4, False)), 3, old).action == rollout.WAIT
    assert rollout.next_step(_replicas((2, True), (3, True)), 3, old).action == rollout.WAIT
    assert rollout.next_step(_replicas((2, True), (3, True), (4, True)), 3, old) == rollout.Step(
        rollout.RESTART, 2, "replica 2 runs the old settings")
    assert rollout.next_step(_replicas((4, True), (5, True), (6, True)), 3, old).action == rollout.DONE
    # a replica that fell over during the change holds the next restart
    assert rollout.next_step(_replicas((2, False), (3, True), (4, True)), 3, old).action == rollout.WAIT
    assert rollout.progress(_replicas((2, True), (4, False)), old) == [
        {"id": 2, "warm": True, "settings": "old"}, {"id": 4, "warm": False, "settings": "new"}]


def test_a_rollout_starts_only_with_every_replica_warm():
    assert rollout.cannot_start(_replicas((1, True), (2, True)), 2) is None
    assert "replica(s) 2 not warm" in rollout.cannot_start(_replicas((1, True), (2, False)), 2)
    assert "1 of 2 replicas exist" in rollout.cannot_start(_replicas((1, True)), 2)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_a_simulated_rollout_keeps_n_minus_1_warm_at_every_step(n):
    replicas = {i: True for i in range(1, n + 1)}
    old, next_id, restarts, warm_seen = set(replicas), n + 1, 0, []
    for _ in range(10 * n):
        step = rollout.next_step(_replicas(*replicas.items()), n, old)
        warm_seen.append(sum(replicas.values()))
        if step.action == rollout.DONE:
            break
        if step.action == rollout.RESTART:
            del replicas[step.instance_id]
            restarts += 1
            replicas[next_id] = False  # GPUStack starts a replacement
            next_id += 1
        else:
            for i in replicas:
                replicas[i] = True  # it warms up
    assert step.action == rollout.DONE and restarts == n and not (set(replicas) & old)
    assert min(warm_seen) >= n - 1


def test_the_index_gets_one_script_and_only_html_200_pages_are_touched():
    page = b"<html><body><div id=root></div><script src=/js/umi.js></script></body></html>"
    once = index_inject.inject(page)
    assert once.count(index_inject.SCRIPT_TAG) == 1 and once.endswith(index_inject.SCRIPT_TAG + b"</body></html>")
    assert index_inject.inject(once) == once and index_inject.inject(b"<p>no body</p>") == b"<p>no body</p>"
    start = {"status": 200, "headers": [(b"content-type", b"text/html; charset=utf-8"), (b"content-length", b"77"),
                                        (b"etag", b'"abc"')]}
    headers, body = index_inject._rewrite(start, page)
    assert body == once and (b"etag", b'"abc-dspark"') in headers
    assert (b"content-length", str(len(once)).encode()) in headers
    for other in ({**start, "status": 304}, {**start, "headers": [(b"content-type", b"application/json")]},
                  {**start, "headers": start["headers"] + [(b"content-encoding", b"gzip")]}):
        assert index_inject._rewrite(other, page)[1] == page


def test_missing_ui_files_are_named_so_the_console_can_stay_off(tmp_path):
    from gpustack_dspark.console.routes import ASSETS, missing_assets

    assert missing_assets() == []  # the checkout's ui-patches/ has them all
    assert missing_assets(tmp_path) == list(ASSETS)


def test_the_rewrites_touch_only_their_get_path_over_asgi():
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse, JSONResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from gpustack_dspark.observe.metrics_config import MetricsConfigMiddleware

    page = "<html><body><div id=root></div></body></html>"
    app = Starlette(routes=[
        Route("/", lambda r: HTMLResponse(page), methods=["GET", "POST"]),
        Route("/other", lambda r: HTMLResponse(page)),
        Route("/v2/metrics/config", lambda r: JSONResponse({"runtime_mapping": {"vLLM": {"*": {}}}})),
    ])
    app.add_middleware(index_inject.IndexInjectMiddleware)
    app.add_middleware(MetricsConfigMiddleware, backend_name=BACKEND_NAME)
    client = TestClient(app)
    index = client.get("/")
    assert index.text.count("/dspark/ui/menu.js") == 1 and int(index.headers["content-length"]) == len(index.content)
    assert client.post("/").text == page and client.get("/other").text == page
    config = client.get("/v2/metrics/config").json()
    assert BACKEND_NAME in config["runtime_mapping"]
