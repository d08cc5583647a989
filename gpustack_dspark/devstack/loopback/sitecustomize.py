"""Keeps every listening socket of a devstack process on loopback.

GPUStack binds its API, proxy, metrics and worker ports on 0.0.0.0 outside its embedded
gateway mode, with no flag to change that. The devstack puts this directory on
PYTHONPATH with DSPARK_LOOPBACK_ONLY=1, so each Python process it starts (and each child
they spawn) rewrites wildcard binds to 127.0.0.1 / ::1 before they happen.
Extra modules named in DSPARK_SITECUSTOMIZE_EXTRA (comma-separated) are imported after,
which is how tests inject faults into a real server process.
"""

import importlib
import os
import socket

if os.environ.get("DSPARK_LOOPBACK_ONLY") == "1":
    _WILDCARDS_V4 = {"", "0.0.0.0"}
    _WILDCARDS_V6 = {"::", "::0"}
    _original_bind = socket.socket.bind

    def _loopback_bind(self, address):
        if isinstance(address, tuple) and address:
            host = address[0]
            if self.family == socket.AF_INET and host in _WILDCARDS_V4:
                address = ("127.0.0.1",) + tuple(address[1:])
            elif self.family == socket.AF_INET6 and host in _WILDCARDS_V6:
                address = ("::1",) + tuple(address[1:])
        return _original_bind(self, address)

    socket.socket.bind = _loopback_bind

for _name in filter(None, os.environ.get("DSPARK_SITECUSTOMIZE_EXTRA", "").split(",")):
    importlib.import_module(_name.strip())
