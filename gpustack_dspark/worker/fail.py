"""`dspark-serve: error: <one line>` and exit 2: how the launcher refuses a configuration.

Why a module of its own: both `serve.py` (before vLLM is imported) and `launch.py` (vLLM's
own checks) refuse this way, and `serve.py` starts `launch.py`; with `fail` here neither
imports the other back (no import circle). Exit 2 is argparse's and GPUStack's admission's
"this configuration cannot run" (admission/start_failure.py reads the line).
"""

import sys
from typing import NoReturn

PROG = "dspark-serve"


def fail(message: str) -> NoReturn:
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)
