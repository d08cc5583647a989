"""The plugin's loop over features (plugin.py, feature.py): how a feature's start, its off
reasons and its tasks land in the status, with stand-in features (the real ones run in the
integration tests: test_server_plugin.py, test_fault_safety.py)."""

import asyncio
from typing import List

from gpustack_dspark import gpustack_seam as gs, plugin
from gpustack_dspark.feature import Feature, FeatureOff, On, TurnedOff


class App:
    pass


class Stub(Feature):
    def __init__(self, name, start=None, internal=True, requires=(), section=None):
        self.name, self.internal, self.requires, self.section = name, internal, requires, section
        self._start = start or (lambda ctx: On())
        self.ran: List[str] = []
        self.ctx = None

    def start(self, ctx):
        self.ctx = ctx
        return self._start(ctx)

    def tasks(self):
        async def task():
            self.ran.append(self.name)
        task.__name__ = f"{self.name}_task"
        return [task]

    def status(self):
        return {"mine": self.name}


def _boom(ctx):
    raise KeyError("bug")


def _seam(ctx):
    raise gs.SeamMismatch("gpustack.x.y is missing")


def _pending(ctx):
    return None


def _off_with_detail(ctx):
    raise FeatureOff("cannot load it", selector="a=b")


def _turned_off(ctx):
    raise TurnedOff("not configured")


def _retrying(ctx):
    return On({"selector": "a=b"}, reason="starting")


def _plugin(monkeypatch, features, cfg=None, installed="2.3.0"):
    from gpustack_dspark import backend, versions

    monkeypatch.setattr(versions, "installed_gpustack_version", lambda: installed)
    registration = backend.BackendRegistration()
    monkeypatch.setattr(plugin, "build_features", lambda status, states: [*features, registration])
    monkeypatch.setattr(registration, "start", lambda ctx: None)
    monkeypatch.setattr(registration, "tasks", lambda: [])
    return plugin.DSparkPlugin(App(), cfg or object())


def test_each_outcome_lands_in_the_status_with_its_text(monkeypatch):
    features = [Stub("always", internal=False), Stub("ok"), Stub("boom", _boom), Stub("seam", _seam),
                Stub("waits", _pending), Stub("off", _off_with_detail), Stub("turned", _turned_off),
                Stub("retrying", _retrying, section="retrying_section"),
                Stub("needs_boom", requires=("boom",)), Stub("needs_ok", requires=("ok",))]
    p = _plugin(monkeypatch, features)
    states = p.status()["features"]
    assert states["always"] == {"state": "enabled"} and states["ok"] == {"state": "enabled"}
    assert states["boom"] == {"state": "disabled", "reason": "KeyError: 'bug'"}
    assert states["seam"] == {"state": "disabled", "reason": "gpustack.x.y is missing"}
    assert states["waits"] == {"state": "pending"}
    assert states["off"] == {"state": "disabled", "reason": "cannot load it", "detail": {"selector": "a=b"}}
    assert states["turned"] == {"state": "disabled", "reason": "not configured"}
    assert states["retrying"] == {"state": "enabled", "reason": "starting", "detail": {"selector": "a=b"}}
    assert states["needs_boom"] == {"state": "disabled", "reason": "boom is off: KeyError: 'bug'"}
    assert states["needs_ok"] == {"state": "enabled"}
    assert features[0].ctx.settings is None  # not internal: started before the settings are read
    assert features[1].ctx.settings is p.settings

    # Tasks: only the started features' (enabled or pending), each guarded.
    async def run():
        await asyncio.gather(*p.async_tasks())
    asyncio.run(run())
    assert [f.name for f in features if f.ran] == ["always", "ok", "waits", "retrying", "needs_ok"]

    # The status document: the plugin's sections, the features, then each feature's own section.
    document = p.status()
    assert list(document) == ["plugin", "gpustack", "settings", "backend", "features", "retrying_section"]
    assert document["retrying_section"] == {"mine": "retrying"}
    features[1].ctx.report.off("later, from its task")
    assert p.status()["features"]["ok"] == {"state": "disabled", "reason": "later, from its task"}


def test_an_unsupported_gpustack_turns_off_every_internal_feature_only(monkeypatch):
    reason = "GPUStack 2.2.0 is not the supported GPUStack 2.3.0"
    features = [Stub("always", internal=False), Stub("ok")]
    p = _plugin(monkeypatch, features, installed="2.2.0")
    states = p.status()["features"]
    assert states["always"] == {"state": "enabled"}
    assert states["ok"] == states["backend_registration"] == {"state": "disabled", "reason": reason}
    assert features[1].ctx is None  # never started
    tasks = p.async_tasks()
    assert len(tasks) == 1  # the feature that is not internal only
    asyncio.run(tasks[0])
    assert features[0].ran == ["always"]


def test_the_disable_switch_turns_off_every_internal_feature(monkeypatch):
    class Cfg:
        dspark_disable = True

    features = [Stub("always", internal=False), Stub("ok")]
    p = _plugin(monkeypatch, features, cfg=Cfg())
    assert p.settings.disabled
    assert p.status()["features"]["ok"] == {"state": "disabled", "reason": "turned off by --dspark-disable"}
    assert features[1].ctx is None


def test_a_task_that_raises_is_logged_not_raised(monkeypatch, caplog):
    class Failing(Stub):
        def tasks(self):
            async def failing():
                raise RuntimeError("task bug")
            return [failing]

    p = _plugin(monkeypatch, [Failing("f")])
    asyncio.run(p.async_tasks()[0])
    assert "background task failing failed" in caplog.text


def test_the_real_feature_list_names_each_feature_once_with_the_requirements_first():
    features = plugin.build_features(dict, dict)
    names = [f.name for f in features]
    assert len(names) == len(set(names)) == 12
    assert [f.name for f in features if not f.internal] == ["status_api"]
    for index, feature in enumerate(features):
        assert set(feature.requires) <= set(names[:index]), feature.name
    assert [f.section for f in features if f.section] == ["routing", "node_label_sync", "replica_caches"]
