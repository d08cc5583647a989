"""`gpustack-dspark delete NAME`: delete a model (GPUStack stops its instances)."""

import argparse

from gpustack_dspark.cli.client import CLIError
from gpustack_dspark.cli.models_api import ModelsAPI


def register(subparsers, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser("delete", parents=[common], help="delete a model",
                                   description="Delete a GPUStack model by name.")
    parser.add_argument("name", metavar="NAME", help="model name")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    with ModelsAPI(args.server, args.api_key) as api:
        model = api.model(args.name)
        if model is None:
            raise CLIError(f"no model named {args.name!r}")
        api.request("DELETE", f"/v2/models/{model['id']}")
    print(f"deleted {args.name} (id {model['id']})")
    return 0
