"""SimDevice / SimAllocator: the simulated GPU and the PyTorch-like allocator a Python engine
uses in place of torch.cuda, read back through memplan's own probe of the same GPU."""

from __future__ import annotations

import pytest

import memplan
from memplan.engine import SimDevice

MIB = 1 << 20


def test_a_sim_device_has_the_profile_total() -> None:
    dev = SimDevice("sim:rtx4090", private=True)
    listed = {d["id"]: d for d in memplan.devices()}
    assert dev.id == "sim:rtx4090"
    assert dev.total_bytes == listed["sim:rtx4090"]["total_bytes"]


def test_the_allocator_caches_like_pytorch() -> None:
    a = SimDevice("sim:h100-80gb", private=True).allocator()
    base = a.memory_stats()
    assert base == {"reserved": 0, "allocated": 0, "peak_allocated": 0, "peak_reserved": 0}
    b = a.malloc(100 * MIB)
    s = a.memory_stats()
    assert s["allocated"] >= 100 * MIB and s["reserved"] >= s["allocated"]
    a.free(b)
    cached = a.memory_stats()
    assert cached["allocated"] == 0
    assert cached["reserved"] >= 100 * MIB  # freed but cached
    assert cached["peak_allocated"] >= 100 * MIB
    assert cached["peak_reserved"] >= cached["reserved"]
    a.empty_cache()
    a.reset_peak()
    assert a.memory_stats() == {"reserved": 0, "allocated": 0, "peak_allocated": 0, "peak_reserved": 0}


def test_graph_capture_goes_to_a_private_pool() -> None:
    a = SimDevice("sim:rtx4090", private=True).allocator()
    a.begin_graph_capture()
    g = a.end_graph_capture(kernel_nodes=100, intermediate_bytes=64 * MIB)
    assert a.live_graphs == 1
    held = a.memory_stats()["reserved"]
    assert held >= 64 * MIB
    a.destroy_graph(g)
    a.release_private_pools()
    assert a.live_graphs == 0
    assert a.memory_stats()["reserved"] < held


def test_stale_handles_are_usage_errors() -> None:
    a = SimDevice("sim:rtx4090", private=True).allocator()
    b = a.malloc(MIB)
    a.free(b)
    with pytest.raises(memplan.UsageError):
        a.free(b)
    with pytest.raises(memplan.UsageError):
        a.destroy_graph(12345)


def test_out_of_device_memory_is_a_measurement_error() -> None:
    dev = SimDevice("sim:l4", private=True)
    a = dev.allocator()
    with pytest.raises(memplan.MeasurementError) as info:
        a.malloc(2 * (dev.total_bytes or 0))
    assert info.value.kind == "out_of_memory"


def test_an_unknown_or_non_sim_id_is_a_usage_error() -> None:
    with pytest.raises(memplan.UsageError):
        SimDevice("sim:no-such-gpu", private=True)
    with pytest.raises(memplan.UsageError):
        SimDevice("cuda:0")


def test_raw_allocations_sit_outside_the_allocator() -> None:
    dev = SimDevice("sim:rtx4090", private=True)
    a = dev.allocator()
    h = dev.allocate(256 * MIB)
    assert a.memory_stats()["reserved"] == 0
    dev.free(h)
    with pytest.raises(memplan.UsageError):
        dev.free(h)
