"""Admission as the plugin sees it: two features, each its own patches of GPUStack's routes.

`admission`: bad DSpark knobs refused where GPUStack validates models (the model routes, the
deploy form's evaluator, the import's document parse) and request bodies bounded.
`start_failure_reasons`: a replica's configuration error shown in the instance's
`state_message`, with no restart loop. Either can be off without the other.
"""

from gpustack_dspark.admission import gpustack_patches
from gpustack_dspark.admission.body_limit import BodyLimitMiddleware
from gpustack_dspark.feature import Context, Feature, On


class Admission(Feature):
    name = "admission"

    def start(self, ctx: Context) -> On:
        gpustack_patches.refuse_bad_knobs().or_off()
        gpustack_patches.bound_import_documents().or_off()
        ctx.app.add_middleware(BodyLimitMiddleware)
        return On()


class StartFailureReasons(Feature):
    name = "start_failure_reasons"

    def start(self, ctx: Context) -> On:
        gpustack_patches.explain_start_failures(ctx.app).or_off()
        return On()
