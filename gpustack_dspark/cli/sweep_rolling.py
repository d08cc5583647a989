"""`gpustack-dspark sweep --deployment NAME`: the sweep on a running GPUStack deployment, one
replica at a time, with the deployment's own settings put back at the end or on Ctrl-C.

Per setting:
1. the model's backend parameters get the setting's knobs in place of its own
   (`bench.sweep.deployment_parameters`, the console editor's rewrite and messages), sent as
   the sparse model update `gpustack-dspark apply` makes, so GPUStack's validation and the
   plugin's knob check judge it as they judge the CLI;
2. one replica, the sweep replica, is deleted once every replica is warm
   (`console/rollout.py`'s `next_step`: never fewer than N-1 warm); GPUStack starts its replacement
   with the new parameters while the other N-1 keep theirs and keep serving;
3. once the replacement is warm and its `/dspark/info` shows the setting, it is measured at
   its own address (worker IP and port, as the console reads it) with the bench runner.
Restore: the original backend parameters are put back, then every replica started during the
sweep is replaced the same way, one at a time. The deployment's own traffic keeps reaching
the sweep replica through GPUStack, so its figures include that load (said in the output).
"""

import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import httpx

from gpustack_dspark import backend_ids
from gpustack_dspark.backend_ids import replica_info, replica_url
from gpustack_dspark.bench import sweep
from gpustack_dspark.backend_ids import sparse_model_update
from gpustack_dspark.cli.client import CLIError
from gpustack_dspark.cli.errors import BadInput
from gpustack_dspark.cli.models_api import ModelsAPI
from gpustack_dspark.console.rollout import DONE, RESTART, Replica, cannot_start, next_step

POLL_S = 2.0


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _warm(instance: Dict[str, Any]) -> bool:
    if str(instance.get("state")).lower() != "running":
        return False
    return (replica_info(instance, timeout_s=3.0) or {}).get("phase") == "ready"


class Deployment:
    """One GPUStack model as the rolling sweep drives it (GPUStack 2.3 REST routes)."""

    def __init__(self, api: ModelsAPI, name: str) -> None:
        self.api = api
        model = api.model(name)
        if model is None:
            raise BadInput(f"--deployment {name}: no such model on {api.server}")
        if model.get("backend") != backend_ids.BACKEND_NAME:
            raise BadInput(f"--deployment {name}: backend {model.get('backend')!r}, not {backend_ids.BACKEND_NAME!r}; "
                           "the sweep changes DSpark knobs")
        self.model = model
        self.wanted = int(model.get("replicas") or 0)
        if self.wanted < 2:
            raise BadInput(f"--deployment {name}: {self.wanted} replica(s); the rolling sweep needs at least 2, so "
                           "that N-1 keep serving while one is measured (scale it, or sweep a scratch replica with "
                           "--model-path)")
        self.original: List[str] = [str(p) for p in (model.get("backend_parameters") or [])]

    def instances(self) -> List[Dict[str, Any]]:
        return sorted(self.api.instances(self.model["id"]), key=lambda i: i["id"])

    def replicas(self) -> List[Replica]:
        return [Replica(i["id"], _warm(i)) for i in self.instances()]

    def not_ready(self) -> Optional[str]:
        return cannot_start(self.replicas(), self.wanted)

    def put_parameters(self, backend_parameters: List[str]) -> None:
        """The sparse update `apply` makes; a refusal (GPUStack's or the plugin's) is the error."""
        model = self.api.request("GET", f"/v2/models/{self.model['id']}")
        self.api.request("PUT", f"/v2/models/{self.model['id']}",
                         json=sparse_model_update(model, {"backend_parameters": backend_parameters}))

    def parameters_now(self) -> List[str]:
        model = self.api.request("GET", f"/v2/models/{self.model['id']}")
        return [str(p) for p in (model.get("backend_parameters") or [])]

    def roll(self, old_ids: Sequence[int], timeout_s: float, why: str,
             check: Optional[Callable[[Optional[Dict[str, Any]]], bool]] = None) -> List[int]:
        """Replace the instances in old_ids one at a time (N-1 warm throughout); returns the ids
        started meanwhile. `check`: what a new replica's /dspark/info must show."""
        old, deleted, before = set(old_ids), set(), {i["id"] for i in self.instances()}
        since = time.monotonic()
        while True:
            listed = self.instances()
            failed = [i for i in listed if i["id"] not in before and str(i.get("state")).lower() == "error"]
            if failed:  # e.g. the setting is refused where the replica starts: no use waiting for it
                raise CLIError(f"{why}: replica {failed[0]['id']} failed to start: "
                               f"{(failed[0].get('state_message') or 'no reason given')[:500]}")
            for broken in [i for i in listed if i["id"] in old and i["id"] not in deleted
                           and str(i.get("state")).lower() == "error"]:
                # It serves nothing, so replacing it now keeps as many warm as before.
                _say(f"    {why}: replacing replica {broken['id']} (in error: it serves nothing)")
                self.api.request("DELETE", f"/v2/model-instances/{broken['id']}")
                deleted.add(broken["id"])
                since = time.monotonic()
            replicas = [Replica(i["id"], _warm(i)) for i in listed if i["id"] not in deleted]
            step = next_step(replicas, self.wanted, old)
            if step.action == DONE:
                new = [r.id for r in replicas if r.id not in before]
                if check is not None:
                    by_id = {i["id"]: i for i in listed}
                    wrong = [n for n in new if not check(replica_info(by_id[n], timeout_s=3.0))]
                    if wrong:
                        raise CLIError(f"{why}: replica(s) {wrong} came up warm without the expected settings")
                return new
            if step.action == RESTART and step.instance_id not in deleted:
                _say(f"    {why}: replacing replica {step.instance_id} ({step.why})")
                self.api.request("DELETE", f"/v2/model-instances/{step.instance_id}")
                deleted.add(step.instance_id)
                since = time.monotonic()
            elif time.monotonic() - since > timeout_s:
                raise CLIError(f"{why}: not done after {timeout_s:.0f} s ({step.why})")
            time.sleep(POLL_S)

    def instance(self, instance_id: int) -> Dict[str, Any]:
        return next(i for i in self.instances() if i["id"] == instance_id)


def plan(deployment: Deployment, settings: Sequence[sweep.Setting]) -> List[List[str]]:
    """Every setting's backend parameters, computed (and refused) before anything changes."""
    try:
        return [sweep.deployment_parameters(deployment.original, s) for s in settings]
    except sweep.GridError as e:
        raise BadInput(str(e)) from None


def run_rolling(api: ModelsAPI, name: str, settings: Sequence[sweep.Setting], ready_timeout_s: float,
                measure: Callable[[sweep.Setting, str, str], None]) -> None:
    """Each setting on the sweep replica, then the deployment restored (also on Ctrl-C or an
    error). `measure(setting, base_url, served_name)` loads the replica and records rows."""
    deployment = Deployment(api, name)
    parameters = plan(deployment, settings)
    problem = deployment.not_ready()
    if problem:
        raise BadInput(f"--deployment {name}: {problem}")
    started_with = {i["id"] for i in deployment.instances()}
    sweep_id = max(started_with)
    _say(f"rolling sweep of {name}: {len(settings)} setting(s) on replica {sweep_id}, "
         f"{deployment.wanted - 1} replica(s) keep serving; the deployment's traffic also reaches the sweep replica")
    changed = False
    try:
        for index, (setting, params) in enumerate(zip(settings, parameters), start=1):
            _say(f"[{index}/{len(settings)}] {setting.label}: updating the model, then replica {sweep_id}")
            changed = True  # before the update: an interrupt during it still restores
            deployment.put_parameters(params)
            new = deployment.roll([sweep_id], ready_timeout_s, setting.label,
                                  check=lambda info, s=setting: sweep.shows_setting(info, s))
            if len(new) != 1:
                raise CLIError(f"{setting.label}: expected one new replica, GPUStack started {new}")
            sweep_id = new[0]
            url = replica_url(deployment.instance(sweep_id))
            if not url:
                raise CLIError(f"{setting.label}: replica {sweep_id} has no address")
            measure(setting, url, deployment.model["name"])
    finally:
        if changed:
            restore(deployment, started_with, ready_timeout_s)


def restore(deployment: Deployment, started_with: set, ready_timeout_s: float) -> None:
    """The original backend parameters back, and each replica started during the sweep replaced."""
    name = deployment.model["name"]
    _say(f"restoring {name}: its own backend parameters, then the replicas started during the sweep")
    try:
        if deployment.parameters_now() != deployment.original:
            deployment.put_parameters(deployment.original)
        during = [i["id"] for i in deployment.instances() if i["id"] not in started_with]
        deployment.roll(during, ready_timeout_s, "restore")
    except (CLIError, httpx.HTTPError, KeyboardInterrupt) as e:
        raise CLIError(f"NOT RESTORED: {name}: {e}; its original backend parameters were: "
                       f"{deployment.original} (put them back with gpustack-dspark apply, then restart the "
                       "replicas started during the sweep)") from None
    _say(f"restored {name}: original backend parameters, {deployment.wanted} replica(s) warm")
