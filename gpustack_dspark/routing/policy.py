"""`policies/routing.yaml`: the routing policy, validated with pydantic at start."""

from enum import Enum
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpustack_dspark.policy_file import PolicyError, read_policy_yaml, validate
from gpustack_dspark.routing import affinity, speed

MAX_SILENCE_TIMEOUT_S = 3600
DEFAULT_POLICY_PATH = Path(__file__).resolve().parents[2] / "policies" / "routing.yaml"


class NoJsonIntentOnJsonOnly(str, Enum):
    SERVE_AS_JSON = "serve_as_json"  # forward: the DSpark replica serves JSON by default
    REFUSE = "refuse"  # 400 naming the model and what to send instead


class GatewaySessionAffinity(str, Enum):
    OFF = "off"  # turn session affinity off once on DSpark routes (user may turn it back on)
    KEEP = "keep"  # never touch it


class Balance(str, Enum):
    EXPECTED_FINISH_TIME = speed.EXPECTED_FINISH_TIME  # lowest seconds-per-token x (in-flight + 1)
    LEAST_CONNECTIONS = speed.LEAST_CONNECTIONS  # fewest in flight
    ROUND_ROBIN = speed.ROUND_ROBIN  # GPUStack's own order (in flight still counted)


class SlowStartPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ramp_s: float = Field(30.0, ge=0, le=3600)  # 0: no slow start
    min_weight: float = Field(0.1, gt=0, le=1)
    aggression: float = Field(1.0, gt=0, le=10)

    def config(self) -> speed.SlowStartConfig:
        return speed.SlowStartConfig(self.ramp_s, self.min_weight, self.aggression)


class AffinityPolicy(BaseModel):
    """Requests that share a schema or a prompt prefix go to one replica within a load bound
    (routing/affinity.py)."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = True
    # A replica takes a keyed request while its in-flight is below load_bound x its fair share
    # of the fleet's in-flight (+1), or within two standard deviations of a balanced count where
    # that is more (few in flight); past that the request goes to the next replica on the ring.
    load_bound: float = Field(1.5, ge=1.0, le=10.0)
    # Bytes of the prompt's leading part (every message but the last) that key a request, in
    # whole blocks of 256; a leading part under one block keys by its schema only.
    prefix_bytes: int = Field(4096, ge=affinity.BLOCK_BYTES, le=1 << 20)

    def config(self) -> affinity.AffinityConfig:
        return affinity.AffinityConfig(self.enabled, self.load_bound, self.prefix_bytes)


class ProxyPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")
    balance: Balance = Balance.EXPECTED_FINISH_TIME
    slow_start: SlowStartPolicy = SlowStartPolicy()
    affinity: AffinityPolicy = AffinityPolicy()
    json_aware: bool = True
    retry_once: bool = True
    pass_replica_status: bool = True
    # gc.freeze() once startup is over (observe/gc_pauses.py): on since 2026-12-05, three
    # measurements, P99.9 of the routing cost benchmark 970 -> 610, 812 -> 571, 989 -> 652 ms.
    gc_freeze: bool = True
    # A try whose replica sent nothing for this long is checked, and given up if the replica
    # fails its health check (routing/silence.py); 0: off (GPUStack's own bounds only).
    silence_timeout_s: float = 15.0

    @model_validator(mode="before")
    @classmethod
    def _least_connections_key(cls, data):
        # Before `balance`, the file had `least_connections: true|false`; it still means the same.
        if isinstance(data, dict) and "least_connections" in data:
            data = dict(data)
            value = data.pop("least_connections")
            if "balance" in data:
                raise ValueError("give either balance or the older least_connections, not both")
            if not isinstance(value, bool):
                raise ValueError(f"least_connections must be true or false (got {value!r}); "
                                 f"or use balance: {' | '.join(speed.MODES)}")
            data["balance"] = speed.LEAST_CONNECTIONS if value else speed.ROUND_ROBIN
        return data


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


def parse_policy(data: Any, source: str = "routing policy") -> RoutingPolicy:
    """Validate a loaded document; errors name the field, the value and what is allowed."""
    policy = validate(RoutingPolicy, data, source, "routing")
    if policy.version != 1:
        raise PolicyError(f"{source}: key 'version': not supported (got {policy.version!r}; allowed: 1)")
    silence = policy.proxy.silence_timeout_s
    if not (silence == 0 or 1 <= silence <= MAX_SILENCE_TIMEOUT_S):
        raise PolicyError(f"{source}: key 'proxy.silence_timeout_s': not allowed (got {silence:g}; allowed: 0 (off) "
                          f"or seconds 1-{MAX_SILENCE_TIMEOUT_S})")
    if policy.gateway.sync_interval_s <= 0:
        raise PolicyError(f"{source}: key 'gateway.sync_interval_s': must be > 0 "
                          f"(got {policy.gateway.sync_interval_s!r}; allowed: seconds > 0)")
    return policy


def load_policy(path: Optional[Path] = None) -> RoutingPolicy:
    path = Path(path or DEFAULT_POLICY_PATH)
    return parse_policy(read_policy_yaml(path), source=str(path))


__all__ = ["PolicyError", "RoutingPolicy", "load_policy", "parse_policy"]
