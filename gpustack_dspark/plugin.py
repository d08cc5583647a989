"""DSparkPlugin: gpustack-dspark inside the GPUStack server, a loop over its features.

Why a loop: each feature is one `Feature` object (gpustack_dspark/feature.py) that starts,
gives its background tasks and its status section; this module only runs them in order, as
llm-d's scheduler runs its plugins through one interface. Adding a feature is one line in
`build_features`.

GPUStack stops the whole server when a plugin's `__init__` raises or one of its background
tasks does, so everything here is guarded: a feature that cannot run (`FeatureOff`) or fails
(any other exception) is logged and shows up as a disabled feature in `/v2/dspark/status`,
and GPUStack carries on as if that feature were not there.
"""

import asyncio
import logging
from typing import Any, Callable, Coroutine, Dict, List, Optional

from gpustack_dspark import __version__, backend
from gpustack_dspark import gpustack_seam as gs
from gpustack_dspark.admission.feature import Admission, StartFailureReasons
from gpustack_dspark.console.feature import Console
from gpustack_dspark.feature import Context, Feature, FeatureOff, Task, TurnedOff
from gpustack_dspark.k8s.feature import NodeLabelSyncFeature
from gpustack_dspark.lifecycle.feature import MissedStartRepair
from gpustack_dspark.observe.features import ENABLED, FeatureRegistry
from gpustack_dspark.observe.metrics_config import MetricsCollection
from gpustack_dspark.observe.status import StatusApi
from gpustack_dspark.placement.feature import PlacementPolicyFeature, VllmResourceFit
from gpustack_dspark.routing.feature import GatewayRoutes, RoutingFeature
from gpustack_dspark.settings import (
    PluginSettings,
    add_start_flags,
    command_line_values,
    images_from_environment,
    resolve_settings,
    server_image_from_environment,
    settings_from_config,
    settings_to_config,
)
from gpustack_dspark.versions import SUPPORTED_GPUSTACK_VERSION, check_gpustack

logger = logging.getLogger(__name__)


def build_features(status: Callable[[], Dict[str, Any]],
                   feature_states: Callable[[], Dict[str, Any]]) -> List[Feature]:
    """Every feature, in start order (a feature's `requires` come before it). `status` is the
    whole status document (served by the status API), `feature_states` its `features`."""
    routing = RoutingFeature()
    return [
        StatusApi(status),
        VllmResourceFit(),
        PlacementPolicyFeature(),
        routing,
        GatewayRoutes(routing),
        MetricsCollection(backend.BACKEND_NAME),
        NodeLabelSyncFeature(),
        Admission(),
        StartFailureReasons(),
        Console(routing.tracker.snapshot, routing.format_stats.snapshot, feature_states),
        MissedStartRepair(),
        backend.BackendRegistration(),
    ]


class DSparkPlugin(gs.Plugin):
    @classmethod
    def setup_start_cmd(cls, parser) -> None:
        add_start_flags(parser)

    @classmethod
    def contribute_config(cls, args, config_data: dict) -> None:
        # config_data already holds the --config-file keys; a bad value raises here, which
        # GPUStack reports as a start failure before anything is started.
        settings = resolve_settings(command_line_values(args), config_data)
        config_data.update(settings_to_config(settings))

    @classmethod
    def extra_image_list(cls) -> List[str]:
        # The worker images GPUStack's workers pull, and the server image with the plugin.
        return [*images_from_environment(), server_image_from_environment()]

    def __init__(self, app, cfg) -> None:
        self.registry = FeatureRegistry()
        self.settings: Optional[PluginSettings] = None
        self.version_check = check_gpustack()
        self._tasks: List[Task] = []
        self.features = build_features(self.status, self.registry.snapshot)
        self.registration = next(f for f in self.features if isinstance(f, backend.BackendRegistration))
        for feature in self.features:
            self.registry.declare(feature.name)
        try:
            self._wire(app, cfg)
        except Exception as e:  # never take the server down
            logger.exception("gpustack-dspark failed to initialise; GPUStack continues without it")
            for feature in self.features:
                if feature.internal:
                    self.registry.disable(feature.name, f"plugin initialisation failed: {e}")

    def _wire(self, app, cfg) -> None:
        # The features that need no GPUStack internals first (the status API): they stay on
        # whatever follows, so the status can say why the rest is off.
        for feature in self.features:
            if not feature.internal:
                self._start(feature, app)
        self.settings = settings_from_config(cfg)
        if self.settings.disabled:
            self._all_off("turned off by --dspark-disable")
            logger.info("gpustack-dspark %s loaded with all features off (--dspark-disable)", __version__)
            return
        if not self.version_check.ok:
            self._all_off(self.version_check.reason)
            logger.error("gpustack-dspark %s: %s; its features are off", __version__, self.version_check.reason)
            return
        for feature in self.features:
            if feature.internal:
                self._start(feature, app)
        logger.info(
            "gpustack-dspark %s loaded: JSON worker label %s, images cuda=%s cpu=%s",
            __version__, self.settings.json_label_text, self.settings.cuda_image, self.settings.cpu_image,
        )

    def _all_off(self, reason: str) -> None:
        for feature in self.features:
            if feature.internal:
                self.registry.disable(feature.name, reason)

    def _start(self, feature: Feature, app) -> None:
        """Start one feature: enabled (or pending on its task) with its tasks queued, or off
        with the reason. Nothing it raises gets further."""
        report = self.registry.reporter(feature.name)
        try:
            for needed in feature.requires:
                state = self.registry.get(needed)
                if state.state != ENABLED:
                    raise FeatureOff(f"{needed} is off: {state.reason}")
            started = feature.start(Context(app=app, settings=self.settings, report=report))
            tasks = feature.tasks()
        except FeatureOff as off:
            consequence = f" ({feature.when_off})" if feature.when_off else ""
            # One line: the reason is the message (a feature that wants a traceback logs it).
            logger.log(logging.INFO if isinstance(off, TurnedOff) else logging.ERROR,
                       "gpustack-dspark %s is off%s: %s", feature.name, consequence, off)
            report.off(str(off), **off.detail)
            return
        except Exception as e:
            logger.exception("gpustack-dspark %s is off%s", feature.name,
                             f" ({feature.when_off})" if feature.when_off else "")
            report.off(f"{type(e).__name__}: {e}")
            return
        if started is not None:
            report.on(started.reason, **started.detail)
        self._tasks.extend(tasks)

    def async_tasks(self) -> List[Coroutine[Any, Any, Any]]:
        return [self._guarded(task) for task in self._tasks]

    async def _guarded(self, task: Task) -> None:
        try:
            await task()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("gpustack-dspark background task %s failed", task.__name__)

    def status(self) -> Dict[str, Any]:
        settings = self.settings
        return {
            "plugin": {"name": "gpustack-dspark", "version": __version__},
            "gpustack": {
                "version": self.version_check.installed,
                "supported_version": SUPPORTED_GPUSTACK_VERSION,
                "supported": self.version_check.ok,
            },
            "settings": settings.as_dict() if settings else None,
            "backend": {
                **self.registration.info,
                "health_check_path": backend.HEALTH_CHECK_PATH,
                "versions": {
                    name: config["image_name"]
                    for name, config in backend.desired_backend(settings)["version_configs"].items()
                } if settings else {},
            },
            "features": self.registry.snapshot(),
            **{feature.section: feature.status() for feature in self.features if feature.section},
        }
