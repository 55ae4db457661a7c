"""The Kubernetes deployment (deploy/): every manifest validates offline and strictly against
the API schemas of Kubernetes 1.32 through 1.36 (kubernetes-validate), the Helm chart renders
with Helm's own engine (helm-python-sdk) to exactly the plain manifests in deploy/kubernetes,
its variants (CPU device, several GPUs, ServiceMonitor) validate too, and the pieces agree
with each other: the daemon's flags, the device plugin's command line, the shared socket
directory, the probes, the Service and the ServiceMonitor.

ServiceMonitor is a custom resource (monitoring.coreos.com/v1), which kubernetes-validate has
no schema for: it alone is left out of schema validation, and checked field by field here."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_validate import utils as kv

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
MANIFESTS = DEPLOY / "kubernetes"
CHART = DEPLOY / "helm" / "salus"
KUBERNETES_VERSIONS = ["1.32", "1.33", "1.34", "1.35", "1.36"]
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}  # CRDs: no bundled schema
SOCKET_DIR = "/run/salus"
DAEMON_SOCKET = "ipc:///run/salus/salus.sock"


def _load_render_module() -> Any:
    spec = importlib.util.spec_from_file_location("render_manifests",
                                                  DEPLOY / "render_manifests.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render_manifests = _load_render_module()


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def manifest_files() -> list[Path]:
    return sorted(MANIFESTS.rglob("*.yaml"))


def plain_objects() -> list[dict[str, Any]]:
    """Every object in deploy/kubernetes, the examples included."""
    return [d for f in manifest_files() for d in documents(f.read_text())]


def deployment_objects() -> list[dict[str, Any]]:
    """The objects `kubectl apply -f deploy/kubernetes/` makes (no examples)."""
    return [d for f in manifest_files() if f.parent == MANIFESTS for d in documents(f.read_text())]


def validation_errors(objects: list[dict[str, Any]], version: str) -> list[str]:
    """What kubernetes-validate --strict says of each object against one version's schemas,
    offline (its schemas are in the package); a kind it has no schema for is an error."""
    errors = []
    for obj in objects:
        where = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        if (obj.get("apiVersion"), obj.get("kind")) in CUSTOM_KINDS:
            continue
        try:
            used = kv.validate(obj, version, strict=True)
        except kv.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            errors.append(f"{where} against {version}: {path}: {e.message}")
            continue
        except kv.SchemaNotFoundError as e:
            errors.append(f"{where}: {e.message}")
            continue
        if used != version:  # it falls back to an older version's schemas when it lacks one
            errors.append(f"{where}: validated against {used}, not {version}")
    return errors


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def container(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    found = [c for c in pod_spec["containers"] if c["name"] == name]
    assert len(found) == 1, f"container {name}: {len(found)}"
    return found[0]


def flag(args: list[str], name: str) -> str:
    assert args.count(name) == 1, f"{name} in {args}"
    return args[args.index(name) + 1]


# --- the validator itself ------------------------------------------------------------------


def test_the_validator_has_every_version_offline_and_is_strict() -> None:
    assert set(KUBERNETES_VERSIONS) <= {kv.major_minor(v) for v in kv.all_versions()}
    good = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"},
            "data": {"a": "b"}}
    assert validation_errors([good], "1.36") == []
    unknown_field = {**good, "dataa": {"a": "b"}}
    wrong_type = {**good, "data": {"a": 1}}
    unknown_kind = {"apiVersion": "v1", "kind": "Widget", "metadata": {"name": "x"}}
    for bad in (unknown_field, wrong_type, unknown_kind):
        assert validation_errors([bad], "1.36"), bad


# --- the plain manifests -------------------------------------------------------------------


def test_the_plain_manifests_are_there() -> None:
    names = {f.relative_to(MANIFESTS).as_posix() for f in manifest_files()}
    assert {"00-namespace.yaml", "configmap.yaml", "daemonset.yaml", "service.yaml",
            "examples/training-pod.yaml"} <= names
    # kubectl apply -f deploy/kubernetes/ goes in file-name order: the namespace first.
    top = sorted(f.name for f in MANIFESTS.glob("*.yaml"))
    assert top[0] == "00-namespace.yaml"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_plain_manifest_validates_strictly(version: str) -> None:
    objects = plain_objects()
    assert len(objects) >= 6
    assert validation_errors(objects, version) == []


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_a_broken_manifest_fails(version: str) -> None:
    daemonset = one(deployment_objects(), "DaemonSet")
    spec = daemonset["spec"]["template"]["spec"]
    spec["containers"][0]["livenessProbe"]["httpGet"]["paht"] = "/healthz"
    assert validation_errors([daemonset], version)


def test_the_plain_namespace_allows_host_paths() -> None:
    objects = deployment_objects()
    namespace = one(objects, "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    for obj in objects:
        if obj["kind"] not in ("Namespace", "Pod") and obj["metadata"].get("namespace"):
            assert obj["metadata"]["namespace"] == namespace["metadata"]["name"]


def test_the_example_pod_asks_for_eight_units_and_uses_the_environment() -> None:
    objects = documents((MANIFESTS / "examples" / "training-pod.yaml").read_text())
    pod = one(objects, "Pod")
    (train,) = pod["spec"]["containers"]
    assert train["resources"]["limits"]["salus.ai/gpu-memory"] == 8
    script = one(objects, "ConfigMap")["data"]["train.py"]
    compile(script, "train.py", "exec")
    assert "SALUS_ENDPOINT" in script and "salus.connect(" in script
    assert "SALUS_ENDPOINT" not in json.dumps(train.get("env", []))  # the plugin sets it


# --- the chart -----------------------------------------------------------------------------


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "salus"
    assert chart["type"] == "application"
    assert re.fullmatch(r"\d+\.\d+\.\d+", chart["version"])
    assert (CHART / "templates" / "_helpers.tpl").is_file()
    assert (CHART / "templates" / "NOTES.txt").is_file()


def _value_exists(values: Any, path: list[str]) -> bool:
    for key in path:
        if not isinstance(values, dict) or key not in values:
            return False
        values = values[key]
    return True


def test_every_value_the_templates_read_is_in_values_yaml() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    referenced = set()
    for template in (CHART / "templates").iterdir():
        for ref in re.findall(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)", template.read_text()):
            referenced.add(ref.lstrip("."))
    assert len(referenced) > 15
    missing = sorted(r for r in referenced if not _value_exists(values, r.split(".")))
    assert missing == []


def test_the_static_check_finds_a_missing_value(tmp_path: Path) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert not _value_exists(values, ["devicePlugin", "nope"])
    assert _value_exists(values, ["devicePlugin", "unit"])


def _renderer() -> str:
    try:
        return render_manifests.renderer()
    except render_manifests.RendererMissing as e:
        pytest.skip(str(e))


def rendered(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    _renderer()
    out = render_manifests.render(values)
    return [d for name in sorted(out) for d in documents(out[name])]


def test_the_plain_manifests_are_the_chart_rendered_with_its_defaults() -> None:
    chart_objects = rendered()
    plain = [d for d in deployment_objects() if d["kind"] != "Namespace"]

    def key(o: dict[str, Any]) -> str:
        return f"{o['kind']}/{o['metadata']['name']}"

    assert sorted(map(key, plain)) == sorted(map(key, chart_objects))
    chart_by_key = {key(o): o for o in chart_objects}
    for obj in plain:
        assert obj == chart_by_key[key(obj)], (
            f"deploy/kubernetes differs from the chart in {key(obj)}: run "
            ".venv/bin/python deploy/render_manifests.py")


def test_the_render_script_agrees_to_the_byte() -> None:
    _renderer()
    for path, text in render_manifests.expected_files().items():
        assert path.read_text() == text, f"{path}: run .venv/bin/python deploy/render_manifests.py"


VARIANTS = {
    "defaults": None,
    "cpu": {"device": "cpu", "nodeSelector": None},
    "two-gpus": {"gpusPerNode": 2},
    "service-monitor": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
    "no-priority-class": {"priorityClassName": "", "tolerations": []},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_chart_renders_valid_manifests(variant: str, version: str) -> None:
    objects = rendered(VARIANTS[variant])
    assert {o["kind"] for o in objects} >= {"ConfigMap", "DaemonSet", "Service"}
    assert validation_errors(objects, version) == []


def test_a_broken_template_fails_to_render(tmp_path: Path) -> None:
    _renderer()
    import shutil

    chart = tmp_path / "salus"
    shutil.copytree(CHART, chart)
    daemonset = chart / "templates" / "daemonset.yaml"
    daemonset.write_text(daemonset.read_text().replace("{{ .Values.metricsPort }}",
                                                       "{{ .Values.metricsPort", 1))
    with pytest.raises(Exception, match="(?i)metricsPort|parse|unclosed|unexpected"):
        render_manifests.render(None, chart=chart)
    with pytest.raises(Exception, match="device must be cuda or cpu"):
        render_manifests.render({"device": "tpu"})


def _pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return one(objects, "DaemonSet")["spec"]["template"]["spec"]


def test_gpu_requests_and_device_flag_follow_the_values() -> None:
    for values, device, gpus in [(None, "cuda:0", 1), ({"gpusPerNode": 2}, "cuda:all", 2),
                                 ({"device": "cpu"}, "cpu", None)]:
        server = container(_pod_spec(rendered(values)), "salus-server")
        assert flag(server["args"], "--device") == device
        limits = server.get("resources", {}).get("limits", {})
        assert limits.get("nvidia.com/gpu") == gpus
        if gpus is None:
            assert "nvidia.com/gpu" not in json.dumps(server)
    # Limits of one's own are kept beside the GPU.
    server = container(_pod_spec(rendered({"server": {"resources": {"limits": {
        "memory": "4Gi"}}}})), "salus-server")
    assert server["resources"]["limits"] == {"memory": "4Gi", "nvidia.com/gpu": 1}


# --- what the pieces agree on --------------------------------------------------------------


def test_the_server_container_runs_the_daemon_as_configured() -> None:
    objects = deployment_objects()
    spec = _pod_spec(objects)
    server = container(spec, "salus-server")
    args = server["args"]
    assert server["command"] == ["salus-server"]
    assert flag(args, "--listen") == DAEMON_SOCKET
    port = next(p for p in server["ports"] if p["name"] == "metrics")["containerPort"]
    assert flag(args, "--metrics-listen") == f"0.0.0.0:{port}"
    main_cc = (REPO / "src" / "server" / "salus_server_main.cc").read_text()
    for name in ("listen", "metrics-listen", "config", "device"):
        assert re.search(rf'\(\s*"{name}(,\w)?",\s*po::value', main_cc), f"no --{name}"
    # The config flag names the ConfigMap's key where the ConfigMap is mounted.
    config_path = Path(flag(args, "--config"))
    mount = next(m for m in server["volumeMounts"] if m["mountPath"] == str(config_path.parent))
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    config_map = one(objects, "ConfigMap")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    config = json.loads(config_map["data"][config_path.name])
    assert config["policy"] in ("fifo", "srtf", "pack", "fair", "priority")
    assert not {"listen", "metrics_listen", "device"} & set(config)  # flags say those
    for probe in ("readinessProbe", "livenessProbe"):
        assert server[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}


def test_the_device_plugin_gets_the_contract_command_line() -> None:
    spec = _pod_spec(deployment_objects())
    plugin = container(spec, "salus-device-plugin")
    args = plugin["args"]
    assert "command" not in plugin  # the image's entrypoint is salus-device-plugin
    assert flag(args, "--daemon") == DAEMON_SOCKET
    assert flag(args, "--kubelet-dir") == "/var/lib/kubelet/device-plugins"
    assert flag(args, "--pod-resources") == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert flag(args, "--socket-dir") == SOCKET_DIR
    assert flag(args, "--unit") == "256MiB"
    assert flag(args, "--reconcile-seconds") == "10"
    resources = [args[i + 1] for i, a in enumerate(args) if a == "--resource"]
    assert resources == ["salus.ai/gpu-memory=batch",
                         "salus.ai/gpu-memory-interactive=interactive:50"]
    # The plugin itself accepts them.
    sys.path.insert(0, str(REPO / "adaptors" / "python"))
    from salus.device_plugin import plugin as device_plugin

    opts = device_plugin.parse_args(args)
    assert opts.endpoint_in_pod() == DAEMON_SOCKET
    assert [r.name for r in opts.resources] == ["salus.ai/gpu-memory",
                                                "salus.ai/gpu-memory-interactive"]
    # Each path it is given is a mount of the matching host path.
    mounts = {m["mountPath"]: m["name"] for m in plugin["volumeMounts"]}
    host = {v["name"]: v.get("hostPath", {}).get("path") for v in spec["volumes"]}
    assert host[mounts["/var/lib/kubelet/device-plugins"]] == "/var/lib/kubelet/device-plugins"
    assert host[mounts["/var/lib/kubelet/pod-resources"]] == "/var/lib/kubelet/pod-resources"
    assert host[mounts[str(Path(flag(args, "--state-file")).parent)]] == "/var/lib/salus"
    # --socket-dir is a host path (the plugin mounts it into pods): it is the same in here.
    assert host[mounts[SOCKET_DIR]] == SOCKET_DIR


def test_both_containers_share_the_host_socket_directory() -> None:
    spec = _pod_spec(deployment_objects())
    (volume,) = (v for v in spec["volumes"] if v.get("hostPath", {}).get("path") == SOCKET_DIR)
    assert volume["hostPath"]["type"] == "DirectoryOrCreate"
    for c in spec["containers"] + spec["initContainers"]:
        (mount,) = (m for m in c["volumeMounts"] if m["name"] == volume["name"])
        assert mount["mountPath"] == SOCKET_DIR
    server = container(spec, "salus-server")
    assert not any(m.get("readOnly") for m in server["volumeMounts"]
                   if m["name"] == volume["name"])
    # The directory is given to the image's user before the daemon starts.
    (init,) = spec["initContainers"]
    assert init["image"] == server["image"]
    assert init["command"][:3] == ["chown", "salus:salus", SOCKET_DIR]


def test_the_daemon_keeps_its_sessions_in_a_host_directory_across_pods() -> None:
    """A rolling update drains each pod (SIGTERM): the snapshot goes to a hostPath the next
    pod restores from (docs/operations.md, Restarts), owned by the daemon's user."""
    spec = _pod_spec(deployment_objects())
    server = container(spec, "salus-server")
    state = server["args"][server["args"].index("--state-dir") + 1]
    (volume,) = (v for v in spec["volumes"] if v.get("hostPath", {}).get("path") == state)
    assert volume["hostPath"]["type"] == "DirectoryOrCreate"
    (mount,) = (m for m in server["volumeMounts"] if m["name"] == volume["name"])
    assert mount["mountPath"] == state and not mount.get("readOnly")
    (init,) = spec["initContainers"]
    assert state in init["command"]
    assert spec["terminationGracePeriodSeconds"] >= 60


def test_no_container_is_privileged_and_capabilities_are_dropped() -> None:
    spec = _pod_spec(deployment_objects())
    assert spec["automountServiceAccountToken"] is False
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
    for c in spec["containers"] + spec["initContainers"]:
        sc = c["securityContext"]
        assert not sc.get("privileged"), c["name"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert set(sc["capabilities"].get("add", [])) <= {"CHOWN"}
    assert "runAsUser" not in container(spec, "salus-server")["securityContext"]


def test_node_placement_defaults() -> None:
    objects = deployment_objects()
    daemonset = one(objects, "DaemonSet")
    spec = daemonset["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"]
    selector = daemonset["spec"]["selector"]["matchLabels"]
    assert selector.items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_the_service_and_service_monitor_find_the_metrics() -> None:
    objects = rendered(VARIANTS["service-monitor"])
    daemonset = one(objects, "DaemonSet")
    service = one(objects, "Service")
    monitor = one(objects, "ServiceMonitor")
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert _selects(service["spec"]["selector"], pod_labels)
    (port,) = service["spec"]["ports"]
    assert port["name"] == "metrics" and port["targetPort"] == "metrics"
    assert _selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert not _selects(monitor["spec"]["selector"]["matchLabels"],
                        daemonset["metadata"]["labels"])  # the Service alone
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert not by_kind(rendered(), "ServiceMonitor")  # off by default


def test_a_new_config_rolls_the_daemons() -> None:
    def checksum(values: dict[str, Any] | None) -> str:
        return one(rendered(values), "DaemonSet")["spec"]["template"]["metadata"][
            "annotations"]["checksum/config"]

    assert checksum(None) == checksum(None)
    assert checksum(None) != checksum({"config": {"policy": "srtf"}})


def test_the_device_plugin_image() -> None:
    text = (REPO / "docker" / "device-plugin.Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+)", text, flags=re.MULTILINE)
    assert stages and all(s == "debian:12-slim" for s in stages)
    assert re.search(r'^ENTRYPOINT \["salus-device-plugin"\]$', text, flags=re.MULTILINE)
    assert "-c requirements.txt" in text and "adaptors/python[kubernetes]" in text
    # Every proto the Python package imports is generated in the image.
    for proto in ("salus/v1/salus.proto", "k8s/deviceplugin_v1beta1.proto",
                  "k8s/podresources_v1.proto"):
        assert proto in text
