"""The TensorFlow adaptor against a real daemon: unmodified TensorFlow scripts (in this folder)
run on SALUS in a child process and must reproduce the same script run on TensorFlow's CPU
device (SALUS_TF_DISABLE=1). Runs in .venv-tf, where scripts/build installed salus-tensorflow.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from salus_daemon import Daemon  # noqa: E402

MAIN_PYTHON = REPO / ".venv" / "bin" / "python"
# Per-epoch losses agree to this relative tolerance (the bar); weights, after every
# step's rounding differences have compounded, to the looser one.
LOSS_RTOL = 1e-4
WEIGHT_RTOL, WEIGHT_ATOL = 1e-3, 1e-3


@pytest.fixture(scope="module")
def daemon():
    d = Daemon(memory="2GiB", policy="fair")
    yield d
    d.stop()


def start(script: str, *args: str, endpoint: str | None,
          env_extra: dict[str, str] | None = None) -> subprocess.Popen:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", **(env_extra or {}))
    if endpoint is None:
        env["SALUS_TF_DISABLE"] = "1"
    else:
        env["SALUS_ENDPOINT"] = endpoint
        env.pop("SALUS_TF_DISABLE", None)
    return subprocess.Popen([sys.executable, str(HERE / script), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 600) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"script failed ({proc.returncode}):\n{err[-4000:]}"
    return json.loads(out.strip().splitlines()[-1])


def run(script: str, *args: str, endpoint: str | None,
        env_extra: dict[str, str] | None = None) -> dict:
    return finish(start(script, *args, endpoint=endpoint, env_extra=env_extra))


@functools.cache
def cpu_reference(script: str, *args: str) -> dict:
    """The script on TensorFlow's CPU device (each reference runs once per test session)."""
    return run(script, *args, endpoint=None)


def assert_matches(salus: dict, cpu: dict) -> None:
    np.testing.assert_allclose(salus["loss"], cpu["loss"], rtol=LOSS_RTOL)
    assert len(salus["weights"]) == len(cpu["weights"])
    for got, want in zip(salus["weights"], cpu["weights"], strict=False):
        np.testing.assert_allclose(got, want, rtol=WEIGHT_RTOL, atol=WEIGHT_ATOL)


def test_keras_mlp_fit_matches_the_cpu(daemon: Daemon) -> None:
    salus = run("keras_mlp.py", endpoint=daemon.endpoint)
    cpu = cpu_reference("keras_mlp.py")
    assert "SALUS" in salus["devices"] and "SALUS" not in cpu["devices"]
    assert_matches(salus, cpu)
    assert salus["accuracy"] == pytest.approx(cpu["accuracy"], abs=1 / 512 + 1e-9)


def test_keras_cnn_fit_evaluate_predict_match_the_cpu(daemon: Daemon) -> None:
    salus = run("keras_cnn.py", endpoint=daemon.endpoint)
    cpu = cpu_reference("keras_cnn.py")
    assert_matches(salus, cpu)
    np.testing.assert_allclose(salus["evaluate"][0], cpu["evaluate"][0], rtol=1e-3)
    assert salus["predict_sum"] == pytest.approx(cpu["predict_sum"], rel=1e-2, abs=0.1)


def test_keras_embedding_and_attention_match_the_cpu(daemon: Daemon) -> None:
    # Embedding, MultiHeadAttention (Einsum), LayerNormalization; Adam sums the embedding's
    # sparse gradient with UnsortedSegmentSum.
    salus = run("keras_attention.py", endpoint=daemon.endpoint)
    assert_matches(salus, cpu_reference("keras_attention.py"))


def test_tensorflows_fused_batch_norm_matches_the_cpu(daemon: Daemon) -> None:
    # FusedBatchNormV3 in training (batch moments, running averages) and inference, and
    # FusedBatchNormGradV3 (Note [Fused batch normalisation]).
    salus = run("fused_batch_norm.py", endpoint=daemon.endpoint)
    cpu = cpu_reference("fused_batch_norm.py")
    assert_matches(salus, cpu)
    np.testing.assert_allclose(salus["evaluate"], cpu["evaluate"], rtol=1e-4)


def test_keras_grouped_convolutions_match_the_cpu(daemon: Daemon) -> None:
    # Keras' XLA function for grouped convolutions is replaced by a plain grouped Conv2D
    # (salus_tensorflow/_autojit.py); its gradients are grouped too.
    salus = run("keras_grouped_conv.py", endpoint=daemon.endpoint)
    assert_matches(salus, cpu_reference("keras_grouped_conv.py"))


def test_mirror_padding_matches_the_cpu(daemon: Daemon) -> None:
    # tf.pad's REFLECT and SYMMETRIC modes: MirrorPad and MirrorPadGrad (Note [Mirror padding]).
    salus = run("mirror_pad.py", endpoint=daemon.endpoint)
    assert_matches(salus, cpu_reference("mirror_pad.py"))


def test_normal_and_truncated_normal_draws_match_the_cpu_bit_for_bit(daemon: Daemon,
                                                                     tmp_path: Path) -> None:
    # keras.random.normal (a VAE's sampling) and truncated_normal inside fit's steps, and
    # stateless draws of odd sizes (Note [TensorFlow random numbers]): SALUS draws the bits
    # TensorFlow's CPU kernels draw, so the training matches and the raw draws are equal.
    salus = run("random_draws.py", endpoint=daemon.endpoint,
                env_extra={"SALUS_TF_DUMP_DIR": str(tmp_path)})
    cpu = cpu_reference("random_draws.py")
    assert_matches(salus, cpu)
    np.testing.assert_array_equal(salus["normal"], cpu["normal"])
    np.testing.assert_array_equal(salus["truncated"], cpu["truncated"])
    graphs = b"".join(p.read_bytes() for p in tmp_path.glob("*.pb"))
    for op in (b"StatelessRandomNormalV2", b"StatelessTruncatedNormalV2"):
        assert op in graphs, f"no captured graph carries {op.decode()}"


def test_custom_loop_with_adam_and_a_saved_model(daemon: Daemon, tmp_path: Path) -> None:
    (tmp_path / "salus").mkdir()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "graphs").mkdir()
    salus = run("custom_loop.py", str(tmp_path / "salus"), endpoint=daemon.endpoint,
                env_extra={"SALUS_TF_DUMP_DIR": str(tmp_path / "graphs")})
    cpu = run("custom_loop.py", str(tmp_path / "cpu"), endpoint=None)
    assert_matches(salus, cpu)  # the weights after the steps that return nothing too
    # Each step is one captured session that fetches only what the function returns (Note
    # [Stand-ins] in rewrite.cc): the variables it reads stay in the daemon.
    steps = [json.loads(p.read_text()) for p in (tmp_path / "graphs").glob("*.spec.json")]
    steps = [s for s in steps if s["name"].startswith("tf:salus_step_")]
    assert not [o for s in steps for o in s["outputs"] if "ReadVariableOp" in o], steps
    training = [s for s in steps if sorted(s["inputs"].values()) == [[64, 1], [64, 8]]]
    assert sorted(len(s["outputs"]) for s in training) == [0, 1], training
    # The model saved from SALUS reloads and predicts what it predicted before saving.
    np.testing.assert_allclose(salus["reloaded_predictions"], salus["predictions"], rtol=1e-5,
                               atol=1e-6)


def test_an_unsupported_op_is_refused_by_name_and_the_daemon_keeps_serving(
        daemon: Daemon) -> None:
    out = run("unsupported_op.py", endpoint=daemon.endpoint)
    assert out["error"] is not None
    assert out["error"]["type"] == "UnimplementedError"
    assert "node 'Cumsum': op Cumsum" in out["error"]["message"]
    assert out["after"] == 32.0
    assert daemon.proc.poll() is None


def test_a_job_under_fifo_never_waits_on_its_own_sessions() -> None:
    # FIFO admits one job at a time; the job's eager, training, evaluate and predict sessions
    # are one job to the daemon (Note [A job never waits on itself]): none queues behind another,
    # so none is closed to make way and made again.
    fifo = Daemon(memory="2GiB", policy="fifo")
    try:
        salus = finish(start("keras_cnn.py", endpoint=fifo.endpoint), timeout=300)
    finally:
        fifo.stop()
    mark = "event: session_created "
    created = [json.loads(line.split(mark, 1)[1]) for line in fifo.log if mark in line]
    assert len(created) >= 4 and all(e["admitted"] for e in created), created
    assert {e["job"] for e in created} == {"tensorflow"}
    steps = [e["name"] for e in created if e["name"].startswith("tf:salus_step_")]
    assert len(steps) == len(set(steps)), f"steps' sessions made again: {steps}"
    cpu = cpu_reference("keras_cnn.py")
    assert_matches(salus, cpu)
    np.testing.assert_allclose(salus["evaluate"][0], cpu["evaluate"][0], rtol=1e-3)


@pytest.mark.skipif(not MAIN_PYTHON.exists(), reason="the project's .venv is missing")
def test_two_tensorflow_jobs_and_an_onnx_job_share_the_daemon_under_fair(
        daemon: Daemon) -> None:
    def onnx_job() -> subprocess.Popen:
        return subprocess.Popen([str(MAIN_PYTHON), str(HERE / "onnx_job.py"), daemon.endpoint,
                                 "40"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    solo = [run("keras_mlp.py", "7", endpoint=daemon.endpoint),
            run("keras_mlp.py", "8", endpoint=daemon.endpoint), finish(onnx_job())]
    procs = [start("keras_mlp.py", "7", endpoint=daemon.endpoint),
             start("keras_mlp.py", "8", endpoint=daemon.endpoint), onnx_job()]
    together = [finish(p) for p in procs]
    for alone, shared in zip(solo, together, strict=False):
        assert shared["loss"] == alone["loss"]  # the same computation, whoever else runs
    for alone, shared in zip(solo[:2], together[:2], strict=False):
        for a, b in zip(alone["weights"], shared["weights"], strict=False):
            assert a == b
    assert solo[0]["loss"] != solo[1]["loss"]  # two different jobs
    # All three were sessions of the one daemon.
    log = "".join(daemon.log)
    assert log.count('"name":"onnx-mlp"') >= 2
    assert log.count('"name":"tf:salus_step_') >= 4


def test_the_compare_benchmark_runs_at_its_smallest_scale(tmp_path: Path) -> None:
    # benchmarks/tensorflow/compare.py (docs/benchmarks.md), fit and a custom loop, so the
    # benchmark cannot break unseen; its timings mean nothing at this scale.
    out = tmp_path / "compare.json"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "tensorflow" / "compare.py"),
                    "--models", "mlp,mlp-loop", "--steps", "6", "--warmup", "2", "--rounds", "1",
                    "--out", str(out)], check=True, timeout=600,
                   env=dict(os.environ, OMP_NUM_THREADS="2"))
    models = json.loads(out.read_text())["models"]
    assert set(models) == {"mlp", "mlp-loop"}
    assert all(m["salus_median_ms"] > 0 and m["tensorflow_median_ms"] > 0
               for m in models.values())


def test_a_keras_fit_carries_on_bit_identical_across_a_daemon_restart(tmp_path: Path) -> None:
    """docs/operations.md, Restarts: in the middle of fit the daemon drains writing a snapshot
    and a new one restores it; the plugin's next step waits for it, and fit ends with the bits
    of a fit through one daemon."""
    from salus_daemon import CTL

    def fit(restart: bool) -> dict:
        first = Daemon(memory="2GiB", policy="fair")
        daemons = [first]
        try:
            env = {"RESTART_AT_BATCH": "11", "RESTART_FLAG": str(tmp_path / "back")} if restart \
                else {}
            proc = start("keras_restart.py", endpoint=first.endpoint, env_extra=env)
            if restart:
                assert proc.stdout is not None
                line = proc.stdout.readline()
                assert line.strip() == "restart", line + proc.stderr.read()[-4000:]
                subprocess.run([str(CTL), "--endpoint", first.admin_endpoint, "drain",
                                "--snapshot", str(tmp_path / "snapshot")], check=True,
                               capture_output=True)
                assert first.proc.wait(60) == 0
                snap = [json.loads(x.split("event: snapshot ", 1)[1]) for x in first.log
                        if "event: snapshot " in x]
                assert snap and snap[0]["sessions"] > 0, "".join(first.log[-20:])
                daemons.append(Daemon("--restore", str(tmp_path / "snapshot"), memory="2GiB",
                                      policy="fair", after=first))
                (tmp_path / "back").touch()
            return finish(proc)
        finally:
            for d in daemons:
                if d.proc.poll() is None:
                    d.stop()

    want = fit(False)
    got = fit(True)
    assert got["loss"] == want["loss"]
    assert got["weights"] == want["weights"]
