"""The parameter server's NumPy optimizers follow Keras's, step for step."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from pipeline.errors import ConfigError
from pipeline.train.algorithms import optimizers

CASES = [
    ("adam", {}),
    ("adam", {"learning_rate": 0.01, "beta_1": 0.5, "beta_2": 0.99, "epsilon": 1e-5}),
    ("sgd", {"learning_rate": 0.1}),
    ("sgd", {"learning_rate": 0.1, "momentum": 0.9}),
    ("sgd", {"learning_rate": 0.1, "momentum": 0.9, "nesterov": True}),
]


def _grads(n: int = 6, size: int = 300) -> np.ndarray:
    return np.random.default_rng(3).standard_normal((n, size)).astype(np.float32)


@pytest.mark.parametrize("name, config", CASES)
def test_steps_match_keras(name: str, config: dict) -> None:  # type: ignore[type-arg]
    import keras

    grads = _grads()
    start = np.random.default_rng(4).standard_normal(grads.shape[1]).astype(np.float32)
    var = keras.Variable(start.copy())
    reference = keras.optimizers.get({"class_name": name, "config": config})
    ours, weights = optimizers.get({"class_name": name, "config": config}, start.size), start.copy()
    for g in grads:
        reference.apply_gradients([(keras.ops.convert_to_tensor(g), var)])
        ours.apply(weights, g)
    np.testing.assert_allclose(weights, np.asarray(var), rtol=1e-5, atol=1e-6)
    assert not np.allclose(weights, start)  # it moved


@pytest.mark.parametrize("name, config", CASES)
def test_state_round_trip_continues_the_same_path(name: str, config: dict) -> None:  # type: ignore[type-arg]
    grads = _grads()
    one, w1 = (
        optimizers.get({"class_name": name, "config": config}, grads.shape[1]),
        np.zeros(grads.shape[1], np.float32),
    )
    for g in grads[:3]:
        one.apply(w1, g)
    two, w2 = optimizers.get({"class_name": name, "config": config}, grads.shape[1]), w1.copy()
    two.load_state(one.state())
    for g in grads[3:]:
        one.apply(w1, g)
        two.apply(w2, g)
    assert np.array_equal(w1, w2) and two.iterations == 6


@pytest.mark.parametrize(
    "identifier, match",
    [
        ("rmsprop", "knows \\['adam', 'sgd'\\]. Received: 'rmsprop'"),
        ({"class_name": "Adam", "config": {"amsgrad": True}}, "amsgrad"),
        (
            {"class_name": "Adam", "config": {"learning_rate": {"class_name": "ExponentialDecay"}}},
            "schedules",
        ),
    ],
)
def test_what_the_server_cannot_run_is_a_clear_error(identifier, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=match):
        optimizers.get(identifier, 10)


def test_a_checkpoint_missing_the_moments_is_refused() -> None:
    with pytest.raises(ConfigError, match="Missing: \\['v'\\]"):
        optimizers.Adam(3).load_state({"iterations": np.array(1), "m": np.zeros(3, np.float32)})


def test_a_large_step_in_two_halves_is_the_serial_step_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server updates a large vector in two threads at once; the weights and moments
    must come out exactly as from one thread (each element's operations are the same)."""
    size = optimizers.SPLIT_MIN + 7  # odd: the halves differ by one
    grads = _grads(4, size)
    split = optimizers.Adam(size, learning_rate=0.01)
    w_split = np.zeros(size, np.float32)
    for g in grads:
        split.apply(w_split, g)
    if optimizers._cores() > 1:  # it did run on the helper
        assert optimizers._pool is not None
    monkeypatch.setattr(optimizers, "_helper", lambda: None)
    serial = optimizers.Adam(size, learning_rate=0.01)
    w_serial = np.zeros(size, np.float32)
    for g in grads:
        serial.apply(w_serial, g)
    assert np.array_equal(w_split, w_serial)
    assert np.array_equal(split.m, serial.m) and np.array_equal(split.v, serial.v)


def test_a_forked_child_steps_without_the_parent_s_helper_thread() -> None:
    """A process forked after a large step (as the zygote forks Spark's Python workers) must
    not hand its second half to a helper thread that fork did not copy: it would wait for it
    forever."""
    size = optimizers.SPLIT_MIN
    optimizers.Adam(size).apply(np.zeros(size, np.float32), np.ones(size, np.float32))
    pid = os.fork()
    if pid == 0:  # the child: one step, within the parent's deadline, or a non-zero exit
        code = 1
        try:
            weights = np.zeros(size, np.float32)
            optimizers.Adam(size).apply(weights, np.ones(size, np.float32))
            code = 0 if np.all(weights < 0) else 1  # every weight stepped
        finally:
            os._exit(code)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError("the forked child's step did not finish within 30 s")
