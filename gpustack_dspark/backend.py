"""The DSpark backend as GPUStack sees it, and its idempotent registration.

Why a separate `DSpark-custom` backend rather than a custom version of the built-in vLLM
backend: the fields that make DSpark a one-click choice — `default_backend_param`,
`common_parameters` and `health_check_path` (the warmup gate) — are per backend in
GPUStack 2.3, so putting them on the vLLM row would pre-fill `--enable-dspark` and a
`/dspark/ready` health path into every stock vLLM deployment. A custom backend also
schedules natively on CPU-only workers (`custom_framework: cpu` + CPU offloading), which
GPUStack's vLLM resource fit has no path for. GPU deployments keep tensor parallelism
through the run command (`{{gpu_count}}`) and get GPUStack's own vLLM VRAM fit through
`placement/gpustack_patches.py` (docs/architecture.md).

The definition and the merge with what the database holds are pure; `register_backend`
is the thin database glue that runs inside the GPUStack server, and `BackendRegistration`
the plugin feature that runs it (a background task with retries: the database may not be
ready when the plugin starts; the feature is `pending` until the row is written).
"""

import asyncio
import copy
import logging
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from gpustack_dspark import knobs
from gpustack_dspark.feature import Context, Feature, Report, Task
from gpustack_dspark.settings import PluginSettings
from gpustack_dspark.backend_ids import BACKEND_NAME, CPU_VERSION, CUDA_VERSION, HEALTH_CHECK_PATH

logger = logging.getLogger(__name__)

__all__ = ["BACKEND_NAME", "CPU_VERSION", "CUDA_VERSION", "HEALTH_CHECK_PATH", "desired_backend",
           "merge_backend", "register_backend", "RegistrationResult", "BackendRegistration"]
ENTRYPOINT = "dspark-serve"

_COMMON_ARGS = "{{model_path}} --host {{worker_ip}} --port {{port}} --served-model-name {{model_name}}"
CUDA_RUN_COMMAND = _COMMON_ARGS + " --tensor-parallel-size {{gpu_count}}"
CPU_RUN_COMMAND = _COMMON_ARGS

DESCRIPTION = (
    "vLLM with DSpark speculative decoding and grammar-constrained JSON by default "
    "(gpustack-dspark). Replicas report ready only after warmup."
)

# Fields the plugin owns and puts back on every start; everything else on the row
# (user-added versions, edited default parameters, environment) is the user's.
MANAGED_VERSIONS = (CUDA_VERSION, CPU_VERSION)


def desired_backend(settings: PluginSettings) -> Dict[str, Any]:
    """The backend row this plugin wants, as plain data."""
    return {
        "backend_name": BACKEND_NAME,
        "description": DESCRIPTION,
        "health_check_path": HEALTH_CHECK_PATH,
        "default_version": CUDA_VERSION,
        "default_backend_param": list(knobs.form_defaults()),
        "common_parameters": list(knobs.knob_flags()) + list(knobs.VLLM_TUNING_FLAGS),
        "parameter_format": "equal",
        "version_configs": {
            CUDA_VERSION: {
                "image_name": settings.cuda_image,
                "entrypoint": ENTRYPOINT,
                "run_command": CUDA_RUN_COMMAND,
                "custom_framework": "cuda",
            },
            CPU_VERSION: {
                "image_name": settings.cpu_image,
                "entrypoint": ENTRYPOINT,
                "run_command": CPU_RUN_COMMAND,
                "custom_framework": "cpu",
            },
        },
    }


def merge_backend(existing: Optional[Dict[str, Any]], desired: Dict[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
    """What the row should become, and the names of the fields that change.

    Creating: the whole desired row. Updating: only what the plugin owns — its own
    versions (image names follow the start flags), the health path, and form hints the
    user has not got yet. An unchanged row yields no changes, so restarts write nothing.
    """
    if existing is None:
        return copy.deepcopy(desired), sorted(desired)

    merged = copy.deepcopy(existing)
    changed: List[str] = []

    versions = dict(merged.get("version_configs") or {})
    for name in MANAGED_VERSIONS:
        want = desired["version_configs"][name]
        have = versions.get(name) or {}
        if any(have.get(key) != value for key, value in want.items()):
            versions[name] = {**have, **want}
            changed.append(f"version_configs.{name}")
    merged["version_configs"] = versions

    if merged.get("health_check_path") != desired["health_check_path"]:
        merged["health_check_path"] = desired["health_check_path"]
        changed.append("health_check_path")

    if merged.get("default_version") not in versions:
        merged["default_version"] = desired["default_version"]
        changed.append("default_version")

    hints = list(merged.get("common_parameters") or [])
    missing = [p for p in desired["common_parameters"] if p not in hints]
    if missing:
        merged["common_parameters"] = hints + missing
        changed.append("common_parameters")

    return merged, changed


_ROW_FIELDS = (
    "backend_name", "description", "health_check_path", "default_version",
    "default_backend_param", "common_parameters", "parameter_format", "version_configs",
)


@dataclass(frozen=True)
class RegistrationResult:
    backend_id: int
    action: str  # "created" | "updated" | "unchanged"
    changed: Tuple[str, ...] = ()


async def register_backend(settings: PluginSettings) -> RegistrationResult:
    """Create or reconcile the DSpark backend row in GPUStack's database (server side)."""
    from gpustack_dspark import gpustack_seam as gs

    InferenceBackend, VersionConfigDict, BackendSourceEnum = gs.InferenceBackend, gs.VersionConfigDict, \
        gs.BackendSourceEnum
    async_session = gs.async_session

    desired = desired_backend(settings)
    async with async_session() as session:
        row = await InferenceBackend.one_by_fields(
            session, {"backend_name": BACKEND_NAME, "owner_principal_id": None}
        )
        existing = None
        if row is not None:
            existing = {field: getattr(row, field) for field in _ROW_FIELDS}
            existing["version_configs"] = {
                name: config.model_dump(exclude_none=True)
                for name, config in row.version_configs.root.items()
            }
        merged, changed = merge_backend(existing, desired)
        values = {field: merged[field] for field in _ROW_FIELDS}
        values["version_configs"] = VersionConfigDict.model_validate(merged["version_configs"])

        if row is None:
            row = InferenceBackend(
                **values,
                backend_source=BackendSourceEnum.CUSTOM,
                enabled=True,
                is_built_in=False,
            )
            row = await InferenceBackend.create(session, row)
            logger.info("Registered the %s backend (id %s)", BACKEND_NAME, row.id)
            return RegistrationResult(row.id, "created", tuple(changed))
        if not changed:
            return RegistrationResult(row.id, "unchanged")
        await row.update(session, {k: values[k] for k in ("version_configs", "health_check_path",
                                                           "default_version", "common_parameters")})
        logger.info("Updated the %s backend: %s", BACKEND_NAME, ", ".join(changed))
        return RegistrationResult(row.id, "updated", tuple(changed))


REGISTRATION_ATTEMPTS = 6
REGISTRATION_FIRST_DELAY_S = 1.0


class BackendRegistration(Feature):
    """`backend_registration`: the `DSpark-custom` row written once the server runs; what it
    wrote (`info`) goes into the status's `backend` section."""

    name = "backend_registration"

    def __init__(self) -> None:
        self.info: Dict[str, Any] = {"name": BACKEND_NAME}
        self.settings: Optional[PluginSettings] = None
        self.report: Optional[Report] = None

    def start(self, ctx: Context) -> None:
        from gpustack_dspark import gpustack_seam as gs

        gs.require_feature(self.name)  # GPUStack lacks a shape the writes go through: no retry helps
        self.settings, self.report = ctx.settings, ctx.report
        return None  # pending until the task has written the row

    def tasks(self) -> List[Task]:
        return [self.registration_task]

    async def registration_task(self) -> None:
        delay = REGISTRATION_FIRST_DELAY_S
        for attempt in range(1, REGISTRATION_ATTEMPTS + 1):
            try:
                result = await register_backend(self.settings)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                reason = f"registering the {BACKEND_NAME} backend failed: {type(e).__name__}: {e}"
                if attempt == REGISTRATION_ATTEMPTS:
                    logger.error("%s (gave up after %d attempts)", reason, attempt)
                    self.report.off(reason)
                    return
                logger.warning("%s; retrying in %.1f s", reason, delay)
                await asyncio.sleep(delay)
                delay *= 2
                continue
            self.info.update(id=result.backend_id, last_registration=result.action)
            self.report.on(action=result.action)
            return
