"""One set of defaults: a measured start-up (memplan.engine.start_up) and a dry run
(memplan.plan) of the same model on the same simulated GPU take every unset setting from the
same functions, so their plans differ only by the terms one measured and the other estimated
(the consumers) and by the free memory each started from (the requested bytes)."""

from __future__ import annotations

from typing import Any, Dict

import memplan
from memplan.engine import SimDevice, start_up
from sim_engine import GIB, MIB, PyEngine

MODEL = "qwen2.5-1.5b-instruct"


def _consumers(p: Dict[str, Any]) -> Dict[str, int]:
    return {c["kind"]: c["bytes"] for c in p["consumers"]}


def test_measured_and_dry_run_share_every_default() -> None:
    dev = SimDevice("sim:rtx4090", private=True)
    measured = start_up(dev, PyEngine(dev, weights=3 * GIB, activation=600 * MIB), model=MODEL).plan
    dry = memplan.plan(model=MODEL, device="sim:rtx4090")
    # The same engine release, rules, KV layout (block size included), limits, requests per step.
    for key in ("engine", "sizing_rules", "kv_spec", "limits", "max_num_seqs", "total_bytes"):
        assert measured[key] == dry[key], key
    assert measured["engine"] == "vllm@0.34"
    # The default request is derived from free memory at the start, and both plans say so.
    for p in (measured, dry):
        assert p["request"]["kind"] == "utilization"
        assert any("free memory / total" in n for n in p["notes"]), p["notes"]
    # The KV budgets differ exactly by the named terms: the requested bytes (free at each
    # start) and each consumer (measured here, estimated there).
    m, d = _consumers(measured), _consumers(dry)
    assert set(m) == set(d)
    terms = (measured["requested_bytes"] - dry["requested_bytes"]) - sum(m[k] - d[k] for k in m)
    assert measured["kv_budget_bytes"] - dry["kv_budget_bytes"] == terms


def test_a_release_chosen_on_both_paths_applies_to_both() -> None:
    dev = SimDevice("sim:l4", private=True)
    measured = start_up(dev, PyEngine(dev), model=MODEL, engine_release="vllm@0.19").plan
    dry = memplan.plan(model=MODEL, device="sim:l4", engine="vllm@0.19")
    for key in ("engine", "sizing_rules", "kv_spec", "limits"):
        assert measured[key] == dry[key], key
    # vLLM 0.19's fixed default, no free-memory derivation.
    assert measured["request"] == dry["request"] == {"kind": "utilization", "value": 0.9}
    assert measured["kv_spec"]["block_size"] == 16
