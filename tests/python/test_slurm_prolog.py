"""scripts/slurm/salus-prolog.sh, the Slurm TaskProlog, run by bash with a faked Slurm
environment (no Slurm installed): what it prints is exactly what slurmstepd would apply to the
task. It runs with no PATH, so it uses nothing but bash."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROLOG = REPO / "scripts" / "slurm" / "salus-prolog.sh"
DEFAULT_EXPORT = "export SALUS_ENDPOINT=ipc:///run/salus/salus.sock\n"
BASH = shutil.which("bash") or "/bin/bash"


def run_prolog(env: dict[str, str], tmp_path: Path, config: str | None = None
               ) -> subprocess.CompletedProcess[str]:
    conf = tmp_path / "slurm.conf"
    if config is not None:
        conf.write_text(config)
    # A job's task environment, less anything of this machine's: the config file is the test's.
    base = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0",
            "SALUS_SLURM_CONF": str(conf)}
    return subprocess.run([BASH, str(PROLOG)], env={**base, **env}, capture_output=True,
                          text=True, timeout=10, check=False)


def exported(env: dict[str, str], tmp_path: Path, config: str | None = None) -> str:
    result = run_prolog(env, tmp_path, config)
    assert result.returncode == 0, result.stderr
    return result.stdout


CASES = [
    # A batch job that asked for 8 units.
    ({"SLURM_JOB_GRES": "salus:8"}, DEFAULT_EXPORT),
    # No generic resource at all.
    ({}, ""),
    # Another generic resource only.
    ({"SLURM_JOB_GRES": "gpu:2"}, ""),
    ({"SLURM_JOB_GRES": "gpu:a100:2", "SLURM_STEP_GRES": "gpu:a100:1"}, ""),
    # Salus among others, with a type, at the step, or as srun's --gres.
    ({"SLURM_JOB_GRES": "gpu:a100:2,salus:8"}, DEFAULT_EXPORT),
    ({"SLURM_STEP_GRES": "salus:big:4"}, DEFAULT_EXPORT),
    ({"SLURM_GRES": "salus"}, DEFAULT_EXPORT),  # no count: one unit
    # The TRES forms newer Slurm versions use.
    ({"SLURM_TRES_PER_NODE": "cpu:4,gres/salus:8"}, DEFAULT_EXPORT),
    ({"SLURM_TRES_PER_TASK": "gres:salus:2"}, DEFAULT_EXPORT),
    ({"SLURM_TRES_PER_NODE": "gres/gpu:1"}, ""),
    # A count of 0 is no request; a name that merely starts with "salus" is another GRES.
    ({"SLURM_JOB_GRES": "salus:0"}, ""),
    ({"SLURM_JOB_GRES": "salusx:3,gpu:1", "SLURM_TRES_PER_NODE": "gres/my-salus:2"}, ""),
    # The step asked for nothing of salus, the job did: the task gets the endpoint.
    ({"SLURM_JOB_GRES": "salus:8", "SLURM_STEP_GRES": "gpu:1"}, DEFAULT_EXPORT),
]


@pytest.mark.parametrize(("env", "want"), CASES)
def test_the_endpoint_is_exported_only_to_jobs_that_asked_for_salus(
        env: dict[str, str], want: str, tmp_path: Path) -> None:
    assert exported(env, tmp_path) == want


def test_the_endpoint_comes_from_the_config_file(tmp_path: Path) -> None:
    config = ("# Salus on this node\n"
              "SALUS_ENDPOINT = ipc:///var/run/salus-gpu0/salus.sock  # the GPU's daemon\n"
              "\n")
    assert exported({"SLURM_JOB_GRES": "salus:8"}, tmp_path, config) == (
        "export SALUS_ENDPOINT=ipc:///var/run/salus-gpu0/salus.sock\n")
    assert exported({"SLURM_JOB_GRES": "gpu:1"}, tmp_path, config) == ""
    quoted = 'SALUS_ENDPOINT="tcp://127.0.0.1:5501"\n'
    assert exported({"SLURM_GRES": "salus:1"}, tmp_path, quoted) == (
        "export SALUS_ENDPOINT=tcp://127.0.0.1:5501\n")


def test_the_gres_name_comes_from_the_config_file(tmp_path: Path) -> None:
    config = "SALUS_GRES_NAME=gpumem\n"
    assert exported({"SLURM_JOB_GRES": "gpumem:4"}, tmp_path, config) == DEFAULT_EXPORT
    assert exported({"SLURM_JOB_GRES": "salus:4"}, tmp_path, config) == ""


def test_the_environment_names_another_config_file(tmp_path: Path) -> None:
    other = tmp_path / "site.conf"
    other.write_text("SALUS_ENDPOINT=ipc:///site/salus.sock\n")
    env = {"SLURM_JOB_GRES": "salus:8", "SALUS_SLURM_CONF": str(other)}
    assert exported(env, tmp_path) == "export SALUS_ENDPOINT=ipc:///site/salus.sock\n"


@pytest.mark.parametrize("config", [
    "SALUS_ENDPOINT=ipc:///run/salus/salus.sock; rm -rf /\n",
    "SALUS_ENDPOINT=ipc:///a b\n",
    "SALUS_ENDPOINT=http://example/\n",
    "SALUS_ENDPOINT=\n",
    "SALUS_GRES_NAME=sal us\n",
])
def test_a_bad_config_exports_nothing_and_lets_the_job_run(config: str, tmp_path: Path) -> None:
    result = run_prolog({"SLURM_JOB_GRES": "salus:8"}, tmp_path, config)
    assert result.returncode == 0
    assert result.stdout == ""
    assert "salus-prolog:" in result.stderr


def test_unknown_config_lines_are_reported_and_ignored(tmp_path: Path) -> None:
    result = run_prolog({"SLURM_JOB_GRES": "salus:8"}, tmp_path,
                        "SALUS_ENDPIONT=ipc:///x.sock\nnonsense\n")
    assert result.returncode == 0
    assert result.stdout == DEFAULT_EXPORT
    assert "unknown key SALUS_ENDPIONT" in result.stderr
    assert "not KEY=VALUE: nonsense" in result.stderr


def test_the_script_is_executable_bash() -> None:
    assert PROLOG.stat().st_mode & 0o111
    assert PROLOG.read_text().startswith("#!/bin/bash\n")
    subprocess.run([BASH, "-n", str(PROLOG)], check=True)
