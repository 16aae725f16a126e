"""Running out of memory in a measured start-up says what happened: the step, the bytes asked
for, what the device and the engine's allocator held; and where a dry run of the same
settings refuses too, the start-up raises that refusal (what memplan.plan says)."""

from __future__ import annotations

import pytest

import memplan
from memplan.engine import SimDevice, start_up
from sim_engine import GIB, PyEngine


def test_weights_that_do_not_fit_name_the_step_and_the_sizes() -> None:
    # A small model on paper, an engine that loads 30 GiB on a 24 GiB GPU.
    dev = SimDevice("sim:rtx4090", private=True)
    with pytest.raises(memplan.OutOfMemoryError) as info:
        start_up(dev, PyEngine(dev, weights=30 * GIB), model="qwen2.5-1.5b-instruct")
    e = info.value
    assert isinstance(e, memplan.DoesNotFitError) and isinstance(e, memplan.MeasurementError)
    assert e.message.startswith("load_weights: "), e.message
    assert " free of " in e.message and "held by the engine's allocator" in e.message
    assert e.help["step"] == "load_weights"
    assert e.help["requested_bytes"] > 0
    # The simulated allocator's own error is the cause.
    assert isinstance(e.__cause__, memplan.OutOfMemoryError)


def test_a_model_the_dry_run_refuses_raises_the_dry_runs_refusal() -> None:
    model = "qwen3-32b"  # about 61 GiB of bf16 weights on a 24 GiB GPU
    with pytest.raises(memplan.DoesNotFitError) as dry:
        memplan.plan(model=model, device="sim:rtx4090")
    dev = SimDevice("sim:rtx4090", private=True)
    with pytest.raises(memplan.DoesNotFitError) as measured:
        start_up(dev, PyEngine(dev, weights=61 * GIB), model=model)
    assert not isinstance(measured.value, memplan.OutOfMemoryError)
    assert "load_weights" in measured.value.message
    assert "a dry run of the same settings does not fit either" in measured.value.message
    assert measured.value.kind == dry.value.kind == "does_not_fit"
