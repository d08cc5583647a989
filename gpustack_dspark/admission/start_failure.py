"""A DSpark replica that exits at start: its reason, and whether GPUStack may restart it (pure).

`dspark-serve` (and vLLM's own argument parser inside it) exits 2 with one line
`<prog>: error: <what is wrong>` for a configuration it cannot run. GPUStack 2.3 only records
"Error (exit code 2)" and restarts the instance forever with back-off; restarting cannot fix a
configuration. So: the line becomes the instance's `state_message`, and the worker's restart
of that instance is held until the model is changed: a change to what a replica is started
from (parameters, env, version, image, paths) schedules the held instances again once it is
committed (GPUStack 2.3 does not replace instances on a spec edit).
"""

import re
from datetime import datetime, timezone
from typing import Optional

CONFIG_EXIT_CODE = 2
HELD_NOTE = "a configuration error: not restarted until the model is changed"
MAX_LINE = 500

_EXIT_CODE = re.compile(r"\bexit code (\d+)\b")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# `dspark-serve: error: ...`, `vllm: error: ...`, argparse's `prog: error: ...`
_ERROR_LINE = re.compile(r"(?:^|\s)([\w.\-/]+: error: \S.*)$")


def exit_code(message: Optional[str]) -> Optional[int]:
    match = _EXIT_CODE.search(message or "")
    return int(match.group(1)) if match else None


def is_config_exit(message: Optional[str]) -> bool:
    return exit_code(message) == CONFIG_EXIT_CODE


def error_line(log_text: str) -> Optional[str]:
    """The last `<prog>: error: ...` line of a log tail, cleaned and bounded."""
    found = None
    for raw in log_text.splitlines():
        match = _ERROR_LINE.search(_ANSI.sub("", raw).rstrip())
        if match:
            found = match.group(1)
    if found and len(found) > MAX_LINE:
        found = found[: MAX_LINE - 3] + "..."
    return found


def config_error_message(line: Optional[str], runtime_message: str, pending: bool = False,
                         unreadable: str = "") -> str:
    """What the instance says: the replica's own line first, then what the runtime said.
    `pending`: the log is still being read; `unreadable`: why it could not be."""
    runtime = (runtime_message or "").strip() or f"exit code {CONFIG_EXIT_CODE}"
    if line:
        return f"{line} ({runtime}; {HELD_NOTE})"
    if pending:
        return f"{runtime}: the replica refused its configuration; reading the reason from its log ({HELD_NOTE})"
    return (f"{runtime}: the replica refused its configuration; its reason could not be read from its log: "
            f"{unreadable or 'unknown'} (see the instance log; {HELD_NOTE})")


def is_held_message(message: Optional[str]) -> bool:
    return HELD_NOTE in (message or "")


def hold_restart(stored_state: str, stored_message: Optional[str], new_state: str) -> bool:
    """Whether a write moving an instance out of ERROR is GPUStack's automatic restart of a
    held configuration error (then it is not applied; a change to the model releases it)."""
    return stored_state == "error" and new_state != "error" and is_held_message(stored_message)


def changed_since(failed_at: Optional[datetime], model_updated_at: Optional[datetime]) -> bool:
    """Whether the model was written after the instance recorded its failure."""
    if failed_at is None or model_updated_at is None:
        return False
    return _naive_utc(model_updated_at) > _naive_utc(failed_at)


def _naive_utc(moment: datetime) -> datetime:
    if moment.tzinfo is not None:
        moment = moment.astimezone(timezone.utc).replace(tzinfo=None)
    return moment
