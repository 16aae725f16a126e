"""A start-up that names no engine release sizes for the one installed in this interpreter
(vLLM, else SGLang), says so in the plan's notes, and refuses one it has no rules for; an
explicit ``engine_release`` always wins, and the dry run never looks."""

from __future__ import annotations

from typing import Dict, Optional

import pytest

import memplan
from memplan import UsageError
from memplan._release import installed_release
from memplan.engine import SimDevice, start_up
from sim_engine import PyEngine

MODEL = "qwen2.5-1.5b-instruct"


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
