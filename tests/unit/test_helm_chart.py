"""deploy/helm/ rendered with the real `helm template` (helm 3.18.0 from `make tools`) from
GPUStack's own chart (inside the gpustack 2.3.0 wheel) and from the overlay chart; every
object validated with kubernetes-validate's strict schemas (gpustack_dspark/k8s/manifests.py),
then checked for what the deployment needs. Plus the server image's Containerfile."""

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

import gpustack
from gpustack_dspark import __version__, settings
from gpustack_dspark.k8s import manifests
from gpustack_dspark.labels import parse_selector, selector_matches
from gpustack_dspark.versions import SUPPORTED_GPUSTACK_VERSION

ROOT = Path(__file__).resolve().parents[2]
HELM = ROOT / ".tools" / "helm-3.18.0" / "helm"
GPUSTACK_CHART = Path(gpustack.__file__).parent / "ui" / "static" / "charts" / "gpustack-chart.tgz"
VALUES = ROOT / "deploy" / "helm" / "gpustack-values.yaml"
CLUSTER_VALUES = ROOT / "deploy" / "helm" / "cluster-helm-values.yaml"
OVERLAY = ROOT / "deploy" / "helm" / "gpustack-dspark"
NAMESPACE = "gpustack"
POOL_KEY = "gpustack-dspark.io/json-inference"
NVIDIA_PCI = "feature.node.kubernetes.io/pci-10de.present"


def helm_template(chart, *args, release="gpustack"):
    assert HELM.exists(), f"{HELM} is missing: run `make tools`"
    return subprocess.run([str(HELM), "template", release, str(chart), "--namespace", NAMESPACE, *args],
                          capture_output=True, text=True, timeout=120)


def render(chart, *args, release="gpustack"):
    done = helm_template(chart, *args, release=release)
    assert done.returncode == 0, done.stderr
    return manifests.load_objects(done.stdout)


def checked(objects):
    report = manifests.check(objects)
    assert report.errors == []
    return report


def find(objects, kind, name=None):
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert found, f"no {kind} {name or ''} rendered"
    return found


def env_of(container):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


@pytest.fixture(scope="module")
def base():
    return render(GPUSTACK_CHART, "-f", str(VALUES), "--include-crds")


def test_every_object_of_gpustack_chart_with_our_values_passes_strict_validation(base):
    report = checked(base)
    assert report.unchecked == {}  # custom resources were checked against their CRDs
    assert report.schema_checked > 100 and report.crd_checked >= 1


def test_the_server_runs_the_plugin_image_with_the_plugin_settings(base):
    server = find(base, "StatefulSet", "gpustack-server")[0]
    container = server["spec"]["template"]["spec"]["containers"][0]
    image = f"docker.io/{settings.SERVER_IMAGE_REPOSITORY}:{settings.SERVER_IMAGE_TAG}"
    assert container["image"] == image
    assert settings.SERVER_IMAGE_TAG == f"{__version__}-gpustack{SUPPORTED_GPUSTACK_VERSION}"
    assert {"configMapRef": {"name": "server-config", "optional": True}} in container["envFrom"]
    assert server["spec"]["template"]["spec"]["serviceAccountName"] == "gpustack-server"
    plugin, errors = manifests.check_plugin_settings(base)
    assert errors == []
    assert plugin.node_label_sync_selector == f"{POOL_KEY}=true"
    assert plugin.node_label_sync_kubeconfig is None  # in-cluster: the pod's service account
    assert plugin.json_label_text == "role=json-inference"
    assert (plugin.cuda_image, plugin.cpu_image) == (
        "docker.io/gpustack-dspark/gpustack-dspark-worker:0.1.0-cuda",
        "docker.io/gpustack-dspark/gpustack-dspark-worker:0.1.0-cpu")


def test_the_json_worker_pool_runs_on_the_nodes_the_sync_selects(base):
    plugin, _ = manifests.check_plugin_settings(base)
    selector = parse_selector(plugin.node_label_sync_selector)
    daemonsets = find(base, "DaemonSet")
    workers = [d for d in daemonsets if d["metadata"]["name"].startswith("gpustack-worker")]
    assert [d["metadata"]["name"] for d in workers] == ["gpustack-worker-nvidia"]  # cpuEnabled: false
    pod = workers[0]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {POOL_KEY: "true", NVIDIA_PCI: "true"}
    assert selector_matches(selector, pod["nodeSelector"])
    env = env_of(pod["containers"][0])
    # What the sync's worker = node mapping rests on.
    assert env["GPUSTACK_WORKER_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["GPUSTACK_RUNTIME_DEPLOY"] == "Kubernetes"
    assert pod["containers"][0]["image"].endswith(f"/{settings.SERVER_IMAGE_REPOSITORY}:{settings.SERVER_IMAGE_TAG}")


def test_cpu_pool_and_all_gpu_nodes_variants():
    with_cpu = render(GPUSTACK_CHART, "-f", str(VALUES), "--set", "worker.cpuEnabled=true")
    checked(with_cpu)
    cpu = find(with_cpu, "DaemonSet", "gpustack-worker")[0]["spec"]["template"]["spec"]
    assert cpu["nodeSelector"] == {POOL_KEY: "true", "feature.gpustack.ai/acceleratable": "false"}

    everywhere = render(GPUSTACK_CHART, "-f", str(VALUES), "--set", "worker.nodeSelector=null")
    checked(everywhere)
    gpu = find(everywhere, "DaemonSet", "gpustack-worker-nvidia")[0]["spec"]["template"]["spec"]
    assert gpu["nodeSelector"] == {NVIDIA_PCI: "true"}  # workers on every GPU node
    plugin, _ = manifests.check_plugin_settings(everywhere)
    assert plugin.node_label_sync_selector == f"{POOL_KEY}=true"  # the sync still picks the pool


def test_helm_values_for_a_registered_cluster():
    from gpustack.schemas.clusters import K8sOptions

    helm_values = yaml.safe_load(CLUSTER_VALUES.read_text())
    K8sOptions.model_validate({"helmValues": helm_values})  # GPUStack's own check: no server-owned paths
    objects = render(GPUSTACK_CHART, "-f", str(CLUSTER_VALUES), "--set", "server.enabled=false",
                     "--set", "higress-core.enabled=false", "--set", "worker.enabled=true",
                     "--set", "worker.serverURL=https://gpustack.example.com", "--set", "registrationToken=t0ken",
                     "--set", f"image.tag=v{SUPPORTED_GPUSTACK_VERSION}")
    checked(objects)
    assert not [o for o in objects if o["kind"] == "StatefulSet"]
    pod = find(objects, "DaemonSet", "gpustack-worker-nvidia")[0]["spec"]["template"]["spec"]
    assert pod["nodeSelector"][POOL_KEY] == "true"


@pytest.fixture(scope="module")
def overlay():
    return render(OVERLAY, "--set", "prometheusRules.labels.release=kube-prometheus-stack", release="dspark")


def test_overlay_rbac_is_read_only_on_nodes(overlay):
    checked(overlay)
    role = find(overlay, "ClusterRole")
    assert len(role) == 1 and role[0]["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]
    assert {o["kind"] for o in overlay} == {"ClusterRole", "ClusterRoleBinding", "ConfigMap"}
    binding = find(overlay, "ClusterRoleBinding")[0]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpustack-server", "namespace": NAMESPACE}]
    assert binding["roleRef"]["name"] == role[0]["metadata"]["name"]


def test_overlay_ships_the_rules_and_dashboard_files_unchanged(overlay):
    rules_file = (ROOT / "deploy" / "prometheus" / "dspark-rules.yml").read_text()
    dashboard_file = (ROOT / "deploy" / "grafana" / "dashboards" / "gpustack-dspark.json").read_text()
    # The chart's copies (Helm reads files inside the chart only) are the same files.
    assert (OVERLAY / "files" / "dspark-rules.yml").read_text() == rules_file
    assert (OVERLAY / "files" / "gpustack-dspark.json").read_text() == dashboard_file
    rules = find(overlay, "ConfigMap", "dspark-prometheus-rules")[0]
    assert yaml.safe_load(rules["data"]["dspark-rules.yml"]) == yaml.safe_load(rules_file)
    assert rules["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    dashboard = find(overlay, "ConfigMap", "dspark-grafana-dashboard")[0]
    assert json.loads(dashboard["data"]["gpustack-dspark.json"]) == json.loads(dashboard_file)
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_overlay_prometheus_rule_crd_and_other_subjects():
    objects = render(OVERLAY, "--set", "prometheusRules.kind=PrometheusRule", "--set", "grafanaDashboard.enabled=false",
                     "--set-json", 'rbac.subjects=[{"kind":"User","name":"dspark-sync","apiGroup":"rbac.authorization.k8s.io"}]',
                     release="dspark")
    report = checked(objects)
    assert report.unchecked == {"PrometheusRule": 1}  # no Prometheus Operator CRD here: checked below
    rule = find(objects, "PrometheusRule")[0]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and set(rule) == {"apiVersion", "kind", "metadata", "spec"}
    assert rule["spec"] == yaml.safe_load((ROOT / "deploy" / "prometheus" / "dspark-rules.yml").read_text())
    # Its metadata against the strict ObjectMeta schema (through a ConfigMap, which has no other fields).
    assert manifests.validate_schemas([{"apiVersion": "v1", "kind": "ConfigMap",
                                        "metadata": rule["metadata"]}]).errors == []
    assert find(objects, "ClusterRoleBinding")[0]["subjects"] == [
        {"kind": "User", "name": "dspark-sync", "apiGroup": "rbac.authorization.k8s.io"}]
    assert not [o for o in objects if o["kind"] == "ConfigMap"]
    assert render(OVERLAY, "--set", "rbac.create=false", "--set", "prometheusRules.enabled=false",
                  "--set", "grafanaDashboard.enabled=false", release="dspark") == []


@pytest.mark.parametrize("args,message", [
    (["--set", "prometheusRules.labels.bad key=x"],
     "prometheusRules.labels: \"bad key\" is not a valid label key (letters, digits, '-', '_', '.', "
     "at most 63 characters, optional DNS prefix/)"),
    (["--set-string", "grafanaDashboard.labels.grafana_dashboard=-1-"],
     "grafanaDashboard.labels.grafana_dashboard: \"-1-\" is not a valid label value (letters, digits, "
     "'-', '_', '.', at most 63 characters)"),
    (["--set", "grafanaDashboard.labels.grafana_dashboard=1"],
     "grafanaDashboard.labels.grafana_dashboard: 1 is not a string (quote label values, e.g. \"1\")"),
    (["--set", "gpustack.release=GPU_Stack"],
     "gpustack.release: \"GPU_Stack\" is not a release name (lowercase letters, digits, '-', at most 63 characters)"),
    (["--set", "prometheusRules.kind=Rules"], "prometheusRules.kind: \"Rules\" is not one of ConfigMap, PrometheusRule"),
])
def test_bad_overlay_values_fail_rendering_with_one_line(args, message):
    done = helm_template(OVERLAY, *args, release="dspark")
    assert done.returncode != 0
    first = done.stderr.strip().splitlines()[0]
    assert first.startswith("Error: execution error at (gpustack-dspark/templates/checks.yaml")
    assert first.endswith(": " + message)


@pytest.mark.parametrize("args,message", [
    (["--set-string", "server.environmentConfig.GPUSTACK_DSPARK_NODE_LABEL_SYNC_SELECTOR=pool json"],
     "ConfigMap server-config data: environment variable GPUSTACK_DSPARK_NODE_LABEL_SYNC_SELECTOR: label selector "
     "requirement 'pool json' is not one of: key, !key, key=value, key!=value, key in (a,b), key notin (a,b), "
     "joined by commas"),
    (["--set-string", "server.environmentConfig.GPUSTACK_DSPARK_JSON_LABEL=json-inference"],
     "ConfigMap server-config data: environment variable GPUSTACK_DSPARK_JSON_LABEL: 'json-inference' is not "
     "KEY=VALUE (for example role=json-inference)"),
    (["--set-string", "server.environmentConfig.GPUSTACK_DSPARK_NODE_SELECTOR=x=y"],
     "ConfigMap server-config data.GPUSTACK_DSPARK_NODE_SELECTOR: not a gpustack-dspark setting (known: "),
    (["--set-json", 'worker.nodeSelector={"json inference":"true"}'],
     "DaemonSet gpustack/gpustack-worker-nvidia spec.template.spec.nodeSelector: label key 'json inference' is not "
     "a valid label key (letters, digits, '-', '_', '.', at most 63 characters, optional DNS prefix/)"),
    (["--set-json", 'server.extraVolumeMounts=[{"name":"ca","mountPath":"/ca","readonly":true}]'],
     "StatefulSet gpustack/gpustack-server: spec.template.spec.containers.0.volumeMounts.1: Additional properties "
     "are not allowed ('readonly' was unexpected) (Kubernetes 1.32 schema, strict)"),
])
def test_bad_values_for_gpustacks_chart_fail_validation_naming_field_and_value(args, message):
    objects = render(GPUSTACK_CHART, "-f", str(VALUES), *args)
    errors = manifests.check(objects).errors
    assert len(errors) == 1 and errors[0].startswith(message), errors


def test_the_check_command_line(tmp_path, base):
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(helm_template(OVERLAY, release="dspark").stdout)
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", "gpustack_dspark.k8s.manifests", str(rendered)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("4 objects: 4 against Kubernetes 1.32's strict schemas, 0 against their CRDs, "
                                   "no schema here: none; 0 error(s)")
    (tmp_path / "deep.yaml").write_text("a: " + "[" * 200 + "]" * 200 + "\n")
    deep = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", "gpustack_dspark.k8s.manifests",
                           str(tmp_path / "deep.yaml")], capture_output=True, text=True, timeout=60)
    assert deep.returncode == 2
    assert deep.stderr.strip() == f"{tmp_path / 'deep.yaml'}: nested deeper than 128 levels; allowed: at most 128 (line 1)"


# -- the server image -------------------------------------------------------------------------

CONTAINERFILE = ROOT / "backend_images" / "server" / "Containerfile"


def _instructions():
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_server_containerfile_builds_on_the_pinned_gpustack_image():
    lines = _instructions()
    assert lines[0] == f"ARG GPUSTACK_IMAGE=docker.io/gpustack/gpustack:v{SUPPORTED_GPUSTACK_VERSION}"
    assert lines[1] == "FROM ${GPUSTACK_IMAGE}"
    # The chart's image.repository default is GPUStack's official image of the same name.
    chart_values = subprocess.run([str(HELM), "show", "values", str(GPUSTACK_CHART)], capture_output=True,
                                  text=True, timeout=60, check=True).stdout
    assert yaml.safe_load(chart_values)["image"]["repository"] == "gpustack/gpustack"
    assert gpustack.__version__ == f"v{SUPPORTED_GPUSTACK_VERSION}"


def test_server_containerfile_installs_the_package_with_the_server_extra():
    lines = _instructions()
    assert "COPY pyproject.toml README.md /opt/gpustack-dspark/" in lines
    assert "COPY gpustack_dspark /opt/gpustack-dspark/gpustack_dspark" in lines
    run = [line for line in lines if line.startswith("RUN ")]
    assert len(run) == 1
    assert '"$python" -m pip install --no-cache-dir "/opt/gpustack-dspark[server]"' in run[0]
    # The [server] extra pins the GPUStack the image already has, so pip keeps it.
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["server"]
    assert f"gpustack=={SUPPORTED_GPUSTACK_VERSION}" in extra


def test_server_containerfile_finds_gpustacks_interpreter_and_checks_the_version():
    """The RUN script's own lines, but pip's: against .venv, whose gpustack is the pinned one."""
    run = [line for line in _instructions() if line.startswith("RUN ")][0].removeprefix("RUN ")
    steps = [s.strip() for s in run.split(";")]
    kept = [s for s in steps if "pip install" not in s and "--help" not in s]
    assert len(kept) == len(steps) - 2
    done = subprocess.run(["bash", "-c", "; ".join(kept) + '; echo "$python"'], capture_output=True, text=True,
                          timeout=60, env={"PATH": f"{ROOT / '.venv' / 'bin'}:/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).resolve() == (ROOT / ".venv" / "bin" / "python").resolve()


def test_the_server_image_is_in_the_image_list():
    from gpustack_dspark.plugin import DSparkPlugin

    images = DSparkPlugin.extra_image_list()
    assert images[-1] == settings.DEFAULT_SERVER_IMAGE == f"{settings.SERVER_IMAGE_REPOSITORY}:{settings.SERVER_IMAGE_TAG}"
    assert settings.server_image_from_environment({settings.SERVER_IMAGE_ENV: "registry.local/x/server:1"}) == \
        "registry.local/x/server:1"
