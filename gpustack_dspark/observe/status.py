"""`GET /v2/dspark/status`: plugin and GPUStack versions, the backend, feature states.

Mounted behind GPUStack's own authentication dependency, so it answers exactly the
callers GPUStack's API answers (API key, session cookie, basic auth) and 401 otherwise.

`StatusApi` is the feature that mounts it: not `internal` (it stays on with `--dspark-disable`
or an unsupported GPUStack, so the status can say why everything else is off).
"""

import logging
from typing import Callable, Dict

from fastapi import APIRouter, Depends

from gpustack_dspark.feature import Context, Feature, FeatureOff, On

logger = logging.getLogger(__name__)

STATUS_PATH = "/v2/dspark/status"


def build_status_router(snapshot: Callable[[], Dict[str, object]]) -> APIRouter:
    from gpustack_dspark import gpustack_seam as gs

    get_current_user = gs.get_current_user

    router = APIRouter()

    @router.get(STATUS_PATH, tags=["DSpark"], dependencies=[Depends(get_current_user)])
    async def dspark_status() -> Dict[str, object]:
        return snapshot()

    return router


class StatusApi(Feature):
    name = "status_api"
    internal = False

    def __init__(self, document: Callable[[], Dict[str, object]]) -> None:
        self.document = document

    def start(self, ctx: Context) -> On:
        try:
            ctx.app.include_router(build_status_router(self.document))
        except Exception as e:
            logger.exception("gpustack-dspark could not mount its status API")
            raise FeatureOff(f"could not mount the status API: {e}") from e
        return On()
