"""`gpustack-dspark export NAME [-o FILE]`: a model as GPUStack 2.3's own deployment document.

The text is GPUStack's `POST /v2/models/export`, unchanged: it imports into GPUStack as it
is, and `apply -f` of it reports "unchanged" (DSpark knobs live in `backend_parameters`).
"""

import argparse
import sys
from pathlib import Path

from gpustack_dspark.cli.client import CLIError
from gpustack_dspark.cli.models_api import ModelsAPI


def register(subparsers, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "export", parents=[common], help="write a model as a YAML document GPUStack can import",
        description="Write a model as GPUStack's deployment document (importable, and re-appliable with apply -f).")
    parser.add_argument("name", metavar="NAME", help="model name")
    parser.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    with ModelsAPI(args.server, args.api_key) as api:
        model = api.model(args.name)
        if model is None:
            known = ", ".join(sorted(m["name"] for m in api.models())) or "none"
            raise CLIError(f"no model named {args.name!r}; models: {known}")
        text = api.export_document([model["id"]])
    if args.output:
        try:
            Path(args.output).write_text(text)
        except OSError as e:
            raise CLIError(f"cannot write {args.output}: {e.strerror or e}") from None
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
