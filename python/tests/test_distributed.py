"""Ranks in separate processes (memplan.distributed): each process measures its own simulated
GPU through the engine hooks, the processes exchange their plans over a loopback all-gather,
and every rank maps the combined KV size."""

from __future__ import annotations

import multiprocessing as mp
import queue
from typing import Any, Dict, List, Optional, Tuple

import pytest

import memplan
from memplan.distributed import combine, exchange, exchanger
from memplan.engine import SimDevice, start_up
from loopback import Address, Hub, all_gather, torch_style
from sim_engine import PyEngine

MODEL = "qwen2.5-1.5b-instruct"  # 2 KV heads: tensor parallelism of 2 splits them
# (rank, its own plan, the combined plan, bytes its post-capture KV range mapped, error)
Result = Tuple[int, Optional[Dict[str, Any]], Optional[Dict[str, Any]], Optional[int], Optional[str]]


def _rank(
    rank: int,
    world: int,
    device: str,
    hub: Address,
    authkey: bytes,
    style: str,
    out: "mp.Queue[Result]",
) -> None:
    """One rank's process: start up on its own GPU, exchange, map the combined KV size."""
    try:
        dev = SimDevice(device, private=True)
        gather = all_gather(hub, authkey, rank)
        if style == "start_up":
            # The exchange inside the start-up: post-capture maps the combined blocks.
            eng = PyEngine(dev, post_capture=True)
            s = start_up(
                dev,
                eng,
                model=MODEL,
                gpu_memory_utilization=0.7,
                tensor_parallel_size=world,
                tensor_parallel_rank=rank,
                exchange=exchanger(gather, rank=rank),
            )
            assert s.kv_range is not None and s.combined is not None
            out.put((rank, s.plan, s.combined, s.kv_range.mapped_bytes, None))
            return
        eng = PyEngine(dev)
        s = start_up(
            dev,
            eng,
            model=MODEL,
            gpu_memory_utilization=0.7,
            tensor_parallel_size=world,
            tensor_parallel_rank=rank,
        )
        if style == "torch":
            combined = exchange(s.plan, torch_style(gather), world_size=world, rank=rank)
        else:
            combined = exchange(s.plan, gather, rank=rank)
        # This rank maps the combined blocks in its own layout, next to its weights.
        mine = combined["ranks"]["per_rank"][rank]["mapped_bytes"]
        eng.alloc.malloc(mine)
        out.put((rank, s.plan, combined, mine, None))
    except BaseException as e:
        out.put((rank, None, None, None, f"{type(e).__name__}: {e}"))


def _run_ranks(devices: List[str], style: str) -> List[Result]:
    world = len(devices)
    hub = Hub(world)
    ctx = mp.get_context("spawn")
    out: "mp.Queue[Result]" = ctx.Queue()
    procs = [
        ctx.Process(target=_rank, args=(r, world, d, hub.address, hub.authkey, style, out))
        for r, d in enumerate(devices)
    ]
    for p in procs:
        p.start()
    results: List[Result] = []
    try:
        for _ in procs:
            results.append(out.get(timeout=180))
        failed = [f"rank {r[0]}: {r[4]}" for r in results if r[4] is not None]
        if failed:
            hub.close()
            pytest.fail("; ".join(failed))
        hub.join()
    except queue.Empty:
        pytest.fail("a rank process did not answer within 180 s")
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return sorted(results, key=lambda r: r[0])


@pytest.mark.parametrize("style", ["mpi", "torch", "start_up"])
def test_two_ranks_in_two_processes_map_the_fewest_blocks(style: str) -> None:
    # Rank 1's GPU is a smaller card (23.58 GiB against 23.99 GiB): room for fewer blocks.
    results = _run_ranks(["sim:rtx4090", "sim:rtx3090"], style)
    for rank, _, _, _, err in results:
        assert err is None, f"rank {rank}: {err}"
    own = [r[1] for r in results]
    combined = [r[2] for r in results]
    assert all(p is not None for p in own) and all(c is not None for c in combined)
    blocks = [p["kv"]["num_blocks"] for p in own if p is not None]
    assert blocks[1] < blocks[0], blocks
    # Every rank got the same combined plan: the fewest blocks, rank 1 named as limiting.
    first = combined[0]
    assert first is not None
    assert all(c == first for c in combined)
    assert first["kv"]["num_blocks"] == min(blocks)
    assert first["kv_cache_bytes"] == own[1]["kv_cache_bytes"]  # type: ignore[index]
    ranks = first["ranks"]
    assert (ranks["count"], ranks["limiting"], ranks["num_blocks"]) == (2, 1, min(blocks))
    assert [r["num_blocks"] for r in ranks["per_rank"]] == blocks
    assert first["tensor_parallel_size"] == 2
    # Each process's own plan says which rank it is and reports the deployment's TP size.
    assert [p["rank"]["tensor_parallel_rank"] for p in own if p is not None] == [0, 1]
    assert all(p["tensor_parallel_size"] == 2 for p in own if p is not None)
    # Each rank mapped the fewest blocks in its own layout: rank 0 less than its own plan.
    # Post-capture maps them in whole granules of the device's mapping granularity (2 MiB on
    # the simulated RTX 4090 and 3090): the blocks' bytes, rounded up to less than a granule
    # more; the other styles allocate the blocks' bytes themselves.
    for rank, p, _, mapped, _ in results:
        assert p is not None and mapped is not None
        blocks_bytes = ranks["per_rank"][rank]["mapped_bytes"]
        assert blocks_bytes == min(blocks) * p["kv"]["block_bytes"]
        if style == "start_up":
            assert mapped % (2 << 20) == 0 and 0 <= mapped - blocks_bytes < 2 << 20, mapped
        else:
            assert mapped == blocks_bytes
    assert results[0][3] < own[0]["kv"]["num_blocks"] * own[0]["kv"]["block_bytes"]  # type: ignore[index]
    limiting = [w for w in first["warnings"] if w["code"] == "limiting_rank"]
    assert len(limiting) == 1, first["warnings"]
    assert limiting[0]["rank"] == 1 and "rtx3090" in limiting[0]["device"], limiting


def test_equal_ranks_name_no_limiting_rank() -> None:
    p = memplan.plan(MODEL, "sim:rtx4090", tensor_parallel_size=2)
    c = combine([p, p])
    assert c["kv"]["num_blocks"] == p["kv"]["num_blocks"]
    assert c["ranks"]["count"] == 2 and c["ranks"]["limiting"] is None
    assert all(w["code"] != "limiting_rank" for w in c["warnings"]), c["warnings"]


def test_combine_reads_plans_as_json_text_too() -> None:
    import json

    a = memplan.plan(MODEL, "sim:rtx4090", max_model_len=8192)
    b = memplan.plan(MODEL, "sim:rtx3090", max_model_len=8192)
    c = combine([json.dumps(a), b])
    assert c["kv"]["num_blocks"] == min(a["kv"]["num_blocks"], b["kv"]["num_blocks"])


def test_exchange_refuses_a_broken_all_gather() -> None:
    p = memplan.plan(MODEL, "sim:rtx4090", max_model_len=8192)
    with pytest.raises(memplan.UsageError, match="not a list"):
        exchange(p, lambda obj: obj)
    with pytest.raises(memplan.UsageError, match="2 plans for world_size=3"):
        exchange(p, lambda obj: [obj, obj], world_size=3)
    with pytest.raises(memplan.UsageError, match="needs world_size"):
        exchange(p, torch_style(lambda obj: [obj]))
    other = memplan.plan(MODEL, "sim:rtx3090", max_model_len=8192)
    with pytest.raises(memplan.UsageError, match="at index 1"):
        exchange(p, lambda obj: [obj, other], rank=1)
    with pytest.raises(memplan.UsageError, match="rank=5"):
        exchange(p, lambda obj: [obj], rank=5)
    with pytest.raises(memplan.UsageError, match="world_size"):
        exchange(p, lambda obj: [obj], world_size=0)


def test_combine_refuses_what_is_not_a_plan() -> None:
    p = memplan.plan(MODEL, "sim:rtx4090", max_model_len=8192)
    with pytest.raises(memplan.UsageError):
        combine([])
    with pytest.raises(memplan.UsageError):
        combine([{"schema": "memplan.probe/1"}])
    with pytest.raises(memplan.UsageError):
        combine([dict(p, schema="memplan.plan/2")])
    with pytest.raises(memplan.UsageError):
        combine(["not json"])
    with pytest.raises(memplan.UsageError, match="expected a sequence"):
        combine("not a list")  # a str is a Sequence of str: refused at run time
    with pytest.raises(memplan.UsageError, match="rank 0"):
        combine([42])  # type: ignore[list-item]
