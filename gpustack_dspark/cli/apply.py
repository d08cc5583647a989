"""`gpustack-dspark apply -f FILE [--dry-run] [--no-wait]`: create or update models from YAML.

1. Every document is validated locally (no network): a bad file exits 2, nothing sent.
2. The materialized documents go to GPUStack's own import as a dry run: GPUStack's plan
   (create / update / unchanged, field changes) and GPUStack's own validation of every
   entry. Any error there: exit 2, nothing written. `--dry-run` prints the plan and stops.
3. Writes: updates of running deployments first (`PUT`, changed fields only; GPUStack's
   import refuses to overwrite a running deployment), then creates and stopped updates in
   one import call (one database transaction). A failure rolls back the in-place
   updates already made, so a file is applied whole or not at all.
4. Unless `--no-wait`: wait until every replica is RUNNING (warm), or stop on ERROR / timeout.
"""

import argparse
from typing import Dict, List, Optional, Tuple

import yaml

from gpustack_dspark.backend_ids import sparse_model_update
from gpustack_dspark.cli import modeldoc, plan, wait
from gpustack_dspark.cli.client import CLIError
from gpustack_dspark.cli.errors import BadInput
from gpustack_dspark.cli.models_api import ModelsAPI


def register(subparsers, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "apply", parents=[common], help="create or update models from a model YAML file",
        description="Create or update GPUStack models from a model YAML file (docs/models-yaml.md). "
                    "All documents are applied, or none.")
    parser.add_argument("-f", "--file", required=True, metavar="FILE", help="model YAML (one model per '---' section)")
    parser.add_argument("--dry-run", action="store_true", help="print what would change against GPUStack; change nothing")
    parser.add_argument("--no-wait", action="store_true", help="do not wait for the replicas to be RUNNING")
    parser.add_argument("--timeout", type=float, default=900, metavar="SECONDS",
                        help="how long to wait for RUNNING replicas (default 900)")
    parser.add_argument("--cluster", metavar="NAME",
                        help="GPUStack cluster for models whose document names none (default: the only cluster)")
    parser.set_defaults(run=run)


def render(docs: List[modeldoc.ModelDocument]) -> str:
    """The documents as GPUStack's import reads them (and its export writes them)."""
    return yaml.safe_dump_all([d.entry for d in docs], sort_keys=False, allow_unicode=True)


def fill_from_server(api: ModelsAPI, docs: List[modeldoc.ModelDocument], wanted: Optional[str]) -> None:
    """Complete what a hand-written document may leave to the server.

    `cluster_name` (GPUStack's import needs one for an admin key, which has no organization
    of its own): the document's own, else the cluster an existing model of that name lives
    in, else --cluster, else the only cluster there is. `categories`: GPUStack derives them
    from the model's config when a model has none; an existing model keeps its own, so a
    document that does not mention them does not read as a change.
    """
    clusters = api.clusters()
    by_id = {c["id"]: c["name"] for c in clusters}
    names = ", ".join(by_id.values()) or "none"
    if wanted is not None and wanted not in by_id.values():
        raise BadInput(f"--cluster {wanted!r}: no such cluster; clusters: {names}")
    existing = {m["name"]: m for m in api.models()}
    for doc in docs:
        entry, current = doc.entry, existing.get(doc.name)
        if "categories" not in entry and current and current.get("categories"):
            entry["categories"] = list(current["categories"])
        if "cluster_name" in entry:
            continue
        cluster = (current and by_id.get(current.get("cluster_id"))) or wanted
        if cluster is None:
            if len(clusters) != 1:
                raise BadInput(f"{doc.name}: which cluster? GPUStack has {len(clusters)} clusters ({names}): "
                               "pass --cluster NAME or set cluster_name in the document")
            cluster = clusters[0]["name"]
        doc.entry = {"name": entry["name"], "cluster_name": cluster,
                     **{k: v for k, v in entry.items() if k != "name"}}


def _refusals(file: str, steps: List[plan.Step]) -> List[str]:
    out = [f"{file}: document {s.index} ({s.name}): GPUStack: {e}" for s in steps for e in s.errors]
    for s in steps:
        fields = plan.unsupported_running_changes(s) if s.running else []
        if fields:
            out.append(f"{file}: document {s.index} ({s.name}): {', '.join(fields)} cannot change while the "
                       "model is running; set replicas: 0, apply, then apply again with the change")
    return out


def write(api: ModelsAPI, docs: List[modeldoc.ModelDocument], steps: List[plan.Step]) -> None:
    in_place = [s for s in steps if s.action == "update" and s.running]
    imported = [s for s in steps if s.action == "create" or (s.action == "update" and not s.running)]
    done: List[Tuple[int, plan.Step]] = []
    try:
        for step in in_place:
            model = api.model(step.name)
            if model is None:
                raise CLIError(f"model {step.name} disappeared while applying")
            api.request("PUT", f"/v2/models/{model['id']}", json=sparse_model_update(model, plan.sparse_update(step.changes)))
            done.append((model["id"], step))
        if imported:
            api.import_documents(render([docs[s.index - 1] for s in imported]), dry_run=False,
                                 overwrite=[s.name for s in imported if s.action == "update"])
    except CLIError as e:
        undone = _roll_back(api, done)
        stuck = [step.name for _, step in done if step.name not in undone]
        if stuck:
            raise CLIError(f"{e}\nPARTLY APPLIED: could not roll back the in-place update of {', '.join(stuck)}; "
                           "check them with gpustack-dspark status") from None
        raise CLIError(f"{e}\nnothing was applied" + (f" (rolled back: {', '.join(undone)})" if undone else "")) from None


def _roll_back(api: ModelsAPI, done: List[Tuple[int, plan.Step]]) -> List[str]:
    undone = []
    for model_id, step in reversed(done):
        try:
            model = api.request("GET", f"/v2/models/{model_id}")
            api.request("PUT", f"/v2/models/{model_id}", json=sparse_model_update(model, plan.sparse_update(step.changes, False)))
            undone.append(step.name)
        except CLIError:
            pass
    return undone


def wait_for(api: ModelsAPI, docs: List[modeldoc.ModelDocument], timeout_s: float) -> None:
    wanted = {d.name: int(d.entry.get("replicas", 1)) for d in docs}
    wanted = {name: n for name, n in wanted.items() if n > 0}
    if not wanted:
        return
    ids = {m["name"]: m["id"] for m in api.models() if m["name"] in wanted}

    def fetch() -> Dict[str, List[Dict]]:
        instances = api.instances()
        return {name: [i for i in instances if i.get("model_id") == ids.get(name)] for name in wanted}

    wait.wait_running(fetch, wanted, timeout_s, pending_hint=wait.instance_messages)


def run(args: argparse.Namespace) -> int:
    try:
        docs = modeldoc.load_file(args.file)
    except modeldoc.SpecErrors as e:
        raise BadInput(f"{len(e.errors)} problem(s), nothing applied:\n{e}") from None
    with ModelsAPI(args.server, args.api_key) as api:
        mentioned = {d.name: set(d.entry) for d in docs}
        fill_from_server(api, docs, args.cluster)
        steps = plan.without_derived(plan.read_plan(api.import_documents(render(docs), dry_run=True)), mentioned)
        refusals = _refusals(args.file, steps)
        if refusals:
            raise BadInput(f"GPUStack refused the file, nothing applied:\n" + "\n".join(refusals))
        print(plan.render_plan(steps), flush=True)
        if args.dry_run:
            return 0
        if any(s.action != "unchanged" for s in steps):
            write(api, docs, steps)
            print("applied", flush=True)
        if any(s.running and s.action == "update" and any(c["field"] != "replicas" for c in s.changes)
               for s in steps):
            print("note: running instances keep their old settings until restarted "
                  "(GPUStack marks them stale; restart from the UI or POST /v2/models/{id}/restart)")
        if not args.no_wait:
            wait_for(api, docs, args.timeout)
    return 0
