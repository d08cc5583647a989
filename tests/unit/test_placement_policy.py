"""The placement policy's pure parts: the file format and the decisions."""

from pathlib import Path

import pytest
import yaml

from gpustack_dspark.placement.policy import (
    ISOLATED,
    JSON_ONLY,
    KEEP_ALL,
    ClusterPolicy,
    PolicyError,
    WorkerView,
    isolation_message,
    load_policy,
    missing_label_message,
    parse_policy,
    screen_workers,
)

ROLE = ("role", "json-inference")
SHIPPED = Path(__file__).resolve().parents[2] / "policies"
DSPARK = "DSpark-custom"


def _parse(data):
    return parse_policy(data, ROLE, "placement.yaml")


def test_the_shipped_file_is_the_built_in_default():
    shipped = load_policy(str(SHIPPED), ROLE)
    built_in = load_policy(None, ROLE)
    assert shipped.default == built_in.default == ClusterPolicy(ROLE, True, frozenset({DSPARK}))
    assert shipped.clusters == {} and shipped.source.endswith("policies/placement.yaml")
    assert built_in.source == "built-in defaults"


def test_cluster_overrides_inherit_the_rest():
    policy = _parse({"json_label": "pool=json", "clusters": {
        "lab": {"isolation": False}, "gpu": {"json_label": "tier=json", "json_backends": ["A-custom"]}}})
    assert policy.default == ClusterPolicy(("pool", "json"), True, frozenset({DSPARK}))
    assert policy.for_cluster("lab") == ClusterPolicy(("pool", "json"), False, frozenset({DSPARK}))
    assert policy.for_cluster("gpu") == ClusterPolicy(("tier", "json"), True, frozenset({"A-custom"}))
    assert policy.for_cluster("other") == policy.default and policy.for_cluster(None) == policy.default
    assert policy.as_dict()["clusters"]["lab"] == {
        "json_label": "pool=json", "isolation": False, "json_backends": [DSPARK]}


def test_empty_file_means_defaults():
    assert _parse(None).default == ClusterPolicy(ROLE)


@pytest.mark.parametrize("data, expected", [
    ({"isolaton": True},
     "placement.yaml: key 'isolaton' is not a placement policy key (allowed: json_label, isolation, "
     "json_backends, clusters)"),
    ({"isolation": "maybe"}, "placement.yaml: key 'isolation': Input should be a valid boolean (got 'maybe')"),
    ({"json_label": "role"}, "key 'json_label': 'role' is not KEY=VALUE"),
    ({"json_backends": []}, "key 'json_backends': must name at least one backend"),
    ({"clusters": {"lab": {"isolation": "off"}}}, "key 'clusters.lab.isolation': Input should be a valid boolean"),
    ({"clusters": {"lab": {"label": "x=y"}}},
     "key 'clusters.lab.label' is not a placement policy key (allowed: json_label, isolation, json_backends)"),
    (["isolation"], "placement.yaml: expected a mapping of policy keys, got list"),
])
def test_bad_values_name_the_key(data, expected):
    with pytest.raises(PolicyError) as e:
        _parse(data)
    assert expected in str(e.value)


def test_file_problems_name_the_file(tmp_path):
    with pytest.raises(PolicyError, match="not a directory"):
        load_policy(str(tmp_path / "nope"), ROLE)
    assert load_policy(str(tmp_path), ROLE).source.endswith("(absent: built-in defaults)")
    (tmp_path / "placement.yaml").write_text("isolation: [unclosed\n")
    with pytest.raises(PolicyError, match=r"placement.yaml: cannot read it as YAML"):
        load_policy(str(tmp_path), ROLE)
    (tmp_path / "placement.yaml").write_text(yaml.safe_dump({"isolation": False}))
    assert load_policy(str(tmp_path), ROLE).default.isolation is False


JSON_A = WorkerView("json-a", 1, {"role": "json-inference"})
GEN_B = WorkerView("gen-b", 1, {"role": "general"})
GEN_C = WorkerView("gen-c", 1, {})
OTHER_CLUSTER = WorkerView("far", 2, {})
FLEET = [JSON_A, GEN_B, GEN_C, OTHER_CLUSTER]


def test_json_workloads_keep_only_labelled_workers_of_their_cluster():
    s = screen_workers(DSPARK, {}, 1, FLEET, ClusterPolicy(ROLE))
    assert (s.rule, s.keep, s.excluded, s.labelled) == (JSON_ONLY, (0, 3), ("gen-b", "gen-c"), ("json-a",))
    # The model's own selector is left to GPUStack's label filter, on top of this.
    assert screen_workers(DSPARK, {"gpu": "h100"}, 1, FLEET, ClusterPolicy(ROLE)).keep == (0, 3)


def test_naming_the_label_key_opts_out():
    s = screen_workers(DSPARK, {"role": "general"}, 1, FLEET, ClusterPolicy(ROLE))
    assert (s.rule, s.keep, s.excluded) == (KEEP_ALL, (0, 1, 2, 3), ())


def test_isolation_keeps_other_models_off_labelled_workers():
    s = screen_workers("vLLM", None, 1, FLEET, ClusterPolicy(ROLE))
    assert (s.rule, s.keep, s.excluded) == (ISOLATED, (1, 2, 3), ("json-a",))
    # Even a model that asks for the label: isolation is the cluster's rule, not the model's.
    assert screen_workers("vLLM", {"role": "json-inference"}, 1, FLEET, ClusterPolicy(ROLE)).excluded == ("json-a",)


def test_isolation_off_keeps_everything():
    s = screen_workers("vLLM", None, 1, FLEET, ClusterPolicy(ROLE, isolation=False))
    assert (s.rule, s.keep) == (KEEP_ALL, (0, 1, 2, 3))


def test_json_backends_decide_what_counts_as_json():
    policy = ClusterPolicy(ROLE, json_backends=frozenset({"vLLM"}))
    assert screen_workers("vLLM", None, 1, FLEET, policy).rule == JSON_ONLY
    assert screen_workers(DSPARK, None, 1, FLEET, policy).rule == ISOLATED


def test_unknown_cluster_considers_every_worker():
    s = screen_workers(DSPARK, None, None, FLEET, ClusterPolicy(ROLE))
    assert s.keep == (0,) and s.excluded == ("gen-b", "gen-c", "far")


def test_missing_label_message_says_which_label_and_how():
    none = screen_workers(DSPARK, None, 1, [GEN_B], ClusterPolicy(ROLE))
    text = missing_label_message(DSPARK, none, ClusterPolicy(ROLE))
    assert "no worker in this cluster has the label role=json-inference" in text
    assert "`gpustack-dspark label <worker> role=json-inference`" in text
    assert "POST /v2/workers/labels" in text and "'role' in the model's worker selector" in text
    some = screen_workers(DSPARK, None, 1, FLEET, ClusterPolicy(ROLE))
    assert "only on workers labelled role=json-inference (json-a), and none of them can take" in \
        missing_label_message(DSPARK, some, ClusterPolicy(ROLE))


def test_isolation_message_says_isolation_excluded_them():
    s = screen_workers("vLLM", None, 1, FLEET, ClusterPolicy(ROLE))
    fits = isolation_message(s, ClusterPolicy(ROLE), "json-a")
    assert fits.startswith("DSpark isolation: this model would fit on json-a, but workers labelled "
                           "role=json-inference accept only JSON models (backends: DSpark-custom)")
    assert "isolation: false" in fits
    assert isolation_message(s, ClusterPolicy(ROLE), None) == (
        "DSpark isolation: 1 worker(s) were not considered (json-a): workers labelled "
        "role=json-inference accept only JSON models (backends: DSpark-custom).")
