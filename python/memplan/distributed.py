"""Ranks in separate processes: exchange every rank's plan and combine them.

An engine runs one process per GPU. Each rank measures (or plans) its own device; the ranks
then exchange their plans through whatever all-gather the engine already has and combine
them: the engine sizes every rank's KV cache like the rank with the **fewest blocks** (vLLM
takes the minimum over all workers, pipeline stages included:
``vllm/v1/core/kv_cache_planning.py``, ``get_kv_cache_configs``, step 5). Every rank then
maps the combined plan's KV size, so all ranks hold the same number of blocks::

    from memplan.distributed import exchange

    s = start_up(device, engine, model=M, tensor_parallel_size=world)   # this rank's plan
    plan = exchange(s.plan, comm.allgather)                              # mpi4py
    plan = exchange(s.plan, dist.all_gather_object, world_size=world)    # torch.distributed
    kv_bytes = plan["kv_cache_bytes"]                                    # the same on every rank

The combining is memplan's own (the Rust planner's, through the native module), the same
code a Rust engine calls: the combined plan is the limiting rank's ``memplan.plan/1``
document with ``ranks`` set (how many were combined, which one limits) and, when the ranks
differ, a ``limiting_rank`` warning that names the limiting rank and its device.

What travels between the ranks is the plan's JSON text (a ``str``): any transport that can
send a string (pickle, MPI, a socket, a Ray object) carries it unchanged.
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from . import _native
from ._errors import UsageError, from_envelope

__all__ = ["combine", "exchange", "AllGather", "PlanLike"]

#: One rank's plan: the dict :func:`memplan.plan` or :func:`memplan.engine.start_up` returns,
#: or its JSON text.
PlanLike = Union[Mapping[str, Any], str]

#: An all-gather: either ``f(obj) -> list`` with every rank's ``obj`` in rank order (mpi4py's
#: ``comm.allgather``, a wrapper over a Ray collective or actor, any plain function), or
#: ``f(output_list, obj) -> None`` filling a list of ``world_size`` slots
#: (``torch.distributed.all_gather_object``).
AllGather = Callable[..., Any]


def _text(plan: PlanLike, where: str) -> str:
    if isinstance(plan, str):
        return plan
    if isinstance(plan, Mapping):
        return json.dumps(plan)
    raise UsageError(
        f"{where}: expected a plan (a dict or its memplan.plan/1 JSON text), got {type(plan).__name__}",
        kind="usage",
        exit_code=2,
    )


def combine(plans: Sequence[PlanLike]) -> Dict[str, Any]:
    """Combine every rank's plan, in rank order, into the plan every rank maps.

    The combined plan is the plan of the rank with the fewest KV blocks (the first such rank
    on a tie), with ``ranks`` = ``{"count": len(plans), "limiting": i}``; when there is more
    than one rank, a ``limiting_rank`` warning names rank ``i`` and its device. Each plan is
    read back through the ``memplan.plan/1`` schema first: a plan of another schema version,
    or one that is not a plan, is refused rather than half-read.

    Raises:
        UsageError: no plans, a plan that is not a ``memplan.plan/1`` document, or plans
            that cannot be combined (different models or KV layouts).
    """
    if isinstance(plans, (str, bytes)) or not isinstance(plans, Sequence):
        raise UsageError(
            f"combine: expected a sequence of rank plans, got {type(plans).__name__}",
            kind="usage",
            exit_code=2,
        )
    texts = [_text(p, f"combine: rank {i}") for i, p in enumerate(plans)]
    code, out = _native.combine_plans(texts)
    data = json.loads(out)
    if code != 0:
        raise from_envelope(code, data)
    result: Dict[str, Any] = data
    return result


def _is_torch_style(all_gather: AllGather) -> bool:
    """Whether ``all_gather`` takes ``(output_list, obj)`` (torch's ``all_gather_object``)
    rather than ``(obj)`` (MPI's ``allgather``): by its required positional parameters.
    A callable whose signature cannot be read (a C extension's method) is taken as MPI's."""
    try:
        sig = inspect.signature(all_gather)
    except (TypeError, ValueError):
        return False
    required = [
        p
        for p in sig.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    return len(required) >= 2


def _gather(text: str, all_gather: AllGather, world_size: Optional[int]) -> List[Any]:
    if _is_torch_style(all_gather):
        if world_size is None:
            raise UsageError(
                "exchange: an all-gather that fills an output list (torch.distributed."
                "all_gather_object) needs world_size= (torch.distributed.get_world_size())",
                kind="usage",
                exit_code=2,
            )
        out: List[Any] = [None] * world_size
        all_gather(out, text)
        return out
    got = all_gather(text)
    if isinstance(got, (str, bytes)) or not isinstance(got, Sequence):
        raise UsageError(
            f"exchange: the all-gather returned {type(got).__name__}, not a list of every "
            "rank's plan in rank order",
            kind="usage",
            exit_code=2,
        )
    return list(got)


def exchange(
    plan: PlanLike,
    all_gather: AllGather,
    *,
    world_size: Optional[int] = None,
    rank: Optional[int] = None,
) -> Dict[str, Any]:
    """Send this rank's ``plan`` to every rank with ``all_gather`` and return the combined
    plan (:func:`combine` over every rank's plan, in rank order). Every rank calls it with
    its own plan and gets the same answer.

    Args:
        plan: this rank's plan (a dict, or its JSON text).
        all_gather: the engine's all-gather (:data:`AllGather`): ``comm.allgather`` (mpi4py),
            ``torch.distributed.all_gather_object`` (with ``world_size``), or any function
            that returns every rank's object in rank order.
        world_size: the number of ranks: required for an all-gather that fills an output
            list; otherwise checked against what the all-gather returned.
        rank: this rank's index: when given, checked to be where this rank's plan came back
            (an all-gather that reorders ranks would name the wrong limiting rank).

    Raises:
        UsageError: a malformed answer from the all-gather (not a list, the wrong number of
            ranks, this rank's plan not at ``rank``), or plans that cannot be combined.
    """
    if world_size is not None and (isinstance(world_size, bool) or world_size < 1):
        raise UsageError(
            f"exchange: world_size={world_size!r} must be a positive int",
            kind="usage",
            exit_code=2,
        )
    text = _text(plan, "exchange: plan")
    gathered = _gather(text, all_gather, world_size)
    if world_size is not None and len(gathered) != world_size:
        raise UsageError(
            f"exchange: the all-gather returned {len(gathered)} plans for world_size={world_size}",
            kind="usage",
            exit_code=2,
        )
    if rank is not None:
        if not 0 <= rank < len(gathered):
            raise UsageError(
                f"exchange: rank={rank} is outside the {len(gathered)} ranks gathered",
                kind="usage",
                exit_code=2,
            )
        if _text(gathered[rank], f"exchange: rank {rank}") != text:
            raise UsageError(
                f"exchange: the all-gather did not return this rank's plan at index {rank}: "
                "it must return every rank's object in rank order",
                kind="usage",
                exit_code=2,
            )
    return combine(gathered)
