"""Exit status 2: bad input (a file, a document, an argument), as opposed to a failed
operation (CLIError, exit 1)."""

from gpustack_dspark.cli.client import CLIError


class BadInput(CLIError):
    exit_code = 2
