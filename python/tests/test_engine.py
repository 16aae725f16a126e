"""The measured start-up from a Python engine (memplan.engine.start_up) on simulated GPUs:
the hooks are called in the protocol's order, the measured figures are the engine's own
allocations, post-capture hands the KV range over before capture, and failures tear down."""

from __future__ import annotations

from typing import Any, Dict, List

import pytest

import memplan
from memplan.engine import SimDevice, start_up
from sim_engine import GIB, MIB, PyEngine, SyncingEngine

MODEL = "qwen2.5-1.5b-instruct"


def test_start_up_measures_what_the_engine_allocated() -> None:
    dev = SimDevice("sim:rtx4090", private=True)
    eng = PyEngine(dev, weights=3 * GIB, activation=600 * MIB)
    s = start_up(dev, eng, model=MODEL, gpu_memory_utilization=0.9)
    assert s.plan["schema"] == "memplan.plan/1"
    assert s.plan["kv_cache_tokens"] > 0
    # the engine's own figures (8 tensors of 384 MiB; one 600 MiB activation), not memplan's
    assert s.profile["weights_bytes"] == 3 * GIB
    assert s.profile["activation_peak_bytes"] == 600 * MIB
    # the workspace the engine took outside its allocator is non-allocator growth
    assert s.profile["non_allocator_growth"] >= 256 * MIB
    assert s.plan["kv_cache_bytes"] < dev.total_bytes - 3 * GIB  # type: ignore[operator]


def test_hooks_run_in_the_protocols_order() -> None:
    dev = SimDevice("sim:h100-80gb", private=True)
    eng = PyEngine(dev, sizes=[64, 8, 1])
    start_up(dev, eng, model=MODEL, graph_strategy="full")
    c = eng.calls
    # cached memory released before the baseline; weights, then the profile run
    assert c[:3] == ["release_cached", "load_weights", "profile_run"]
    # every capture right after its warm-up; cache released before each capture's baseline
    for size in (64, 8, 1):
        i = c.index(f"capture {size}")
        assert c[i - 2 : i] == [f"warm_up {size}", "release_cached"] or c[i - 1] == f"warm_up {size}"
        assert c.index(f"warm_up {size}") < i
    # full capture is torn down: graphs destroyed, pool released
    last_capture = max(i for i, x in enumerate(c) if x.startswith("capture"))
    teardown = c.index("release_graphs", last_capture)
    assert eng.alloc.live_graphs == 0
    # after it, only warm-ups at odd sizes that are no graph size, each from an emptied cache:
    # this allocator offers no tensors, so the session narrows the bound on its rounding
    for x in c[teardown + 1 :]:
        if x != "release_cached":
            size = int(x.removeprefix("warm_up "))
            assert size % 2 == 1 and size not in (64, 8, 1), x


def test_post_capture_hands_the_kv_range_over_before_capture() -> None:
    dev = SimDevice("sim:rtx4090", private=True)
    eng = PyEngine(dev, post_capture=True)
    s = start_up(dev, eng, model=MODEL)
    assert s.plan["graph"]["strategy"] == "post-capture"
    c = eng.calls
    assert c.index("bind_kv_range") < min(i for i, x in enumerate(c) if x.startswith("capture"))
    kv = s.kv_range
    assert kv is not None and eng.kv_range is not None
    assert kv.address == eng.kv_range[0]  # mapped where the graphs point
    assert 0 < kv.mapped_bytes <= s.plan["kv_cache_bytes"]
    assert len(eng.graphs) == len(eng.sizes)  # post-capture keeps its graphs
    kv.release()
    assert kv.released
    kv.release()  # twice is nothing
    with pytest.raises(memplan.UsageError):
        kv.address


def test_an_engine_without_post_capture_allocates_its_kv_cache_itself() -> None:
    dev = SimDevice("sim:rtx4090", private=True)
    eng = PyEngine(dev)
    s = start_up(dev, eng, model=MODEL)
    assert s.kv_range is None
    assert "bind_kv_range" not in eng.calls
    kv = eng.alloc.malloc(s.plan["kv_cache_bytes"])  # the plan's budget fits
    eng.alloc.free(kv)


@pytest.mark.parametrize("device", ["sim:rx7900xtx-rocm6.2", "sim:arc-a770", "sim:mi300x"])
def test_start_up_on_other_vendors(device: str) -> None:
    dev = SimDevice(device, private=True)
    eng = PyEngine(dev, post_capture=True)
    s = start_up(dev, eng, model=MODEL, gpu_memory_utilization=0.8)
    assert s.plan["kv_cache_tokens"] > 0
    assert s.profile["weights_bytes"] == 3 * GIB
    if s.kv_range is not None:
        s.kv_range.release()


def test_an_engine_exception_is_reraised_after_teardown() -> None:
    dev = SimDevice("sim:rtx4090", private=True)
    eng = PyEngine(dev, fail_capture_at=2)
    with pytest.raises(RuntimeError, match="injected failure"):
        start_up(dev, eng, model=MODEL, graph_strategy="full")
    # The teardown destroys the graphs, then releases what the phase's warm-ups left cached.
    assert eng.calls[-2:] == ["release_graphs", "release_cached"]
    assert eng.alloc.live_graphs == 0
    assert not eng.capturing


def test_a_broken_allocator_view_is_raised_not_read_as_zero() -> None:
    class NoPeak(PyEngine):
        def memory_stats(self) -> Dict[str, int]:
            s = super().memory_stats()
            del s["peak_allocated"]
            return s

    dev = SimDevice("sim:rtx4090", private=True)
    with pytest.raises(memplan.MeasurementError, match="peak_allocated") as info:
        start_up(dev, NoPeak(dev), model=MODEL)
    assert "memory_stats()" in info.value.message


def test_an_allocator_without_a_reserved_peak_is_bounded_and_warned() -> None:
    class NoReservedPeak(PyEngine):
        def memory_stats(self) -> Dict[str, int]:
            s = super().memory_stats()
            del s["peak_reserved"]
            return s

    dev = SimDevice("sim:rtx4090", private=True)
    eng = NoReservedPeak(dev, weights=3 * GIB, activation=600 * MIB + 1)
    s = start_up(dev, eng, model=MODEL, gpu_memory_utilization=0.9)
    # the allocated peak rounded up to the 2 MiB bound, never taken as what was allocated
    assert s.profile["activation_peak_bytes"] == 602 * MIB
    assert "reserved_peak_unreported" in [w["code"] for w in s.plan["warnings"]]


def test_bad_requests_are_usage_errors() -> None:
    dev = SimDevice("sim:rtx4090", private=True)
    with pytest.raises(memplan.UsageError):
        start_up(dev, PyEngine(dev), model=MODEL, gpu_memory_utilization=1.5)
    with pytest.raises(memplan.UsageError):
        start_up(dev, PyEngine(dev), model="no-such-model")
    with pytest.raises(memplan.UsageError):
        start_up(dev, PyEngine(dev), model=MODEL, graph_strategy="no-such-strategy")
    with pytest.raises(memplan.UsageError):
        start_up(42, PyEngine(dev), model=MODEL)


def test_an_unknown_kv_cache_dtype_lists_auto_with_the_dtypes() -> None:
    dev = SimDevice("sim:rtx4090", private=True)
    with pytest.raises(memplan.UsageError) as info:
        start_up(dev, PyEngine(dev), model=MODEL, kv_cache_dtype="fp4")
    assert "expected auto, bf16," in str(info.value)
    # `auto` itself (any case) is the model's dtype, not an error.
    s = start_up(dev, PyEngine(dev), model=MODEL, kv_cache_dtype="AUTO")
    assert s.plan["kv_cache_tokens"] > 0


def test_weights_larger_than_the_device_fail_with_a_memplan_error() -> None:
    dev = SimDevice("sim:l4", private=True)
    eng = PyEngine(dev, weights=64 * GIB)
    with pytest.raises(memplan.MemplanError) as info:
        start_up(dev, eng, model=MODEL)
    assert info.value.kind in ("out_of_memory", "does_not_fit")


def test_a_device_id_opens_the_same_simulated_gpu() -> None:
    dev = SimDevice("sim:a100-80gb,other=1GiB")  # shared: the process-wide GPU of this id
    eng = PyEngine(dev)
    s: Any = start_up("sim:a100-80gb,other=1GiB", eng, model=MODEL)
    assert s.profile["weights_bytes"] == 3 * GIB
    # memplan's own probe of the id sees what the engine holds (weights, workspace)
    free = memplan.probe("sim:a100-80gb,other=1GiB")["memory"]["driver"]["free"]
    held = dev.total_bytes - free
    assert held >= 3 * GIB + 256 * MIB + 1 * GIB


def test_the_readme_example_runs() -> None:
    """python/README.md's example 3, as written."""
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = text.split("### 3. The measured start-up from a Python engine", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    scope: Dict[str, Any] = {}
    exec(compile(code, "README.md example 3", "exec"), scope)
    assert scope["s"].plan["kv_cache_tokens"] > 0
    assert scope["s"].profile["weights_bytes"] == 8 * 384 * MIB


def test_a_device_without_synchronize_uses_the_engines_own() -> None:
    # Level Zero has no device-wide synchronize: memplan waits for the engine's queue first.
    dev = SimDevice("sim:max1550", private=True)
    eng = SyncingEngine(dev)
    s = start_up(dev, eng, model=MODEL, gpu_memory_utilization=0.9)
    codes = [w["code"] for w in s.plan["warnings"]]
    assert "readings_not_synchronized" not in codes
    assert eng.calls.count("synchronize") >= 3
    # the profile run's activation came back before its reading: only the workspace stays
    assert s.profile["non_allocator_growth"] < 256 * MIB + 600 * MIB
    # without the hook memplan says so, and the in-flight activation reads as still held
    dev = SimDevice("sim:max1550", private=True)
    eng2 = PyEngine(dev)
    s = start_up(dev, eng2, model=MODEL, gpu_memory_utilization=0.9)
    assert "readings_not_synchronized" in [w["code"] for w in s.plan["warnings"]]
    assert "synchronize" not in eng2.calls
    assert s.profile["non_allocator_growth"] >= 256 * MIB + 600 * MIB


def test_an_allocator_on_another_gpu_is_refused() -> None:
    # The engine allocates on a private GPU; the start-up would read the shared one of the
    # same id, where none of the engine's memory shows. (An id no other test opens.)
    gpu = "sim:rtx4090,seed=21"
    dev = SimDevice(gpu, private=True)
    eng = PyEngine(dev)
    with pytest.raises(memplan.UsageError, match="allocates on GPU sim:rtx4090,seed=21#"):
        start_up(gpu, eng, model=MODEL)
    assert eng.calls == [], "refused before anything ran"
    # The same GPU through its id, opened once: accepted.
    shared = SimDevice(gpu)
    ok = start_up(gpu, PyEngine(shared), model=MODEL)
    assert ok.plan["consumers"][0]["bytes"] > 0


class TensorEngine(PyEngine):
    """The engine whose allocator offers memplan tensors (``torch.empty`` in a PyTorch
    engine), here from the simulated caching allocator."""

    def __init__(self, device: SimDevice, **kw: Any) -> None:
        super().__init__(device, **kw)
        self.measured: List[int] = []

    def allocate_tensor(self, nbytes: int) -> int:
        self.measured.append(nbytes)
        return self.alloc.malloc(nbytes)

    def free_tensor(self, handle: int) -> None:
        self.alloc.free(handle)


def test_the_kv_allocation_is_measured_through_the_engines_tensors() -> None:
    # Without allocate_tensor nothing measures the engine's later KV allocation, and the
    # start-up says so; with it, the plan's layout is allocated, read and freed, and the blocks
    # handed over fit. The layout is the release's: vLLM up to 0.28 allocates one tensor per
    # layer (gpu_model_runner.py, _allocate_kv_cache_tensors), 0.29.0 on one backing buffer of
    # num_blocks x the block's bytes (vllm/v1/worker/utils.py, allocate_kv_cache).
    dev = SimDevice("sim:rtx4090", private=True)
    s = start_up(dev, PyEngine(dev), model=MODEL, gpu_memory_utilization=0.9)
    codes = [w["code"] for w in s.kv_warnings]
    assert "kv_allocation_unmeasured" in codes
    assert s.kv_blocks == s.plan["kv"]["num_blocks"]

    for release, allocation in (("vllm@0.34", "one_backing"), ("vllm@0.19", "per_tensor")):
        dev = SimDevice("sim:rtx4090", private=True)
        eng = TensorEngine(dev)
        s = start_up(
            dev, eng, model=MODEL, gpu_memory_utilization=0.9, engine_release=release
        )
        assert s.plan["sizing_rules"]["kv_allocation"] == allocation, release
        assert "kv_allocation_unmeasured" not in [w["code"] for w in s.kv_warnings]
        assert 0 < s.kv_blocks <= s.plan["kv"]["num_blocks"]
        block, page = s.plan["kv"]["block_bytes"], s.plan["kv"]["page_bytes"]
        caches = [n for n in eng.measured if n > block]
        assert caches, (release, eng.measured)
        if allocation == "one_backing":
            # Each cache tried is one tensor of whole blocks.
            assert all(n % block == 0 for n in caches), (release, eng.measured)
        else:
            # At least one cache of one tensor per layer, each of whole pages.
            assert len(eng.measured) >= block // page, (release, eng.measured)
            assert all(n % page == 0 for n in caches), (release, eng.measured)
        assert eng.alloc.memory_stats()["allocated"] == eng.weights  # every tensor freed


def test_the_allocator_configuration_is_the_callers_else_this_process_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The engine runs in this process, so its caching allocator reads this process's
    # PYTORCH_ALLOC_CONF: a start-up that states none takes the variable, as PyTorch does.
    for var in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"):
        monkeypatch.delenv(var, raising=False)

    def notes(**kw: Any) -> List[str]:
        dev = SimDevice("sim:rtx4090", private=True)
        s = start_up(dev, PyEngine(dev), model=MODEL, gpu_memory_utilization=0.9, **kw)
        return [n for n in s.plan["notes"] if "caching allocator" in n or "alloc" in n]

    assert not any("expandable" in n for n in notes())
    stated = notes(alloc_conf="expandable_segments:True")
    assert any("alloc_conf=" in n for n in stated), stated
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    read = notes()
    assert any("PYTORCH_CUDA_ALLOC_CONF" in n for n in read), read
    # A malformed value is refused before anything runs, naming the option.
    dev = SimDevice("sim:rtx4090", private=True)
    with pytest.raises(memplan.UsageError, match="expandable_segments"):
        start_up(dev, PyEngine(dev), model=MODEL, alloc_conf="expandable_segments:maybe")
