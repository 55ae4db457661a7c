"""salus-device-plugin: the node's salus-server as kubelet device-plugin resources.

What it advertises (Note [Memory units]). The daemon's arena is cut into units of
`--unit` bytes (256 MiB by default), and every configured resource name
(`salus.ai/gpu-memory`, `salus.ai/gpu-memory-interactive`, ...) lists one device per unit.
A pod asks for a share as a count of units. The names all list the same units: a name picks
the latency class and priority of the pod's sessions, not a slice of the device. So the
kubelet's count bounds each name, while the daemon bounds the node: a pod whose budget is
granted but whose memory is in use waits in the daemon's admission queue, it is never refused.

What Allocate does (Note [Allocations]). The kubelet does not say which pod asks. For each
container the plugin makes an *allocation*: a public id, a secret token, a budget of
units x unit bytes, the resource's class and priority. It registers the allocation with the
daemon (GrantAllocation, over the daemon's ipc socket, where the plugin, running as root,
is the administrator) and answers with a read-only mount of the socket directory and the
environment `SALUS_ENDPOINT`, `SALUS_ALLOCATION_TOKEN`, `SALUS_ALLOCATION`. Clients present
the token in Hello; the daemon then knows the pod by it and holds its sessions to the
budget. Allocate fails only on a request it cannot read: a daemon that is down when a
pod starts gets the allocation when it comes back (the pod's client retries its Hello).

What the reconcile loop does, every `--reconcile-seconds`:
- asks the kubelet's PodResources `List` which pod holds which units, names each allocation's
  pod to the daemon (its metrics are labelled by it), and revokes the allocation of a pod that
  is gone: the daemon closes its sessions and forgets its token. An allocation no pod has
  claimed after `--grace-seconds` is revoked too (the pod failed before it started);
- grants again what the daemon lost (it restarted), and revokes what the daemon holds under
  this plugin's prefix that the plugin no longer knows;
- marks the units unhealthy while the daemon cannot be reached, so no new pod is placed here.
The plugin's allocations are written to `--state-file`, so a restarted plugin keeps them.

Registration. The kubelet removes every socket in its device-plugins directory when it
restarts; the plugin watches its own sockets and the kubelet's, and serves and registers
again when either changes."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc

import salus
from salus._generated.k8s import deviceplugin_v1beta1_pb2 as dp
from salus._generated.k8s import podresources_v1_pb2 as pr
from salus.device_plugin import kubelet

log = logging.getLogger("salus.device_plugin")

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
DEFAULT_UNIT_BYTES = 256 * MIB
DEFAULT_RESOURCES = ("salus.ai/gpu-memory=batch", "salus.ai/gpu-memory-interactive=interactive")
ALLOCATION_PREFIX = "k8s-"  # ids of the allocations this plugin makes
MAX_UNITS = 100_000  # a ListAndWatch answer stays well under gRPC's message limit
_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[a-zA-Z0-9]([-a-zA-Z0-9_.]*[a-zA-Z0-9])?$")


def parse_size(text: str) -> int:
    """'256MiB', '1GiB', '4096' (bytes)."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"not a size: {text!r} (say 256MiB or 1GiB)")
    scale = {"": 1, "B": 1, "K": KIB, "M": MIB, "G": GIB, "T": 1024 * GIB}
    value = int(m.group(1)) * scale[(m.group(2) or "").upper()[:1]]
    if value <= 0:
        raise ValueError(f"a size must be positive: {text!r}")
    return value


@dataclass(frozen=True)
class ResourceSpec:
    """One advertised resource name and what its pods' sessions get."""

    name: str
    latency_class: str = "batch"  # "batch" or "interactive"
    priority: int = 0
    max_priority: int = 0

    @staticmethod
    def parse(text: str) -> ResourceSpec:
        """`NAME=CLASS[:PRIORITY[:MAX_PRIORITY]]`, for example
        `salus.ai/gpu-memory-interactive=interactive:50`."""
        name, _, rest = text.partition("=")
        if not _RESOURCE.match(name):
            raise ValueError(f"resource {name!r}: not a domain/name resource name")
        parts = rest.split(":") if rest else ["batch"]
        if parts[0] not in ("batch", "interactive") or len(parts) > 3:
            raise ValueError(f"resource {text!r}: say NAME=batch|interactive[:PRIORITY[:MAX]]")
        try:
            nums = [int(p) for p in parts[1:]]
        except ValueError:
            raise ValueError(f"resource {text!r}: priorities are integers") from None
        if any(not 0 <= n <= 100 for n in nums):
            raise ValueError(f"resource {text!r}: priorities are 0..100")
        return ResourceSpec(name, parts[0], *nums)

    @property
    def socket_name(self) -> str:
        return "salus-" + re.sub(r"[^a-zA-Z0-9_.-]", "_", self.name) + ".sock"


@dataclass
class Options:
    daemon: str = "ipc:///run/salus/salus.sock"
    kubelet_dir: str = "/var/lib/kubelet/device-plugins"
    pod_resources: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    socket_dir: str = "/run/salus"  # the daemon's socket directory on the host
    container_dir: str = "/run/salus"  # where pods see it
    pod_endpoint: str = ""  # default: the daemon's ipc socket under container_dir
    unit_bytes: int = DEFAULT_UNIT_BYTES
    memory_bytes: int = 0  # what to advertise; 0: the daemon's capacity
    resources: list[ResourceSpec] = field(
        default_factory=lambda: [ResourceSpec.parse(r) for r in DEFAULT_RESOURCES])
    reconcile_seconds: float = 10.0
    grace_seconds: float = 120.0
    state_file: str = "/var/lib/salus/device-plugin.json"

    def endpoint_in_pod(self) -> str:
        if self.pod_endpoint:
            return self.pod_endpoint
        prefix = "ipc://"
        if not self.daemon.startswith(prefix):
            raise ValueError("--daemon is not an ipc endpoint: say --pod-endpoint")
        sock = Path(self.daemon[len(prefix):])
        if sock.parent != Path(self.socket_dir):
            raise ValueError(f"the daemon's socket {sock} is not in --socket-dir {self.socket_dir}")
        return f"ipc://{Path(self.container_dir) / sock.name}"


@dataclass
class Allocation:
    """One container's share, as the daemon knows it (Note [Allocations])."""

    id: str
    token: str
    resource: str
    device_ids: list[str]
    memory_bytes: int
    created: float  # time.time()
    pod: str = ""  # "namespace/name" once PodResources shows it
    granted: bool = False  # the daemon has it as it is now


class Ledger:
    """The plugin's allocations, kept in `path` (mode 0600: it holds the tokens)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path) if path else None
        self.lock = threading.Lock()
        self.allocations: dict[str, Allocation] = {}
        if self.path and self.path.exists():
            try:
                for a in json.loads(self.path.read_text())["allocations"]:
                    alloc = Allocation(**a)
                    alloc.granted = False  # the daemon is checked again
                    self.allocations[alloc.id] = alloc
            except (ValueError, KeyError, TypeError) as e:
                log.warning("event: state_unreadable %s",
                            json.dumps({"path": str(path), "error": str(e)}))

    def save(self) -> None:
        """Writes the ledger (call with `lock` held)."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"allocations": [asdict(a) for a in self.allocations.values()]}, f)
        os.replace(tmp, self.path)


class DaemonLink:
    """The plugin's administrator connection to the daemon, made again after a failure."""

    def __init__(self, endpoint: str, connect: Callable[..., Any] = salus.connect) -> None:
        self.endpoint = endpoint
        self._connect = connect
        self._client: Any = None
        self._lock = threading.Lock()

    def call(self, fn: Callable[[Any], Any]) -> Any:
        """fn(client); raises salus.SalusError (or OSError) when the daemon cannot be reached."""
        with self._lock:
            if self._client is None:
                client = self._connect(self.endpoint, timeout=5.0, name="device-plugin",
                                       stage_from=None)
                if client.server["role"] != "admin":
                    client.close()
                    raise salus.SalusError(
                        "PERMISSION_DENIED",
                        f"the plugin is not the administrator of {self.endpoint} (principal "
                        f"{client.server['principal']}): run it as root or as the daemon's user")
                self._client = client
            client = self._client
        try:
            return fn(client)
        except salus.SalusError as e:
            if e.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "UNAUTHENTICATED"):
                self.reset()
            raise

    def reset(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - a broken connection may fail to close too
                pass


class ResourceServicer:
    """`DevicePlugin` for one resource name."""

    def __init__(self, plugin: DevicePlugin, spec: ResourceSpec) -> None:
        self.plugin = plugin
        self.spec = spec

    def GetDevicePluginOptions(self, request: dp.Empty, context: grpc.ServicerContext) -> Any:
        return dp.DevicePluginOptions(pre_start_required=False,
                                      get_preferred_allocation_available=False)

    def ListAndWatch(self, request: dp.Empty, context: grpc.ServicerContext) -> Iterator[Any]:
        yield from self.plugin.watch_devices(context)

    def Allocate(self, request: dp.AllocateRequest, context: grpc.ServicerContext) -> Any:
        out = dp.AllocateResponse()
        for c in request.container_requests:
            try:
                out.container_responses.append(self.plugin.allocate(self.spec, list(c.devices_ids)))
            except ValueError as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return out

    def PreStartContainer(self, request: Any, context: grpc.ServicerContext) -> Any:
        return dp.PreStartContainerResponse()


class DevicePlugin:
    def __init__(self, options: Options, connect: Callable[..., Any] = salus.connect) -> None:
        self.o = options
        self.pod_endpoint = options.endpoint_in_pod()
        self.daemon = DaemonLink(options.daemon, connect)
        self.ledger = Ledger(options.state_file)
        self.units = 0
        self.healthy = False
        self.generation = 0  # bumped when units or health change
        self.cond = threading.Condition()
        self.stopping = threading.Event()
        self.servers: dict[str, grpc.Server] = {}
        self.kubelet_sock_id: tuple[int, int] | None = None

    # -- devices -----------------------------------------------------------------------
    def unit_ids(self) -> list[str]:
        return [f"unit-{k:05d}" for k in range(self.units)]

    def set_state(self, units: int, healthy: bool) -> None:
        with self.cond:
            if (units, healthy) != (self.units, self.healthy):
                log.info("event: devices %s", json.dumps({"units": units, "healthy": healthy}))
                self.units, self.healthy = units, healthy
                self.generation += 1
                self.cond.notify_all()

    def watch_devices(self, context: grpc.ServicerContext) -> Iterator[Any]:
        seen = -1
        while context.is_active() and not self.stopping.is_set():
            with self.cond:
                if self.generation == seen:
                    self.cond.wait(timeout=1.0)
                    continue
                seen = self.generation
                health = kubelet.HEALTHY if self.healthy else kubelet.UNHEALTHY
                reply = dp.ListAndWatchResponse(
                    devices=[dp.Device(ID=i, health=health) for i in self.unit_ids()])
            yield reply

    def refresh_capacity(self) -> list[dict] | None:
        """Units from the daemon's capacity (or --memory), health from reaching it; returns the
        daemon's allocations (an administrator's request, so it shows the plugin may grant),
        None when the daemon cannot be reached."""
        try:
            capacity = self.daemon.call(lambda c: c.server["capacity_bytes"])
            held = self.daemon.call(lambda c: c.list_allocations())
        except (salus.SalusError, OSError) as e:
            log.warning("event: daemon_unreachable %s",
                        json.dumps({"daemon": self.o.daemon, "error": str(e)}))
            self.set_state(self.units, False)
            return None
        memory = self.o.memory_bytes or capacity
        self.set_state(min(memory // self.o.unit_bytes, MAX_UNITS), True)
        return held

    # -- allocations ---------------------------------------------------------------------
    def allocate(self, spec: ResourceSpec, device_ids: list[str]) -> Any:
        if not device_ids:
            raise ValueError("an allocation of no units")
        known = set(self.unit_ids())
        unknown = [d for d in device_ids if d not in known]
        if unknown:
            raise ValueError(f"unknown units of {spec.name}: {', '.join(unknown[:5])}")
        alloc = Allocation(
            id=ALLOCATION_PREFIX + secrets.token_hex(6), token=secrets.token_urlsafe(32),
            resource=spec.name, device_ids=sorted(device_ids),
            memory_bytes=len(device_ids) * self.o.unit_bytes, created=time.time())
        with self.ledger.lock:
            # The kubelet hands out a unit again only once its pod is gone.
            stale = [a for a in self.ledger.allocations.values()
                     if a.resource == spec.name and set(a.device_ids) & set(device_ids)]
            for a in stale:
                del self.ledger.allocations[a.id]
            self.ledger.allocations[alloc.id] = alloc
            self.ledger.save()
        for a in stale:
            self.revoke(a, "units reallocated")
        self.grant(alloc)
        log.info("event: allocated %s", json.dumps(
            {"allocation": alloc.id, "resource": spec.name, "units": len(device_ids),
             "memory_bytes": alloc.memory_bytes, "granted": alloc.granted}))
        resp = dp.ContainerAllocateResponse()
        resp.envs["SALUS_ENDPOINT"] = self.pod_endpoint
        resp.envs["SALUS_ALLOCATION_TOKEN"] = alloc.token
        resp.envs["SALUS_ALLOCATION"] = alloc.id
        resp.mounts.add(container_path=self.o.container_dir, host_path=self.o.socket_dir,
                        read_only=True)
        return resp

    def spec_of(self, resource: str) -> ResourceSpec | None:
        return next((s for s in self.o.resources if s.name == resource), None)

    def grant(self, alloc: Allocation) -> None:
        spec = self.spec_of(alloc.resource)
        if spec is None:  # a resource no longer configured: its pods keep their class
            spec = ResourceSpec(alloc.resource)
        try:
            self.daemon.call(lambda c: c.grant_allocation(
                alloc.id, alloc.token, memory_bytes=alloc.memory_bytes,
                latency_class=spec.latency_class, priority=spec.priority,
                max_priority=spec.max_priority, pod=alloc.pod))
            alloc.granted = True
        except (salus.SalusError, OSError) as e:
            alloc.granted = False
            log.warning("event: grant_failed %s",
                        json.dumps({"allocation": alloc.id, "error": str(e)}))

    def revoke(self, alloc: Allocation, why: str) -> None:
        try:
            closed = self.daemon.call(lambda c: c.revoke_allocation(alloc.id))
        except salus.SalusError as e:
            if e.code != "NOT_FOUND":
                log.warning("event: revoke_failed %s",
                            json.dumps({"allocation": alloc.id, "error": str(e)}))
                return
            closed = 0
        except OSError as e:
            log.warning("event: revoke_failed %s",
                        json.dumps({"allocation": alloc.id, "error": str(e)}))
            return
        log.info("event: revoked %s", json.dumps(
            {"allocation": alloc.id, "pod": alloc.pod, "why": why, "sessions_closed": closed}))

    def pods_by_unit(self) -> dict[tuple[str, str], str] | None:
        """(resource, unit) -> "namespace/name" from PodResources; None when it cannot be read."""
        if not os.path.exists(self.o.pod_resources):
            return None
        try:
            with kubelet.unix_channel(self.o.pod_resources) as ch:
                reply = kubelet.PodResourcesStub(ch).List(pr.ListPodResourcesRequest(), timeout=5)
        except grpc.RpcError as e:
            log.warning("event: pod_resources_failed %s", json.dumps({"error": str(e.code())}))
            return None
        owners: dict[tuple[str, str], str] = {}
        for pod in reply.pod_resources:
            for c in pod.containers:
                for d in c.devices:
                    for unit in d.device_ids:
                        owners[(d.resource_name, unit)] = f"{pod.namespace}/{pod.name}"
        return owners

    def reconcile(self) -> None:
        listed = self.refresh_capacity()
        owners = self.pods_by_unit()
        now = time.time()
        to_grant: list[Allocation] = []
        to_revoke: list[tuple[Allocation, str]] = []
        with self.ledger.lock:
            for alloc in list(self.ledger.allocations.values()):
                pods = set() if owners is None else {
                    owners[(alloc.resource, u)] for u in alloc.device_ids
                    if (alloc.resource, u) in owners}
                if owners is not None and not pods:
                    if alloc.pod:
                        to_revoke.append((alloc, "pod gone"))
                    elif now - alloc.created > self.o.grace_seconds:
                        to_revoke.append((alloc, "no pod claimed it"))
                    else:
                        continue
                    del self.ledger.allocations[alloc.id]
                    continue
                if pods and alloc.pod != min(pods):
                    alloc.pod = min(pods)
                    alloc.granted = False
                if not alloc.granted:
                    to_grant.append(alloc)
            self.ledger.save()
        for alloc, why in to_revoke:
            self.revoke(alloc, why)
        if listed is None:
            return
        revoked = {alloc.id for alloc, _ in to_revoke}
        held = {a["id"]: a for a in listed if a["id"] not in revoked}
        with self.ledger.lock:
            known = dict(self.ledger.allocations)
        for alloc in known.values():
            if alloc.id not in held or held[alloc.id]["pod"] != alloc.pod:
                alloc.granted = False
                if alloc not in to_grant:
                    to_grant.append(alloc)
        for alloc in to_grant:
            self.grant(alloc)
        for aid in held:
            if aid.startswith(ALLOCATION_PREFIX) and aid not in known:
                self.revoke(Allocation(aid, "", "", [], 0, now), "unknown to the plugin")

    # -- kubelet -------------------------------------------------------------------------
    def socket_path(self, spec: ResourceSpec) -> str:
        return os.path.join(self.o.kubelet_dir, spec.socket_name)

    def kubelet_socket_id(self) -> tuple[int, int] | None:
        try:
            st = os.stat(os.path.join(self.o.kubelet_dir, kubelet.KUBELET_SOCKET))
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_ctime_ns)

    def serve_and_register(self) -> bool:
        """(Re)starts every resource's server and registers it; False if the kubelet refused
        or is not there yet."""
        self.stop_servers()
        for spec in self.o.resources:
            path = self.socket_path(spec)
            if os.path.exists(path):
                os.unlink(path)
            self.servers[spec.name] = kubelet.unix_server(
                path, kubelet.device_plugin_handler(ResourceServicer(self, spec)))
        self.kubelet_sock_id = self.kubelet_socket_id()
        if self.kubelet_sock_id is None:
            return False
        kubelet_sock = os.path.join(self.o.kubelet_dir, kubelet.KUBELET_SOCKET)
        try:
            with kubelet.unix_channel(kubelet_sock) as ch:
                stub = kubelet.RegistrationStub(ch)
                for spec in self.o.resources:
                    stub.Register(dp.RegisterRequest(
                        version=kubelet.API_VERSION, endpoint=spec.socket_name,
                        resource_name=spec.name, options=dp.DevicePluginOptions()), timeout=10)
                    log.info("event: registered %s", json.dumps(
                        {"resource": spec.name, "endpoint": spec.socket_name}))
        except grpc.RpcError as e:
            log.warning("event: register_failed %s",
                        json.dumps({"code": str(e.code()), "details": e.details()}))
            return False
        return True

    def registration_lost(self) -> bool:
        if self.kubelet_socket_id() != self.kubelet_sock_id:
            return True
        return any(not os.path.exists(self.socket_path(s)) for s in self.o.resources)

    def stop_servers(self) -> None:
        for server in self.servers.values():
            server.stop(grace=0.5)
        self.servers.clear()

    def run(self) -> None:
        registered = False
        next_reconcile = 0.0
        poll = min(1.0, self.o.reconcile_seconds / 2)
        while not self.stopping.is_set():
            if time.monotonic() >= next_reconcile:
                self.reconcile()
                next_reconcile = time.monotonic() + self.o.reconcile_seconds
            if not registered or self.registration_lost():
                if registered:
                    log.info("event: kubelet_restarted {}")
                registered = self.serve_and_register()
            self.stopping.wait(poll)
        self.stop_servers()

    def stop(self) -> None:
        self.stopping.set()
        with self.cond:
            self.cond.notify_all()


def parse_args(argv: list[str] | None = None) -> Options:
    p = argparse.ArgumentParser(
        prog="salus-device-plugin",
        description="Advertises the node's salus-server to the kubelet as memory units.")
    o = Options()
    p.add_argument("--daemon", default=o.daemon,
                   help="the daemon's ipc endpoint (default %(default)s)")
    p.add_argument("--kubelet-dir", default=o.kubelet_dir)
    p.add_argument("--pod-resources", default=o.pod_resources,
                   help="the kubelet's PodResources socket")
    p.add_argument("--socket-dir", default=o.socket_dir,
                   help="the host directory of the daemon's socket, mounted into pods")
    p.add_argument("--container-dir", default=o.container_dir, help="where pods see it")
    p.add_argument("--pod-endpoint", default="", help="SALUS_ENDPOINT for pods (default: derived)")
    p.add_argument("--unit", default="256MiB", help="bytes per unit (default %(default)s)")
    p.add_argument("--memory", default="", help="memory to advertise (default: the daemon's arena)")
    p.add_argument("--resource", action="append", default=None, metavar="NAME=CLASS[:PRIO[:MAX]]",
                   help="a resource name and its sessions' class (default "
                   + " ".join(DEFAULT_RESOURCES) + ")")
    p.add_argument("--reconcile-seconds", type=float, default=o.reconcile_seconds)
    p.add_argument("--grace-seconds", type=float, default=o.grace_seconds,
                   help="how long an allocation may wait for its pod to appear")
    p.add_argument("--state-file", default=o.state_file)
    p.add_argument("--log-level", default="info")
    a = p.parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        resources = [ResourceSpec.parse(r) for r in (a.resource or DEFAULT_RESOURCES)]
        if len({r.name for r in resources}) != len(resources):
            raise ValueError("a resource name is given twice")
        opts = Options(
            daemon=a.daemon, kubelet_dir=a.kubelet_dir, pod_resources=a.pod_resources,
            socket_dir=a.socket_dir, container_dir=a.container_dir, pod_endpoint=a.pod_endpoint,
            unit_bytes=parse_size(a.unit), memory_bytes=parse_size(a.memory) if a.memory else 0,
            resources=resources, reconcile_seconds=a.reconcile_seconds,
            grace_seconds=a.grace_seconds, state_file=a.state_file)
        if opts.reconcile_seconds <= 0:
            raise ValueError("--reconcile-seconds must be positive")
        opts.endpoint_in_pod()
    except ValueError as e:
        p.error(str(e))
    return opts


def main(argv: list[str] | None = None) -> int:
    plugin = DevicePlugin(parse_args(argv))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: plugin.stop())
    plugin.run()
    return 0
