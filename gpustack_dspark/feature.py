"""The one shape every plugin feature has: start, background tasks, status; one way to be off.

Why: plugin.py used to wire eleven features by hand, each with its own success/failure
convention (a `PatchResult`, a list of problems, an exception, a callback). Now each feature is
one `Feature` object and the plugin is a loop over them, as llm-d's scheduler runs its plugins
through one interface per kind with typed parameters:

- `start(ctx)` applies the feature and returns `On` (enabled, with its detail) — or `None`
  when its background task reports the outcome (it stays `pending` until then) — or raises
  `FeatureOff("why")` when it cannot run, with nothing half-applied. Any other exception is
  a fault: the plugin reports it as `"<Type>: <message>"` and GPUStack carries on.
- `tasks()` gives the background coroutines of a started feature (the plugin guards each).
- `status()` gives the feature's own section of `/v2/dspark/status` where it has one
  (`section` names it); its line in `features` is written through `ctx.report`.
- `requires` names features that must be enabled first; otherwise this one is off with
  "<name> is off: <its reason>".

A leaf at run time (the settings' type is imported for type checkers only), so the GPUStack
seam can raise `FeatureOff` too (`SeamMismatch` is one).
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, List, Mapping, Optional, Protocol, Tuple

if TYPE_CHECKING:  # pragma: no cover
    from gpustack_dspark.settings import PluginSettings

Task = Callable[[], Awaitable[None]]


class FeatureOff(Exception):
    """This feature cannot run; the message is the reason shown in status ("off, because …").
    Keyword arguments are the detail shown with it."""

    def __init__(self, reason: str, **detail: object) -> None:
        super().__init__(reason)
        self.detail = detail


class TurnedOff(FeatureOff):
    """Off because the operator's settings say so (not configured, switched off): the same in
    the status, logged as information rather than as a problem."""


class Report(Protocol):
    """A feature's line in `/v2/dspark/status` → `features`, written while it runs."""

    def on(self, reason: Optional[str] = None, **detail: object) -> None:
        """Enabled; `reason` set while something it depends on is failing (it retries)."""

    def off(self, reason: str, **detail: object) -> None:
        """Disabled, with the reason."""


@dataclass(frozen=True)
class Context:
    """What every feature starts with."""

    app: Any
    """GPUStack's FastAPI application (routers and middleware are added to it)."""
    settings: Optional["PluginSettings"]
    """The plugin's `gpustack start` settings; None only for features that are not
    `internal` (they start before the settings are read, so a bad setting cannot hide them)."""
    report: Report
    """This feature's line in the status, for what it learns after `start`."""


@dataclass(frozen=True)
class On:
    """A started feature: enabled with `detail`, and `reason` while something it depends on
    is failing."""

    detail: Mapping[str, object] = field(default_factory=dict)
    reason: Optional[str] = None


class Feature:
    """One plugin feature. Subclasses set `name` and override what they need."""

    name: str = ""
    """Its key in `/v2/dspark/status` → `features`."""
    internal: bool = True
    """Needs GPUStack internals: off with `--dspark-disable` or an unsupported GPUStack."""
    requires: Tuple[str, ...] = ()
    """Features that must be enabled before this one starts (started earlier in the list)."""
    section: Optional[str] = None
    """Its own top-level key in the status document, filled by `status()`."""
    when_off: str = ""
    """What GPUStack does instead while this feature is off (for the log line)."""

    def start(self, ctx: Context) -> Optional[On]:
        """Apply the feature; raise FeatureOff with the reason it is off."""
        return On()

    def tasks(self) -> List[Task]:
        """Background coroutines to run once started (each guarded by the plugin)."""
        return []

    def status(self) -> Any:
        """This feature's section of the status document (`section`), where it has one."""
        return None
