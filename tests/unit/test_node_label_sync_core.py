"""The node-label sync's pure parts: label selectors, the plan, the node view; the flags."""

import pytest

from gpustack_dspark import settings
from gpustack_dspark.k8s.node_labels import MARKER_KEY, MARKER_VALUE, NodeView, WorkerLabels, plan_labels
from gpustack_dspark.labels import parse_selector, selector_matches, selector_text

JSON = ("role", "json-inference")
OURS = {"role": "json-inference", MARKER_KEY: MARKER_VALUE}


@pytest.mark.parametrize("text,normal,labels,matches", [
    ("pool=json", "pool=json", {"pool": "json"}, True),
    ("pool==json", "pool=json", {"pool": "json"}, True),
    ("pool!=json", "pool!=json", {}, True),  # != matches a missing key (as in Kubernetes)
    ("pool", "pool", {"pool": ""}, True),
    ("!pool", "!pool", {"pool": "x"}, False),
    ("tier in (a, b),gpustack-dspark.io/json-inference=true", "tier in (a,b),gpustack-dspark.io/json-inference=true",
     {"tier": "b", "gpustack-dspark.io/json-inference": "true"}, True),
    ("tier notin (a,b)", "tier notin (a,b)", {"tier": "a"}, False),
    (" a = b , c ", "a=b,c", {"a": "b", "c": "1"}, True),
])
def test_selectors_parse_and_match_like_kubernetes(text, normal, labels, matches):
    requirements = parse_selector(text)
    assert selector_text(requirements) == normal
    assert selector_matches(requirements, labels) is matches


@pytest.mark.parametrize("text,fragment", [
    ("", "the label selector is empty"),
    ("a=b,,c", "has an empty requirement"),
    ("a b", "is not one of: key, !key, key=value"),
    ("a>3", "is not one of"),
    ("Bad_/x=1", "label key 'Bad_/x' is not a valid label key"),
    ("a=" + "v" * 64, "is not a valid label value"),
    ("a in ()", "in needs at least one value"),
])
def test_bad_selectors_are_refused_naming_the_part(text, fragment):
    with pytest.raises(ValueError) as e:
        parse_selector(text)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_the_selector_flag_names_itself_on_a_bad_value():
    import argparse

    parser = argparse.ArgumentParser(prog="gpustack start")
    settings.add_start_flags(parser, environ={})
    assert parser.parse_args(["--dspark-node-label-sync-selector", "a == b"]).dspark_node_label_sync_selector == "a=b"
    with pytest.raises(SystemExit):
        parser.parse_args(["--dspark-node-label-sync-selector", "a b"])
    with pytest.raises(ValueError, match="environment variable GPUSTACK_DSPARK_NODE_LABEL_SYNC_SELECTOR: label selector"):
        settings.resolve_settings({}, {}, environment={settings.FLAG_NODE_SELECTOR.env: "x y"})
    resolved = settings.resolve_settings({}, {"dspark_node_label_sync_selector": "pool=json",
                                              "dspark_node_label_sync_kubeconfig": "kc"})
    assert resolved.node_label_sync_selector == "pool=json" and resolved.node_label_sync_kubeconfig.endswith("/kc")
    assert settings.PluginSettings().node_label_sync_selector is None  # off by default


def _w(i, name, **labels):
    return WorkerLabels(i, name, labels)


def _by_name(plan):
    return {c.worker_name: (dict(c.set), c.remove) for c in plan.changes}


def test_matching_node_workers_get_the_label_with_the_marker():
    plan = plan_labels({"n1", "n2"}, [_w(1, "n1"), _w(2, "n2", role="general"), _w(3, "other")], JSON)
    assert _by_name(plan) == {"n1": (OURS, ()), "n2": (OURS, ())}
    assert plan.labelled == ("n1", "n2")


def test_a_hand_set_label_is_kept_and_never_claimed():
    plan = plan_labels({"n1"}, [_w(1, "n1", role="json-inference"), _w(2, "laptop", role="json-inference")], JSON)
    assert plan.changes == () and plan.labelled == ("n1",)
    assert plan_labels(set(), [_w(1, "n1", role="json-inference")], JSON).changes == ()


def test_only_the_syncs_own_labels_are_removed():
    workers = [_w(1, "gone", **OURS), _w(2, "changed", role="general", **{MARKER_KEY: MARKER_VALUE}),
               _w(3, "kept", **OURS), _w(4, "hand", role="json-inference")]
    plan = plan_labels({"kept"}, workers, JSON)
    assert _by_name(plan) == {"gone": ({}, ("role", MARKER_KEY)), "changed": ({}, (MARKER_KEY,))}
    change = plan.changes[0]
    assert change.apply({"role": "json-inference", MARKER_KEY: MARKER_VALUE, "os": "linux"}) == {"os": "linux"}


def test_two_workers_with_one_name_are_left_alone():
    plan = plan_labels({"n1"}, [_w(1, "n1"), _w(2, "n1", **OURS), _w(3, "n2", **OURS)], JSON)
    assert plan.ambiguous == ("n1",)
    assert _by_name(plan) == {"n2": ({}, ("role", MARKER_KEY))}


def test_node_view_follows_lists_and_watch_events():
    view = NodeView(parse_selector("pool=json"))
    assert view.matching() == frozenset() and not view.synced
    assert view.replace({"a": {"pool": "json"}, "b": {}}, "10") is True
    assert view.synced and view.matching() == {"a"} and view.resource_version == "10"
    assert view.event("ADDED", "c", {"pool": "json"}, "11") is True
    assert view.event("MODIFIED", "c", {"pool": "json", "x": "1"}, "12") is False
    assert view.event("MODIFIED", "a", {"pool": "other"}, "13") is True  # re-checked here too
    assert view.event("DELETED", "c", {"pool": "json"}, "14") is True
    assert view.matching() == frozenset() and view.resource_version == "14"
    assert view.event("BOOKMARK", "", {}, "15") is False and view.resource_version == "15"
