"""Error mapping: every failure is a MemplanError of the right subclass, with the CLI's exit
code and its JSON error envelope; never a bare RuntimeError, never a panic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import memplan
from memplan import _native
from conftest import DEVICE, MODEL

SCENARIOS = Path(__file__).resolve().parents[2] / "crates" / "memplan-testbed" / "scenarios"


def test_utilization_out_of_range_is_a_usage_error() -> None:
    with pytest.raises(memplan.MemplanError) as info:
        memplan.plan(model=MODEL, device=DEVICE, gpu_memory_utilization=1.5)
    e = info.value
    assert isinstance(e, memplan.UsageError) and isinstance(e, ValueError)
    assert e.exit_code == 2
    assert "1.5" in e.message
    assert e.envelope["schema"] == "memplan.error/1"
    assert e.envelope["error"]["kind"] == e.kind


@pytest.mark.parametrize("value", [0.0, -0.1, float("nan"), float("inf")])
def test_every_utilization_outside_0_1_raises(value: float) -> None:
    with pytest.raises(memplan.UsageError):
        memplan.plan(MODEL, DEVICE, gpu_memory_utilization=value)


def test_unknown_keyword_raises_and_names_it() -> None:
    with pytest.raises(memplan.UsageError) as info:
        memplan.plan(MODEL, DEVICE, gpu_memory_utilisation=0.8)
    assert "gpu_memory_utilisation" in str(info.value)


@pytest.mark.parametrize("key", ["json", "emit_args", "help", "version", "log"])
def test_keywords_the_api_sets_itself_are_refused(key: str) -> None:
    with pytest.raises(memplan.UsageError):
        memplan.plan(MODEL, DEVICE, **{key: True})  # type: ignore[arg-type]


def test_a_value_of_the_wrong_type_is_refused_before_running() -> None:
    with pytest.raises(memplan.UsageError):
        memplan.plan(MODEL, DEVICE, max_model_len={"a": 1})  # type: ignore[arg-type]


def test_unknown_model_device_and_scenario_are_usage_errors() -> None:
    with pytest.raises(memplan.UsageError) as info:
        memplan.plan("no-such-model", DEVICE)
    # says which names exist (in the message or in what still helps)
    assert "qwen2.5-1.5b-instruct" in info.value.message + json.dumps(info.value.help)
    with pytest.raises(memplan.UsageError):
        memplan.plan(MODEL, "sim:no-such-gpu")
    with pytest.raises(memplan.UsageError):
        memplan.probe("sim:no-such-gpu")
    with pytest.raises(memplan.UsageError):
        memplan.simulate("no-such-scenario")
    with pytest.raises(memplan.UsageError):
        memplan.simulate("fp8-24g", strategy="no-such-strategy")


def test_a_scenario_whose_engine_cannot_start_raises_did_not_start(tmp_path: Path) -> None:
    # A shipped scenario whose weights (30 GiB) do not fit its 24 GiB device: no run starts.
    shipped = SCENARIOS / "bf16-24g.toml"
    text = shipped.read_text()
    assert 'weights = "2.88GiB"' in text
    scenario = tmp_path / "too-big.toml"
    scenario.write_text(text.replace('weights = "2.88GiB"', 'weights = "30GiB"'))
    for strategy in (None, "all"):
        with pytest.raises(memplan.MemplanError) as info:
            memplan.simulate(scenario, strategy=strategy)
        e = info.value
        assert e.kind == "did_not_start", e
        assert e.exit_code == 1
        assert not isinstance(e, memplan.UsageError)
        assert "did not start" in e.message and "does not fit on the device" in e.message
        runs = e.help["simulation"]["runs"]
        assert runs and all(isinstance(r["failed"], str) for r in runs)
    # The shipped scenario itself starts: a result, no error.
    assert memplan.simulate(shipped)["runs"]


def test_missing_device_and_total_is_a_usage_error() -> None:
    with pytest.raises(memplan.UsageError) as info:
        memplan.plan(MODEL)
    assert "--total-memory" in info.value.message


def test_a_model_too_large_does_not_fit() -> None:
    with pytest.raises(memplan.DoesNotFitError) as info:
        memplan.plan(MODEL, total_memory="2GiB")
    assert info.value.exit_code == 1
    assert not isinstance(info.value, memplan.UsageError)


def test_a_request_longer_than_the_cache_does_not_fit() -> None:
    with pytest.raises(memplan.DoesNotFitError) as info:
        memplan.plan(MODEL, DEVICE, max_model_len=10_000_000)
    assert info.value.kind == "does_not_fit"
    # what still helps: the longest max_model_len that fits, as a number
    fit = info.value.help["max_model_len_fit"]
    assert 0 < fit < 10_000_000
    assert memplan.plan(MODEL, DEVICE, max_model_len=fit)["kv_cache_tokens"] >= fit


def test_a_backend_without_its_driver_is_a_measurement_error() -> None:
    cuda = [b for b in memplan.backends()["backends"] if b["backend"] == "cuda"]
    if not cuda or cuda[0]["status"] != "unavailable":
        pytest.skip("a CUDA driver is present: no failing backend to provoke")
    with pytest.raises(memplan.MeasurementError) as info:
        memplan.probe("cuda:0")
    assert "libcuda" in info.value.message


def test_a_backend_not_compiled_in_is_a_memplan_error() -> None:
    compiled = {b["backend"] for b in memplan.backends()["backends"]}
    if "xpu" in compiled:
        pytest.skip("this wheel has the xpu backend")
    with pytest.raises(memplan.MemplanError) as info:
        memplan.probe("xpu:0")
    assert "--features xpu" in info.value.message


def test_a_panic_never_crosses_the_boundary() -> None:
    # the same guard that wraps every call; a panic becomes an `internal` envelope
    code, text = _native._panic_for_test("boom")
    e = memplan._errors.from_envelope(code, json.loads(text))
    assert isinstance(e, memplan.InternalError)
    assert e.kind == "internal" and "boom" in e.message


def test_output_that_is_no_envelope_is_an_internal_error() -> None:
    e = memplan._errors.from_envelope(1, "not an envelope")
    assert isinstance(e, memplan.InternalError)


def test_every_error_class_is_a_memplan_error() -> None:
    for cls in (
        memplan.UsageError,
        memplan.MeasurementError,
        memplan.DoesNotFitError,
        memplan.InternalError,
    ):
        assert issubclass(cls, memplan.MemplanError)
        assert not issubclass(cls, RuntimeError)
