"""Per-step time of PyTorch training through salus-server against eager PyTorch in-process.

For each model (the tests' ResNet-shaped CNN with BatchNorm and SGD-momentum, and their
Transformer encoder with Adam, at a batch given by --batch), the same unmodified step function
runs `--steps` times eagerly, `--steps` times through salus_torch.capture_step and `--steps`
times on the lazy `salus` device (the model moved there, each batch moved there by the step),
against a salus-server this script starts, alternating rounds, with the same number of threads
on both sides (torch.set_num_threads and the daemon's OMP_NUM_THREADS). The first `--warmup`
steps of each run (tracing, compiling, first writes of the state) are dropped. Prints the
medians and their ratios to eager (and the means of the steps that read the loss every step)
and writes them as JSON. Eager and the lazy device also run
a loop that reads the loss only every `--log-every` steps (10), as a loop that logs every so
often does: there the lazy device records a step while the daemon runs the one before.

    .venv-torch/bin/python benchmarks/pytorch/compare.py [--models resnet,encoder] [--rounds 3]
        [--phases] [--floor]

`--floor` also times the step on tensors whose every op reaches a Python `__torch_dispatch__`
that only makes its outputs (bare.py): the least any device written in Python can cost; and,
in a child process beside eager steps there, on tensors whose ops reach a C++ fallback that
only makes its outputs (`bare.py --cpp`, bare.cc): the least a device recording in C++ can
cost.

`--phases` also times the lazy device's step phase by phase (the batch moved to the device,
zero_grad, forward and loss, backward, the optimizer step with its flush, the loss read),
beside the daemon's own run time of the step's iterations and this process's CPU time for the
phases before the loss read (steadier than their wall time on a shared machine).

On a GPU, `--device cuda:0` runs the daemon on that device and the eager baseline on PyTorch's
same CUDA device; capture_step and the lazy device are unchanged (their batches start on the
host, as the eager baseline's are copied to the GPU inside each step). The eager CUDA rounds
run in a child process that never imports salus_torch: once the `salus` device is registered,
PyTorch takes it for the process's accelerator, and CUDA's autograd streams no longer match.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for p in ("tests/integration", "tests/pytorch", "adaptors/python", "adaptors/pytorch"):
    sys.path.insert(0, str(REPO / p))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from models import Encoder, ResNet, user_step  # noqa: E402


def build(model: str, batch: int, device: str = "cpu"):  # noqa: ANN201
    """The model (on `device`), its optimizer and one host batch, seeded."""
    torch.manual_seed(0)
    if model == "resnet":
        m = ResNet().to(device)
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        data = (torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,)))
    else:
        m = Encoder(tokens=32, width=64).to(device)
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
        data = (torch.randint(0, 100, (batch, 32)), torch.randint(0, 10, (batch,)))
    return m, opt, data


def make(model: str, batch: int, device: str = "cpu"):  # noqa: ANN201
    m, opt, data = build(model, batch, device)
    if device == "cpu":
        return user_step(m, opt), data
    step = user_step(m, opt)
    return (lambda x, y: step(x.to(device), y.to(device))), data


PHASES = ("batch to device", "zero_grad", "forward and loss", "backward",
          "optimizer step and flush", "loss read")


def device_phases(model: str, batch: int, steps: int, warmup: int) -> dict[str, float]:
    """The lazy device's step timed phase by phase (median ms of each), with the daemon's own
    run time of the step's iterations up to their replies (IterationStats.run_us: the loss
    comes back after the forward pass, Note [Fetches before the end]) and of the whole
    iteration (the daemon's moving average for the step's session) beside them."""
    import salus_torch
    m, opt, data = build(model, batch, "salus")
    times: dict[str, list[float]] = {p: [] for p in (*PHASES, "daemon run to the reply",
                                                     "recording cpu")}
    for i in range(steps + warmup):
        before = {id(s): s.last_stats for s in salus_torch.device.runtime().sessions}
        t = [time.perf_counter()]
        cpu0 = time.process_time()  # (this process's CPU: recording, flush, and autograd)
        x, y = data[0].to("salus"), data[1].to("salus")
        t.append(time.perf_counter())
        opt.zero_grad()
        t.append(time.perf_counter())
        loss = F.cross_entropy(m(x), y)
        t.append(time.perf_counter())
        loss.backward()
        t.append(time.perf_counter())
        opt.step()
        t.append(time.perf_counter())
        cpu = time.process_time() - cpu0
        float(loss)
        t.append(time.perf_counter())
        if i < warmup:
            continue
        for p, a, b in zip(PHASES, t, t[1:], strict=False):  # t has one more
            times[p].append((b - a) * 1e3)
        ran = [s.last_stats.run_us for s in salus_torch.device.runtime().sessions
               if s.last_stats is not None and s.last_stats is not before.get(id(s))]
        times["daemon run to the reply"].append(sum(ran) / 1e3)
        times["recording cpu"].append(cpu * 1e3)
    rt = salus_torch.device.runtime()
    ids = {s.id for s in rt.sessions}
    ran = [s for s in rt.client.sessions() if s["session_id"] in ids]
    step = max(ran, key=lambda s: s["iterations_done"])
    salus_torch.device.close()
    out = {p: statistics.median(v) for p, v in times.items()}
    out["daemon run of the whole step"] = step["avg_iteration_seconds"] * 1e3
    return out


def timed(step, data, steps: int, warmup: int, every: int = 1) -> list[float]:  # noqa: ANN001
    """Seconds per step. The loss reaches the host every `every` steps, as in a loop that logs
    it that often; with `every` over 1, each of `steps` blocks of `every` steps gives its mean."""
    for _ in range(warmup):
        float(step(*data))
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        for _ in range(every - 1):
            step(*data)
        float(step(*data))
        times.append((time.perf_counter() - t) / every)
    return times


def eager_times(args: argparse.Namespace, model: str) -> tuple[list[float], list[float]]:
    """One round of eager steps, the loss read every step and every --log-every steps: here on
    the CPU, in a child process on a GPU."""
    if args.device == "cpu":
        return eager_round(args, model)
    cmd = [sys.executable, __file__, "--eager-only", "--models", model, "--device", args.device,
           "--batch", str(args.batch), "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--threads", str(args.threads), "--log-every", str(args.log_every)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return tuple(json.loads(out.strip().splitlines()[-1])[model])


def eager_round(args: argparse.Namespace, model: str) -> tuple[list[float], list[float]]:
    step, data = make(model, args.batch, args.device)
    return (timed(step, data, args.steps, args.warmup),
            timed(step, data, args.steps // 2, 0, args.log_every))


def floor_round(args: argparse.Namespace, model: str) -> tuple[list[float], float]:
    """Steps of the model whose tensors are `Bare` (bare.py): the cost of dispatching every op
    into Python and nothing else, with the ops per step."""
    from bare import Bare, bare_data, bare_model
    m, opt, data = build(model, args.batch)
    bare_model(m)
    opt = type(opt)(m.parameters(), **opt.defaults)
    step = user_step(m, opt)
    before = Bare.ops
    times = timed(step, bare_data(*data), args.steps, args.warmup)
    return times, (Bare.ops - before) / (args.steps + args.warmup)


def cpp_floor_round(args: argparse.Namespace, model: str) -> dict:
    """Steps of the model on tensors whose ops reach a C++ fallback and nothing else, beside
    eager steps, in a child process (`bare.py --cpp`: it names PrivateUse1 otherwise)."""
    cmd = [sys.executable, str(Path(__file__).with_name("bare.py")), "--cpp", "--models", model,
           "--batch", str(args.batch), "--steps", str(args.steps), "--warmup",
           str(args.warmup), "--threads", str(args.threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])[model]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="resnet,encoder")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--device", default="cpu",
                    help="the daemon's device; the eager baseline runs on PyTorch's same device")
    ap.add_argument("--out", default=str(REPO / "results" / "pytorch_compare.json"))
    ap.add_argument("--eager-only", action="store_true",
                    help="time the eager steps of --models alone and print them as JSON")
    ap.add_argument("--phases", action="store_true",
                    help="also time the lazy device's step phase by phase")
    ap.add_argument("--floor", action="store_true",
                    help="also time the step on tensors whose ops only reach Python (bare.py)")
    ap.add_argument("--reply-at-end", action="store_true",
                    help="iterations replied when they end rather than when their fetches are "
                         "ready (RunIteration.reply_when_fetched off): the before of that change")
    ap.add_argument("--log-every", type=int, default=10,
                    help="the loss is also read only every this many steps, in --steps/2 "
                         "blocks (eager and the lazy device)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    if args.eager_only:
        print(json.dumps({model: eager_round(args, model) for model in args.models.split(",")}))
        return

    import salus_torch
    from salus_daemon import Daemon

    import salus
    if args.reply_at_end:
        submit = salus.client.Session._submit
        salus.client.Session._submit = (  # type: ignore[method-assign]
            lambda self, feeds, fetches, state_only, reply_when_fetched=False:
            submit(self, feeds, fetches, state_only))
    daemon_args = [] if args.device == "cpu" else ["--device", args.device]
    daemon = Daemon(*daemon_args, memory="4GiB", policy="fifo")
    results = {}
    try:
        for model in args.models.split(","):
            eager, salus, lazy, eager_logged, lazy_logged, floor = [], [], [], [], [], []
            cpp_floor, cpp_eager, cpp_ops = [], [], 0
            for _ in range(args.rounds):
                every_step, logged = eager_times(args, model)
                eager += every_step
                eager_logged += logged
                if args.floor:
                    times, ops = floor_round(args, model)
                    floor += times
                    if args.device == "cpu":
                        child = cpp_floor_round(args, model)
                        cpp_floor += child["cpp"]
                        cpp_eager += child["eager"]
                        cpp_ops = child["ops"]
                step, data = make(model, args.batch)
                with salus_torch.capture_step(step, endpoint=daemon.endpoint) as captured:
                    salus += timed(captured, data, args.steps, args.warmup)
                os.environ["SALUS_ENDPOINT"] = daemon.endpoint
                step, data = make(model, args.batch, "salus")
                lazy += timed(step, data, args.steps, args.warmup)
                lazy_logged += timed(step, data, args.steps // 2, 0, args.log_every)
                salus_torch.device.close()
            e, s, z = statistics.median(eager), statistics.median(salus), statistics.median(lazy)
            el, zl = statistics.median(eager_logged), statistics.median(lazy_logged)
            results[model] = {"eager_ms": e * 1e3, "salus_ms": s * 1e3, "ratio": s / e,
                              "device_ms": z * 1e3, "device_ratio": z / e,
                              "samples": len(eager), "log_every": args.log_every,
                              "eager_logged_ms": el * 1e3, "device_logged_ms": zl * 1e3,
                              "device_logged_ratio": zl / el}
            print(f"{model}: eager {e * 1e3:.2f} ms, capture_step {s * 1e3:.2f} ms "
                  f"({s / e:.2f}x), salus device {z * 1e3:.2f} ms ({z / e:.2f}x) "
                  f"({len(eager)} steps each)", flush=True)
            print(f"  loss read every {args.log_every} steps: eager {el * 1e3:.2f} ms, salus "
                  f"device {zl * 1e3:.2f} ms ({zl / el:.2f}x)", flush=True)
            # (Means as well: what a job's length follows, pauses included, such as a
            # collection of Python's cycle collector in one step of forty.)
            em, zm = statistics.mean(eager), statistics.mean(lazy)
            results[model].update(eager_mean_ms=em * 1e3, device_mean_ms=zm * 1e3,
                                  device_mean_ratio=zm / em)
            print(f"  means, loss read every step: eager {em * 1e3:.2f} ms, salus device "
                  f"{zm * 1e3:.2f} ms ({zm / em:.2f}x)", flush=True)
            if floor:
                f = statistics.median(floor)
                results[model].update(floor_ms=f * 1e3, floor_ratio=f / e, floor_ops=ops)
                print(f"  ops dispatched into Python and nothing else ({ops:.0f} per step, "
                      f"{f / ops * 1e6:.1f} us each): {f * 1e3:.2f} ms ({f / e:.2f}x eager)",
                      flush=True)
            if cpp_floor:
                c, ce = statistics.median(cpp_floor), statistics.median(cpp_eager)
                results[model].update(cpp_floor_ms=c * 1e3, cpp_floor_eager_ms=ce * 1e3,
                                      cpp_floor_ratio=c / ce, cpp_floor_ops=cpp_ops)
                print(f"  ops reaching a C++ fallback and nothing else ({cpp_ops} per step, "
                      f"{c / cpp_ops * 1e6:.1f} us each): {c * 1e3:.2f} ms ({c / ce:.2f}x eager "
                      f"in its process, {ce * 1e3:.2f} ms)", flush=True)
            if args.phases:
                phases = device_phases(model, args.batch, args.steps, args.warmup)
                results[model]["device_phases_ms"] = phases
                print("  device step, ms: " + ", ".join(f"{p} {v:.2f}"
                                                         for p, v in phases.items()),
                      flush=True)
    finally:
        daemon.stop()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"threads": args.threads, "batch": args.batch,
                                          "device": args.device, "torch": torch.__version__,
                                          "models": results},
                                         indent=2))


if __name__ == "__main__":
    main()
