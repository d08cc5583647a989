"""Glue: the console's page, its assets and JSON endpoints, behind GPUStack's own
authentication (`get_current_user`: session cookie, API key; admin-only changes behind
`get_admin_user`). The page without a session goes to GPUStack's login; the endpoints
answer 401 (GPUStack's own answer)."""

import sys
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from fastapi import APIRouter, Body, Depends, Request
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse

from gpustack_dspark import gpustack_seam as gs
from gpustack_dspark.console.editor import EDITABLE, edit_knobs
from gpustack_dspark.console import rollout
from gpustack_dspark.console.rolling import GPUStackRefused, Rollouts, put_backend_parameters, replicas_now
from gpustack_dspark.console.sampler import ConsoleSampler, read_deployments

# ui-patches/ beside the package (a checkout, an editable install), else where a wheel puts it
# (pyproject's data-files: <prefix>/share/gpustack-dspark/ui-patches).
_CHECKOUT_UI = Path(__file__).resolve().parents[2] / "ui-patches"
_INSTALLED_UI = Path(sys.prefix) / "share" / "gpustack-dspark" / "ui-patches"
UI_DIR = _CHECKOUT_UI if (_CHECKOUT_UI / "console.js").is_file() else _INSTALLED_UI
PAGE_PATH = "/dspark/console"
ASSET_PREFIX = "/dspark/ui"
API_PATH = "/v2/dspark/console"
LOGIN_URL = "/#/login"
ASSETS = {"menu.js": "text/javascript", "console.js": "text/javascript", "console.css": "text/css",
          "console.html": "text/html"}


def missing_assets(ui_dir: Optional[Path] = None) -> list:
    return [name for name in ASSETS if not ((ui_dir or UI_DIR) / name).is_file()]


async def _model(model_id: int) -> Optional[Dict[str, Any]]:
    for model, instances in await read_deployments():
        if model["id"] == model_id:
            return {**model, "_instance_ids": [i["id"] for i in instances]}
    return None


def _not_found(model_id: int) -> JSONResponse:
    return JSONResponse({"message": f"model {model_id}: no such DSpark deployment"}, status_code=404)


def _knobs_from(body: Any) -> Optional[Dict[str, Optional[str]]]:
    knobs = body.get("knobs") if isinstance(body, dict) else None
    if not isinstance(knobs, dict) or not all(isinstance(k, str) and (v is None or isinstance(v, (str, int, float)))
                                              for k, v in knobs.items()):
        return None
    return {k: None if v is None else str(v) for k, v in knobs.items()}


BAD_BODY = ("body: expected {\"knobs\": {FLAG: value or null}}; editable flags: " + ", ".join(EDITABLE))


def build_console_router(sampler: ConsoleSampler, rollouts: Rollouts,
                         features: Callable[[], Dict[str, Any]]) -> APIRouter:
    SESSION_COOKIE_NAME, authenticate_request = gs.SESSION_COOKIE_NAME, gs.authenticate_request
    get_admin_user, get_current_user = gs.get_admin_user, gs.get_current_user

    router = APIRouter()

    @router.get(PAGE_PATH, include_in_schema=False)
    async def console_page(request: Request):
        try:
            await authenticate_request(request, cookie_token=request.cookies.get(SESSION_COOKIE_NAME))
        except Exception:
            return RedirectResponse(LOGIN_URL, status_code=302)
        return FileResponse(UI_DIR / "console.html", headers={"Cache-Control": "no-cache"})

    @router.get(ASSET_PREFIX + "/{name}", include_in_schema=False)
    async def console_asset(name: str):
        if name not in ASSETS or name == "console.html":
            return JSONResponse({"message": f"{name}: no such asset"}, status_code=404)
        return FileResponse(UI_DIR / name, media_type=ASSETS[name], headers={"Cache-Control": "no-cache"})

    @router.get(API_PATH, tags=["DSpark"], dependencies=[Depends(get_current_user)])
    async def console_data() -> Dict[str, Any]:
        data = sampler.view(features())
        for deployment in data["deployments"]:
            deployment["rollout"] = rollouts.state.get(deployment["id"])
        return data

    async def _edit(model_id: int, body: Any):
        model = await _model(model_id)
        if model is None:
            return None, None, _not_found(model_id)
        knobs = _knobs_from(body)
        if knobs is None:
            return model, None, JSONResponse({"message": BAD_BODY, "errors": {}}, status_code=400)
        edit = edit_knobs(model.get("backend_parameters"), knobs)
        if edit.errors:
            return model, edit, JSONResponse({"message": " | ".join(edit.errors.values()), **edit.as_dict()},
                                             status_code=400)
        return model, edit, None

    @router.post(API_PATH + "/models/{model_id}/preview", tags=["DSpark"], dependencies=[Depends(get_admin_user)])
    async def preview(model_id: int, body: Any = Body(None)):
        _, edit, refused = await _edit(model_id, body)
        return refused or {**edit.as_dict(), "running_change": rollouts.running(model_id)}

    @router.post(API_PATH + "/models/{model_id}/apply", tags=["DSpark"], dependencies=[Depends(get_admin_user)])
    async def apply(model_id: int, request: Request, body: Any = Body(None)):
        model, edit, refused = await _edit(model_id, body)
        if refused:
            return refused
        if rollouts.running(model_id):
            return JSONResponse({"message": f"model {model['name']}: a rolling change is already running; "
                                            "wait until its replicas are warm"}, status_code=409)
        if not edit.changes:
            return JSONResponse({"message": "nothing to change", **edit.as_dict()}, status_code=400)
        found = await replicas_now(model_id)
        why_not = rollout.cannot_start(found[1] if found else [], model.get("replicas") or 1)
        if why_not:
            return JSONResponse({"message": f"model {model['name']}: {why_not}; nothing was changed",
                                 **edit.as_dict()}, status_code=409)
        host, port = request.scope.get("server") or ("127.0.0.1", 80)
        try:
            await put_backend_parameters(f"http://{host}:{port}", request.headers, model, edit.backend_parameters)
        except GPUStackRefused as e:
            return JSONResponse({"message": str(e), **edit.as_dict()}, status_code=e.status)
        state = rollouts.start(model_id, model["_instance_ids"], model.get("replicas") or 1, edit.changes)
        return JSONResponse({**edit.as_dict(), "rollout": state}, status_code=202)

    return router
