"""A real `salus-server --device cuda:0` with real clients, checked against a CPU daemon.

Every test skips, saying why, unless `salus-devices` (beside the salus-server under test)
reports a usable GPU. Outputs of the reference models on the GPU daemon must match those of a
CPU daemon fed the same batches within 1e-4 relative. No test asserts a duration: waits poll
for a state the daemon guarantees, with a limit that only turns a hang into a failure.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable

import mlp_job
import numpy as np
import pytest
from salus_daemon import MODELS, REPO, SERVER, Daemon
from test_daemon import wait_for

import salus

RTOL, ATOL = 1e-4, 1e-5
GPU = "cuda:0"
# Batch of each reference model in these tests (make_models.py: input names and shapes).
BATCH = {"mlp": 32, "lenet5": 32, "resnet": 32, "espcn": 8, "vae": 32}


def _no_gpu_reason() -> str:
    """Why cuda:0 cannot be used by the daemon under test, or "" when it can."""
    devices = SERVER.parent / "salus-devices"
    if not devices.exists():
        return f"no {devices} (build the project, or set SALUS_SERVER)"
    try:
        out = subprocess.run([str(devices), "--json"], capture_output=True, text=True,
                             timeout=60, check=True).stdout
        cuda = json.loads(out).get("cuda", {})
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        return f"salus-devices failed: {e}"
    if not cuda.get("compiled"):
        return "this build has no CUDA device (SALUS_WITH_CUDA)"
    if not cuda.get("devices"):
        return f"no usable GPU: {cuda.get('reason', 'salus-devices lists none')}"
    return ""


NO_GPU = _no_gpu_reason()
pytestmark = pytest.mark.skipif(bool(NO_GPU), reason=f"needs a GPU: {NO_GPU}")


def input_specs(model: str, batch: int) -> dict[str, tuple[tuple[int, ...], type]]:
    n = batch
    if model in ("mlp", "lenet5", "resnet"):
        x = {"mlp": (n, 784), "lenet5": (n, 1, 28, 28), "resnet": (n, 3, 32, 32)}[model]
        return {"x": (x, np.float32), "labels": ((n,), np.int64)}
    if model == "espcn":
        return {"x": ((n, 1, 16, 16), np.float32), "target": ((n, 1, 48, 48), np.float32)}
    if model == "vae":
        return {"x": ((n, 784), np.float32), "eps": ((n, 20), np.float32)}
    raise ValueError(model)


def feeds(model: str, batch: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, (shape, dtype) in input_specs(model, batch).items():
        if dtype == np.int64:
            out[name] = rng.integers(0, 10, shape).astype(np.int64)
        elif model == "vae" and name == "x":
            out[name] = rng.random(shape, dtype=np.float32)  # pixels in [0, 1)
        else:
            out[name] = rng.uniform(-1, 1, shape).astype(np.float32)
    return out


def infer_session(client: salus.Client, model: str, batch: int | None = None,
                  **kw: object) -> salus.Session:
    batch = batch or BATCH[model]
    shapes = {n: s for n, (s, _) in input_specs(model, batch).items()}
    return client.create_session(model=MODELS / f"{model}.onnx", mode="infer", inputs=shapes,
                                 name=model, **kw)  # type: ignore[arg-type]


def run_all(session: salus.Session, batch_feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One iteration fetching every output (the loss too)."""
    return session.run(batch_feeds, fetches=sorted(session.outputs))


def cpu_reference(cpu: Daemon, model: str, seeds: list[int],
                  batch: int | None = None) -> list[dict[str, np.ndarray]]:
    """The CPU daemon's outputs of `model` for the batches of `seeds`."""
    batch = batch or BATCH[model]
    with salus.connect(cpu.endpoint) as c:
        s = infer_session(c, model, batch)
        out = [run_all(s, feeds(model, batch, seed)) for seed in seeds]
        s.close()
    return out


def assert_close(got: dict[str, np.ndarray], want: dict[str, np.ndarray], what: str) -> None:
    assert sorted(got) == sorted(want), what
    for name in want:
        assert got[name].shape == want[name].shape, f"{what} {name}"
        np.testing.assert_allclose(got[name], want[name], rtol=RTOL, atol=ATOL,
                                   err_msg=f"{what}: output {name!r}, GPU against CPU")


@pytest.fixture
def gpu_daemon(daemon_factory: Callable[..., Daemon]) -> Daemon:
    return daemon_factory("--device", GPU)


@pytest.fixture
def cpu_daemon(daemon_factory: Callable[..., Daemon]) -> Daemon:
    return daemon_factory()


def test_hello_reports_the_gpu(gpu_daemon: Daemon) -> None:
    with salus.connect(gpu_daemon.endpoint) as c:
        assert c.server["device"] == GPU
        assert c.server["capacity_bytes"] == 1 << 30
        assert c.stats().get("device_lost", "OK") == "OK"


def test_concurrent_inference_clients_match_the_cpu(gpu_daemon: Daemon,
                                                    cpu_daemon: Daemon) -> None:
    seeds = list(range(6))
    want = {m: cpu_reference(cpu_daemon, m, seeds) for m in BATCH}
    got: dict[tuple[str, int], list[dict[str, np.ndarray]]] = {}
    errors: dict[tuple[str, int], BaseException] = {}

    def client(model: str, k: int) -> None:
        try:
            with salus.connect(gpu_daemon.endpoint, name=f"gpu-{model}") as c:
                s = infer_session(c, model)
                assert s.state == "ADMITTED"
                # Two iterations in flight at a time: submit the next, then collect the last.
                outs, pending = [], None
                for seed in seeds:
                    nxt = s.submit(feeds(model, BATCH[model], seed), fetches=sorted(s.outputs))
                    if pending is not None:
                        outs.append(pending.result(timeout=60))
                    pending = nxt
                assert pending is not None
                outs.append(pending.result(timeout=60))
                s.close()
                got[(model, k)] = outs
        except BaseException as e:  # reported below, per client
            errors[(model, k)] = e

    # Two clients per model, ten in all, each on its own connection.
    threads = [threading.Thread(target=client, args=(m, k)) for m in BATCH for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    for (model, k), outs in sorted(got.items()):
        for seed, (g, w) in enumerate(zip(outs, want[model], strict=True)):
            assert_close(g, w, f"{model} client {k} batch {seed}")
    assert len(got) == 2 * len(BATCH)


SMALL, LARGE, HUGE = 32, 256, 4096  # MLP batches for the admission test


def _admission_events(d: Daemon) -> list[str]:
    """Admission of MLP inference sessions, from two clients, on a daemon with room for a
    session of batch LARGE and half of another's parameters: what happens, in words."""
    events = []
    with salus.connect(d.endpoint) as a, salus.connect(d.endpoint) as b:
        first = infer_session(a, "mlp", SMALL)
        events.append(f"first {first.state}")
        # Its E fits neither beside the first's lane nor as that lane grown: it waits.
        second = infer_session(b, "mlp", LARGE)
        events.append(f"second {second.state}")
        done = threading.Event()

        def run_second() -> None:
            run_all(second, feeds("mlp", LARGE, 7))  # waits for admission first
            done.set()

        t = threading.Thread(target=run_second)
        t.start()
        run_all(first, feeds("mlp", SMALL, 1))
        events.append(f"second ran before first closed: {done.is_set()}")
        first.close()
        t.join(120)
        events.append(f"second ran after first closed: {done.is_set()}")
        # A batch whose input alone is larger than the arena can never be admitted.
        try:
            infer_session(a, "mlp", HUGE)
            events.append("huge ADMITTED")
        except salus.SalusError as e:
            events.append(f"huge {e.code}")
        second.close()
    events.append(f"exit {d.stop()}")
    return events


def test_admission_waits_and_refuses_as_on_the_cpu(daemon_factory: Callable[..., Daemon]) -> None:
    per_device = {}
    for args in ((), ("--device", GPU)):
        # P and E on this device (E may differ between devices: the kernels' scratch).
        probe = daemon_factory(*args)
        with salus.connect(probe.endpoint) as c:
            small, large = infer_session(c, "mlp", SMALL), infer_session(c, "mlp", LARGE)
            p = -(-small.persistent_bytes // 256) * 256
            e_small = -(-small.ephemeral_bytes // 256) * 256
            e_large = -(-large.ephemeral_bytes // 256) * 256
            small.close()
            large.close()
        probe.stop()
        assert e_large > e_small
        # Room for P + E(LARGE) and half of another P: the first (E(SMALL)) is admitted, the
        # second (E(LARGE)) waits until the first leaves, then fits alone.
        capacity = -(-(p + e_large + p // 2) // 4096) * 4096
        d = daemon_factory(*args, memory=str(capacity))
        per_device[args[-1] if args else "cpu"] = _admission_events(d)
    expected = ["first ADMITTED", "second WAITING", "second ran before first closed: False",
                "second ran after first closed: True", "huge RESOURCE_EXHAUSTED", "exit 0"]
    assert per_device["cpu"] == expected
    assert per_device[GPU] == expected


def train_session(client: salus.Client, model: str, optimizer: dict[str, object],
                  batch: int | None = None) -> salus.Session:
    batch = batch or BATCH[model]
    shapes = {n: s for n, (s, _) in input_specs(model, batch).items()}
    return client.create_session(model=MODELS / f"{model}.onnx", mode="train", inputs=shapes,
                                 loss="loss", optimizer=optimizer, seed=7,
                                 name=f"{model}-train")  # type: ignore[arg-type]


TRAIN_STEPS = 20
TRAINED = {"mlp": {"type": "sgd", "lr": 0.05, "momentum": 0.9},
           "lenet5": {"type": "adam", "lr": 0.001},
           "espcn": {"type": "sgd", "lr": 0.01, "momentum": 0.9}}


def train_losses(endpoint: str, model: str, out: dict[str, object]) -> None:
    """20 steps of `model` on the daemon at `endpoint`: each step's loss and the final state
    (parameters and optimizer state) into out[model], or the exception raised."""
    try:
        with salus.connect(endpoint, name=f"train-{model}") as c:
            s = train_session(c, model, TRAINED[model])
            batch = feeds(model, BATCH[model], 0)  # one batch: the loss must fall
            losses = [float(s.run(batch, fetches=["loss"])["loss"]) for _ in range(TRAIN_STEPS)]
            params = s.read_state(sorted(s.state_specs))  # parameters, optimizer state
            s.close()
            out[model] = (losses, params)
    except BaseException as e:  # noqa: BLE001
        out[model] = e


def test_training_sessions_match_the_cpu_daemon(gpu_daemon: Daemon, cpu_daemon: Daemon) -> None:
    """Three training jobs at once on the GPU daemon reproduce the CPU daemon's losses."""
    want: dict[str, object] = {}
    for model in TRAINED:
        train_losses(cpu_daemon.endpoint, model, want)
    got: dict[str, object] = {}
    threads = [threading.Thread(target=train_losses, args=(gpu_daemon.endpoint, m, got))
               for m in TRAINED]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for model in TRAINED:
        assert not isinstance(want[model], BaseException), want[model]
        assert not isinstance(got[model], BaseException), got[model]
        want_losses, want_params = want[model]  # type: ignore[misc]
        got_losses, got_params = got[model]  # type: ignore[misc]
        np.testing.assert_allclose(got_losses, want_losses, rtol=1e-3, atol=1e-5,
                                   err_msg=f"{model}: losses on {GPU} against the CPU")
        assert got_losses[-1] < got_losses[0], f"{model}: the loss did not fall: {got_losses}"
        # Parameters and optimizer state, by the norm of the difference (a velocity, a running
        # sum of gradients, amplifies summation-order differences element by element; the
        # engine's test compares parameters element by element).
        assert sorted(got_params) == sorted(want_params), model
        for name, value in want_params.items():
            diff = float(np.linalg.norm(got_params[name].astype(np.float64) - value))
            assert diff <= 1e-2 * float(np.linalg.norm(value)) + 1e-5, (
                f"{model}: state {name} differs from the CPU's by {diff}")
    with salus.connect(gpu_daemon.endpoint) as c:
        assert c.sessions() == []


# A client process that keeps four ResNet iterations in flight until it is killed; it prints
# "running" once its first iteration is back.
VICTIM = """
import sys
import numpy as np
import salus
c = salus.connect(sys.argv[1], name="victim")
shapes = {"x": (64, 3, 32, 32), "labels": (64,)}
s = c.create_session(model=sys.argv[2], mode="infer", inputs=shapes, name="resnet")
rng = np.random.default_rng(3)
feeds = {"x": rng.uniform(-1, 1, shapes["x"]).astype(np.float32),
         "labels": rng.integers(0, 10, 64).astype(np.int64)}
pending = [s.submit(feeds) for _ in range(4)]
pending.pop(0).result(timeout=60)
print("running", flush=True)
while True:
    pending.append(s.submit(feeds))
    pending.pop(0).result(timeout=60)
"""


def start_victim(endpoint: str) -> subprocess.Popen:
    path = os.pathsep.join(p for p in (str(REPO / "adaptors" / "python"),
                                       os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.Popen([sys.executable, "-c", VICTIM, endpoint, str(MODELS / "resnet.onnx")],
                            stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=path))


def test_client_killed_mid_iteration_harms_no_one(daemon_factory: Callable[..., Daemon],
                                                   cpu_daemon: Daemon) -> None:
    d = daemon_factory("--device", GPU, lease=1.0)
    victim = start_victim(d.endpoint)
    try:
        assert victim.stdout is not None
        assert victim.stdout.readline().strip() == "running", "the victim never ran"
        others = ("mlp", "espcn")
        want = {m: cpu_reference(cpu_daemon, m, [11, 12]) for m in others}
        # The administrator (ipc) sees every client's sessions, the victim's included.
        with salus.connect(d.endpoint, name="survivor") as c, \
                salus.connect(d.admin_endpoint, name="watcher") as admin:
            sessions = {m: infer_session(c, m) for m in others}
            for m, s in sessions.items():
                assert_close(run_all(s, feeds(m, BATCH[m], 11)), want[m][0], f"{m} before")
            wait_for(lambda: any(s["name"] == "resnet" and s["iterations_done"] > 0
                                 for s in admin.sessions()), "the victim's iterations")
            victim.send_signal(signal.SIGKILL)
            assert victim.wait(30) == -signal.SIGKILL
            for m, s in sessions.items():
                assert_close(run_all(s, feeds(m, BATCH[m], 12)), want[m][1], f"{m} after")
            # The victim's in-flight iterations end, its lease lapses, its memory returns.
            wait_for(lambda: sorted(s["name"] for s in admin.sessions()) == sorted(others),
                     "the victim's session to close")
            mine = sum(s.persistent_bytes + s.ephemeral_bytes for s in sessions.values())
            stats = c.stats()
            assert stats["committed_bytes"] <= mine + 4096 * len(others), stats
            assert stats.get("device_lost", "OK") == "OK", stats
            for m, s in sessions.items():
                assert_close(run_all(s, feeds(m, BATCH[m], 11)), want[m][0], f"{m} at the end")
                s.close()
    finally:
        if victim.poll() is None:
            victim.kill()
        victim.wait()
    assert d.stop() == 0


def test_sigterm_drains_in_flight_gpu_iterations_and_exits_zero(gpu_daemon: Daemon,
                                                                 cpu_daemon: Daemon) -> None:
    models = ("mlp", "resnet", "espcn")
    seeds = [21, 22, 23, 24]
    want = {m: cpu_reference(cpu_daemon, m, seeds) for m in models}
    held: dict[str, object] = {}
    # Feeds in frames: a client's staging buffers, unregistered when it closes, would each
    # wait out the client's timeout once the daemon is gone.
    with salus.connect(gpu_daemon.endpoint, stage_from=None) as c:
        sessions = {m: infer_session(c, m) for m in models}
        for m, s in sessions.items():  # each model has run once before the drain
            assert_close(run_all(s, feeds(m, BATCH[m], seeds[0])), want[m][0], m)
        # A one-second synthetic iteration is surely in flight when SIGTERM arrives.
        hold = c.create_session(synthetic={"persistent_bytes": 1 << 20,
                                           "ephemeral_bytes": 1 << 20,
                                           "iteration_seconds": 1.0})

        def run_hold() -> None:
            try:
                hold.run(timeout=60)
                held["result"] = "ok"
            except salus.SalusError as e:
                held["result"] = e.code

        t = threading.Thread(target=run_hold)
        t.start()
        with salus.connect(gpu_daemon.endpoint) as watcher:
            wait_for(lambda: watcher.stats()["running_iterations"] >= 1, "the held iteration")
        pending = {m: [s.submit(feeds(m, BATCH[m], seed), fetches=sorted(s.outputs))
                       for seed in seeds] for m, s in sessions.items()}
        gpu_daemon.proc.send_signal(signal.SIGTERM)
        for m, its in pending.items():
            for seed_index, it in enumerate(its):
                try:
                    assert_close(it.result(timeout=60), want[m][seed_index], f"{m} in the drain")
                except salus.SalusError as e:
                    assert e.code == "UNAVAILABLE", f"{m}: {e}"  # queued when the drain began
        t.join(60)
        assert gpu_daemon.proc.wait(60) == 0
    assert held["result"] == "ok"
    assert any("event: draining" in line for line in gpu_daemon.log)


def mlp_losses(s: salus.Session, steps: range) -> list[float]:
    return [float(s.run(feeds=mlp_job.feeds(0, i, seed=700), fetches=["loss"])["loss"])
            for i in steps]


def test_every_gpu_trains_and_a_session_moves_between_gpus(
        daemon_factory: Callable[..., Daemon]) -> None:
    """`--device cuda:all`: a session pinned to each GPU trains as on a one-GPU daemon. With two
    GPUs or more, a session the engine moves from cuda:0 to cuda:1 mid-training (to let in one
    pinned to cuda:0) is compiled again for cuda:1 and keeps its losses."""
    with salus.connect(daemon_factory("--device", GPU).endpoint) as c:
        ref = mlp_job.create(c, "ref")
        expected = mlp_losses(ref, range(4))
        info = next(x for x in c.sessions() if x["session_id"] == ref.id)
        need = info["persistent_bytes"] + info["ephemeral_bytes"]
    with salus.connect(daemon_factory("--device", "cuda:all").endpoint) as c:
        gpus = [x["device"] for x in c.stats()["devices"]]
        assert gpus[0] == GPU
        for gpu in gpus:
            s = mlp_job.create(c, gpu, device=gpu)
            assert s.device == gpu
            # Identical GPUs give identical bits; other models of GPU may differ in the last.
            np.testing.assert_allclose(mlp_losses(s, range(4)), expected, rtol=1e-5,
                                       err_msg=f"losses on {gpu}")
            s.close()
    if len(gpus) < 2:
        return  # one GPU: nothing to move to
    capacity = (need * 3 // 2 // 256) * 256  # one session per GPU
    d = daemon_factory("--device", f"{gpus[0]},{gpus[1]}", "--paging-quantum-ms", "0",
                       memory=f"{capacity}B", policy="fair")
    with salus.connect(d.endpoint) as c:
        a = mlp_job.create(c, "a")
        assert a.device == gpus[0]
        got = mlp_losses(a, range(2))
        w = mlp_job.create(c, "w", device=gpus[0])
        assert w.state == "WAITING"
        mlp_losses(w, range(2))
        got += mlp_losses(a, range(2, 4))
        np.testing.assert_allclose(got, expected, rtol=1e-5, err_msg="the moved session's losses")
        info = {x["name"]: x for x in c.sessions()}
        assert (info["a"]["device"], info["a"]["migrations"]) == (gpus[1], 1)
    assert any("session_recompiled" in line for line in d.log)
