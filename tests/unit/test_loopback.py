"""The devstack's bind rewrite, checked in a real child interpreter."""

import json
import subprocess
import sys

from gpustack_dspark.devstack.processes import loopback_env

PROBE = """
import json, socket
out = {}
for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET, ""), (socket.AF_INET6, "::")):
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.bind((host, 0))
        out[repr(host)] = s.getsockname()[0]
    except OSError as e:
        out[repr(host)] = "error: %s" % e
    finally:
        s.close()
print(json.dumps(out))
"""


def _probe(env):
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_wildcard_binds_become_loopback():
    seen = _probe(loopback_env())
    assert seen["'0.0.0.0'"] == "127.0.0.1"
    assert seen["''"] == "127.0.0.1"
    assert seen["'::'"] == "::1" or seen["'::'"].startswith("error")  # no IPv6 here is fine
