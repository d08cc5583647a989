"""DSparkPlugin: wires gpustack-dspark into the GPUStack server. Logic lives elsewhere.

GPUStack stops the whole server when a plugin's `__init__` raises or one of its
background tasks does, so everything here is guarded: a failure is logged and shows up
as a disabled feature in `/v2/dspark/status`, and GPUStack carries on as if the plugin
were not there.
"""

import asyncio
import logging
from typing import Any, Awaitable, Callable, Coroutine, Dict, List, Optional

from gpustack.extension import Plugin

from gpustack_dspark import __version__, backend
from gpustack_dspark.admission import gpustack_patches as admission_patches
from gpustack_dspark.admission.body_limit import BodyLimitMiddleware
from gpustack_dspark.console.index_inject import IndexInjectMiddleware
from gpustack_dspark.console.rolling import Rollouts
from gpustack_dspark.console.routes import build_console_router, missing_assets
from gpustack_dspark.console.sampler import ConsoleSampler
from gpustack_dspark.k8s.feature import NodeLabelSync
from gpustack_dspark.lifecycle import gpustack_patches as lifecycle_patches
from gpustack_dspark.lifecycle.missed_start import MissedStart
from gpustack_dspark.observe.features import FeatureRegistry
from gpustack_dspark.observe.metrics_config import MetricsConfigMiddleware
from gpustack_dspark.observe.status import build_status_router
from gpustack_dspark.placement import gpustack_patches
from gpustack_dspark.routing.feature import RoutingFeature
from gpustack_dspark.placement.policy import PlacementPolicy, load_policy
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

FEATURE_STATUS_API = "status_api"
FEATURE_BACKEND = "backend_registration"
FEATURE_VLLM_FIT = "vllm_resource_fit"
FEATURE_PLACEMENT = "placement_policy"
FEATURE_ROUTING = "routing"  # proxy mode: least-connections, JSON-aware targets, one retry
FEATURE_GATEWAY_ROUTES = "routing_gateway_routes"  # least-load on DSpark routes (Higress)
FEATURE_METRICS_COLLECTION = "metrics_collection"  # GPUStack's workers scrape DSpark replicas
FEATURE_ADMISSION = "admission"  # bad DSpark knobs refused where GPUStack validates models
FEATURE_START_FAILURES = "start_failure_reasons"  # a replica's config error in state_message, no restart loop
FEATURE_NODE_LABEL_SYNC = "node_label_sync"  # Kubernetes node labels -> the JSON worker label
FEATURE_CONSOLE = "console"  # the DSpark page in GPUStack's web UI, its menu entry, the sampler
FEATURE_MISSED_START = "missed_start_repair"  # a DSpark instance stuck STARTING re-announced (lifecycle/)
# Features that need GPUStack internals; they wait on the version check.
INTERNAL_FEATURES = (FEATURE_BACKEND, FEATURE_VLLM_FIT, FEATURE_PLACEMENT, FEATURE_ROUTING,
                     FEATURE_GATEWAY_ROUTES, FEATURE_METRICS_COLLECTION, FEATURE_ADMISSION,
                     FEATURE_START_FAILURES, FEATURE_NODE_LABEL_SYNC, FEATURE_CONSOLE, FEATURE_MISSED_START)

REGISTRATION_ATTEMPTS = 6
REGISTRATION_FIRST_DELAY_S = 1.0


class DSparkPlugin(Plugin):
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
        self.features = FeatureRegistry()
        self.settings: Optional[PluginSettings] = None
        self.version_check = check_gpustack()
        self.backend_info: Dict[str, Any] = {"name": backend.BACKEND_NAME}
        self.placement_policy: Optional[PlacementPolicy] = None
        self._tasks: List[Callable[[], Awaitable[None]]] = []
        self.routing = RoutingFeature()
        self.node_label_sync: Optional[NodeLabelSync] = None
        self.console: Optional[ConsoleSampler] = None
        for name in (FEATURE_STATUS_API,) + INTERNAL_FEATURES:
            self.features.declare(name)
        try:
            self._wire(app, cfg)
        except Exception as e:  # never take the server down
            logger.exception("gpustack-dspark failed to initialise; GPUStack continues without it")
            for name in INTERNAL_FEATURES:
                self.features.disable(name, f"plugin initialisation failed: {e}")

    def _wire(self, app, cfg) -> None:
        try:
            app.include_router(build_status_router(self.status))
            self.features.enable(FEATURE_STATUS_API)
        except Exception as e:
            logger.exception("gpustack-dspark could not mount its status API")
            self.features.disable(FEATURE_STATUS_API, f"could not mount the status API: {e}")

        self.settings = settings_from_config(cfg)
        if self.settings.disabled:
            for name in INTERNAL_FEATURES:
                self.features.disable(name, "turned off by --dspark-disable")
            logger.info("gpustack-dspark %s loaded with all features off (--dspark-disable)", __version__)
            return
        if not self.version_check.ok:
            for name in INTERNAL_FEATURES:
                self.features.disable(name, self.version_check.reason)
            logger.error("gpustack-dspark %s: %s; its features are off", __version__, self.version_check.reason)
            return

        self._apply_vllm_fit()
        self._apply_placement_policy()
        self._apply_routing(app)
        self._apply_metrics_collection(app)
        self._apply_node_label_sync()
        self._apply_admission(app)
        self._apply_console(app)
        self._apply_missed_start()
        self._tasks.append(self._register_backend)
        logger.info(
            "gpustack-dspark %s loaded: JSON worker label %s, images cuda=%s cpu=%s",
            __version__, self.settings.json_label_text, self.settings.cuda_image, self.settings.cpu_image,
        )

    def _apply_vllm_fit(self) -> None:
        try:
            result = gpustack_patches.route_gpu_flavour_to_vllm_fit()
        except Exception as e:
            logger.exception("gpustack-dspark could not route DSpark CUDA models to vLLM's resource fit")
            result = gpustack_patches.PatchResult(False, f"{type(e).__name__}: {e}")
        if result.applied:
            self.features.enable(FEATURE_VLLM_FIT)
        else:
            logger.warning("DSpark CUDA models use GPUStack's custom-backend fit: %s", result.reason)
            self.features.disable(FEATURE_VLLM_FIT, result.reason)

    def _apply_routing(self, app) -> None:
        try:
            self.routing.start(app, self.settings.policy_dir)
        except Exception as e:
            logger.exception("gpustack-dspark routing is off; GPUStack's round-robin proxy stays")
            reason = f"{type(e).__name__}: {e}" if not isinstance(e, ValueError) else str(e)
            self.features.disable(FEATURE_ROUTING, reason)
            self.features.disable(FEATURE_GATEWAY_ROUTES, "routing is off: " + reason)
            return
        self.features.enable(FEATURE_ROUTING, hooks=list(self.routing.hooks))
        if self.routing.policy.proxy.gc_freeze:
            self._tasks.append(self.routing.gc_freeze_task)
        if not self.routing.policy.gateway.least_load:
            self.features.disable(FEATURE_GATEWAY_ROUTES, "turned off by gateway.least_load=false in the routing policy")
            return
        try:
            self.routing.start_gateway()
        except Exception as e:
            logger.exception("gpustack-dspark cannot manage DSpark routes' gateway configuration")
            self.features.disable(FEATURE_GATEWAY_ROUTES, f"{type(e).__name__}: {e}")
            return
        self.features.enable(FEATURE_GATEWAY_ROUTES)
        self._tasks.append(self.routing.gateway_task)
    def _apply_metrics_collection(self, app) -> None:
        try:
            app.add_middleware(MetricsConfigMiddleware, backend_name=backend.BACKEND_NAME)
        except Exception as e:
            logger.exception("GPUStack's workers will not scrape DSpark replicas")
            self.features.disable(FEATURE_METRICS_COLLECTION, f"{type(e).__name__}: {e}")
            return
        self.features.enable(FEATURE_METRICS_COLLECTION, runtime=backend.BACKEND_NAME)

    def _apply_node_label_sync(self) -> None:
        selector = self.settings.node_label_sync_selector
        if not selector:
            self.features.disable(FEATURE_NODE_LABEL_SYNC, "not configured (--dspark-node-label-sync-selector)")
            return
        sync = NodeLabelSync(selector, self.settings.node_label_sync_kubeconfig, self.settings.json_label,
                             lambda reason, **detail: self.features.running(FEATURE_NODE_LABEL_SYNC, reason, **detail))
        try:
            sync.start()
        except Exception as e:
            logger.error("DSpark node-label sync is off: %s", e)
            self.features.disable(FEATURE_NODE_LABEL_SYNC, str(e), selector=selector)
            return
        self.node_label_sync = sync
        self.features.running(FEATURE_NODE_LABEL_SYNC, "starting", selector=selector)
        self._tasks.append(self._run_node_label_sync)

    async def _run_node_label_sync(self) -> None:
        try:
            await self.node_label_sync.task()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug in the sync: this feature off, the server unaffected
            logger.exception("DSpark node-label sync stopped")
            self.features.disable(FEATURE_NODE_LABEL_SYNC, f"stopped: {type(e).__name__}: {e}")
    def _apply_admission(self, app) -> None:
        for feature, apply in ((FEATURE_ADMISSION, lambda: self._admission_patches(app)),
                               (FEATURE_START_FAILURES, lambda: admission_patches.explain_start_failures(app))):
            try:
                result = apply()
            except Exception as e:
                logger.exception("gpustack-dspark %s is off", feature)
                result = admission_patches.PatchResult(False, f"{type(e).__name__}: {e}")
            if result.applied:
                self.features.enable(feature)
            else:
                logger.error("gpustack-dspark %s is off: %s", feature, result.reason)
                self.features.disable(feature, result.reason)

    @staticmethod
    def _admission_patches(app) -> admission_patches.PatchResult:
        for patch in (admission_patches.refuse_bad_knobs, admission_patches.bound_import_documents):
            result = patch()
            if not result.applied:
                return result
        app.add_middleware(BodyLimitMiddleware)
        return result

    def _apply_console(self, app) -> None:
        # Off (with the reason) if anything is missing; GPUStack's own UI is then untouched.
        try:
            missing = missing_assets()
            if missing:
                raise RuntimeError(f"ui-patches/ lacks {', '.join(missing)}")
            detail = {"page": "/dspark/console"}
            sampler = ConsoleSampler(self.routing.tracker.snapshot, self.routing.format_stats.snapshot,
                                     lambda reason: self.features.running(FEATURE_CONSOLE, reason, **detail))
            app.include_router(build_console_router(sampler, Rollouts(), self.features.snapshot))
            app.add_middleware(IndexInjectMiddleware)
        except Exception as e:
            logger.exception("gpustack-dspark console is off")
            self.features.disable(FEATURE_CONSOLE, f"{type(e).__name__}: {e}")
            return
        self.console = sampler
        self.features.enable(FEATURE_CONSOLE, **detail)
        self._tasks.append(sampler.task)

    def _apply_missed_start(self) -> None:
        problems = lifecycle_patches.check()
        if problems:
            logger.error("gpustack-dspark %s is off: %s", FEATURE_MISSED_START, "; ".join(problems))
            self.features.disable(FEATURE_MISSED_START, "; ".join(problems))
            return
        tracker = MissedStart()
        self.features.running(FEATURE_MISSED_START, None, **tracker.snapshot())

        async def missed_start_task() -> None:
            await lifecycle_patches.task(tracker, lambda reason: self.features.running(
                FEATURE_MISSED_START, reason, **tracker.snapshot()))

        self._tasks.append(missed_start_task)

    def _apply_placement_policy(self) -> None:
        # A bad policy file turns off this feature only; GPUStack then schedules as usual.
        try:
            self.placement_policy = load_policy(self.settings.policy_dir, self.settings.json_label)
            result = gpustack_patches.enforce_placement_policy(lambda: self.placement_policy)
        except Exception as e:
            result = gpustack_patches.PatchResult(False, str(e))
        if not result.applied:
            self.placement_policy = None
            logger.error("DSpark placement policy is off: %s", result.reason)
            self.features.disable(FEATURE_PLACEMENT, result.reason)
            return
        self.features.enable(FEATURE_PLACEMENT, **self.placement_policy.as_dict())

    def async_tasks(self) -> List[Coroutine[Any, Any, Any]]:
        return [self._guarded(task) for task in self._tasks]

    async def _guarded(self, task: Callable[[], Awaitable[None]]) -> None:
        try:
            await task()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("gpustack-dspark background task %s failed", task.__name__)

    async def _register_backend(self) -> None:
        delay = REGISTRATION_FIRST_DELAY_S
        for attempt in range(1, REGISTRATION_ATTEMPTS + 1):
            try:
                result = await backend.register_backend(self.settings)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                reason = f"registering the {backend.BACKEND_NAME} backend failed: {type(e).__name__}: {e}"
                if attempt == REGISTRATION_ATTEMPTS:
                    logger.error("%s (gave up after %d attempts)", reason, attempt)
                    self.features.disable(FEATURE_BACKEND, reason)
                    return
                logger.warning("%s; retrying in %.1f s", reason, delay)
                await asyncio.sleep(delay)
                delay *= 2
                continue
            self.backend_info.update(id=result.backend_id, last_registration=result.action)
            self.features.enable(FEATURE_BACKEND, action=result.action)
            return

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
                **self.backend_info,
                "health_check_path": backend.HEALTH_CHECK_PATH,
                "versions": {
                    name: config["image_name"]
                    for name, config in backend.desired_backend(settings)["version_configs"].items()
                } if settings else {},
            },
            "features": self.features.snapshot(),
            "routing": self.routing.status(),
            "node_label_sync": self.node_label_sync.status() if self.node_label_sync else None,
        }
