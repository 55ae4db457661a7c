"""Captured TensorFlow steps replayed on a GPU: the daemon's side of the TensorFlow path on CUDA,
for machines that have no TensorFlow.

capture (here, in .venv-tf, with a daemon): trains keras.applications models with
benchmarks/tensorflow/zoo.py's script on SALUS, the adaptor writing every session's GraphDef,
spec and first iteration (feeds, the variables it was sent, its fetched results;
SALUS_TF_DUMP_DIR and SALUS_TF_DUMP_VALUES) into a bundle folder. Models given with
--graphs-only keep their feeds but not their variables (they start at zero there): enough to
time them, small enough to carry.

replay (there, any Python with numpy, pyzmq and the salus client): starts salus-server with
the CPU and cuda:0 devices, makes each captured step a session on both, writes the same
variables and feeds, runs one iteration and compares the fetched results (cuda:0 against the
CPU engine, and the CPU engine against what the capture recorded) and the variables the step
updated; then times each step on both devices. With torch and torchvision importable it times
PyTorch's eager CUDA training step of the same architectures (ResNet50, MobileNetV2,
EfficientNetB0) at the same batch and resolution beside them.

    .venv-tf/bin/python benchmarks/tensorflow/gpu_steps.py capture --out build/tfsteps
    python3 benchmarks/tensorflow/gpu_steps.py replay --bundle build/tfsteps --device cuda:0

(scripts/gpu-bundle captures into .gpu/tfsteps.tar.xz; scripts/gpu-check --step tfsteps
replays it.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "tensorflow"))
import zoo  # noqa: E402

# Wire element types (salus.v1.DataType) as numpy's.
WIRE_TYPES = {1: np.float32, 2: np.int64, 3: np.int32, 4: np.float64, 5: np.uint8, 6: np.bool_}
FETCH_RTOL, FETCH_ATOL = 1e-4, 1e-5
TORCHVISION = {"ResNet50": "resnet50", "MobileNetV2": "mobilenet_v2",
               "EfficientNetB0": "efficientnet_b0"}


# -- capture ---------------------------------------------------------------------------------
def capture(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    server = run_dir = None
    endpoint = args.endpoint
    if endpoint is None:
        server, endpoint, run_dir = zoo.start_server(2)
    os.environ["SALUS_TF_DUMP_VALUES"] = "1"
    models = {name: True for name in args.models.split(",") if name}
    models.update({name: False for name in args.graphs_only.split(",") if name})
    manifest = {}
    try:
        for name, keep_state in models.items():
            result = zoo.run_child(name, out, endpoint, args.timeout)
            if result.get("error"):
                print(f"{name}: {result['error']}", file=sys.stderr)
                return 1
            Path(result["weights_file"]).unlink(missing_ok=True)
            steps = select_steps(out / f"{name}-graphs", keep_state, zoo.BATCH)
            # The zoo's script fits, evaluates and predicts, in that order.
            kinds = ["train", "evaluate", "predict"] if len(steps) == 3 else steps
            manifest[name] = {"steps": steps, "kinds": kinds, "state": keep_state,
                              "batch": zoo.BATCH,
                              "size": zoo.MODELS[name]}
            print(f"{name}: {len(steps)} steps", flush=True)
    finally:
        if server is not None:
            server.terminate()
            server.wait()
            run_dir.cleanup()
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"bundle {out}: {size / 2**20:.1f} MiB")
    return 0


def select_steps(graphs: Path, keep_state: bool, batch: int) -> list[str]:
    """Keeps the first session of each captured function fed a batch of images (the train,
    evaluate and predict steps at the full batch; eager ops, the optimizer's initialisation, the
    last short batch go), with its variables only for the training step (the one sent the most)
    of a model captured with them; deletes the rest."""
    first: dict[str, str] = {}
    for spec_file in sorted(graphs.glob("*.spec.json"), key=lambda f: int(f.name.split(".")[0])):
        spec = json.loads(spec_file.read_text())
        images = any(len(d) == 4 and d[0] == batch for d in spec["inputs"].values())
        if spec["name"].startswith("tf:") and images and spec["name"] not in first:
            first[spec["name"]] = spec_file.name.split(".")[0]
    steps = sorted(first.values(), key=int)

    def state_bytes(stem: str) -> int:
        index = json.loads((graphs / f"{stem}.json").read_text())
        return sum(e["bytes"] for e in index if e["role"] == "state")

    training = max(steps, key=state_bytes) if keep_state and steps else None
    for stem in steps:
        drop_values(graphs / stem, keep_state=stem == training)
    for f in graphs.iterdir():
        if f.name.split(".")[0] not in steps:
            f.unlink()
    return steps


def drop_values(stem: Path, keep_state: bool) -> None:
    """Rewrites a step's values without its variables (unless `keep_state`: they start at zero
    in the replay) and without fetches over 64 KiB (variables some steps fetch)."""
    index = json.loads(stem.with_suffix(".json").read_text())
    data = stem.with_suffix(".bin").read_bytes()
    kept, blob, offset = [], bytearray(), 0
    for e in index:
        if (e["role"] == "state" and not keep_state) or (e["role"] == "fetch"
                                                         and e["bytes"] > 65536):
            continue
        blob += data[e["offset"]:e["offset"] + e["bytes"]]
        kept.append(dict(e, offset=offset))
        offset += e["bytes"]
    stem.with_suffix(".json").write_text(json.dumps(kept))
    stem.with_suffix(".bin").write_bytes(bytes(blob))


# -- replay ----------------------------------------------------------------------------------
def load_values(stem: Path) -> dict[str, dict[str, np.ndarray]]:
    values: dict[str, dict[str, np.ndarray]] = {"feed": {}, "state": {}, "fetch": {}}
    if not stem.with_suffix(".json").exists():
        return values
    data = stem.with_suffix(".bin").read_bytes()
    for e in json.loads(stem.with_suffix(".json").read_text()):
        a = np.frombuffer(data, WIRE_TYPES[e["type"]], e["bytes"] // np.dtype(
            WIRE_TYPES[e["type"]]).itemsize, e["offset"]).reshape(e["shape"])
        values[e["role"]][e["name"]] = a
    return values


def close(got: np.ndarray, want: np.ndarray) -> tuple[bool, float]:
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    diff = float(np.max(np.abs(got - want), initial=0.0))
    ok = bool(np.allclose(got, want, rtol=FETCH_RTOL, atol=FETCH_ATOL, equal_nan=True))
    return ok, diff


def replay_step(client, stem: Path, devices: list[str], iters: int, warmup: int) -> dict:
    spec = json.loads(stem.with_suffix(".spec.json").read_text())
    values = load_values(stem)
    graph = stem.with_suffix(".pb").read_bytes()
    row = {"step": stem.name, "session": spec["name"]}
    fetches = list(spec["outputs"])
    results, times, states = {}, {}, {}
    for device in devices:
        s = client.create_session(tf_graph=graph, inputs={k: tuple(v) for k, v in
                                                          spec["inputs"].items()},
                                  outputs=spec["outputs"], device=device,
                                  name=f"{spec['name']}@{device}")
        try:
            if values["state"]:
                s.write_state({k: np.array(v, copy=True) for k, v in values["state"].items()})
            feeds = {k: np.array(v, copy=True) for k, v in values["feed"].items()}
            results[device] = s.run(feeds, fetches)
            if values["state"]:
                states[device] = s.read_state(sorted(values["state"]))
            samples = []
            for i in range(warmup + iters):
                t0 = time.perf_counter()
                s.run(feeds, fetches)
                if i >= warmup:
                    samples.append((time.perf_counter() - t0) * 1e3)
            times[device] = statistics.median(samples)
        finally:
            s.close()
    cpu, gpu = devices
    ok, worst = True, 0.0
    for name in fetches:
        good, diff = close(results[gpu][name], results[cpu][name])
        ok, worst = ok and good, max(worst, diff)
    row["fetch_max_diff"] = worst
    row["fetches_match"] = ok
    if values["fetch"] and values["state"]:  # without its variables a step computes otherwise
        recorded = all(close(results[cpu][n], v)[0] for n, v in values["fetch"].items()
                       if n in results[cpu])
        row["cpu_matches_capture"] = recorded
    if states:
        diffs = [np.abs(np.asarray(states[gpu][k], np.float64) - np.asarray(v, np.float64))
                 for k, v in states[cpu].items()]
        row["state_max_diff"] = float(max((d.max(initial=0.0) for d in diffs), default=0.0))
        total = sum(d.size for d in diffs)
        row["state_share_beyond_1e-4"] = (sum(int((d > 1e-4).sum()) for d in diffs) / total
                                          if total else 0.0)
    row["cpu_ms"], row["cuda_ms"] = times[cpu], times[gpu]
    return row


def torch_step_ms(arch: str, batch: int, size: int, iters: int, warmup: int) -> float | None:
    try:
        import torch
        import torchvision
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    model = getattr(torchvision.models, arch)(num_classes=10).cuda()
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(batch, 3, size, size, device="cuda")
    y = torch.randint(0, 10, (batch,), device="cuda")
    samples = []
    for i in range(warmup + iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        loss.item()
        if i >= warmup:
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def replay(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(REPO / "adaptors" / "python"))
    from salus.client import Client

    bundle = Path(args.bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    server_bin = Path(args.server)
    # The CPU engine beside the device under test; `--device cpu` replays on a second CPU
    # device (a smoke run without a GPU).
    if args.device == "cpu":
        server_devices, devices = "cpu:2", ["cpu:0", "cpu:1"]
    else:
        server_devices, devices = f"cpu,{args.device}", ["cpu", args.device]
    run_dir = tempfile.mkdtemp(prefix="salus-tfsteps-")
    endpoint = f"ipc://{run_dir}/salus.sock"
    server = subprocess.Popen([str(server_bin), "--listen", endpoint, "--device",
                               server_devices, "--memory", args.memory, "--policy",
                               "fair", "--metrics-listen", "127.0.0.1:0"],
                              stderr=open(Path(run_dir) / "server.log", "w"))
    rows = []
    try:
        for _ in range(100):
            if Path(run_dir, "salus.sock").exists():
                break
            time.sleep(0.1)
        with Client(endpoint, timeout=600) as client:
            for model, m in manifest.items():
                for stem, kind in zip(m["steps"], m.get("kinds", m["steps"]), strict=True):
                    row = replay_step(client, bundle / f"{model}-graphs" / stem, devices,
                                      args.iters, args.warmup)
                    row["model"], row["kind"] = model, kind
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                arch = TORCHVISION.get(model)
                if arch:
                    ms = torch_step_ms(arch, m["batch"], m["size"], args.iters, args.warmup)
                    if ms is not None:
                        rows.append({"model": model, "kind": "train: PyTorch eager "
                                     f"torchvision.{arch}", "cuda_ms": ms})
                        print(json.dumps(rows[-1]), flush=True)
    finally:
        server.terminate()
        server.wait()
    table = [f"| model | step | fetches {devices[1]} vs {devices[0]} (max diff) | CPU vs capture "
             f"| updated variables (max diff, share > 1e-4) | {devices[0]} ms | {devices[1]} ms |",
             "| --- | --- | --- | --- | --- | ---: | ---: |"]
    for r in rows:
        state = (f"{r['state_max_diff']:.1e}, {r['state_share_beyond_1e-4']:.2%}"
                 if "state_max_diff" in r else "-")
        fetch = (f"{'ok' if r['fetches_match'] else 'DIFFER'} ({r['fetch_max_diff']:.1e})"
                 if "fetches_match" in r else "-")
        capture_ok = {True: "ok", False: "DIFFER"}.get(r.get("cpu_matches_capture"), "-")
        table.append(f"| {r['model']} | {r['kind']} | {fetch} | {capture_ok} | {state} "
                     f"| {zoo.cell(r, 'cpu_ms', '.1f')} | {zoo.cell(r, 'cuda_ms', '.1f')} |")
    print("\n".join(table))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "tfsteps.json").write_text(json.dumps(rows, indent=1))
        Path(args.out, "tfsteps.md").write_text("\n".join(table) + "\n")
    failed = [r for r in rows if r.get("fetches_match") is False
              or r.get("cpu_matches_capture") is False]
    return 1 if failed else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("capture")
    c.add_argument("--out", default=str(REPO / "build" / "tfsteps"))
    c.add_argument("--models", default="MobileNetV3Small",
                   help="captured with their variables (checked there)")
    c.add_argument("--graphs-only", default="MobileNetV2,EfficientNetB0,ResNet50",
                   help="captured without variables (timed there)")
    c.add_argument("--endpoint")
    c.add_argument("--timeout", type=float, default=1800)
    r = sub.add_parser("replay")
    r.add_argument("--bundle", default=str(REPO / "build" / "tfsteps"))
    r.add_argument("--server", default=str(REPO / "build" / "bin" / "salus-server"))
    r.add_argument("--device", default="cuda:0")
    r.add_argument("--memory", default="16GiB")
    r.add_argument("--iters", type=int, default=20)
    r.add_argument("--warmup", type=int, default=3)
    r.add_argument("--out")
    args = p.parse_args()
    return capture(args) if args.command == "capture" else replay(args)


if __name__ == "__main__":
    sys.exit(main())
