"""salus-device-plugin against a fake kubelet and a real daemon.

The kubelet is faked from the published v1beta1 protocol: a registration server on a
temporary unix socket, which then calls the plugin's own socket as the kubelet would
(options, ListAndWatch, Allocate), and a PodResources server whose pods the test sets. The
daemon, the plugin (its own process) and the pods' training jobs are real; a pod is a
process in its own mount namespace that applies the mount Allocate returned."""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from k8s_pod_job import train
from mlp_job import create
from salus_daemon import REPO, Daemon
from test_daemon import wait_for

import salus
from salus._generated.k8s import deviceplugin_v1beta1_pb2 as dp
from salus._generated.k8s import podresources_v1_pb2 as pr
from salus.device_plugin import kubelet

BATCH = "salus.ai/gpu-memory"
INTERACTIVE = "salus.ai/gpu-memory-interactive"
POD_JOB = Path(__file__).with_name("k8s_pod_job.py")


class FakeKubelet:
    """The kubelet's registration socket in a device-plugins directory, and its calls to the
    plugins that registered."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "device-plugins"
        self.dir.mkdir()
        self.registrations: queue.Queue[dp.RegisterRequest] = queue.Queue()
        self.start()

    def Register(self, request: dp.RegisterRequest, context: grpc.ServicerContext) -> dp.Empty:
        if request.version != kubelet.API_VERSION:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"version {request.version}")
        self.registrations.put(request)
        return dp.Empty()

    def start(self) -> None:
        self.server = kubelet.unix_server(str(self.dir / kubelet.KUBELET_SOCKET),
                                          kubelet.registration_handler(self))

    def restart(self) -> None:
        """As the kubelet does: its socket and every plugin's socket go, then it serves anew."""
        self.server.stop(0).wait()
        for sock in self.dir.glob("*.sock"):
            sock.unlink()
        self.start()

    def registered(self, count: int) -> dict[str, dp.RegisterRequest]:
        out = {}
        for _ in range(count):
            r = self.registrations.get(timeout=60)
            out[r.resource_name] = r
        return out

    def plugin(self, request: dp.RegisterRequest) -> kubelet.DevicePluginStub:
        path = self.dir / request.endpoint
        wait_for(path.exists, f"{path}")
        return kubelet.DevicePluginStub(kubelet.unix_channel(str(path)))

    def stop(self) -> None:
        self.server.stop(0).wait()


class FakePodResources:
    """The kubelet's PodResources List: `pods` maps "namespace/name" to its
    (resource, unit ids) pairs."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.pods: dict[str, list[tuple[str, list[str]]]] = {}
        self.server = kubelet.unix_server(str(path), kubelet.pod_resources_handler(self))

    def List(self, request: Any, context: grpc.ServicerContext) -> pr.ListPodResourcesResponse:
        out = pr.ListPodResourcesResponse()
        for key, devices in dict(self.pods).items():
            ns, name = key.split("/")
            pod = out.pod_resources.add(name=name, namespace=ns)
            c = pod.containers.add(name="main")
            for resource, ids in devices:
                c.devices.add(resource_name=resource, device_ids=ids)
        return out

    def stop(self) -> None:
        self.server.stop(0).wait()


class Node:
    """A daemon, a fake kubelet and the plugin's process, in one temporary directory."""

    def __init__(self, daemon: Daemon, unit: int, *args: str) -> None:
        self.daemon = daemon
        self.unit = unit
        self.root = Path(tempfile.mkdtemp(prefix="salus-node-"))
        self.kubelet = FakeKubelet(self.root)
        self.pod_resources = FakePodResources(self.root / "pod-resources" / "kubelet.sock")
        self.container_dir = self.root / "pod-root" / "run" / "salus"  # empty outside a pod
        self.container_dir.mkdir(parents=True)
        self.log = open(self.root / "plugin.log", "w")  # noqa: SIM115
        env = dict(os.environ, PYTHONPATH=str(REPO / "adaptors" / "python"))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "salus.device_plugin", "--daemon", daemon.admin_endpoint,
             "--kubelet-dir", str(self.kubelet.dir),
             "--pod-resources", str(self.pod_resources.path),
             "--socket-dir", str(daemon.dir), "--container-dir", str(self.container_dir),
             "--unit", str(unit), "--reconcile-seconds", "0.2", "--grace-seconds", "600",
             "--state-file", str(self.root / "state" / "plugin.json"), *args],
            stderr=self.log, env=env)
        regs = self.kubelet.registered(2)
        assert set(regs) == {BATCH, INTERACTIVE}, regs
        self.stubs = {name: self.kubelet.plugin(r) for name, r in regs.items()}

    def units(self, resource: str) -> list[dp.Device]:
        call = self.stubs[resource].ListAndWatch(dp.Empty(), timeout=60)
        try:
            return list(next(call).devices)
        finally:
            call.cancel()

    def allocate(self, resource: str, ids: list[str]) -> dp.ContainerAllocateResponse:
        req = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)])
        resp = self.stubs[resource].Allocate(req, timeout=60)
        assert len(resp.container_responses) == 1
        return resp.container_responses[0]

    def allocations(self) -> dict[str, dict]:
        with salus.connect(self.daemon.admin_endpoint) as c:
            return {a["id"]: a for a in c.list_allocations()}

    def log_text(self) -> str:
        self.log.flush()
        return (self.root / "plugin.log").read_text()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.kubelet.stop()
        self.pod_resources.stop()
        self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def node_factory(daemon_factory) -> Iterator:  # noqa: ANN001
    nodes: list[Node] = []

    def make(memory: int, unit: int, *args: str) -> Node:
        n = Node(daemon_factory(memory=f"{memory}B", policy="fair"), unit, *args)
        nodes.append(n)
        return n

    yield make
    for n in nodes:
        n.close()


def session_need(daemon_factory) -> tuple[int, list[list[float]]]:  # noqa: ANN001
    """The MLP training session's P + E, and the losses of jobs 0 and 1 trained alone."""
    d = daemon_factory()
    with salus.connect(d.endpoint) as c:
        ref = []
        for job in range(2):
            s = create(c, f"alone{job}")
            info = next(x for x in c.sessions() if x["session_id"] == s.id)
            ref.append(train(s, job, 4))
            s.close()
    d.stop()
    return info["persistent_bytes"] + info["ephemeral_bytes"], ref


def test_registers_advertises_units_and_allocates_a_token(node_factory) -> None:  # noqa: ANN001
    unit = 16 << 20
    node = node_factory(memory=8 * unit + 256, unit=unit)
    for resource in (BATCH, INTERACTIVE):
        opts = node.stubs[resource].GetDevicePluginOptions(dp.Empty(), timeout=30)
        assert not opts.pre_start_required
        units = node.units(resource)
        assert [u.ID for u in units] == [f"unit-{k:05d}" for k in range(8)]  # whole units only
        assert {u.health for u in units} == {kubelet.HEALTHY}

    got = node.allocate(INTERACTIVE, ["unit-00002", "unit-00005", "unit-00006"])
    assert got.envs["SALUS_ENDPOINT"] == f"ipc://{node.container_dir}/salus.sock"
    token, aid = got.envs["SALUS_ALLOCATION_TOKEN"], got.envs["SALUS_ALLOCATION"]
    assert len(token) >= 32 and aid.startswith("k8s-")
    assert [(m.host_path, m.container_path, m.read_only) for m in got.mounts] == [
        (str(node.daemon.dir), str(node.container_dir), True)]
    alloc = node.allocations()[aid]
    assert alloc["memory_bytes"] == 3 * unit
    assert alloc["latency_class"] == "interactive"
    assert "token" not in alloc

    # A second container gets its own token; a unit the plugin never listed is refused.
    other = node.allocate(BATCH, ["unit-00000"])
    assert other.envs["SALUS_ALLOCATION_TOKEN"] != token
    assert node.allocations()[other.envs["SALUS_ALLOCATION"]]["latency_class"] == "batch"
    with pytest.raises(grpc.RpcError) as err:
        node.allocate(BATCH, ["unit-00099"])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unit-00099" in err.value.details()


def test_registers_again_when_the_kubelet_restarts(node_factory) -> None:  # noqa: ANN001
    node = node_factory(memory=4 << 20, unit=1 << 20)
    got = node.allocate(BATCH, ["unit-00001"])
    node.kubelet.restart()
    regs = node.kubelet.registered(2)
    assert set(regs) == {BATCH, INTERACTIVE}
    stub = node.kubelet.plugin(regs[BATCH])
    call = stub.ListAndWatch(dp.Empty(), timeout=60)
    assert len(next(call).devices) == 4
    call.cancel()
    # What was allocated before the restart still holds.
    assert got.envs["SALUS_ALLOCATION"] in node.allocations()
    assert "kubelet_restarted" in node.log_text()


def run_pod(node: Node, alloc: dp.ContainerAllocateResponse, *args: str) -> subprocess.Popen:
    """A pod's container: a private mount namespace with Allocate's mounts, its environment,
    and the training job."""
    mounts = " && ".join(
        f"mount --bind {m.host_path} {m.container_path}"
        + (f" && mount -o remount,bind,ro {m.container_path}" if m.read_only else "")
        for m in alloc.mounts)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SALUS_")}
    env.update(alloc.envs)
    cmd = f"{mounts} && exec {sys.executable} {POD_JOB} " + " ".join(args)
    return subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", cmd],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(pod: subprocess.Popen) -> dict:
    out, err = pod.communicate(timeout=300)
    assert pod.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def can_unshare() -> bool:
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not can_unshare(), reason="needs CAP_SYS_ADMIN for a mount namespace")
def test_pods_train_through_the_mount_and_wait_for_each_other(daemon_factory,  # noqa: ANN001
                                                              node_factory) -> None:  # noqa: ANN001
    need, ref = session_need(daemon_factory)
    memory = need * 3 // 2 // 256 * 256  # one session fits, two do not
    unit = memory // 4
    node = node_factory(memory=memory, unit=unit)
    # Each pod's budget (3 of 4 units) holds its session, but the node holds only one of them:
    # the two resource names list the same units, so the kubelet grants both.
    a = node.allocate(BATCH, ["unit-00000", "unit-00001", "unit-00002"])
    b = node.allocate(INTERACTIVE, ["unit-00001", "unit-00002", "unit-00003"])
    assert 3 * unit >= need
    # Outside the pod's mount namespace the socket is not there.
    assert not (node.container_dir / "salus.sock").exists()

    ready, hold = node.root / "a.ready", node.root / "a.hold"
    pod_a = run_pod(node, a, "--job 0 --name pod-a", f"--ready {ready} --hold {hold}")
    wait_for(ready.exists, "pod a's first step", 120)
    pod_b = run_pod(node, b, "--job 1 --name pod-b")

    def b_waits() -> bool:
        with salus.connect(node.daemon.admin_endpoint) as c:
            return any(s["name"] == "pod-b" and s["state"] == "WAITING" for s in c.sessions())

    wait_for(b_waits, "pod b's session to wait for memory", 120)
    assert pod_b.poll() is None  # waiting, not failed
    hold.write_text("go")
    ra, rb = finish(pod_a), finish(pod_b)
    assert ra["allocation"] == a.envs["SALUS_ALLOCATION"]
    assert ra["principal"] == f"alloc:{ra['allocation']}" and ra["role"] == "user"
    assert rb["allocation"] == b.envs["SALUS_ALLOCATION"]
    assert ra["losses"] == pytest.approx(ref[0], rel=1e-5)
    assert rb["losses"] == pytest.approx(ref[1], rel=1e-5)


def metric_lines(daemon: Daemon, name: str) -> list[str]:
    text = urllib.request.urlopen(
        f"http://127.0.0.1:{daemon.metrics_port}/metrics", timeout=10).read().decode()
    return [ln for ln in text.splitlines() if ln.startswith(name + "{")]


def test_names_the_pod_and_reclaims_its_share_when_it_is_gone(node_factory) -> None:  # noqa: ANN001
    unit = 64 << 20
    node = node_factory(memory=8 * unit, unit=unit)
    ids = ["unit-00003", "unit-00004"]
    got = node.allocate(BATCH, ids)
    aid = got.envs["SALUS_ALLOCATION"]
    job = salus.connect(node.daemon.admin_endpoint,
                        allocation_token=got.envs["SALUS_ALLOCATION_TOKEN"])
    assert job.allocation == aid and job.server["role"] == "user"
    session = create(job, "train")
    train(session, 0, 2)

    node.pod_resources.pods["team-a/trainer-0"] = [(BATCH, ids)]
    wait_for(lambda: node.allocations()[aid]["pod"] == "team-a/trainer-0",
             "the pod's name at the daemon")
    lines = metric_lines(node.daemon, "salus_alloc_memory_budget_bytes")
    assert any(f'allocation="{aid}"' in ln and 'pod="team-a/trainer-0"' in ln
               and ln.endswith(f" {2 * unit}") for ln in lines), lines

    # The pod is gone: its allocation is revoked, its session closed, its token dead.
    del node.pod_resources.pods["team-a/trainer-0"]
    wait_for(lambda: aid not in node.allocations(), "the revocation")
    with pytest.raises(salus.SalusError):
        train(session, 0, 1)
    job.close()
    with pytest.raises(salus.SalusError) as err:
        salus.connect(node.daemon.admin_endpoint,
                      allocation_token=got.envs["SALUS_ALLOCATION_TOKEN"])
    assert err.value.code == "UNAUTHENTICATED"



def test_an_allocation_no_pod_claims_is_revoked_after_the_grace_period(node_factory) -> None:  # noqa: ANN001
    node = node_factory(4 << 20, 1 << 20, "--grace-seconds", "1")
    orphan = node.allocate(BATCH, ["unit-00003"]).envs["SALUS_ALLOCATION"]
    wait_for(lambda: "no pod claimed it" in node.log_text(), "the orphan's revocation")
    assert orphan not in node.allocations()


def test_a_restarted_plugin_keeps_its_allocations(node_factory) -> None:  # noqa: ANN001
    node = node_factory(memory=8 << 20, unit=1 << 20)
    got = node.allocate(BATCH, ["unit-00000"])
    aid = got.envs["SALUS_ALLOCATION"]
    node.pod_resources.pods["ns/p"] = [(BATCH, ["unit-00000"])]
    wait_for(lambda: node.allocations()[aid]["pod"] == "ns/p", "the pod's name")
    state = json.loads((node.root / "state" / "plugin.json").read_text())
    assert [a["id"] for a in state["allocations"]] == [aid]
    assert oct((node.root / "state" / "plugin.json").stat().st_mode & 0o777) == "0o600"
    # The daemon forgets it (as after a restart): the plugin grants it again, same token.
    with salus.connect(node.daemon.admin_endpoint) as c:
        c.revoke_allocation(aid)
    wait_for(lambda: aid in node.allocations(), "the grant again")
    with salus.connect(node.daemon.admin_endpoint,
                       allocation_token=got.envs["SALUS_ALLOCATION_TOKEN"]) as c:
        assert c.allocation == aid
