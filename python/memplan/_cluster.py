"""The deployment plan of :func:`memplan.ray.plan_cluster`, assembled from what the tasks on
every GPU read and planned. Pure Python over plain data (no Ray here), so the placement
rules and the assembly are testable without a cluster.

Placement follows vLLM's Ray executor (vLLM 0.34):

- ``vllm/v1/executor/ray_utils.py``, ``initialize_ray_cluster``: one placement group of
  ``world_size`` bundles ``{"GPU": 1.0}``, strategy ``"PACK"``;
- ``vllm/v1/executor/ray_utils.py``, ``get_bundles_sorted_by_node``: the GPU bundles sorted
  driver's node first, then by node id (a stable sort, so bundle order within a node), and
  ``vllm/v1/executor/ray_executor_v2.py``, ``RayExecutorV2._init_executor``: rank ``r`` is
  the ``r``-th bundle of that order;
- ``vllm/distributed/parallel_state.py``, ``initialize_model_parallel``: ranks laid out
  ``... x PP x TP`` with tensor parallelism fastest, so rank ``r`` is in pipeline stage
  ``r // tp``;
- ``vllm/v1/core/kv_cache_planning.py``, ``get_kv_cache_configs`` (step 5): every worker of
  every stage gets the fewest blocks any worker has room for.
"""

from __future__ import annotations

import shlex
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ._errors import MemplanError
from .distributed import combine

SCHEMA = "memplan.cluster/1"

#: Where the placement rules come from (the engine's own code), repeated in every answer.
PLACEMENT_RULE = (
    "vLLM 0.34 vllm/v1/executor/ray_utils.py initialize_ray_cluster (one {GPU: 1} bundle per "
    "worker, PACK) and get_bundles_sorted_by_node (driver's node first, then node id; rank r "
    "on the r-th bundle, ray_executor_v2.py _init_executor); stage = rank // tp "
    "(vllm/distributed/parallel_state.py initialize_model_parallel)"
)

#: Largest pipeline-parallel size the layout search tries (vLLM deployments use a few stages;
#: each extra size costs one plan per GPU).
MAX_LAYOUT_PP = 16

GIB = float(1 << 30)

#: A GPU's place in the cluster: (placement group, bundle index), the group being "ranks"
#: (the deployment's own, as vLLM creates it) or "rest" (the GPUs left over).
Slot = Tuple[str, int]


def vllm_order(bundle_nodes: Sequence[str], driver_node: str) -> List[int]:
    """Bundle indices in the order vLLM gives them ranks (``get_bundles_sorted_by_node``):
    the driver's node first, then by node id, bundle order within a node."""
    return sorted(
        range(len(bundle_nodes)),
        key=lambda b: (0 if bundle_nodes[b] == driver_node else 1, bundle_nodes[b], b),
    )


def assumed_order(slots: Dict[Slot, str], driver_node: str) -> List[Slot]:
    """Every probed GPU in the order the layout search gives ranks: the deployment's own
    bundles first in vLLM's order, then the rest with vLLM's rule (driver's node first),
    nodes with more free GPUs before smaller ones (Ray's PACK fills as few nodes as it can),
    then by node id."""
    per_node: Dict[str, int] = {}
    for node in slots.values():
        per_node[node] = per_node.get(node, 0) + 1
    return sorted(
        slots,
        key=lambda s: (
            0 if slots[s] == driver_node else 1,
            -per_node[slots[s]],
            slots[s],
            0 if s[0] == "ranks" else 1,
            s[1],
        ),
    )


def layout_candidates(gpus: int, tp: int, pp: int) -> List[Tuple[int, int]]:
    """TP x PP layouts worth trying on ``gpus`` GPUs: tensor-parallel sizes that are powers of
    two (what attention-head counts divide) and the one asked for, pipeline sizes up to
    :data:`MAX_LAYOUT_PP`, at most ``gpus`` ranks; the requested layout always."""
    tps = sorted({1 << i for i in range(gpus.bit_length()) if 1 << i <= gpus} | {tp})
    out = {(tp, pp)}
    for t in tps:
        for p in range(1, min(gpus // t, MAX_LAYOUT_PP) + 1):
            out.add((t, p))
    return sorted(out)


def _gib(b: Optional[int]) -> str:
    return "unknown" if b is None else f"{b / GIB:.2f} GiB"


def reading(probe: Dict[str, Any]) -> Dict[str, Any]:
    """What is free on one GPU and why, from its ``memplan.probe/1`` answer."""
    mem = probe.get("memory", {})
    driver = mem.get("driver", {}) or {}
    total, free = driver.get("total"), driver.get("free")
    available = (mem.get("device") or {}).get("available")
    readings = (probe.get("capability") or {}).get("readings", {}) or {}
    kinds = {k: (v or {}).get("kind") for k, v in readings.items()}
    why: List[str] = []
    if total is not None and free is not None:
        used = total - free
        why.append(
            f"{_gib(free)} free of {_gib(total)}: {_gib(used)} in use by other processes, "
            "driver contexts or graphics"
        )
    if kinds.get("driver_free") not in (None, "exact"):
        why.append(f"the driver's free reading is {kinds.get('driver_free')}")
    if available is not None and free is not None and available != free:
        why.append(f"the device-wide reading says {_gib(available)} available")
    return {
        "name": (probe.get("descriptor") or {}).get("name"),
        "total_bytes": total,
        "free_bytes": free,
        "device_available_bytes": available,
        "in_use_bytes": None if total is None or free is None else total - free,
        "capability": kinds,
        "why": "; ".join(why) or "no free-memory reading on this device",
    }


def _message(err: Any) -> str:
    if isinstance(err, dict):
        return str(err.get("message") or err.get("kind") or err)
    return str(err)


def _where(g: Dict[str, Any]) -> str:
    return f"node {str(g['node_id'])[:8]} GPU {g['gpu']} ({g['device']})"


def spec(tp: int, pp: int, rank: int) -> Dict[str, int]:
    """What global rank ``rank`` of a TP x PP deployment plans: its stage and its
    tensor-parallel rank (tensor parallelism fastest)."""
    return {"tp": tp, "pp": pp, "stage": rank // tp, "tp_rank": rank % tp}


def _plan_of(g: Dict[str, Any], want: Dict[str, int]) -> Tuple[Optional[Dict[str, Any]], str]:
    """The plan this GPU made for ``want`` (a :func:`spec`), or why there is none."""
    if g.get("error"):
        return None, _message(g["error"])
    for p in g.get("plans", []):
        if p["spec"] == want:
            if "plan" in p:
                return p["plan"], ""
            return None, _message(p.get("error"))
    return None, f"not planned for TP {want['tp']} x PP {want['pp']} stage {want['stage']}"


def _combined(
    placed: Sequence[Dict[str, Any]], tp: int, pp: int
) -> Tuple[Optional[Dict[str, Any]], List[Optional[Dict[str, Any]]], List[str]]:
    """Every rank's plan in rank order, the combined plan, and why a rank has none."""
    plans: List[Optional[Dict[str, Any]]] = []
    errors: List[str] = []
    for r, g in enumerate(placed):
        p, why = _plan_of(g, spec(tp, pp, r))
        plans.append(p)
        if p is None:
            errors.append(f"rank {r} on {_where(g)}: {why}")
    if errors or not plans:
        return None, plans, errors
    return combine([p for p in plans if p is not None]), plans, errors


def vllm_flags(combined: Dict[str, Any], plans: Sequence[Dict[str, Any]], pp: int) -> Optional[str]:
    """The vLLM flags of the deployment: the limiting rank's (they pin its KV budget, which
    is the fewest blocks), with pipeline parallelism and the Ray executor; where the stages'
    blocks differ in size (layers split unevenly), ``--num-gpu-blocks-override`` so every
    worker allocates the combined block count rather than its bytes' worth."""
    base = (combined.get("engine_args") or {}).get("vllm")
    if not base:
        return None
    args = shlex.split(base)
    args += ["--pipeline-parallel-size", str(pp), "--distributed-executor-backend", "ray"]
    sizes = {p["kv"]["block_bytes"] for p in plans}
    if len(sizes) > 1:
        args += ["--num-gpu-blocks-override", str(combined["kv"]["num_blocks"])]
    return " ".join(shlex.quote(a) for a in args)


def _tp_within_node(placed: Sequence[Dict[str, Any]], tp: int) -> bool:
    return all(
        len({g["node_id"] for g in placed[i : i + tp]}) == 1 for i in range(0, len(placed), tp)
    )


def _layout(
    ordered: Sequence[Dict[str, Any]], tp: int, pp: int, placement: str
) -> Dict[str, Any]:
    world = tp * pp
    entry: Dict[str, Any] = {
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "world_size": world,
        "placement": placement,
        "fits": False,
        "kv_cache_blocks": None,
        "kv_cache_tokens": None,
        "max_concurrency": None,
        "tp_within_node": None,
        "why": None,
    }
    if world > len(ordered):
        entry["why"] = f"needs {world} GPUs; {len(ordered)} are free in the cluster"
        return entry
    placed = list(ordered[:world])
    entry["tp_within_node"] = _tp_within_node(placed, tp)
    try:
        combined, _, errors = _combined(placed, tp, pp)
    except MemplanError as e:  # a plan set the planner refuses to combine
        entry["why"] = e.message
        return entry
    if combined is None:
        entry["why"] = errors[0] if errors else "no ranks"
        return entry
    entry.update(
        fits=True,
        kv_cache_blocks=combined["kv"]["num_blocks"],
        kv_cache_tokens=combined["kv_cache_tokens"],
        max_concurrency=combined["kv"].get("max_concurrency"),
    )
    return entry


def rank_layouts(entries: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Best first: layouts that fit, then the most KV tokens, tensor parallelism within one
    node, fewer GPUs, then smaller TP."""
    return sorted(
        entries,
        key=lambda e: (
            not e["fits"],
            -(e["kv_cache_tokens"] or 0),
            not e["tp_within_node"],
            e["world_size"],
            e["tensor_parallel_size"],
        ),
    )


def assemble(
    *,
    model: str,
    tp: int,
    pp: int,
    ray_info: Dict[str, Any],
    nodes: Sequence[Dict[str, Any]],
    gpus: Dict[Slot, Dict[str, Any]],
    rank_slots: Optional[Sequence[Slot]],
    order: Sequence[Slot],
    layouts: Optional[Sequence[Tuple[int, int]]],
) -> Dict[str, Any]:
    """The deployment plan (``memplan.cluster/1``).

    Args:
        nodes: the cluster's alive nodes: ``{"node_id", "ip", "gpus_declared"}``.
        gpus: each probed GPU's task answer (:func:`memplan._cluster_task.run`), by slot.
        rank_slots: the deployment's slots in rank order (``None``: it could not be placed).
        order: every slot in the order the layout search gives ranks.
        layouts: the TP x PP layouts to rank, or ``None``.
    """
    world = tp * pp
    driver = ray_info.get("driver_node")
    rank_of = {s: r for r, s in enumerate(rank_slots or [])}
    warnings: List[str] = []
    out_nodes: List[Dict[str, Any]] = []
    unfit: List[Dict[str, Any]] = []
    for n in nodes:
        entries = sorted(
            ((s, g) for s, g in gpus.items() if g["node_id"] == n["node_id"]),
            key=lambda sg: (sg[1]["gpu"] is None, sg[1]["gpu"]),
        )
        out_gpus = []
        for slot, g in entries:
            r = rank_of.get(slot)
            item: Dict[str, Any] = {
                "gpu": g["gpu"],
                "device": g["device"],
                "device_source": g["device_source"],
                "rank": r,
                "stage": None if r is None else r // tp,
                "error": g.get("error"),
            }
            item.update(reading(g["probe"]) if g.get("probe") else reading({}))
            # Its rank's stage; a GPU outside the deployment: every stage (as tensor-parallel
            # rank 0: the figures of a stage's ranks do not depend on which one).
            wants = [spec(tp, pp, r)] if r is not None else [spec(tp, pp, s * tp) for s in range(pp)]
            stages = [w["stage"] for w in wants]
            found = [_plan_of(g, w) for w in wants]
            item["can_host_rank"] = any(p is not None for p, _ in found)
            item["kv_cache_blocks"] = {
                str(s): p["kv"]["num_blocks"] for s, (p, _) in zip(stages, found) if p is not None
            }
            if not item["can_host_rank"]:
                why = "; ".join(
                    f"stage {s}: {w}" if len(stages) > 1 else w for s, (_, w) in zip(stages, found)
                )
                item["cannot_host_why"] = why
                unfit.append(
                    {"node_id": n["node_id"], "gpu": g["gpu"], "device": g["device"], "why": why}
                )
            else:
                item["cannot_host_why"] = None
            out_gpus.append(item)
        busy = int(n.get("gpus_declared", 0)) - len(out_gpus)
        if busy > 0:
            warnings.append(
                f"node {str(n['node_id'])[:8]} ({n.get('ip')}): {busy} of its "
                f"{n.get('gpus_declared')} GPUs are held by other Ray work and were not probed"
            )
        out_nodes.append(
            {
                "node_id": n["node_id"],
                "ip": n.get("ip"),
                "hostname": next((g.get("hostname") for _, g in entries), None),
                "driver": n["node_id"] == driver,
                "gpus_declared": n.get("gpus_declared"),
                "gpus": out_gpus,
            }
        )

    doc: Dict[str, Any] = {
        "schema": SCHEMA,
        "model": model,
        "ray": ray_info,
        "layout": {"tensor_parallel_size": tp, "pipeline_parallel_size": pp, "world_size": world},
        "placement": {
            "bundles": [{"GPU": 1.0}] * world,
            "strategy": "PACK",
            "rule": PLACEMENT_RULE,
        },
        "fits": False,
        "why": None,
        "nodes": out_nodes,
        "ranks": [],
        "stages": [],
        "combined": None,
        "kv_cache_blocks": None,
        "kv_cache_tokens": None,
        "limiting": None,
        "engine_args": {},
        "unfit_gpus": unfit,
        "layouts": None,
        "warnings": warnings,
    }
    if rank_slots is None:
        doc["why"] = (
            f"TP {tp} x PP {pp} needs {world} GPUs; {len(gpus)} are free in the cluster "
            "(vLLM would wait for its placement group and then fail)"
        )
    else:
        placed = [gpus[s] for s in rank_slots]
        try:
            combined, plans, errors = _combined(placed, tp, pp)
        except MemplanError as e:  # the planner refused to combine the ranks' plans
            combined, plans, errors = None, [None] * len(placed), [e.message]
        for r, (g, p) in enumerate(zip(placed, plans)):
            doc["ranks"].append(
                {
                    "rank": r,
                    "stage": r // tp,
                    "tp_rank": r % tp,
                    "node_id": g["node_id"],
                    "gpu": g["gpu"],
                    "device": g["device"],
                    "kv_cache_blocks": None if p is None else p["kv"]["num_blocks"],
                    "maps_bytes": None,
                    "plan": p,
                }
            )
        if not _tp_within_node(placed, tp):
            warnings.append(
                f"a tensor-parallel group of {tp} spans nodes: vLLM warns (ray_utils.py "
                "_verify_bundles) and its all-reduce crosses the network"
            )
        if combined is None:
            doc["why"] = "; ".join(errors)
        else:
            ok = [p for p in plans if p is not None]
            for s in range(pp):
                members = list(range(s * tp, (s + 1) * tp))
                fewest = min(members, key=lambda r: (ok[r]["kv"]["num_blocks"], r))
                differ = any(ok[r]["kv"]["num_blocks"] != ok[fewest]["kv"]["num_blocks"] for r in members)
                doc["stages"].append(
                    {
                        "stage": s,
                        "ranks": members,
                        "kv_cache_blocks": ok[fewest]["kv"]["num_blocks"],
                        "limiting_rank": fewest if differ else None,
                    }
                )
            blocks = combined["kv"]["num_blocks"]
            lim = combined["ranks"]["limiting"]  # index in per_rank, which is in global-rank order
            for entry, own in zip(doc["ranks"], combined["ranks"]["per_rank"]):
                entry["maps_bytes"] = own["mapped_bytes"]
            doc.update(
                fits=True,
                combined=combined,
                kv_cache_blocks=blocks,
                kv_cache_tokens=combined["kv_cache_tokens"],
            )
            if lim is not None:
                g = placed[lim]
                doc["limiting"] = {
                    "rank": lim,
                    "node_id": g["node_id"],
                    "gpu": g["gpu"],
                    "device": g["device"],
                }
            flags = vllm_flags(combined, ok, pp)
            if flags is not None:
                doc["engine_args"]["vllm"] = flags
    if unfit:
        warnings.append(
            f"{len(unfit)} GPU(s) cannot host a rank of this deployment (see unfit_gpus)"
        )
    if layouts is not None:
        ordered = [gpus[s] for s in order]
        searched: Dict[Tuple[int, int], Dict[str, Any]] = {}
        for lt, lp in layouts:
            if (lt, lp) == (tp, pp) and rank_slots is not None:
                searched[(lt, lp)] = _layout([gpus[s] for s in rank_slots], lt, lp, "placed")
            else:
                searched[(lt, lp)] = _layout(ordered, lt, lp, "assumed")
        doc["layouts"] = rank_layouts(searched.values())
    return doc


def plan_specs(
    tp: int,
    pp: int,
    rank: Optional[int],
    position: int,
    layouts: Optional[Sequence[Tuple[int, int]]],
) -> List[Dict[str, int]]:
    """What one GPU plans: its rank's stage (or every stage, for a GPU outside the
    deployment: can it host one?), and for each layout searched, the stage it would hold at
    ``position`` in the search order."""
    specs = [spec(tp, pp, rank)] if rank is not None else [spec(tp, pp, s * tp) for s in range(pp)]
    for t, p in layouts or []:
        if position < t * p and spec(t, p, position) not in specs:
            specs.append(spec(t, p, position))
    return specs


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _span(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}"


def render(doc: Dict[str, Any]) -> str:
    """The deployment plan as text."""
    lay = doc["layout"]
    ray_info = doc["ray"]
    lines = [
        f"memplan cluster: {doc['model']}, TP {lay['tensor_parallel_size']} x PP "
        f"{lay['pipeline_parallel_size']} = {lay['world_size']} ranks on Ray "
        f"{ray_info.get('version')} at {ray_info.get('address')} "
        f"({_count(len(doc['nodes']), 'node')}, "
        f"{_count(sum(len(n['gpus']) for n in doc['nodes']), 'GPU')} probed)",
        "",
    ]
    for n in doc["nodes"]:
        lines.append(
            f"node {str(n['node_id'])[:8]} ({n.get('ip')}{', driver' if n['driver'] else ''})"
        )
        for g in n["gpus"]:
            where = (
                f"rank {g['rank']} (stage {g['stage']})" if g["rank"] is not None else "no rank"
            )
            blocks = ", ".join(f"stage {s}: {b:,} blocks" for s, b in g["kv_cache_blocks"].items())
            lines.append(f"  GPU {g['gpu']}  {g['device']}  {g.get('name') or ''}  {where}  {blocks}")
            lines.append(f"      {g['why']}")
            if g["cannot_host_why"]:
                lines.append(f"      cannot host a rank: {g['cannot_host_why']}")
        if not n["gpus"]:
            lines.append("  (no GPU probed)")
    lines.append("")
    if doc["fits"]:
        c = doc["combined"]
        lim = doc["limiting"]
        limit = (
            f"rank {lim['rank']} limits ({lim['device']} on node {str(lim['node_id'])[:8]})"
            if lim
            else "every rank has the same room"
        )
        lines.append(
            f"KV cache: {doc['kv_cache_blocks']:,} blocks x {c['kv']['block_size']} tokens = "
            f"{doc['kv_cache_tokens']:,} tokens on every rank; {limit}"
        )
        lines.append(
            "stages: "
            + "; ".join(
                f"{s['stage']}: {_span(s['ranks'])}, {s['kv_cache_blocks']:,} blocks"
                for s in doc["stages"]
            )
        )
        if "vllm" in doc["engine_args"]:
            name = c.get("model") or doc["model"]
            lines.append(f"vLLM: vllm serve {name} {doc['engine_args']['vllm']}")
    else:
        lines.append(f"does not fit: {doc['why']}")
    for w in doc["warnings"]:
        lines.append(f"warning: {w}")
    if doc["layouts"] is not None:
        lines.append("")
        lines.append("layouts (best first):")
        for e in doc["layouts"]:
            head = f"  TP {e['tensor_parallel_size']} x PP {e['pipeline_parallel_size']}"
            if e["fits"]:
                lines.append(
                    f"{head}: {e['kv_cache_tokens']:,} tokens ({e['kv_cache_blocks']:,} blocks)"
                    f"{'' if e['tp_within_node'] else ', TP spans nodes'}"
                    f"{' [placed]' if e['placement'] == 'placed' else ''}"
                )
            else:
                lines.append(f"{head}: does not fit: {e['why']}")
    return "\n".join(lines)
