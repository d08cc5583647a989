"""Bounded time series of samples, one ring buffer per (key, metric) (pure).

The sampler appends one point per metric and deployment every interval; the console reads
the last hour. Memory is bounded twice: points per series (`window_s / interval_s`) and the
number of keys (the oldest-touched key goes first).
"""

import threading
from collections import OrderedDict, deque
from typing import Deque, Dict, Hashable, List, Optional, Tuple

Point = Tuple[float, Optional[float]]


class SeriesStore:
    def __init__(self, window_s: float = 3600.0, interval_s: float = 5.0, max_keys: int = 256) -> None:
        if window_s <= 0 or interval_s <= 0 or max_keys < 1:
            raise ValueError("window_s and interval_s must be > 0 and max_keys >= 1")
        self.window_s = window_s
        self.max_points = max(2, int(window_s / interval_s) + 1)
        self.max_keys = max_keys
        self._lock = threading.Lock()
        self._data: "OrderedDict[Hashable, Dict[str, Deque[Point]]]" = OrderedDict()

    def add(self, key: Hashable, t: float, values: Dict[str, Optional[float]]) -> None:
        with self._lock:
            series = self._data.pop(key, None) or {}
            self._data[key] = series
            for metric, value in values.items():
                ring = series.get(metric)
                if ring is None:
                    ring = series[metric] = deque(maxlen=self.max_points)
                ring.append((t, None if value is None else float(value)))
            while len(self._data) > self.max_keys:
                self._data.popitem(last=False)

    def get(self, key: Hashable, now: float) -> Dict[str, List[Point]]:
        """The points of `key` in the last `window_s` seconds, per metric, oldest first."""
        since = now - self.window_s
        with self._lock:
            series = self._data.get(key) or {}
            return {metric: [p for p in ring if p[0] >= since] for metric, ring in series.items()}

    def keep_only(self, keys) -> None:
        """Drop the series of keys no longer present (deleted deployments)."""
        keep = set(keys)
        with self._lock:
            for key in [k for k in self._data if k not in keep]:
                del self._data[key]

    def keys(self) -> List[Hashable]:
        with self._lock:
            return list(self._data)
