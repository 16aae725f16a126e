"""The deployment plan's rules without a cluster: vLLM's rank order, the layouts searched,
the assembly over real plans of simulated GPUs, and the errors when Ray or the cluster is
missing. (tests/test_ray_cluster.py runs the whole thing on a local Ray cluster.)"""

from __future__ import annotations

import importlib
import os
import socket
import sys
import time
from typing import Any, Dict, List, Optional

import pytest

import memplan
from memplan import _cluster, _cluster_cli, _cluster_task

MODEL = "llama-3.1-8b-instruct"


def test_ranks_follow_vllms_bundle_order() -> None:
    # The example in vLLM's own get_bundles_sorted_by_node docstring (vllm 0.34,
    # vllm/v1/executor/ray_utils.py): driver on node-A, bundles spread over A, B, C.
    nodes = ["node-C", "node-A", "node-B", "node-C", "node-A", "node-B"]
    assert _cluster.vllm_order(nodes, "node-A") == [1, 4, 2, 5, 0, 3]
    # Tensor parallelism fastest: rank r is in stage r // tp.
    specs = _cluster.plan_specs(4, 2, 5, 5, None)
    assert specs == [{"tp": 4, "pp": 2, "stage": 1, "tp_rank": 1}]
    # A GPU outside the deployment plans every stage (can it host one?).
    assert _cluster.plan_specs(2, 3, None, 7, None) == [
        {"tp": 2, "pp": 3, "stage": s, "tp_rank": 0} for s in range(3)
    ]
    # With the layout search, the stage and rank it would hold at its place in the order.
    assert {"tp": 2, "pp": 2, "stage": 1, "tp_rank": 1} in _cluster.plan_specs(
        1, 1, None, 3, [(2, 2), (4, 1)]
    )


def test_layout_search_and_order() -> None:
    c = _cluster.layout_candidates(5, 2, 2)
    assert (2, 2) in c and (1, 5) in c and (4, 1) in c
    assert all(t * p <= 5 for t, p in c)
    assert all(t & (t - 1) == 0 for t, _ in c)
    # The layout asked for is searched even when it cannot fit.
    assert (8, 2) in _cluster.layout_candidates(5, 8, 2)
    # The driver's node first, then bigger nodes, then node id.
    slots = {("rest", 0): "b", ("rest", 1): "c", ("rest", 2): "c", ("ranks", 0): "a"}
    assert _cluster.assumed_order(slots, "a") == [
        ("ranks", 0),
        ("rest", 1),
        ("rest", 2),
        ("rest", 0),
    ]


def _answer(node: str, gpu: int, device: str, specs: List[Dict[str, int]]) -> Dict[str, Any]:
    """What the task on one GPU answers, from real memplan calls on a simulated device."""
    return {
        "bundle": ["ranks", gpu],
        "node_id": node,
        "node_ip": "127.0.0.1",
        "hostname": "test",
        "gpu": gpu,
        "device": device,
        "device_source": _cluster_task.DEVICES_ENV,
        "probe": memplan.probe(device),
        "error": None,
        "plans": [_cluster_task._plan(device, MODEL, ["--max-model-len=8192"], s) for s in specs],
    }


def test_assembly_combines_the_ranks_by_the_fewest_blocks() -> None:
    devices = {
        ("ranks", 0): ("n1", 0, "sim:h100-80gb"),
        ("ranks", 1): ("n1", 1, "sim:h100-80gb,other=20GiB"),
        ("rest", 0): ("n2", 0, "sim:l4,other=22GiB"),
    }
    rank_slots: List[_cluster.Slot] = [("ranks", 0), ("ranks", 1)]
    gpus = {}
    for slot, (node, gpu, dev) in devices.items():
        rank: Optional[int] = rank_slots.index(slot) if slot in rank_slots else None
        gpus[slot] = _answer(node, gpu, dev, _cluster.plan_specs(1, 2, rank, 0, None))
    doc = _cluster.assemble(
        model=MODEL,
        tp=1,
        pp=2,
        ray_info={"driver_node": "n1", "address": "test", "version": "test"},
        nodes=[
            {"node_id": "n1", "ip": "127.0.0.1", "gpus_declared": 2},
            {"node_id": "n2", "ip": "127.0.0.2", "gpus_declared": 2},
        ],
        gpus=gpus,
        rank_slots=rank_slots,
        order=list(devices),
        layouts=None,
    )
    assert doc["schema"] == "memplan.cluster/1" and doc["fits"], doc["why"]
    blocks = [r["kv_cache_blocks"] for r in doc["ranks"]]
    assert doc["kv_cache_blocks"] == min(blocks) == doc["combined"]["kv"]["num_blocks"]
    assert [r["stage"] for r in doc["ranks"]] == [0, 1]
    # rank 1 has 20 GiB less room: it limits, and is named
    assert doc["limiting"] is not None and doc["limiting"]["rank"] == 1
    n1 = doc["nodes"][0]["gpus"]
    assert n1[1]["in_use_bytes"] > 20 * (1 << 30) and "20." in n1[1]["why"]
    # the L4 with 22 GiB taken cannot host either stage, and says why
    assert [u["device"] for u in doc["unfit_gpus"]] == ["sim:l4,other=22GiB"]
    assert "stage 0:" in doc["unfit_gpus"][0]["why"] and "stage 1:" in doc["unfit_gpus"][0]["why"]
    # node n2 declared 2 GPUs but only 1 was free
    assert any("held by other Ray work" in w for w in doc["warnings"])
    flags = doc["engine_args"]["vllm"]
    assert "--pipeline-parallel-size 2" in flags and "--distributed-executor-backend ray" in flags
    assert "--tensor-parallel-size 1" in flags
    text = _cluster.render(doc)
    assert "rank 1 limits" in text and "cannot host a rank" in text


def test_no_ray_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import memplan.ray

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(memplan.ClusterError, match=r"pip install 'memplan\[ray\]'") as e:
        memplan.ray.plan_cluster(MODEL, tp=1)
    assert e.value.kind == "ray_not_installed"


def test_no_cluster_is_a_clear_error_and_quick() -> None:
    try:
        importlib.import_module("ray")  # untyped here: mypy need not read Ray
    except ImportError:
        if os.environ.get("CI") or os.environ.get("MEMPLAN_RAY_REQUIRED"):
            pytest.fail("CI installs Ray into the test environment: `import ray` failed")
        pytest.skip("Ray is not installed")
    import memplan.ray

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = time.monotonic()
    with pytest.raises(memplan.ClusterError, match=f"no Ray cluster answers at 127.0.0.1:{port}") as e:
        memplan.ray.plan_cluster(MODEL, address=f"127.0.0.1:{port}", timeout=20)
    assert e.value.kind == "cluster_unreachable"
    assert time.monotonic() - t < 20


def test_bad_input_is_refused_before_the_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    import memplan.ray

    with pytest.raises(memplan.UsageError, match="tp=0"):
        memplan.ray.plan_cluster(MODEL, tp=0)
    with pytest.raises(memplan.UsageError, match="device="):
        memplan.ray.plan_cluster(MODEL, device="sim:h100-80gb")
    with pytest.raises(memplan.UsageError, match="--model"):
        memplan.ray.plan_cluster("no-such-model")
    with pytest.raises(memplan.UsageError, match="timeout"):
        memplan.ray.plan_cluster(MODEL, timeout=-1)
    # The command line: usage errors exit 2, naming the problem.
    assert _cluster_cli.main(["--tp", "2"]) == 2
    assert "--model" in capsys.readouterr().err
    assert memplan.main(["cluster", "--model", MODEL, "--max-model-len", "-5"]) == 2
    assert memplan.main(["cluster", "--help"]) == 0
    assert "MEMPLAN_RAY_DEVICES" in capsys.readouterr().out


def test_uneven_stages_pin_the_block_count_for_vllm() -> None:
    # 32 layers on 3 stages: [11, 11, 10] layers, so the last stage's blocks are smaller and
    # vLLM would give it more blocks for the same bytes: the flags pin the block count.
    devices = ["sim:h100-80gb", "sim:a100-80gb", "sim:h100-80gb,other=30GiB"]
    gpus = {
        ("ranks", r): _answer("n1", r, d, _cluster.plan_specs(1, 3, r, r, None))
        for r, d in enumerate(devices)
    }
    doc = _cluster.assemble(
        model=MODEL,
        tp=1,
        pp=3,
        ray_info={"driver_node": "n1", "address": "test", "version": "test"},
        nodes=[{"node_id": "n1", "ip": "127.0.0.1", "gpus_declared": 3}],
        gpus=gpus,
        rank_slots=list(gpus),
        order=list(gpus),
        layouts=[(1, 3), (1, 2), (2, 1), (1, 4)],
    )
    assert doc["fits"], doc["why"]
    sizes = {r["plan"]["kv"]["block_bytes"] for r in doc["ranks"]}
    assert len(sizes) == 2
    blocks = doc["kv_cache_blocks"]
    assert blocks == min(r["kv_cache_blocks"] for r in doc["ranks"])
    assert f"--num-gpu-blocks-override {blocks}" in doc["engine_args"]["vllm"]
    # every rank maps the same blocks, each in its own layout
    for r in doc["ranks"]:
        assert r["maps_bytes"] == blocks * r["plan"]["kv"]["block_bytes"]
    assert doc["limiting"] is not None and doc["limiting"]["rank"] == 2
    lays = doc["layouts"]
    assert [(e["tensor_parallel_size"], e["pipeline_parallel_size"]) for e in lays][-1] == (1, 4)
    assert not lays[-1]["fits"] and "needs 4 GPUs; 3 are free" in lays[-1]["why"]
    assert next(e for e in lays if e["placement"] == "placed")["kv_cache_blocks"] == blocks


def test_each_gpu_finds_its_device(monkeypatch: pytest.MonkeyPatch) -> None:
    mapped = _cluster_task._mapped
    assert mapped(1, "sim:h100-80gb  sim:a100-80gb,other=4GiB") == ("sim:a100-80gb,other=4GiB", None)
    device, err = mapped(2, "sim:h100-80gb sim:a100-80gb")
    assert device is None and err is not None and "lists 2 device(s)" in err["message"]
    # Ray narrows the visible devices to the task's GPU: the ordinal is its place there.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    assert _cluster_task._ordinal("cuda", 3) == 1
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert _cluster_task._ordinal("cuda", 3) == 3
    monkeypatch.setenv("ZE_AFFINITY_MASK", "2")
    assert _cluster_task._ordinal("xpu", 2) == 0
    # Without the map and without a GPU backend here: an error naming both, never a guess.
    if not any(
        b["status"] == "available" and b.get("devices") and b["backend"] != "sim"
        for b in memplan.backends()["backends"]
    ):
        device, err = _cluster_task._real(0)
        assert device is None and err is not None
        assert _cluster_task.DEVICES_ENV in err["message"] and "cuda" in err["message"]
