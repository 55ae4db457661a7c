"""Reading and writing a session's persistent state (RunIteration feeds/fetches naming state
values, and state_only requests), and the CreateSession checks of TensorFlow-graph models,
against a real daemon."""

from __future__ import annotations

import math

import numpy as np
import pytest
from salus_daemon import MODELS, Daemon

import salus

PARAMS = {
    "fc_w1": (512, 784), "fc_b2": (512,), "fc_w5": (512, 512), "fc_b6": (512,),
    "fc_w9": (10, 512), "fc_b10": (10,),
}


def mlp_session(client: salus.Client, batch: int = 16, **optimizer: float | str):  # noqa: ANN201
    return client.create_session(model=MODELS / "mlp.onnx", mode="train",
                                 inputs={"x": (batch, 784), "labels": (batch,)}, loss="loss",
                                 optimizer={"type": "sgd", "lr": 0.05, **optimizer},
                                 name="mlp-state")


def mlp_feeds(batch: int = 16, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((batch, 784), dtype=np.float32),
            "labels": rng.integers(0, 10, batch).astype(np.int64)}


def iterations_done(client: salus.Client, session: salus.Session) -> int:
    return next(s["iterations_done"] for s in client.sessions()
                if s["session_id"] == session.id)


def test_state_lists_parameters_and_optimizer_state(daemon: Daemon) -> None:
    with salus.connect(daemon.endpoint) as c:
        s = mlp_session(c, momentum=0.9)
        for name, shape in PARAMS.items():
            assert s.state_specs[name] == (shape, np.dtype(np.float32)), name
            # Optimizer state is named after its parameter (made unique by the compiler).
            velocity = [k for k in s.state_specs if k.startswith(name + ".velocity")]
            assert len(velocity) == 1, name
            assert s.state_specs[velocity[0]] == (shape, np.dtype(np.float32)), name
        assert "x" not in s.state_specs and "loss" not in s.state_specs
        # ONNX inference compiles its weights as constants: nothing to read or write.
        inf = c.create_session(model=MODELS / "mlp.onnx", mode="infer",
                               inputs={"x": (4, 784), "labels": (4,)})
        assert inf.state_specs == {}
        # Synthetic sessions have no state either.
        syn = c.create_session(synthetic={"persistent_bytes": 4096, "ephemeral_bytes": 4096})
        assert syn.state_specs == {}
        with pytest.raises(salus.SalusError) as e:
            syn.read_state([])
        assert e.value.code == "INVALID_ARGUMENT"


def test_read_state_follows_training_and_is_no_iteration(daemon: Daemon) -> None:
    with salus.connect(daemon.endpoint) as c:
        s = mlp_session(c)
        initial = s.read_state(list(PARAMS))  # before any step: the model's initializers
        for name, shape in PARAMS.items():
            assert initial[name].shape == shape and initial[name].dtype == np.float32, name
        assert np.any(initial["fc_w1"] != 0)
        feeds = mlp_feeds()
        for _ in range(3):
            s.run(feeds=feeds, fetches=["loss"])
        stats = s.last_stats
        after = s.read_state("fc_w1")
        assert after["fc_w1"].shape == (512, 784)
        assert not np.array_equal(after["fc_w1"], initial["fc_w1"])
        # A read queued behind a submitted step sees that step's update.
        pending = s.submit(feeds=feeds, fetches=["loss"])
        behind = s.read_state(["fc_b10"])["fc_b10"]
        pending.result()
        assert np.array_equal(behind, s.read_state("fc_b10")["fc_b10"])
        # A fetch of a state value in a step is read after the step's update.
        out = s.run(feeds=feeds, fetches=["loss", "fc_b10"])
        assert out["fc_b10"].shape == (10,)
        assert not np.array_equal(out["fc_b10"], behind)
        assert np.array_equal(out["fc_b10"], s.read_state("fc_b10")["fc_b10"])
        # State requests are not iterations.
        assert iterations_done(c, s) == 5
        assert s.last_stats is not None and s.last_stats.iteration == 4
        assert stats is not None and stats.iteration == 2


def test_replies_when_fetched_match_and_later_requests_follow_the_whole_step(
        daemon: Daemon) -> None:
    """RunIteration.reply_when_fetched: the loss comes back before the step's updates have run
    (stats say so), equal to a session replied at the end; what the session does next (a state
    read, the next step) sees the whole step."""
    with salus.connect(daemon.endpoint) as c:
        early, late = mlp_session(c, momentum=0.9), mlp_session(c, momentum=0.9)
        for seed in range(3):
            feeds = mlp_feeds(seed=seed)
            a = early.run(feeds=feeds, fetches=["loss"], reply_when_fetched=True)
            assert early.last_stats is not None and early.last_stats.early
            behind = early.read_state(list(PARAMS))
            b = late.run(feeds=feeds, fetches=["loss"])
            assert late.last_stats is not None and not late.last_stats.early
            assert a["loss"] == b["loss"]
            ref = late.read_state(list(PARAMS))
            for name in PARAMS:
                assert np.array_equal(behind[name], ref[name]), name
        # Submitted back to back, replied early: each still starts from the one before.
        pend = [early.submit(feeds=mlp_feeds(seed=s), fetches=["loss"], reply_when_fetched=True)
                for s in (3, 4)]
        ref = [late.run(feeds=mlp_feeds(seed=s), fetches=["loss"])["loss"] for s in (3, 4)]
        assert [p.result()["loss"] for p in pend] == ref
        # A fetch of a state value is read after the step's updates: replied at the end.
        out = early.run(feeds=mlp_feeds(seed=5), fetches=["loss", "fc_b10"],
                        reply_when_fetched=True)
        assert not early.last_stats.early
        assert np.array_equal(out["fc_b10"], early.read_state("fc_b10")["fc_b10"])
        assert iterations_done(c, early) == 6


def test_written_weights_are_what_the_next_step_uses(daemon: Daemon) -> None:
    with salus.connect(daemon.endpoint) as c:
        s = mlp_session(c)
        feeds = mlp_feeds()
        first = float(s.run(feeds=feeds, fetches=["loss"])["loss"])
        assert abs(first - math.log(10)) > 1e-3
        # Zero weights give zero logits: the loss is ln(10) whatever the batch.
        s.write_state({n: np.zeros(shape, np.float32) for n, shape in PARAMS.items()})
        zeros = s.read_state(list(PARAMS))
        assert all(not np.any(v) for v in zeros.values())
        loss = float(s.run(feeds=feeds, fetches=["loss"])["loss"])
        assert loss == pytest.approx(math.log(10), abs=1e-5)
        # Restoring a snapshot restores the loss exactly.
        snap = s.read_state(list(PARAMS))
        l1 = float(s.run(feeds=feeds, fetches=["loss"])["loss"])
        s.run(feeds=mlp_feeds(seed=1), fetches=["loss"])
        s.write_state(snap)
        assert float(s.run(feeds=feeds, fetches=["loss"])["loss"]) == pytest.approx(l1, rel=1e-6)
        # A state feed in a step is written before the step runs.
        zero = {n: np.zeros(shape, np.float32) for n, shape in PARAMS.items()}
        out = s.run(feeds={**feeds, **zero}, fetches=["loss"])
        assert float(out["loss"]) == pytest.approx(math.log(10), abs=1e-5)
        assert iterations_done(c, s) == 6


def test_state_written_before_the_first_step_is_not_overwritten(daemon: Daemon) -> None:
    with salus.connect(daemon.endpoint) as c:
        s = mlp_session(c)
        s.write_state({"fc_w9": np.zeros((10, 512), np.float32),
                       "fc_b10": np.zeros(10, np.float32)})
        assert iterations_done(c, s) == 0
        loss = float(s.run(feeds=mlp_feeds(), fetches=["loss"])["loss"])
        assert loss == pytest.approx(math.log(10), abs=1e-5)
        # The other parameters kept their initial values.
        assert np.any(s.read_state("fc_w1")["fc_w1"] != 0)


def test_bad_state_requests_name_the_tensor_and_harm_no_one(daemon: Daemon) -> None:
    with salus.connect(daemon.endpoint) as c:
        s = mlp_session(c)
        other = mlp_session(c)
        feeds = mlp_feeds()
        before = float(s.run(feeds=feeds, fetches=["loss"])["loss"])
        other.run(feeds=feeds)
        snapshot = s.read_state(list(PARAMS))
        cases = [
            ("read unknown", lambda: s.read_state(["nope"]), "nope"),
            ("write unknown", lambda: s.write_state({"nope": np.zeros(3, np.float32)}), "nope"),
            ("wrong shape", lambda: s.write_state({"fc_b10": np.zeros(11, np.float32)}),
             "fc_b10"),
            ("wrong dtype", lambda: s.write_state({"fc_b10": np.zeros(10, np.float64)}),
             "fc_b10"),
            ("wrong dtype, same bytes", lambda: s.write_state({"fc_b2": np.zeros(512, np.int32)}),
             "fc_b2"),
            ("input in a state request", lambda: s.write_state({"x": feeds["x"]}), "x"),
            ("output in a state request", lambda: s.read_state(["loss"]), "loss"),
            ("unknown state feed in a step",
             lambda: s.run(feeds={**feeds, "nope": np.zeros(3, np.float32)}), "nope"),
            ("wrong state shape in a step",
             lambda: s.run(feeds={**feeds, "fc_w1": np.zeros((784, 512), np.float32)}), "fc_w1"),
            ("unknown fetch in a step", lambda: s.run(feeds=feeds, fetches=["nope"]), "nope"),
            ("step without its inputs", lambda: s.run(feeds={"fc_b10": snapshot["fc_b10"]}),
             "x|labels"),
        ]
        for what, call, names in cases:
            with pytest.raises(salus.SalusError) as e:
                call()
            assert e.value.code == "INVALID_ARGUMENT", f"{what}: {e.value}"
            assert any(f"'{n}'" in e.value.message for n in names.split("|")), \
                f"{what}: {e.value.message}"
        # Nothing was written or run by the refused requests.
        for n, v in s.read_state(list(PARAMS)).items():
            assert np.array_equal(v, snapshot[n]), n
        assert iterations_done(c, s) == 1
        after = float(s.run(feeds=feeds, fetches=["loss"])["loss"])
        assert after < before
        other.run(feeds=feeds)
        assert daemon.proc.poll() is None


def test_tf_graph_create_session_checks(daemon: Daemon) -> None:
    with salus.connect(daemon.endpoint) as c:
        onnx = (MODELS / "mlp.onnx").read_bytes()
        cases = [
            ("onnx and tf_graph", dict(model=onnx, tf_graph=b"\x0a\x00", outputs=["y:0"])),
            ("empty output name", dict(tf_graph=b"\x0a\x00", outputs=["y:0", ""])),
            ("output twice", dict(tf_graph=b"\x0a\x00", outputs=["y:0", "y:0"])),
            ("outputs with onnx", dict(model=onnx, outputs=["y:0"], loss="loss",
                                       inputs={"x": (4, 784), "labels": (4,)})),
        ]
        for what, kw in cases:
            with pytest.raises(salus.SalusError) as e:
                c.create_session(**kw)  # type: ignore[arg-type]
            assert e.value.code == "INVALID_ARGUMENT", f"{what}: {e.value}"
        assert c.sessions() == []


def test_tf_graph_with_nothing_to_fetch_runs(daemon: Daemon) -> None:
    # A step run for its variable updates alone (a tf.function that returns nothing) lists no
    # outputs; its iterations reply with none.
    from test_hostile import tf_const_graph

    with salus.connect(daemon.endpoint) as c:
        s = c.create_session(tf_graph=tf_const_graph("c", [2, 3]))
        assert s.run() == {}
        assert iterations_done(c, s) == 1
        s.close()


def test_tf_graph_that_does_not_parse_is_refused(daemon: Daemon) -> None:
    with salus.connect(daemon.endpoint) as c:
        with pytest.raises(salus.SalusError) as e:
            c.create_session(tf_graph=b"\xff\xfe not a GraphDef \x00" * 8, outputs=["y:0"],
                             inputs={"x": (4, 3)})
        assert e.value.code == "INVALID_ARGUMENT", str(e.value)
        assert c.sessions() == []
        assert daemon.proc.poll() is None
