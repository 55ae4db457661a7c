"""Command line: `python -m benchmarks.driver <experiment> [options]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import ModuleType

from benchmarks.driver import (
    common,
    fairness,
    hyperparam,
    inference,
    interactive,
    overhead,
    srtf,
    trace,
)

EXPERIMENTS: dict[str, tuple[ModuleType, str]] = {
    "trace": (trace, "Table 1 / Figure 7: a job trace under FIFO, SRTF, PACK and FAIR"),
    "fairness": (fairness, "Figure 9: three training jobs share the device under FAIR"),
    "srtf": (srtf, "Figure 8: a long job preempted by shorter arrivals under SRTF"),
    "hyperparam": (hyperparam, "Figure 11: N jobs of one model at once, FIFO vs PACK"),
    "inference": (inference, "Figure 10: many inference sessions on one device"),
    "interactive": (interactive, "an interactive inference service beside batch training"),
    "overhead": (overhead, "Figure 12: per-iteration time through the daemon vs in-process"),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.driver",
                                description="Runs the Salus paper's experiments on this machine.")
    sub = p.add_subparsers(dest="experiment", required=True)
    for name, (module, help_text) in EXPERIMENTS.items():
        sp = sub.add_parser(name, help=help_text, description=(module.__doc__ or help_text))
        sp.formatter_class = argparse.RawDescriptionHelpFormatter
        sp.add_argument("--out", type=Path, default=None,
                        help="output folder (default results/<experiment>-<timestamp>/)")
        sp.add_argument("--endpoint", default="",
                        help="use this running salus-server instead of starting one")
        sp.add_argument("--smoke", action="store_true", help="the smallest scale (seconds)")
        sp.add_argument("--seed", type=int, default=1)
        sp.add_argument("--device", default="cpu",
                        help="the device of the daemons it starts (cpu, cuda:N); in-process "
                        "runs use it too")
        module.add_arguments(sp)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    module, title = EXPERIMENTS[args.experiment]
    if args.smoke:
        module.smoke(args)
    args.out = common.out_dir(args.experiment, args.out)
    clock = common.Stopwatch()
    try:
        sections = module.run(args)
    except KeyboardInterrupt:
        print("interrupted; every daemon this run started has been stopped", file=sys.stderr)
        return 130
    common.write_report(args.out, f"{args.experiment}: {title}", args, sections, clock())
    print(f"{args.experiment}: wrote {args.out}/report.md ({clock():.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
