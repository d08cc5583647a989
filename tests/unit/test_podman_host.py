"""The Podman host decisions (pure): which sandbox fixes a host gets, and the files they become."""

from pathlib import Path

from gpustack_dspark.devstack.podman import CONMON_NPROC, HostFacts, containers_conf, plan_fixes, storage_conf

NORMAL = HostFacts(is_root=True, has_sys_resource=True, cgroup_hybrid=False, nofile_hard=1048576,
                   nproc_hard=4194304, runc="/usr/sbin/runc")
SANDBOX = HostFacts(is_root=True, has_sys_resource=False, cgroup_hybrid=True, nofile_hard=20000,
                    nproc_hard=96364, runc="/usr/sbin/runc")


def test_a_normal_host_gets_no_fix():
    fixes = plan_fixes(NORMAL)
    assert fixes.ulimits == () and fixes.runtime is None and fixes.reasons == ()
    conf = containers_conf(fixes, NORMAL.runc, Path("/w"))
    assert "default_ulimits" not in conf and "runtime" not in conf


def test_without_cap_sys_resource_limits_are_pinned_and_oom_adj_is_dropped():
    fixes = plan_fixes(SANDBOX)
    assert fixes.ulimits == ("nofile=20000:20000", f"nproc={CONMON_NPROC}:{CONMON_NPROC}")
    assert fixes.runtime == "runc-wrapper"
    conf = containers_conf(fixes, SANDBOX.runc, Path("/x/runc-wrapper"))
    assert 'default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]' in conf
    assert 'runtime = "dspark-runc"' in conf and 'dspark-runc = ["/x/runc-wrapper"]' in conf


def test_a_hybrid_cgroup_host_alone_gets_plain_runc():
    facts = HostFacts(**{**NORMAL.__dict__, "cgroup_hybrid": True})
    fixes = plan_fixes(facts)
    assert fixes.runtime == "runc" and fixes.ulimits == ()
    assert 'runc = ["/usr/sbin/runc"]' in containers_conf(fixes, facts.runc, Path("/w"))


def test_low_hard_limits_are_kept():
    facts = HostFacts(**{**SANDBOX.__dict__, "nproc_hard": 4096})
    assert plan_fixes(facts).ulimits[1] == "nproc=4096:4096"


def test_storage_conf_names_the_private_store():
    text = storage_conf(Path("/s/storage"), Path("/s/run"))
    assert 'graphroot = "/s/storage"' in text and 'runroot = "/s/run"' in text


def test_a_run_store_reads_images_from_the_machine_store():
    text = storage_conf(Path("/run1/storage"), Path("/run1/run"), image_store=Path("/m/storage"))
    assert 'graphroot = "/run1/storage"' in text and 'additionalimagestores = ["/m/storage"]' in text
