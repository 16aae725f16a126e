"""A start-up that names no engine release sizes for the one installed in this interpreter
(vLLM, else SGLang), says so in the plan's notes, and refuses one it has no rules for; an
explicit ``engine_release`` always wins, and the dry run never looks."""

from __future__ import annotations

import math
from typing import Any, Dict, Optional

import pytest

import memplan
from memplan import UsageError
from memplan._release import installed_release
from memplan.engine import SimDevice, start_up
from sim_engine import MIB, PyEngine

MODEL = "qwen2.5-1.5b-instruct"
KIB = 1 << 10


def _installed(monkeypatch: pytest.MonkeyPatch, versions: Dict[str, str]) -> None:
    def version_of(dist: str) -> Optional[str]:
        return versions.get(dist)

    monkeypatch.setattr("memplan._release._version_of", version_of)


@pytest.mark.parametrize(
    ("versions", "want"),
    [
        ({}, None),
        ({"vllm": "0.28.1"}, ("vllm@0.28.1", "0.28.1")),
        # local builds, pre-releases and four-part versions keep their release part
        ({"vllm": "0.28.1+cu126"}, ("vllm@0.28.1", "0.28.1+cu126")),
        ({"vllm": "0.29.0rc1"}, ("vllm@0.29.0", "0.29.0rc1")),
        ({"vllm": "0.10.1.1"}, ("vllm@0.10.1", "0.10.1.1")),
        ({"sglang": "0.5.23"}, ("sglang@0.5.23", "0.5.23")),
        # both installed: vLLM's
        ({"vllm": "0.19.0", "sglang": "0.5.23"}, ("vllm@0.19.0", "0.19.0")),
        # metadata that is no version: named, with no release
        ({"vllm": "unknown"}, ("vllm", "unknown")),
    ],
)
def test_the_installed_release_is_read_from_package_metadata(
    monkeypatch: pytest.MonkeyPatch, versions: Dict[str, str], want: object
) -> None:
    _installed(monkeypatch, versions)
    assert installed_release() == want


def test_a_start_up_sizes_for_the_installed_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    # vLLM 0.28 made one allocation per layer (`_allocate_kv_cache_tensors`); 0.29 on one
    # backing buffer (`vllm/v1/worker/utils.py` `allocate_kv_cache`): the installed release
    # decides how much allocator rounding the plan keeps room for.
    _installed(monkeypatch, {"vllm": "0.28.1+cu126"})
    dev = SimDevice("sim:l4", private=True)
    plan = start_up(dev, PyEngine(dev), model=MODEL).plan
    assert plan["engine"].startswith("vllm@0.28"), plan["engine"]
    assert plan["sizing_rules"]["kv_allocation"] == "per_tensor"
    assert any("installed in this interpreter" in n and "0.28.1+cu126" in n for n in plan["notes"])


@pytest.mark.parametrize(
    ("version", "allocation"), [("0.5.9", "split_kv"), ("0.5.23", "paired_kv")]
)
def test_a_start_up_sizes_for_the_installed_sglang(
    monkeypatch: pytest.MonkeyPatch, version: str, allocation: str
) -> None:
    # SGLang up to 0.5.22 allocates a K and a V tensor per layer, 0.5.23 K and V as the halves of
    # one where their shapes match (`python/sglang/srt/mem_cache/memory_pool.py`,
    # `MHATokenToKVPool._create_buffers` / `_create_buffers_normal`).
    _installed(monkeypatch, {"sglang": version})
    dev = SimDevice("sim:l4", private=True)
    # SGLang's default of 16,384 batched tokens is more than this simulated engine's
    # activation fits on an L4 beside its weights: vLLM's default for the card.
    eng = PyEngine(dev)
    plan = start_up(dev, eng, model=MODEL, max_num_seqs=256, max_num_batched_tokens=2048).plan
    assert plan["engine"].startswith("sglang@"), plan["engine"]
    assert plan["sizing_rules"]["kv_allocation"] == allocation
    # SGLang sizes its pool from the free memory it reads once its weights are loaded: the
    # start-up plans by that rule and gives the fraction that reaches its cache.
    assert plan["sizing_rules"]["start_check"] == "pool_of_free_after_weights"
    assert plan["suggestions"]["engine_static_fraction"] is not None


def _share(plan: Dict[str, Any]) -> float:
    # The request's share of the device, to the thousandth as --mem-fraction-static is written.
    value: float = plan["request"]["value"]
    return math.ceil(value * 1000 - 1e-6) / 1000


@pytest.mark.parametrize(
    "release", ["sglang@0.4.4", "sglang@0.5.9", "sglang@0.5.14", "sglang@0.5.23"]
)
def test_a_start_up_told_an_sglang_release_gives_the_fraction_its_pool_rule_needs(
    release: str,
) -> None:
    # Every SGLang release memplan knows sizes its pool as the free memory read after the
    # weights less (1 - mem_fraction_static) of the free memory read before them (0.4.4
    # `srt/model_executor/model_runner.py` `profile_max_num_token`; 0.5.9
    # `model_runner_kv_cache_mixin.py` `profile_max_num_token`; 0.5.14
    # `model_runner_kv_cache_mixin.py` `_profile_available_bytes`; 0.5.23
    # `srt/mem_cache/kv_cache_configurator.py` `_profile_available_bytes`). With 8 GiB held by
    # others, the request of 0.9 is above the free memory at the start: the measured start-up
    # keeps the request and gives the fraction whose pool holds the plan's cache. Its engine
    # keeps little beside the weights and the cache (100 MiB of activation, four small
    # graphs), less than the slack the request's share leaves it (0.1 of the 16 GiB free at
    # its start), so that fraction is above the share. The dry run of the same settings reads
    # no free memory after the weights and plans within the request's share of the free
    # memory, its flags writing that share.
    device = "sim:rtx4090,other=8GiB"
    settings: Dict[str, Any] = dict(
        model=MODEL, gpu_memory_utilization=0.9, max_num_seqs=256, max_num_batched_tokens=2048
    )
    dev = SimDevice(device, private=True)
    engine = PyEngine(
        dev, activation=100 * MIB, intermediate_per_token=64 * KIB, sizes=[1, 2, 4, 8]
    )
    measured = start_up(dev, engine, engine_release=release, **settings).plan
    assert measured["engine"].startswith("sglang@"), measured["engine"]
    assert measured["sizing_rules"]["start_check"] == "pool_of_free_after_weights"
    fraction = measured["suggestions"]["engine_static_fraction"]
    assert fraction is not None and _share(measured) < fraction <= 1.0, fraction
    # The request stands: the engine compares none with the free memory.
    request = math.ceil(measured["total_bytes"] * 0.9)
    assert abs(measured["requested_bytes"] - request) <= 1

    dry = memplan.plan(device=device, engine=release, **settings)
    assert dry["engine"] == measured["engine"]
    assert dry["sizing_rules"]["start_check"] == "share_of_free"
    assert dry["suggestions"]["engine_static_fraction"] is None
    assert dry["requested_bytes"] < request
    assert "--mem-fraction-static 0.900 " in dry["engine_args"]["sglang"], dry["engine_args"]
    # Every other rule as the start-up's.
    rules = dict(dry["sizing_rules"], start_check="pool_of_free_after_weights")
    assert rules == measured["sizing_rules"]


def test_a_named_release_wins_over_the_installed_one(monkeypatch: pytest.MonkeyPatch) -> None:
    _installed(monkeypatch, {"vllm": "0.28.1"})
    dev = SimDevice("sim:l4", private=True)
    plan = start_up(dev, PyEngine(dev), model=MODEL, engine_release="vllm@0.34").plan
    assert plan["engine"] == "vllm@0.34"
    assert plan["sizing_rules"]["kv_allocation"] == "one_backing"
    assert not any("installed in this interpreter" in n for n in plan["notes"])


def test_nothing_installed_sizes_for_the_newest_vllm() -> None:
    # conftest's fixture: neither vLLM nor SGLang installed
    dev = SimDevice("sim:l4", private=True)
    plan = start_up(dev, PyEngine(dev), model=MODEL).plan
    assert plan["engine"] == "vllm@0.34"
    assert not any("installed in this interpreter" in n for n in plan["notes"])


@pytest.mark.parametrize("version", ["99.0.0", "0.1.0"])
def test_an_installed_release_without_rules_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    _installed(monkeypatch, {"vllm": version})
    dev = SimDevice("sim:l4", private=True)
    eng = PyEngine(dev)
    with pytest.raises(UsageError) as e:
        start_up(dev, eng, model=MODEL)
    assert f"installed here: vllm {version}" in e.value.message
    assert e.value.envelope["error"]["message"] == e.value.message
    assert e.value.exit_code == 2


def test_metadata_that_is_no_version_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _installed(monkeypatch, {"vllm": "unknown"})
    dev = SimDevice("sim:l4", private=True)
    eng = PyEngine(dev)
    with pytest.raises(UsageError, match="reports version 'unknown'"):
        start_up(dev, eng, model=MODEL)
    # refused before anything ran
    assert eng.calls == []


def test_the_dry_run_does_not_look(monkeypatch: pytest.MonkeyPatch) -> None:
    _installed(monkeypatch, {"vllm": "0.28.1"})
    assert memplan.plan(model=MODEL, device="sim:l4")["engine"] == "vllm@0.34"
