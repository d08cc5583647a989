"""Every change admission makes to GPUStack internals, in one place (GPUStack 2.3.0).

1. `validate_model_in` — GPUStack's one model check, used by `POST /v2/models`,
   `PUT /v2/models/{id}`, `POST /v2/models/import` (dry run and real), revision rollback (all
   through the module global in `gpustack.routes.models`) and by the deploy form's
   compatibility check (`gpustack.scheduler.evaluator`, bound by `from ... import`): both names
   are wrapped. For DSpark models the knob check (`admission/check.py`) runs first and raises
   GPUStack's own `BadRequestException` (400, nothing written; the evaluator shows it inline).
2. `ModelInstanceService` as `gpustack.routes.model_instances` uses it for
   `PUT /v2/model-instances/{id}` (how workers report instance state): a DSpark instance
   reported ERROR with exit code 2 gets the replica's own error line (read from the instance
   log through the worker, as the log API does) as its `state_message`; the worker's automatic
   restart of such an instance is not applied until the model changes
   (`admission/start_failure.py`).

Each patch checks the GPUStack version and the exact shape of what it replaces (the GPUStack
seam, `gpustack_seam/shapes.py`); on a mismatch
nothing is applied and the reason is reported. Any error inside our code is logged and GPUStack
goes on as if the plugin were not there.
"""

import logging
from typing import Any, Optional

from gpustack_dspark import gpustack_seam as gs
from gpustack_dspark.admission import check, start_failure
from gpustack_dspark.backend_ids import BACKEND_NAME
from gpustack_dspark.gpustack_seam import PatchResult, SeamMismatch

logger = logging.getLogger(__name__)

LOG_TAIL_LINES = 200
LOG_TIMEOUT_S = 5.0

__all__ = ["PatchResult", "refuse_bad_knobs", "bound_import_documents", "explain_start_failures"]


# --- 1. the knob check in validate_model_in ----------------------------------------------

def _judge(model_in: Any, stored: Any) -> Optional[str]:
    """The refusal message for this write, or None."""
    flatten_to_argv = gs.flatten_to_argv
    backend = getattr(model_in, "backend", None)
    if backend != BACKEND_NAME:
        return None
    fields_set = getattr(model_in, "model_fields_set", None)
    if stored is not None and fields_set is not None and "backend_parameters" not in fields_set \
            and getattr(stored, "backend", None) == BACKEND_NAME:
        return None  # a sparse update that leaves the parameters as they are
    argv = flatten_to_argv(list(getattr(model_in, "backend_parameters", None) or []))
    stored_argv = None
    if stored is not None:
        stored_argv = flatten_to_argv(list(getattr(stored, "backend_parameters", None) or []))
    errors = check.refusals(backend, argv, getattr(stored, "backend", None), stored_argv)
    return check.refusal_message(errors) if errors else None


# What a replica is started from: a change to any of these is worth another try.
START_FIELDS = ("backend_parameters", "env", "backend_version", "image_name", "run_command", "local_path",
                "huggingface_repo_id", "huggingface_filename", "model_scope_model_id", "model_scope_file_path")


def _spec_changed(model_in: Any, stored: Any) -> bool:
    fields_set = getattr(model_in, "model_fields_set", None) or set(START_FIELDS)
    return any(getattr(model_in, f, None) != getattr(stored, f, None) for f in START_FIELDS if f in fields_set)


def _wrap_validate(original):
    BadRequestException = gs.BadRequestException

    async def validate_model_in(session, model_in, *, cluster_id=None, stored=None):
        try:
            message = _judge(model_in, stored)
        except Exception:  # a bug here must not block GPUStack's own writes
            logger.exception("DSpark admission check failed; GPUStack validates as usual")
            message = None
        if message:
            raise BadRequestException(message=message)
        result = await original(session, model_in, cluster_id=cluster_id, stored=stored)
        if stored is not None and _held_release is not None and getattr(model_in, "backend", None) == BACKEND_NAME \
                and _spec_changed(model_in, stored):
            _spawn(_held_release(stored.id))  # once the change is committed, held replicas try again
        return result

    return gs.wrap(original, validate_model_in)


def refuse_bad_knobs() -> PatchResult:
    try:
        model_routes, original = gs.target("routes.models.validate_model_in")
        if gs.is_patched(original):
            return PatchResult(True)
        evaluator, bound = gs.target("evaluator.validate_model_in")
        if gs.is_patched(bound):
            return PatchResult(True)
        gs.require("flatten_to_argv", "BadRequestException")
    except SeamMismatch as e:
        return PatchResult(False, str(e))
    if bound is not original:
        return PatchResult(False, "gpustack.scheduler.evaluator.validate_model_in is not the routes' function")
    wrapped = _wrap_validate(original)
    model_routes.validate_model_in = wrapped
    evaluator.validate_model_in = wrapped
    return PatchResult(True)


# --- 1b. bounded import documents ---------------------------------------------------------

def _wrap_load_deployments(original):
    from gpustack_dspark import bounded

    def load_deployments(text):
        # GPUStack turns a ValueError into a 400 with this message; a hostile document
        # (alias bomb, recursive alias, deep nesting) never reaches PyYAML's constructor.
        try:
            bounded.check_yaml(text if isinstance(text, str) else str(text), bounded.MODEL_FILE)
        except bounded.BoundedError as e:
            raise ValueError(f"the document cannot be imported: {e}") from None
        except Exception:
            pass  # a syntax error: GPUStack's own parser words it
        return original(text)

    return gs.wrap(original, load_deployments)


def bound_import_documents() -> PatchResult:
    try:
        model_routes, original = gs.target("routes.models.load_deployments")
    except SeamMismatch as e:
        return PatchResult(False, str(e))
    if gs.is_patched(original):
        return PatchResult(True)
    model_routes.load_deployments = _wrap_load_deployments(original)
    return PatchResult(True)


# --- 2. start failures on PUT /v2/model-instances/{id} -----------------------------------

def _state(value: Any) -> str:
    return str(getattr(value, "value", value) or "")


async def _read_log_tail(app, session, instance, build_params) -> str:
    """The instance's log tail, through its worker as GPUStack's log API reads it."""
    import aiohttp

    request_to_worker = gs.request_to_worker
    worker = await gs.Worker.one_by_id(session, instance.worker_id)
    if worker is None:
        raise RuntimeError(f"worker {instance.worker_id} not found")
    params = build_params(instance, tail=LOG_TAIL_LINES, follow=False, previous=False)
    response, body = await request_to_worker(
        worker, "GET", f"serveLogs/{instance.id}",
        proxy_client=getattr(app.state, "http_client", None),
        no_proxy_client=getattr(app.state, "http_client_no_proxy", None),
        params=params, timeout=aiohttp.ClientTimeout(total=LOG_TIMEOUT_S, sock_connect=2),
        raise_on_error=False)
    if response.status >= 400:
        raise RuntimeError(f"the worker answered HTTP {response.status}")
    return (body or b"").decode("utf-8", "replace")


_background: set = set()
_held_release = None  # set when the start-failure feature is on: model id -> coroutine


def _spawn(coroutine) -> None:
    import asyncio

    task = asyncio.get_running_loop().create_task(coroutine)
    _background.add(task)
    task.add_done_callback(_background.discard)


async def _explain_later(app, base, build_params, instance_id: int, runtime_message: str) -> None:
    """Replace the pending message with the replica's own error line (a few tries: the
    log may lag the exit). Writes only while the instance still holds the pending message."""
    import asyncio

    ModelInstance, async_session = gs.ModelInstance, gs.async_session
    problem = "no '<program>: error:' line in its last lines"
    for attempt in range(1, 4):
        await asyncio.sleep(0.5 * attempt)
        try:
            async with async_session() as session:
                instance = await ModelInstance.one_by_id(session, instance_id)
                if instance is None or _state(instance.state) != "error" \
                        or not start_failure.is_held_message(instance.state_message):
                    return
                line = start_failure.error_line(await _read_log_tail(app, session, instance, build_params))
                if line is None and attempt < 3:
                    continue
                message = start_failure.config_error_message(line, runtime_message, unreadable=problem)
                await base(session).update(instance, {"state_message": message})
                logger.warning("DSpark instance %s: %s", instance.name, message)
                return
        except Exception as e:
            problem = f"{type(e).__name__}: {e}"
            logger.warning("reading the start failure of DSpark instance %s: %s", instance_id, problem)
    try:
        async with async_session() as session:
            instance = await ModelInstance.one_by_id(session, instance_id)
            if instance is not None and start_failure.is_held_message(instance.state_message):
                await base(session).update(instance, {"state_message": start_failure.config_error_message(
                    None, runtime_message, unreadable=problem)})
    except Exception:
        logger.exception("could not record the start failure of DSpark instance %s", instance_id)


def _service_class(base, app, build_params):
    class DSparkModelInstanceService(base):
        """GPUStack's service; DSpark instances' start failures are reviewed first."""

        async def update(self, model_instance, source=None):
            try:
                held = await self._dspark_review(model_instance, source)
            except Exception:
                logger.exception("DSpark start-failure review failed; the update goes through as sent")
                held = False
            if held:
                return model_instance
            return await super().update(model_instance, source)

        async def _dspark_review(self, instance, source) -> bool:
            """True: do not apply (the automatic restart of a configuration error)."""
            if source is None or isinstance(source, dict) or getattr(instance, "backend", None) != BACKEND_NAME:
                return False
            new_state, stored_state = _state(getattr(source, "state", None)), _state(instance.state)
            new_message = getattr(source, "state_message", None) or ""
            if new_state == "error" and stored_state != "error" and start_failure.is_config_exit(new_message):
                # The reason is read from the log after this write is committed: the row is
                # locked now, and the worker that sent this write also serves the log.
                source.state_message = start_failure.config_error_message(None, new_message, pending=True)
                _spawn(_explain_later(app, base, build_params, instance.id, new_message))
                logger.warning("DSpark instance %s refused its configuration (%s)", instance.name, new_message)
                return False
            if stored_state == "error" and new_state == "error" and \
                    start_failure.is_held_message(instance.state_message) and \
                    not start_failure.is_held_message(new_message):
                source.state_message = instance.state_message  # a stale whole-object write keeps the reason
                return False
            # GPUStack's automatic restart (a write moving it out of ERROR) is not applied: a
            # change to the model releases the instance (_release_held), nothing else does.
            if start_failure.hold_restart(stored_state, instance.state_message, new_state):
                logger.info("DSpark instance %s keeps its configuration error; not restarted", instance.name)
                return True
            return False

    DSparkModelInstanceService.__name__ = "ModelInstanceService"
    return gs.wrap(base, DSparkModelInstanceService)


def explain_start_failures(app) -> PatchResult:
    try:
        routes, base = gs.target("routes.model_instances.ModelInstanceService")
        if gs.is_patched(base):
            return PatchResult(True)
        _, build_params = gs.target("routes.model_instances._build_serve_log_params")
        gs.require("request_to_worker", "Worker", "ModelInstance", "Model", "ModelInstanceStateEnum", "async_session")
    except SeamMismatch as e:
        return PatchResult(False, str(e))
    global _held_release
    routes.ModelInstanceService = _service_class(base, app, build_params)
    _held_release = lambda model_id: _release_held(base, model_id)  # noqa: E731
    return PatchResult(True)


async def _release_held(base, model_id: int) -> None:
    """After a change to the model is committed, its instances held in a configuration error
    are scheduled again, the way GPUStack's worker restarts an instance (the worker then
    starts them with the changed model)."""
    import asyncio
    from datetime import datetime, timezone

    Model, ModelInstance, async_session = gs.Model, gs.ModelInstance, gs.async_session
    ModelInstanceStateEnum = gs.ModelInstanceStateEnum
    for attempt in range(1, 6):
        await asyncio.sleep(1.0 * attempt)
        try:
            async with async_session() as session:
                model = await Model.one_by_id(session, model_id)
                if model is None:
                    return
                held = [i for i in await ModelInstance.all_by_field(session, "model_id", model_id)
                        if _state(i.state) == "error" and start_failure.is_held_message(i.state_message)]
                if not held:
                    return
                changed = [i for i in held if start_failure.changed_since(i.updated_at, model.updated_at)]
                if not changed:
                    continue  # the write is not committed yet (or was refused)
                for instance in changed:
                    await base(session).update(instance, {
                        "state": ModelInstanceStateEnum.SCHEDULED, "state_message": "",
                        "restart_count": (instance.restart_count or 0) + 1,
                        "last_restart_time": datetime.now(timezone.utc)})
                    logger.info("DSpark instance %s: the model changed; trying it again", instance.name)
                return
        except Exception:
            logger.exception("releasing the held instances of model %s", model_id)
            return
