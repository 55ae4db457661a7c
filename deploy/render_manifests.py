#!/usr/bin/env python3
"""Writes the plain manifests in deploy/kubernetes/ from the Helm chart in deploy/helm/salus:
the chart rendered with its default values, as release "salus" in namespace "salus-system"
(namespace.yaml and examples/ are written by hand).

    .venv/bin/python deploy/render_manifests.py           # rewrite them
    .venv/bin/python deploy/render_manifests.py --check   # exit 1 if they differ from the chart

It renders with Helm's own engine: the helm-python-sdk package (in .venv, from
requirements.txt; Helm's Go SDK as a shared library), else a `helm` binary on PATH, as
`helm template salus deploy/helm/salus --namespace salus-system`."""

from __future__ import annotations

import argparse
import difflib
import re
import shutil
import subprocess
import sys
from pathlib import Path

DEPLOY = Path(__file__).resolve().parent
CHART = DEPLOY / "helm" / "salus"
MANIFESTS = DEPLOY / "kubernetes"
RELEASE = "salus"
NAMESPACE = "salus-system"
HEADER = (
    "# Rendered from deploy/helm/salus ({template}) with its default values, release\n"
    f'# "{RELEASE}" in namespace "{NAMESPACE}". Do not edit: change the chart and run\n'
    "# .venv/bin/python deploy/render_manifests.py\n"
)


class RendererMissing(RuntimeError):
    """Neither helm-python-sdk nor a helm binary is installed."""


def renderer() -> str:
    """'helm-python-sdk' or 'helm' (the binary); raises RendererMissing."""
    try:
        import helm_python  # noqa: F401
        return "helm-python-sdk"
    except ImportError:
        pass
    if shutil.which("helm"):
        return "helm"
    raise RendererMissing("no Helm renderer: install requirements.txt into .venv "
                          "(helm-python-sdk) or put helm on PATH")


def render(values: dict | None = None, chart: Path = CHART) -> dict[str, str]:
    """The chart's templates rendered: {"templates/daemonset.yaml": text, ...}, without
    NOTES.txt and without templates that render to nothing."""
    if renderer() == "helm-python-sdk":
        import helm_python

        with helm_python.Chart.load(str(chart)) as c:
            out = c.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
        rendered = {re.sub(r"^[^/]+/", "", k): v for k, v in out.items()}
    else:
        cmd = ["helm", "template", RELEASE, str(chart), "--namespace", NAMESPACE]
        if values:
            import json
            import tempfile

            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                json.dump(values, f)
            cmd += ["--values", f.name]
        text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rendered = {}
        for part in re.split(r"^---\n# Source: [^/\n]+/", text, flags=re.MULTILINE)[1:]:
            name, _, body = part.partition("\n")
            rendered[name] = rendered.get(name, "") + body
    return {k: v for k, v in rendered.items()
            if not k.endswith("NOTES.txt") and re.search(r"^kind:", v, re.MULTILINE)}


def expected_files() -> dict[Path, str]:
    """deploy/kubernetes/<template>.yaml for each rendered template, as it should read."""
    files = {}
    for template, text in sorted(render().items()):
        path = MANIFESTS / Path(template).name
        files[path] = HEADER.format(template=template) + text.strip("\n") + "\n"
    return files


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="compare, write nothing")
    args = p.parse_args()
    stale = 0
    for path, text in expected_files().items():
        have = path.read_text() if path.exists() else ""
        if have == text:
            continue
        stale += 1
        if args.check:
            sys.stdout.writelines(difflib.unified_diff(
                have.splitlines(True), text.splitlines(True), str(path), "rendered"))
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(DEPLOY.parent)}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
