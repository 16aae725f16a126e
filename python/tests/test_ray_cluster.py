"""A deployment plan on a real Ray cluster: three Ray nodes on this machine, loopback only,
started and stopped by the test (also when it fails), GPUs declared as Ray resources and
mapped to simulated memplan devices: two H100s on the driver's node, an A100 next to an A100
where another process holds 12 GiB, and an L4 that another process nearly fills.

Ray is the optional extra (``memplan[ray]``): without it these tests skip, except under CI
or ``cargo xtask python`` (``MEMPLAN_RAY_REQUIRED=1``), which install it and must run them.
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

import memplan
import memplan._cluster
import memplan.ray

MODEL = "llama-3.1-8b-instruct"
GIB = 1 << 30
# Seconds each step may take on a loaded 2-core machine; the whole module is bounded below.
TIMEOUT = 120
SCHEMA = Path(__file__).resolve().parents[2] / "docs" / "schemas" / "cluster.schema.json"

# node: (GPUs declared to Ray, the memplan device of each)
NODES = [
    (2, "sim:h100-80gb sim:h100-80gb"),
    (2, "sim:a100-80gb sim:a100-80gb,other=12GiB"),
    (1, "sim:l4,other=22GiB"),
]


def _ray() -> Any:
    try:
        return importlib.import_module("ray")
    except ImportError:
        if os.environ.get("CI") or os.environ.get("MEMPLAN_RAY_REQUIRED"):
            pytest.fail("CI installs Ray into the test environment: `import ray` failed")
        pytest.skip("Ray is not installed (pip install 'memplan[ray]')")


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """Three Ray nodes on 127.0.0.1 (Ray's own ray.cluster_utils.Cluster), no dashboard;
    yields the head's address and tears everything down on the way out."""
    # conftest.py keeps every Ray process on 127.0.0.1 (set before Ray is imported).
    assert os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == "0"
    ray = _ray()
    cluster_utils = importlib.import_module("ray.cluster_utils")
    # Hard bound: a hang anywhere dumps the stacks and exits; Ray's reaper then kills the
    # nodes this process started.
    faulthandler.dump_traceback_later(600, exit=True)
    tmp = tempfile.mkdtemp(prefix="mp-ray-")
    # Ray writes the head's address to <RAY_TMPDIR or /tmp>/ray/ray_current_cluster whatever
    # temp_dir says, and does not create that folder (ray/_common/utils.py,
    # get_ray_address_file, Ray 2.60): on a fresh machine /tmp/ray does not exist. Everything
    # Ray writes stays under this test's own folder instead, removed on the way out.
    os.makedirs(os.path.join(tmp, "ray"), exist_ok=True)
    saved_tmpdir = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = tmp
    c: Any = None
    try:
        t = time.monotonic()
        for i, (gpus, devices) in enumerate(NODES):
            args: Dict[str, Any] = {
                "num_cpus": 1,
                "num_gpus": gpus,
                "node_ip_address": "127.0.0.1",
                "env_vars": {memplan.ray.DEVICES_ENV: devices},
                "object_store_memory": 80 * 1024 * 1024,
            }
            if i == 0:
                args.update(include_dashboard=False, temp_dir=tmp)
                c = cluster_utils.Cluster(initialize_head=True, head_node_args=args)
            else:
                c.add_node(**args)
        c.wait_for_nodes(timeout=TIMEOUT)
        print(f"ray cluster of {len(NODES)} nodes up in {time.monotonic() - t:.1f} s")
        yield str(c.address)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if c is not None:
            c.shutdown()
        if saved_tmpdir is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved_tmpdir
        shutil.rmtree(tmp, ignore_errors=True)
        faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="module")
def deployment(cluster: str) -> Dict[str, Any]:
    t = time.monotonic()
    d = memplan.ray.plan_cluster(
        MODEL, tp=2, pp=2, address=cluster, layouts=True, timeout=TIMEOUT, max_model_len=8192
    )
    print(f"plan_cluster tp=2 pp=2 with layouts: {time.monotonic() - t:.1f} s")
    return d


def test_combined_kv_is_the_fewest_blocks_of_the_ranks(deployment: Dict[str, Any]) -> None:
    d = deployment
    assert d["fits"], d["why"]
    ranks = d["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert [r["stage"] for r in ranks] == [0, 0, 1, 1]
    blocks = [r["plan"]["kv"]["num_blocks"] for r in ranks]
    assert d["kv_cache_blocks"] == min(blocks) == d["combined"]["kv"]["num_blocks"]
    assert d["kv_cache_tokens"] == d["combined"]["kv_cache_tokens"]
    # Each rank planned its own stage of the layers on its own GPU, at TP 2.
    for r in ranks:
        assert r["plan"]["tensor_parallel_size"] == 2
        assert r["plan"]["device"].startswith(r["device"])
    # Per stage: the fewest blocks among that stage's ranks.
    for s in d["stages"]:
        assert s["kv_cache_blocks"] == min(blocks[i] for i in s["ranks"])


def test_ranks_are_placed_as_vllm_places_its_workers(deployment: Dict[str, Any]) -> None:
    d = deployment
    driver = d["ray"]["driver_node"]
    # PACK puts 4 bundles on the two 2-GPU nodes; the driver's node takes ranks 0 and 1.
    assert [r["node_id"] == driver for r in d["ranks"]] == [True, True, False, False]
    assert {r["device"] for r in d["ranks"][:2]} == {"sim:h100-80gb"}
    assert {r["device"] for r in d["ranks"][2:]} == {"sim:a100-80gb", "sim:a100-80gb,other=12GiB"}
    # The A100 that shares its memory limits the deployment and is named.
    assert d["limiting"] is not None
    assert d["limiting"]["device"] == "sim:a100-80gb,other=12GiB"
    assert d["placement"]["bundles"] == [{"GPU": 1.0}] * 4
    assert "get_bundles_sorted_by_node" in d["placement"]["rule"]


def test_every_gpu_says_what_is_free_and_why(deployment: Dict[str, Any]) -> None:
    d = deployment
    gpus = [g for n in d["nodes"] for g in n["gpus"]]
    assert len(d["nodes"]) == 3 and len(gpus) == 5
    for g in gpus:
        assert g["total_bytes"] > 0 and 0 <= g["free_bytes"] <= g["total_bytes"]
        assert g["capability"]["driver_free"] == "exact"
        assert g["device_source"] == memplan.ray.DEVICES_ENV
    shared = next(g for g in gpus if g["device"] == "sim:a100-80gb,other=12GiB")
    assert shared["in_use_bytes"] >= 12 * GIB and "in use by other processes" in shared["why"]
    # The L4 another process nearly fills cannot host a rank of either stage.
    assert [u["device"] for u in d["unfit_gpus"]] == ["sim:l4,other=22GiB"]
    l4 = next(g for g in gpus if g["device"].startswith("sim:l4"))
    assert l4["rank"] is None and not l4["can_host_rank"]
    assert "stage 0:" in l4["cannot_host_why"]


def test_vllm_flags_and_layouts(deployment: Dict[str, Any]) -> None:
    d = deployment
    flags = d["engine_args"]["vllm"]
    for f in (
        "--tensor-parallel-size 2",
        "--pipeline-parallel-size 2",
        "--distributed-executor-backend ray",
        "--max-model-len 8192",
    ):
        assert f in flags, flags
    lays = d["layouts"]
    fitting = [e for e in lays if e["fits"]]
    assert fitting and all(e["fits"] for e in lays[: len(fitting)])  # fitting ones first
    tokens = [e["kv_cache_tokens"] for e in fitting]
    assert tokens == sorted(tokens, reverse=True)  # best first
    placed = [e for e in lays if e["placement"] == "placed"]
    assert len(placed) == 1 and placed[0]["kv_cache_blocks"] == d["kv_cache_blocks"]
    # 5 free GPUs: a layout of 6 or more ranks cannot fit, and says so.
    assert all(not e["fits"] for e in lays if e["world_size"] > 5)


def test_deployment_plan_matches_its_schema(deployment: Dict[str, Any]) -> None:
    jsonschema = pytest.importorskip("jsonschema")  # a dependency of Ray
    jsonschema.validate(deployment, json.loads(SCHEMA.read_text()))


def test_too_many_ranks_do_not_fit_and_do_not_hang(cluster: str) -> None:
    t = time.monotonic()
    d = memplan.ray.plan_cluster(MODEL, tp=4, pp=2, address=cluster, timeout=TIMEOUT)
    assert not d["fits"] and "needs 8 GPUs; 5 are free" in d["why"]
    assert d["combined"] is None and d["ranks"] == []
    assert len([g for n in d["nodes"] for g in n["gpus"]]) == 5  # still probed
    assert time.monotonic() - t < TIMEOUT


def test_command_line(cluster: str, script: str, deployment: Dict[str, Any]) -> None:
    argv: List[str] = [
        script, "cluster", "--address", cluster, "--model", MODEL, "--tp", "2",
        "--max-model-len", "8192", "--timeout", str(TIMEOUT), "--json",
    ]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["schema"] == "memplan.cluster/1" and d["fits"]
    assert d["layout"] == {"tensor_parallel_size": 2, "pipeline_parallel_size": 1, "world_size": 2}
    assert d["kv_cache_blocks"] == min(r["kv_cache_blocks"] for r in d["ranks"])
    # The text the command prints without --json, from the deployment planned above.
    text = memplan._cluster.render(deployment)
    assert "KV cache:" in text and "vllm serve meta-llama/Llama-3.1-8B-Instruct" in text
    assert "cannot host a rank" in text and "layouts (best first):" in text
