"""Plans of several ranks combined (the native combine_plans under memplan.distributed): every
rank gets the fewest blocks,
the combined plan names the deployment, each rank's figures and the limiting rank; plans of
another version or of another deployment are refused."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Union

import pytest

import memplan
from memplan import _native
from memplan._errors import from_envelope
from memplan.engine import SimDevice, start_up
from sim_engine import GIB, PyEngine

MODEL = "qwen2.5-1.5b-instruct"


def combine(plans: List[Union[str, Dict[str, Any]]]) -> Dict[str, Any]:
    code, text = _native.combine_plans([p if isinstance(p, str) else json.dumps(p) for p in plans])
    data: Dict[str, Any] = json.loads(text)
    if code != 0:
        raise from_envelope(code, data)
    return data


def _rank_plan(device: str, rank: int) -> Dict[str, Any]:
    dev = SimDevice(device, private=True)
    s = start_up(
        dev,
        PyEngine(dev, weights=3 * GIB),
        model=MODEL,
        tensor_parallel_size=2,
        tensor_parallel_rank=rank,
    )
    return s.plan


def test_two_ranks_combine_to_the_fewest_blocks() -> None:
    # GPUs of different sizes (40 and 24 GiB): the two fit different numbers of blocks. Two
    # 24 GiB cards a few MiB apart may not: a plan keeps whole allocator granules per layer.
    p0 = _rank_plan("sim:a100-40gb", 0)
    p1 = _rank_plan("sim:l4", 1)
    assert p0["tensor_parallel_size"] == 2 and p0["rank"]["tensor_parallel_rank"] == 0
    c = combine([json.dumps(p1), p0])  # text or dict, any order
    r = c["ranks"]
    assert c["tensor_parallel_size"] == 2 and r["count"] == 2
    blocks = [p0["kv"]["num_blocks"], p1["kv"]["num_blocks"]]
    assert blocks[0] != blocks[1]
    assert r["num_blocks"] == min(blocks) == c["kv"]["num_blocks"]
    assert r["limiting"] == blocks.index(min(blocks))  # per_rank is in rank order
    assert [x["rank"]["tensor_parallel_rank"] for x in r["per_rank"]] == [0, 1]
    assert any(w["code"] == "limiting_rank" for w in c["warnings"])
    assert all(x["mapped_bytes"] == r["num_blocks"] * x["block_bytes"] for x in r["per_rank"])


def test_equal_ranks_name_no_limiting_rank() -> None:
    p0 = _rank_plan("sim:l4", 0)
    p1 = _rank_plan("sim:l4", 1)
    c = combine([p0, p1])
    assert c["ranks"]["limiting"] is None
    assert not any(w["code"] == "limiting_rank" for w in c["warnings"])


def test_bad_plans_are_usage_errors() -> None:
    p0 = _rank_plan("sim:l4", 0)
    newer = dict(p0, schema="memplan.plan/2")
    with pytest.raises(memplan.UsageError, match="version 2"):
        combine([newer])
    with pytest.raises(memplan.UsageError, match="both"):
        combine([p0, p0])
    with pytest.raises(memplan.UsageError, match="not valid JSON"):
        combine(["{"])
    with pytest.raises(memplan.UsageError):
        combine([])


def test_combine_refuses_what_cannot_be_one_deployment() -> None:
    from memplan.distributed import combine as combine_plans

    p0 = _rank_plan("sim:l4", 0)
    p1 = _rank_plan("sim:l4", 1)
    # No plans: said so, not in command-line flags.
    with pytest.raises(memplan.UsageError, match="no plans given") as info:
        combine_plans([])
    assert "--" not in str(info.value)
    # Rank 0 of two alone: rank 1 is named.
    with pytest.raises(memplan.UsageError, match="no plan of rank 1 of 2") as info:
        combine_plans([p0])
    assert "--tensor-parallel-size" not in str(info.value)
    # Another model on rank 1.
    with pytest.raises(memplan.UsageError, match="`model` differs"):
        combine_plans([p0, dict(p1, model="other/model")])
    # A KV figure that is not the sizing of the KV cache granted.
    tampered = dict(p1, kv=dict(p1["kv"], page_bytes=2**63))
    with pytest.raises(memplan.UsageError, match="kv.page_bytes"):
        combine_plans([p0, tampered])
    # Not a plan at all: a TypeError too.
    with pytest.raises(memplan.ArgumentTypeError):
        combine_plans([p0, 1])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        combine_plans("plans")  # a str is a Sequence of str: refused at run time
    assert combine_plans([p1, p0])["ranks"]["count"] == 2


def test_a_rank_maps_the_combined_plan_through_its_exchange() -> None:
    # Rank 1 planned elsewhere (its own process); rank 0's exchange returns both plans.
    p1 = json.dumps(_rank_plan("sim:l4", 1))
    seen = []

    def all_gather(own: str) -> List[str]:
        seen.append(json.loads(own)["rank"]["tensor_parallel_rank"])
        return [own, p1]

    dev = SimDevice("sim:rtx4090", private=True)
    eng = PyEngine(dev, weights=3 * GIB, post_capture=True)
    s = start_up(
        dev, eng, model=MODEL, tensor_parallel_size=2, tensor_parallel_rank=0, exchange=all_gather
    )
    assert seen == [0]
    assert s.combined is not None
    blocks = s.combined["ranks"]["num_blocks"]
    assert blocks == min(s.plan["kv"]["num_blocks"], json.loads(p1)["kv"]["num_blocks"])
    # Post-capture: this rank's range holds exactly the combined blocks (rounded up to 2 MiB).
    assert s.kv_range is not None
    need = blocks * s.plan["kv"]["block_bytes"]
    assert need <= s.kv_range.mapped_bytes < need + (2 << 20)


def test_an_exchange_that_raises_is_reraised_after_teardown() -> None:
    class Lost(Exception):
        pass

    def all_gather(own: str) -> List[str]:
        raise Lost("a rank went away")

    dev = SimDevice("sim:rtx4090", private=True)
    eng = PyEngine(dev, post_capture=True)
    with pytest.raises(Lost):
        start_up(dev, eng, model=MODEL, exchange=all_gather)
    assert eng.alloc.live_graphs == 0, "kept graphs released with the session"
    with pytest.raises(memplan.ArgumentTypeError, match="exchange"):
        start_up(dev, PyEngine(dev), model=MODEL, exchange="all")  # type: ignore[arg-type]
