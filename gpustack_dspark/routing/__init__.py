"""Request routing in GPUStack's proxy: in-flight accounting, least-connections, JSON-aware
target choice, one retry; and least-load for DSpark routes in Higress gateway mode.

Pure decisions live in `intent`, `targets`, `inflight`, `retry`, `policy`, `gateway`;
`middleware`, `gpustack_patches`, `gateway_sync` and `metrics` are the thin glue.
"""
