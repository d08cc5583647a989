"""Which tests `make test`'s two pytest-xdist workers run together: the unit of work is a
module, or a group of modules that must run one after another on one worker.

- "containers-and-platform": the modules that start Podman stacks (and may build the CPU
  image), then the modules on the session's shared platform (tests/integration/shared_stack.py),
  one after another on one worker: never two Podman stacks at once, one platform per run, and
  never a Podman stack starting beside the real-replica routing tests, whose fair-share
  assertions assume two replicas of one speed (seen with them side by side: 16 of 16 requests
  to one replica, the other first measured slow under the containers' start);
- every other module is its own unit (its module-scoped stack starts once, on one worker).

Why a scheduler of our own rather than xdist's `xdist_group` marks: pytest 9 keeps node ids
in `Item._id`, and xdist 3.8 still writes the group into `Item._nodeid`, so the marks are
silently ignored (seen: one module's tests spread over both workers, its server started twice).
The groups are named here by path, because the controller that schedules sees node ids only;
tests/integration/conftest.py checks on collection that the modules which ask for the shared
platform are exactly SHARED_PLATFORM_MODULES.
"""

PODMAN_MODULES = frozenset({
    "tests/integration/test_demo.py",
    "tests/integration/test_demo_stops.py",
    "tests/integration/test_e2e_podman.py",
})
SHARED_PLATFORM_MODULES = frozenset({
    "tests/integration/test_console_browser.py",
    "tests/integration/test_deploy_form_browser.py",
    "tests/integration/test_observability.py",
    "tests/integration/test_real_model.py",
    "tests/integration/test_request_path.py",
    "tests/integration/test_routing_dspark_replicas.py",
})


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def group_of(nodeid: str) -> str:
    module = module_of(nodeid)
    if module in PODMAN_MODULES or module in SHARED_PLATFORM_MODULES:
        return "containers-and-platform"
    return module


def make_scheduler(config, log):
    """xdist's scope scheduler with our groups as scopes: work units go out in collection order
    (with --no-loadscope-reorder), a worker takes the next unit when it has finished its own."""
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return ByGroup(config, log)
