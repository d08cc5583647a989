"""`GET /v2/dspark/status`: plugin and GPUStack versions, the backend, feature states.

Mounted behind GPUStack's own authentication dependency, so it answers exactly the
callers GPUStack's API answers (API key, session cookie, basic auth) and 401 otherwise.
"""

from typing import Callable, Dict

from fastapi import APIRouter, Depends

STATUS_PATH = "/v2/dspark/status"


def build_status_router(snapshot: Callable[[], Dict[str, object]]) -> APIRouter:
    from gpustack.api.auth import get_current_user

    router = APIRouter()

    @router.get(STATUS_PATH, tags=["DSpark"], dependencies=[Depends(get_current_user)])
    async def dspark_status() -> Dict[str, object]:
        return snapshot()

    return router
