"""The session's shared platform (tests/integration/shared_stack.py) and the hooks that keep
the suite inside its budget on a 2-core machine:

- the modules that use the platform run one after another, and it stops after the last of
  them instead of at the session's end (its replicas would otherwise sit beside every later
  module's own);
- with `PYTEST_WORKERS=2` (`make test` runs one stream by default), two pytest-xdist workers
  take a module, or a group of modules, at a time (tests/xdist_groups.py); collection order is
  the order units go out: the longest group first.
"""

from typing import Dict, List

import pytest

from tests.integration.shared_stack import SharedStack
from tests.xdist_groups import PODMAN_MODULES, SHARED_PLATFORM_MODULES, module_of

SHARED = "shared_stack"
_started: List[SharedStack] = []


@pytest.fixture(scope="session")
def shared_stack(tmp_path_factory):
    stack = SharedStack(tmp_path_factory.mktemp("shared"))
    _started.append(stack)
    try:
        yield stack
    finally:
        stack.stop()


def pytest_collection_modifyitems(session, config, items):
    """The container modules first (the longest group: started first, it does not end the run
    alone), then the platform's users one after another, then every other module in its place;
    every test keeps its place in its module. The users must be the ones tests/xdist_groups.py
    names (the scheduler groups by path)."""
    by_module: Dict[str, list] = {}
    for item in items:
        by_module.setdefault(module_of(item.nodeid), []).append(item)
    users = [m for m, its in by_module.items() if any(SHARED in it.fixturenames for it in its)]
    unnamed = set(users) - SHARED_PLATFORM_MODULES
    if unnamed:
        raise pytest.UsageError(f"{sorted(unnamed)} use {SHARED}: add them to SHARED_PLATFORM_MODULES "
                                "in tests/xdist_groups.py")
    podman = [m for m in by_module if m in PODMAN_MODULES]
    rest = [m for m in by_module if m not in PODMAN_MODULES and m not in users]
    items[:] = [it for module in podman + users + rest for it in by_module[module]]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    result = yield  # the item's own fixtures are torn down first (a module's models go before the platform)
    users = SHARED_PLATFORM_MODULES  # exactly the users (checked on collection)
    if module_of(item.nodeid) in users and (nextitem is None or module_of(nextitem.nodeid) not in users):
        for stack in _started:
            stack.stop()
    return result

