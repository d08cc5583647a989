"""The placement side as the plugin sees it: two features, each one patch of GPUStack's scheduler.

Why two: the vLLM resource fit (DSpark CUDA models sized by GPUStack's own vLLM VRAM fit) and
the placement policy (the JSON label, isolation) are independent — a bad policy file turns off
the policy only, and GPUStack keeps fitting DSpark CUDA models as vLLM ones.
"""

from typing import Optional

from gpustack_dspark.feature import Context, Feature, FeatureOff, On
from gpustack_dspark.placement import gpustack_patches
from gpustack_dspark.placement.policy import PlacementPolicy, load_policy


class VllmResourceFit(Feature):
    name = "vllm_resource_fit"
    when_off = "DSpark CUDA models use GPUStack's custom-backend fit"

    def start(self, ctx: Context) -> On:
        gpustack_patches.route_gpu_flavour_to_vllm_fit().or_off()
        return On()


class PlacementPolicyFeature(Feature):
    name = "placement_policy"
    when_off = "GPUStack schedules as usual"

    def __init__(self) -> None:
        self.policy: Optional[PlacementPolicy] = None

    def start(self, ctx: Context) -> On:
        # Any failure here (a bad policy file above all) is reported in its own words.
        try:
            self.policy = load_policy(ctx.settings.policy_dir, ctx.settings.json_label)
            result = gpustack_patches.enforce_placement_policy(lambda: self.policy)
        except Exception as e:
            self.policy = None
            raise FeatureOff(str(e)) from e
        if not result.applied:
            self.policy = None
            raise FeatureOff(result.reason)
        return On(self.policy.as_dict())
