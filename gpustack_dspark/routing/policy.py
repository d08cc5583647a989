"""`policies/routing.yaml`: the routing policy, validated with pydantic at start."""

from enum import Enum
from pathlib import Path
from typing import Any, Optional

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

DEFAULT_POLICY_PATH = Path(__file__).resolve().parents[2] / "policies" / "routing.yaml"


class NoJsonIntentOnJsonOnly(str, Enum):
    SERVE_AS_JSON = "serve_as_json"  # forward: the DSpark replica serves JSON by default
    REFUSE = "refuse"  # 400 naming the model and what to send instead


class GatewaySessionAffinity(str, Enum):
    OFF = "off"  # turn session affinity off once on DSpark routes (user may turn it back on)
    KEEP = "keep"  # never touch it


class ProxyPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")
    least_connections: bool = True
    json_aware: bool = True
    retry_once: bool = True
    pass_replica_status: bool = True


class GatewayPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")
    least_load: bool = True
    session_affinity: GatewaySessionAffinity = GatewaySessionAffinity.OFF
    sync_interval_s: float = 10.0

    @field_validator("session_affinity", mode="before")
    @classmethod
    def _yaml_off(cls, value):
        # YAML 1.1 reads an unquoted `off` as false.
        return "off" if value is False else value


class RoutingPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = 1
    json_only_without_json_intent: NoJsonIntentOnJsonOnly = NoJsonIntentOnJsonOnly.SERVE_AS_JSON
    proxy: ProxyPolicy = ProxyPolicy()
    gateway: GatewayPolicy = GatewayPolicy()


class PolicyError(ValueError):
    pass


def parse_policy(data: Any, source: str = "routing policy") -> RoutingPolicy:
    """Validate a loaded document; errors name the field, the value and what is allowed."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PolicyError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        policy = RoutingPolicy.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            field = ".".join(str(p) for p in err["loc"]) or "(top level)"
            allowed = (err.get("ctx") or {}).get("expected")
            text = f"{field}={err.get('input')!r}: {err['msg']}"
            if allowed:
                text += f" (allowed: {allowed})"
            problems.append(text)
        raise PolicyError(f"{source}: " + "; ".join(problems)) from None
    if policy.version != 1:
        raise PolicyError(f"{source}: version={policy.version!r} is not supported (allowed: 1)")
    if policy.gateway.sync_interval_s <= 0:
        raise PolicyError(f"{source}: gateway.sync_interval_s={policy.gateway.sync_interval_s!r} must be > 0")
    return policy


def load_policy(path: Optional[Path] = None) -> RoutingPolicy:
    path = Path(path or DEFAULT_POLICY_PATH)
    try:
        text = path.read_text()
    except OSError as e:
        raise PolicyError(f"cannot read routing policy {path}: {e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PolicyError(f"routing policy {path} is not valid YAML: {e}") from None
    return parse_policy(data, source=str(path))
