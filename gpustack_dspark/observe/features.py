"""Which plugin features are on, and why not when they are off.

Every feature starts `pending`, ends `enabled` or `disabled` with a reason. A failure
anywhere in the plugin lands here instead of reaching GPUStack. Each feature writes its own
line through a `FeatureReport` (the `Report` of `gpustack_dspark/feature.py`).
"""

import threading
from dataclasses import dataclass, field
from typing import Dict, Optional

PENDING = "pending"
ENABLED = "enabled"
DISABLED = "disabled"


@dataclass
class FeatureState:
    state: str = PENDING
    reason: Optional[str] = None
    detail: Dict[str, object] = field(default_factory=dict)

    def as_dict(self) -> Dict[str, object]:
        out: Dict[str, object] = {"state": self.state}
        if self.reason:
            out["reason"] = self.reason
        if self.detail:
            out["detail"] = dict(self.detail)
        return out


class FeatureRegistry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._features: Dict[str, FeatureState] = {}

    def declare(self, name: str) -> None:
        with self._lock:
            self._features.setdefault(name, FeatureState())

    def enable(self, name: str, **detail: object) -> None:
        with self._lock:
            self._features[name] = FeatureState(ENABLED, None, detail)

    def disable(self, name: str, reason: str, **detail: object) -> None:
        with self._lock:
            self._features[name] = FeatureState(DISABLED, reason, detail)

    def running(self, name: str, reason: Optional[str] = None, **detail: object) -> None:
        """Enabled, with the reason while something it depends on is failing (it retries)."""
        with self._lock:
            self._features[name] = FeatureState(ENABLED, reason, detail)

    def reporter(self, name: str) -> "FeatureReport":
        return FeatureReport(self, name)

    def get(self, name: str) -> FeatureState:
        with self._lock:
            return self._features.get(name, FeatureState())

    def snapshot(self) -> Dict[str, Dict[str, object]]:
        with self._lock:
            return {name: state.as_dict() for name, state in sorted(self._features.items())}


class FeatureReport:
    """One feature's line in the registry (`feature.Report`)."""

    def __init__(self, registry: FeatureRegistry, name: str) -> None:
        self.registry = registry
        self.name = name

    def on(self, reason: Optional[str] = None, **detail: object) -> None:
        self.registry.running(self.name, reason, **detail)

    def off(self, reason: str, **detail: object) -> None:
        self.registry.disable(self.name, reason, **detail)
