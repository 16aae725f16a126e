"""Ranks in separate processes: exchange every rank's plan and combine them.

An engine runs one process per GPU. Each rank measures (or plans) its own device; the ranks
then exchange their plans through whatever all-gather the engine already has and combine
them: the engine sizes every rank's KV cache like the rank with the **fewest blocks** (vLLM
takes the minimum over all workers, pipeline stages included:
``vllm/v1/core/kv_cache_planning.py``, ``get_kv_cache_configs``, step 5). Every rank then
maps the combined plan's KV size, so all ranks hold the same number of blocks::

    from memplan.distributed import exchange, exchanger

    # in the start-up: it combines and maps the fewest blocks itself (post-capture too)
    s = start_up(device, engine, model=M, tensor_parallel_size=world,
                 tensor_parallel_rank=rank, exchange=exchanger(comm.allgather, rank=rank))
    s.combined["ranks"]["num_blocks"]                          # what every rank mapped

    # or after it, for an engine that allocates its KV cache itself
    plan = exchange(s.plan, comm.allgather, rank=rank)                   # mpi4py
    plan = exchange(s.plan, dist.all_gather_object, world_size=world)    # torch.distributed
    blocks = plan["ranks"]["num_blocks"]                                 # the same on every rank

The combining is memplan's own (the Rust planner's, through the native module), the same
code a Rust engine calls: the combined plan is the limiting rank's ``memplan.plan/1``
document with ``ranks`` set (how many were combined, the deployment's TP/PP sizes, the
blocks every rank maps, each rank's own figures, which one limits) and, when the ranks differ,
a ``limiting_rank`` warning that names the limiting rank and its device. Each rank maps the
combined blocks in its own block layout (``ranks["per_rank"][i]["mapped_bytes"]``: pipeline
stages hold different layers, so their blocks differ in bytes).

What travels between the ranks is the plan's JSON text (a ``str``): any transport that can
send a string (pickle, MPI, a socket, a Ray object) carries it unchanged.
"""

from __future__ import annotations

import inspect
import json
import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Type, Union

from . import _native
from ._errors import ArgumentTypeError, UsageError, a_type, from_envelope

__all__ = ["combine", "exchange", "exchanger", "AllGather", "PlanLike"]

#: One rank's plan: the dict :func:`memplan.plan` or :func:`memplan.engine.start_up` returns,
#: or its JSON text.
PlanLike = Union[Mapping[str, Any], str]

#: An all-gather: either ``f(obj) -> list`` with every rank's ``obj`` in rank order (mpi4py's
#: ``comm.allgather``, a wrapper over a Ray collective or actor, any plain function), or
#: ``f(output_list, obj) -> None`` filling a list of ``world_size`` slots
#: (``torch.distributed.all_gather_object``).
AllGather = Callable[..., Any]


#: Deeper than any plan is nested (a plan is a few levels deep; memplan's JSON reader stops at
#: 128 levels): a structure this deep, or one that contains itself, is refused by name.
_MAX_DEPTH = 128


def _json_problem(
    value: Any, path: str, depth: int = 0
) -> Optional[Tuple[str, Any, Type[UsageError]]]:
    """The first value under ``value`` that JSON cannot carry as memplan reads it: a float
    that is NaN or infinite (``json.dumps`` would write ``NaN``, which is not JSON), or an
    object of a type JSON has no form for; as ``(key path, value, exception class)``."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, value, UsageError)
    if value is None or isinstance(value, (str, int)):
        return None
    if depth >= _MAX_DEPTH:
        return (path, value, UsageError)
    if isinstance(value, Mapping):
        for k, v in value.items():
            key = json.dumps(k) if isinstance(k, str) else repr(k)
            if not (k is None or isinstance(k, (str, int, float))):
                return (f"{path}[{key}]", k, ArgumentTypeError)
            found = _json_problem(v, f"{path}[{key}]", depth + 1)
            if found is not None:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found = _json_problem(v, f"{path}[{i}]", depth + 1)
            if found is not None:
                return found
        return None
    return (path, value, ArgumentTypeError)


def _as_dict(o: Any) -> Dict[Any, Any]:
    """``json.dumps``'s ``default=``: a mapping that is not a dict, as a dict (nothing else
    reaches here once :func:`_json_problem` found nothing)."""
    if isinstance(o, Mapping):
        return dict(o)
    raise TypeError(f"{type(o).__name__} is not JSON")


def _text(plan: PlanLike, where: str) -> str:
    if isinstance(plan, str):
        return plan
    if isinstance(plan, Mapping):
        problem = _json_problem(plan, "plan")
        if problem is not None:
            path, value, error = problem
            if isinstance(value, float):
                why = f"{path} is {value!r}: NaN and infinity are not numbers memplan can use"
            elif error is UsageError:
                why = f"{path} is nested more than {_MAX_DEPTH} levels deep (or contains itself)"
            else:
                why = f"{path} is {a_type(value)}, which JSON has no form for"
            kind = "type" if error is ArgumentTypeError else "usage"
            raise error(f"{where}: {why}", kind=kind, exit_code=2)
        return json.dumps(plan, allow_nan=False, default=_as_dict)
    raise ArgumentTypeError(
        f"{where}: expected a plan (a dict or its memplan.plan/1 JSON text), got {type(plan).__name__}",
        kind="type",
        exit_code=2,
    )


def combine(plans: Sequence[PlanLike]) -> Dict[str, Any]:
    """Combine every rank's plan, in rank order, into the plan every rank maps.

    The combined plan is the plan of the rank with the fewest KV blocks, with ``ranks``:
    ``count``, the deployment's ``tensor_parallel_size`` and ``pipeline_parallel_size``,
    ``num_blocks`` (what every rank maps), ``per_rank`` (each rank's own figures, in rank
    order) and ``limiting`` (an index in ``per_rank``; ``None`` when every rank fits the same
    blocks, and only then is no ``limiting_rank`` warning given). Each plan is read back
    through the ``memplan.plan/1`` schema first: a plan of another schema version, or one that
    is not a plan, or whose figures disagree with each other, is refused rather than half-read.
    Plans that say which rank they are (measured start-ups, ``memplan plan --pipeline-stage S
    --tensor-parallel-rank R``) may come in any order; plans that do not are the
    tensor-parallel ranks of one stage, in order.

    What is checked, each refusal naming the ranks or the JSON key:

    - every rank of the deployment (``tensor_parallel_size`` x ``pipeline_parallel_size``,
      as the plans' ``rank`` fields state) has exactly one plan: a rank left out or given
      twice is refused (there is no partial combine: a rank left out may have fewer blocks);
    - the plans can be one deployment: the same ``model`` and ``engine`` (where both plans
      name one), ``sizing_rules``, ``kv_spec.dtype``, ``kv_spec.block_size``,
      ``limits.max_model_len`` and kind of ``request`` (and the same bytes of a fixed KV
      cache, ``kv_cache_bytes``); ranks of one pipeline stage the same ``kv_spec``. Devices,
      totals and budgets differ by rank, and so may a utilisation (vllm@0.34's default is each
      device's own free share) and the batch limits (a dry run's defaults are its device's);
    - none is itself a combined plan.

    Raises:
        UsageError: no plans, a plan that is not a valid ``memplan.plan/1`` document (a dict
            holding a float NaN or infinity is refused naming its key path,
            ``plan["kv"]["num_blocks"] is nan``), or plans that cannot be combined (above).
        ArgumentTypeError: ``plans`` is not a sequence of dicts or JSON texts, or a dict holds
            a value JSON has no form for (named by its key path).
    """
    if isinstance(plans, (str, bytes)) or not isinstance(plans, Sequence):
        raise ArgumentTypeError(
            f"combine: expected a sequence of rank plans, got {type(plans).__name__}",
            kind="type",
            exit_code=2,
        )
    if len(plans) == 0:
        raise UsageError(
            "combine: no plans given: pass every rank's plan (one per rank of the deployment)",
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


def exchanger(
    all_gather: AllGather,
    *,
    world_size: Optional[int] = None,
    rank: Optional[int] = None,
) -> Callable[[str], List[str]]:
    """The ``exchange=`` of :func:`memplan.engine.start_up` from the engine's all-gather: a
    function that sends this rank's plan (JSON text) to every rank and returns every rank's,
    in rank order, checked as :func:`exchange` checks them. ``start_up`` then combines the
    plans and maps the combined blocks itself (post-capture too: the KV range is mapped with
    the fewest blocks of any rank)::

        s = start_up(dev, engine, model=M, tensor_parallel_size=world,
                     tensor_parallel_rank=rank, exchange=exchanger(comm.allgather, rank=rank))
        s.combined["ranks"]["num_blocks"]     # what every rank mapped

    Raises:
        ArgumentTypeError: ``all_gather`` is not callable, ``world_size`` is not an int.
        UsageError: ``world_size`` below 1; when called, as :func:`exchange`.
    """
    if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int)):
        raise ArgumentTypeError(
            f"exchange: world_size={world_size!r} is {a_type(world_size)}; it takes a positive int",
            kind="type",
            exit_code=2,
        )
    if world_size is not None and world_size < 1:
        raise UsageError(
            f"exchange: world_size={world_size!r} must be a positive int",
            kind="usage",
            exit_code=2,
        )
    if not callable(all_gather):
        raise ArgumentTypeError(
            f"exchange: all_gather={all_gather!r} is not callable", kind="type", exit_code=2
        )

    def gather(text: str) -> List[str]:
        gathered = _gather(text, all_gather, world_size)
        if world_size is not None and len(gathered) != world_size:
            raise UsageError(
                f"exchange: the all-gather returned {len(gathered)} plans for world_size={world_size}",
                kind="usage",
                exit_code=2,
            )
        texts = [_text(g, f"exchange: rank {i}") for i, g in enumerate(gathered)]
        if rank is not None:
            if not 0 <= rank < len(texts):
                raise UsageError(
                    f"exchange: rank={rank} is outside the {len(texts)} ranks gathered",
                    kind="usage",
                    exit_code=2,
                )
            if texts[rank] != text:
                raise UsageError(
                    f"exchange: the all-gather did not return this rank's plan at index {rank}: "
                    "it must return every rank's object in rank order",
                    kind="usage",
                    exit_code=2,
                )
        return texts

    return gather


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
            ranks, this rank's plan not at ``rank``), or plans that cannot be combined (as
            :func:`combine`).
        ArgumentTypeError: ``plan``, ``all_gather`` or ``world_size`` of the wrong type, or an
            all-gather that returned something other than plans (dicts or JSON text).
    """
    gather = exchanger(all_gather, world_size=world_size, rank=rank)
    return combine(gather(_text(plan, "exchange: plan")))
