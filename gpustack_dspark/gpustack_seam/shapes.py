"""Every GPUStack 2.3 internal the plugin uses: one table, one row per name.

Why: the plugin reaches into GPUStack (its schemas, services, scheduler, proxy, auth). When
GPUStack moves something, this table is the one place to change; `guard.problems` checks each
row (importable, present, parameter names, coroutine-ness) so a moved name turns off exactly
the features that need it, with a one-line reason naming it. Nothing here imports GPUStack:
rows are resolved lazily by `guard.resolve`.
"""

from dataclasses import dataclass
from typing import Dict, Optional, Tuple


@dataclass(frozen=True)
class Shape:
    module: str
    """The GPUStack module, e.g. `gpustack.routes.openai`."""
    attr: str = ""
    """Attribute path inside the module ("" = the module itself; dotted for class members)."""
    params: Optional[Tuple[str, ...]] = None
    """The parameter names it must take, in order (None: not checked)."""
    method: str = ""
    """For a class whose shape is one method's: the method whose `params` are checked."""
    coroutine: bool = False
    """It must be a coroutine function (the wrapper awaits it)."""

    @property
    def where(self) -> str:
        return ".".join(p for p in (self.module, self.attr) if p)


def _s(module: str, attr: str = "", params: Optional[Tuple[str, ...]] = None, **kw) -> Shape:
    return Shape(module, attr, tuple(params) if params is not None else None, **kw)


DB = "gpustack.server.db"
MODELS = "gpustack.schemas.models"
SERVICES = "gpustack.server.services"
OPENAI = "gpustack.routes.openai"
SCHEDULER = "gpustack.scheduler.scheduler"

SHAPES: Dict[str, Shape] = {
    # --- the plugin base and the database --------------------------------------------------
    "Plugin": _s("gpustack.extension", "Plugin"),
    "db": _s(DB),  # `db.engine`: the writer lock's own connection (k8s/)
    "async_session": _s(DB, "async_session"),
    # --- schemas ----------------------------------------------------------------------------
    "Model": _s(MODELS, "Model"),
    "Model.one_by_id": _s(MODELS, "Model.one_by_id"),
    "ModelInstance": _s(MODELS, "ModelInstance"),
    "ModelInstance.all_by_field": _s(MODELS, "ModelInstance.all_by_field"),
    "ModelInstanceStateEnum": _s(MODELS, "ModelInstanceStateEnum"),
    "BackendSourceEnum": _s(MODELS, "BackendSourceEnum"),
    "InferenceBackend": _s("gpustack.schemas.inference_backend", "InferenceBackend"),
    "VersionConfigDict": _s("gpustack.schemas.inference_backend", "VersionConfigDict"),
    "Worker": _s("gpustack.schemas.workers", "Worker"),
    "Cluster": _s("gpustack.schemas.clusters", "Cluster"),
    "ModelRoute": _s("gpustack.schemas.model_routes", "ModelRoute"),
    "ModelRouteTarget": _s("gpustack.schemas.model_routes", "ModelRouteTarget"),
    # --- services ---------------------------------------------------------------------------
    "ModelService": _s(SERVICES, "ModelService"),
    "WorkerService": _s(SERVICES, "WorkerService"),
    "WorkerService.get_workers_for_update": _s(SERVICES, "WorkerService.get_workers_for_update"),
    "WorkerService.batch_update": _s(SERVICES, "WorkerService.batch_update"),
    "ModelInstanceService": _s(SERVICES, "ModelInstanceService"),
    "ModelInstanceService.update": _s(SERVICES, "ModelInstanceService.update"),
    "ModelInstanceService.delete": _s(SERVICES, "ModelInstanceService.delete"),
    # --- API: errors and authentication ----------------------------------------------------
    "BadRequestException": _s("gpustack.api.exceptions", "BadRequestException"),
    "get_current_user": _s("gpustack.api.auth", "get_current_user"),
    "get_admin_user": _s("gpustack.api.auth", "get_admin_user"),
    "authenticate_request": _s("gpustack.api.auth", "authenticate_request"),
    "SESSION_COOKIE_NAME": _s("gpustack.api.auth", "SESSION_COOKIE_NAME"),
    # --- the proxy (routing/gpustack_patches.py) ----------------------------------------
    "openai": _s(OPENAI),
    "openai.load_balancer": _s(OPENAI, "load_balancer"),
    "openai.ModelRouteService": _s(OPENAI, "ModelRouteService", ("self", "name"), method="resolve_route_targets"),
    "openai.parse_request_body": _s(OPENAI, "parse_request_body", ("request",)),
    "openai.request_to_worker": _s(OPENAI, "request_to_worker", (
        "worker", "method", "path", "proxy_client", "no_proxy_client", "params", "data", "headers", "timeout",
        "raise_on_error")),
    "openai.get_running_instance": _s(OPENAI, "get_running_instance", ("session", "model", "overridden_model_name")),
    "openai._stream_response": _s(OPENAI, "_stream_response", (
        "worker", "method", "path", "headers", "data", "proxy_client", "no_proxy_client")),
    "LoadBalancingStrategy": _s("gpustack.http_proxy.strategies", "LoadBalancingStrategy", ("self", "instances"),
                                method="select_instance"),
    "model_instance_prefix": _s("gpustack.gateway.utils", "model_instance_prefix"),
    "router_header_key": _s("gpustack.gateway.utils", "router_header_key"),
    # --- gateway routes (routing/gateway_sync.py) ------------------------------------------
    "RoutePlugin": _s("gpustack.routes.plugins", "RoutePlugin"),
    "get_route_plugin": _s("gpustack.routes.plugins", "get_route_plugin"),
    "register_route_plugin": _s("gpustack.routes.plugins", "register_route_plugin"),
    "enrich_routes": _s("gpustack.routes.plugins", "enrich_routes"),
    "lb_plugin": _s("gpustack.routes.plugins.lb.plugin", "lb_plugin"),
    # --- the scheduler (placement/gpustack_patches.py) -------------------------------------
    "scheduler": _s(SCHEDULER),
    "scheduler.build_candidate_selector": _s(SCHEDULER, "build_candidate_selector", (
        "config", "model", "model_instances", "cpu_only", "ram_claim", "resource_view")),
    "scheduler.find_candidate": _s(SCHEDULER, "find_candidate", (
        "session", "config", "model", "workers", "model_instances", "role", "exclude_instance_id", "group_id",
        "resource_view"), coroutine=True),
    "VLLMResourceFitSelector": _s("gpustack.policies.candidate_selectors", "VLLMResourceFitSelector"),
    # --- admission (admission/gpustack_patches.py) -----------------------------------------
    "routes.models": _s("gpustack.routes.models"),
    "routes.models.validate_model_in": _s("gpustack.routes.models", "validate_model_in",
                                          ("session", "model_in", "cluster_id", "stored")),
    "routes.models.load_deployments": _s("gpustack.routes.models", "load_deployments", ("text",)),
    "evaluator": _s("gpustack.scheduler.evaluator"),
    "evaluator.validate_model_in": _s("gpustack.scheduler.evaluator", "validate_model_in"),
    "flatten_to_argv": _s("gpustack.utils.command", "flatten_to_argv", ("parameters",)),
    "routes.model_instances": _s("gpustack.routes.model_instances"),
    "routes.model_instances.ModelInstanceService": _s(
        "gpustack.routes.model_instances", "ModelInstanceService", ("self", "model_instance", "source"),
        method="update"),
    "routes.model_instances._build_serve_log_params": _s(
        "gpustack.routes.model_instances", "_build_serve_log_params",
        ("model_instance", "tail", "follow", "previous", "container_name", "offset", "limit")),
    "request_to_worker": _s("gpustack.server.worker_request", "request_to_worker"),
    # --- lifecycle (lifecycle/gpustack_patches.py) -----------------------------------------
    "InferenceServer._until_model_instance_starting": _s(
        "gpustack.worker.backends.base", "InferenceServer._until_model_instance_starting"),
    # --- devstack: the worker's prebuilt tools ---------------------------------------------
    "third_party": _s("gpustack.third_party"),
}

# What each plugin feature needs (the names of `/v2/dspark/status`'s features). A mismatch in
# one of these turns that feature off, and only that one.
NEEDS: Dict[str, Tuple[str, ...]] = {
    "backend_registration": ("async_session", "InferenceBackend", "VersionConfigDict", "BackendSourceEnum"),
    "vllm_resource_fit": ("scheduler.build_candidate_selector", "VLLMResourceFitSelector"),
    "placement_policy": ("scheduler.find_candidate", "Cluster"),
    "routing": ("openai.load_balancer", "openai.ModelRouteService", "openai.parse_request_body",
                "openai.request_to_worker", "openai.get_running_instance", "openai._stream_response",
                "LoadBalancingStrategy", "BadRequestException", "model_instance_prefix", "router_header_key",
                "async_session", "ModelService", "WorkerService"),
    "routing_gateway_routes": ("RoutePlugin", "get_route_plugin", "register_route_plugin", "enrich_routes",
                               "lb_plugin", "ModelRoute", "ModelRouteTarget", "Model", "async_session"),
    "admission": ("routes.models.validate_model_in", "evaluator.validate_model_in", "flatten_to_argv",
                  "routes.models.load_deployments", "BadRequestException"),
    "start_failure_reasons": ("routes.model_instances.ModelInstanceService",
                              "routes.model_instances._build_serve_log_params", "request_to_worker", "Worker",
                              "ModelInstance", "Model", "ModelInstanceStateEnum", "async_session"),
    "node_label_sync": ("db", "async_session", "Worker", "WorkerService.get_workers_for_update",
                        "WorkerService.batch_update"),
    "console": ("get_current_user", "get_admin_user", "authenticate_request", "SESSION_COOKIE_NAME", "Model",
                "ModelInstance", "async_session", "ModelInstanceService.delete"),
    "missed_start_repair": ("InferenceServer._until_model_instance_starting", "ModelInstanceService.update",
                            "ModelInstance.all_by_field", "Model.one_by_id", "ModelInstanceStateEnum",
                            "async_session"),
    "status_api": ("get_current_user",),
}
