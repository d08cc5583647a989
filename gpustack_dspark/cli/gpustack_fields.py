"""The fields of a GPUStack 2.3 deployment document, as `POST /v2/models/import` accepts them.

The CLI must not import GPUStack (it installs without it), yet must reject a bad document
before any network call. So the field list is written down here, checked against
GPUStack's own `deployment_document.ENTRY_FIELDS` by a test that runs with GPUStack
installed. Kinds are checked locally; nested GPUStack structures beyond their first level
are left to GPUStack's own dry run (`apply` runs it before writing anything).
"""

from typing import Dict, Tuple

# kind: str | int | bool | list[str] | map[str] | mapping | list | enum:<a|b>
ENTRY_FIELDS: Dict[str, str] = {
    "name": "str",
    "cluster_name": "str",
    "source": "enum:huggingface|model_scope|local_path",
    "huggingface_repo_id": "str",
    "huggingface_filename": "str",
    "model_scope_model_id": "str",
    "model_scope_file_path": "str",
    "local_path": "str",
    "description": "str",
    "replicas": "int",
    "categories": "list[str]",
    "placement_strategy": "enum:spread|binpack",
    "cpu_offloading": "bool",
    "distributed_inference_across_workers": "bool",
    "worker_selector": "map[str]",
    "gpu_selector": "mapping",
    "gpu_type_selector": "mapping",
    "backend": "str",
    "backend_version": "str",
    "backend_parameters": "list[str]",
    "image_name": "str",
    "run_command": "str",
    "native_anthropic_api": "bool",
    "env": "map[str]",
    "restart_on_error": "bool",
    "distributable": "bool",
    "extended_kv_cache": "mapping",
    "speculative_config": "mapping",
    "scaling_schedule": "mapping",
    "generic_proxy": "bool",
    "lora_list": "list",
    "roles": "list",
    "disaggregation": "mapping",
    "gather": "mapping",
    "enable_model_route": "bool",
}

# The id field each source needs (GPUStack's ModelSource check).
SOURCE_FIELDS: Dict[str, str] = {
    "huggingface": "huggingface_repo_id",
    "model_scope": "model_scope_model_id",
    "local_path": "local_path",
}

# Written by the server; an import refuses them (GPUStack's SERVER_MANAGED_FIELDS).
SERVER_MANAGED: Tuple[str, ...] = (
    "id", "created_at", "updated_at", "deleted_at", "ready_replicas", "meta", "cluster_id",
    "owner_principal_id", "access_policy", "revision_history_limit",
)

# Keys inside gpu_selector (GPUStack's GPUSelector), plus gpu_count: our shorthand.
GPU_SELECTOR_FIELDS: Tuple[str, ...] = ("gpu_ids", "gpus_per_replica")
