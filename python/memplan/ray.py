"""A multi-node deployment plan on a running Ray cluster (``pip install 'memplan[ray]'``).

:func:`plan_cluster` (and ``memplan cluster`` on the command line) runs a probe/plan task on
every free GPU of the cluster, placed as vLLM's Ray executor places its workers: a placement
group of one ``{"GPU": 1}`` bundle per rank, strategy ``PACK``, ranks given to the bundles
driver's node first, then by node id (vLLM 0.34 ``vllm/v1/executor/ray_utils.py``:
``initialize_ray_cluster``, ``get_bundles_sorted_by_node``). Each task finds its GPU's memplan
device, probes it (free, total, the device-wide reading, the capability, what others hold)
and plans the model's pipeline stage that rank holds; the driver combines the ranks by the
fewest blocks (memplan's own combine, :func:`memplan.distributed.combine`) and returns the
deployment plan::

    import memplan.ray
    d = memplan.ray.plan_cluster("llama-3.1-70b-instruct", tp=8, pp=2,
                                 address="ray://head:10001", max_model_len=32768)
    d["kv_cache_tokens"], d["engine_args"]["vllm"], d["unfit_gpus"]

GPUs left over after the deployment's placement group are probed too (can they host a rank,
and why not), and with ``layouts=True`` every TP x PP layout that fits the cluster is
ranked, best first.

Simulated GPUs: a node declares GPUs to Ray as usual (``ray start --num-gpus 2``) and maps
each to a memplan device with ``MEMPLAN_RAY_DEVICES`` in the environment ``ray start`` runs
in (``"sim:h100-80gb sim:h100-80gb,other=20GiB"``: GPU 0, GPU 1, whitespace-separated).
Without it, a GPU is the real device Ray assigned (``cuda:N``, ``rocm:N``, ``xpu:N``);
see :mod:`memplan._cluster_task`.

Ray is imported only when a function here runs; without it, or without a cluster at the
address, :class:`memplan.ClusterError` says so.
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import threading
import time
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from . import FlagValue, _flag_args, _run
from . import _cluster, _cluster_task
from ._errors import ClusterError, DoesNotFitError, UsageError

__all__ = ["plan_cluster", "DEVICES_ENV", "RAY_VERSION"]

#: The node environment variable that maps a node's GPUs to memplan devices.
DEVICES_ENV = _cluster_task.DEVICES_ENV

#: The Ray release the ``ray`` extra pins and CI tests (pyproject.toml).
RAY_VERSION = "2.60.0"

# Flags plan_cluster sets per rank itself.
_OWN_FLAGS = frozenset(
    {"device", "total_memory", "tensor_parallel_size", "pipeline_parallel_size", "pipeline_stage"}
)


def _ray() -> Any:
    """The ``ray`` module (untyped: Ray ships no complete type information), or a
    :class:`ClusterError` saying how to install it."""
    try:
        return importlib.import_module("ray")
    except ImportError as e:
        raise ClusterError(
            f"Ray is not installed ({e}): pip install 'memplan[ray]' on the driver and on every "
            "node of the cluster",
            kind="ray_not_installed",
        ) from None


def _host_port(address: str) -> Optional[Tuple[str, int]]:
    rest = address.split("://", 1)[-1]
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]") or "127.0.0.1", int(port)


def _check_reachable(address: str, timeout: float) -> None:
    """Fail fast, with the address, where nothing listens (Ray itself retries for a minute)."""
    hp = _host_port(address)
    if hp is None:
        return
    try:
        socket.create_connection(hp, timeout=min(timeout, 10.0)).close()
    except OSError as e:
        raise ClusterError(
            f"no Ray cluster answers at {address} ({e}): start one (`ray start --head`) or pass "
            "the head's address (`ray://HEAD:10001` for Ray Client, `HEAD:6379` on a node of "
            "the cluster)",
            kind="cluster_unreachable",
        ) from None


class _DropMessage(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def _init_bounded(ray: Any, address: str, kwargs: Dict[str, Any], timeout: float) -> None:
    """``ray.init`` within ``timeout`` seconds. Ray retries a silent GCS for many minutes
    (20 attempts of ~40 s); a connection that does not come up in time is an error here, and
    the attempt is left to Ray's own retries in a daemon thread."""
    box: Dict[str, BaseException] = {}

    def connect() -> None:
        try:
            ray.init(address=address, **kwargs)
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e

    # Off the main thread Ray cannot install its SIGTERM handler and says so; the driver here
    # lives for one plan, so the notice is noise to the user.
    quiet = _DropMessage("SIGTERM handler is not set")
    log = logging.getLogger("ray._private.worker")
    log.addFilter(quiet)
    t = threading.Thread(target=connect, name="memplan-ray-init", daemon=True)
    t.start()
    t.join(timeout)
    log.removeFilter(quiet)
    if t.is_alive():
        raise ClusterError(
            f"Ray did not connect to {address} within {timeout:.0f} s: its port answers but no "
            "Ray GCS replied there (a head started with --node-ip-address=127.0.0.1 is reached "
            "only by drivers that Ray also keeps on the loopback)",
            kind="cluster_unreachable",
        )
    if "error" in box:
        raise box["error"]


@contextmanager
def _connected(ray: Any, address: Optional[str], timeout: float) -> Iterator[str]:
    """Connect to the cluster (unless this process already is) and disconnect afterwards;
    yields the address. Never starts a cluster of its own."""
    if ray.is_initialized():
        yield str(address or "(this process's Ray connection)")
        return
    addr = address or os.environ.get("RAY_ADDRESS") or "auto"
    if addr != "auto":
        _check_reachable(addr, timeout)
    # Ray Client (ray://) forwards extra keywords to the server's ray.init: give it none.
    quiet: Dict[str, Any] = (
        {} if addr.startswith("ray://") else {"log_to_driver": False, "logging_level": logging.WARNING}
    )
    try:
        _init_bounded(ray, addr, quiet, min(timeout, 60.0))
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ClusterError(
            f"could not connect to a Ray cluster at {addr}: {e}",
            kind="cluster_unreachable",
        ) from None
    try:
        yield addr
    finally:
        ray.shutdown()


def _plan_argv(flags: Dict[str, FlagValue]) -> List[str]:
    own = sorted(_OWN_FLAGS & set(flags))
    if own:
        raise UsageError(
            f"{', '.join(k + '=' for k in own)}: plan_cluster sets this per rank itself (the "
            "device of each GPU, tp= and pp=)",
            kind="usage",
            exit_code=2,
        )
    return _flag_args(flags)


def _check_flags(model: str, tp: int, pp: int, argv: List[str]) -> None:
    """Refuse a bad model or flag on the driver, before the cluster does the same N times."""
    try:
        _run(
            [
                "plan",
                f"--model={model}",
                "--total-memory=1TiB",
                f"--tensor-parallel-size={tp}",
                f"--pipeline-parallel-size={pp}",
                *argv,
                "--json",
            ]
        )
    except DoesNotFitError:
        pass


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{name}={value!r} must be a positive int", kind="usage", exit_code=2)
    return value


def plan_cluster(
    model: Union[str, "os.PathLike[str]"],
    tp: int = 1,
    pp: int = 1,
    *,
    address: Optional[str] = None,
    layouts: bool = False,
    timeout: float = 120.0,
    **plan_flags: FlagValue,
) -> Dict[str, Any]:
    """Plan ``model`` at ``tp`` x ``pp`` on the Ray cluster at ``address``: the deployment plan.

    Args:
        model: a preset, a Hugging Face id in the local cache or a model path, as
            :func:`memplan.plan` takes; readable on the driver and on every node.
        tp, pp: tensor- and pipeline-parallel sizes (vLLM's ``--tensor-parallel-size``,
            ``--pipeline-parallel-size``): ``tp * pp`` ranks, one GPU each.
        address: the cluster (``ray://HEAD:10001``, ``HEAD:6379``); default ``RAY_ADDRESS``,
            else the cluster this node belongs to. A process already connected to Ray
            (``ray.init`` done) uses its own connection.
        layouts: also rank every TP x PP layout that fits the cluster's free GPUs, best first.
        timeout: seconds for the whole run (placement groups and tasks).
        **plan_flags: any ``memplan plan`` flag for every rank (``max_model_len=32768``,
            ``kv_cache_dtype="fp8"``, ``gpu_memory_utilization=0.9``...), as
            :func:`memplan.plan` takes them.

    Returns:
        The deployment plan (``"schema": "memplan.cluster/1"``, docs/cluster.md): ``nodes``
        (per node and GPU: device, what is free and why, capability, rank and stage, whether
        it can host a rank), ``ranks`` (each rank's plan), ``stages``, ``combined`` (the
        plan every rank maps), ``kv_cache_blocks``/``kv_cache_tokens``, ``limiting`` (the
        rank that limits, when ranks differ), ``engine_args["vllm"]``, ``unfit_gpus``,
        ``layouts`` (with ``layouts=True``), ``fits`` and ``why``, ``warnings``.

    Raises:
        UsageError: bad ``tp``/``pp``, model or flag.
        ClusterError: Ray not installed, no cluster at ``address``, placement timed out.
    """
    return _plan_cluster(
        os.fspath(model), tp, pp, _plan_argv(dict(plan_flags)), address, layouts, timeout
    )


def _plan_cluster(
    name: str,
    tp: int,
    pp: int,
    argv: List[str],
    address: Optional[str],
    layouts: bool,
    timeout: float,
) -> Dict[str, Any]:
    """:func:`plan_cluster` with the plan flags as command-line arguments."""
    tp, pp = _positive("tp", tp), _positive("pp", pp)
    if isinstance(timeout, bool) or not (isinstance(timeout, (int, float)) and 0 < timeout < 1e9):
        raise UsageError(
            f"timeout={timeout!r} must be a positive number of seconds", kind="usage", exit_code=2
        )
    _check_flags(name, tp, pp, argv)
    ray = _ray()
    deadline = time.monotonic() + float(timeout)
    with _connected(ray, address, float(timeout)) as addr:
        return _plan_on(ray, addr, name, tp, pp, argv, layouts, deadline)


def _left(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.1)


def _placement_group(ray: Any, bundles: int, wait: float) -> Any:
    """vLLM's placement group: ``bundles`` x ``{"GPU": 1.0}``, PACK, waited for ``wait``
    seconds; ``None`` when Ray could not place it in time (the group is removed)."""
    pg_mod: Any = importlib.import_module("ray.util.placement_group")
    pg = pg_mod.placement_group([{"GPU": 1.0}] * bundles, strategy="PACK")
    try:
        ray.get(pg.ready(), timeout=wait)
    except ray.exceptions.GetTimeoutError:
        pg_mod.remove_placement_group(pg)
        return None
    return pg


def _free_gpus(ray: Any) -> int:
    return int(ray.available_resources().get("GPU", 0))


def _settle(ray: Any, gpus: int, wait: float) -> int:
    """The cluster's free GPUs once Ray's count has caught up with at least ``gpus`` (placement
    groups are removed asynchronously: a plan right after another would see too few)."""
    end = time.monotonic() + wait
    free = _free_gpus(ray)
    while free < gpus and time.monotonic() < end:
        time.sleep(0.2)
        free = _free_gpus(ray)
    return free


def _bundle_nodes(pg: Any) -> List[str]:
    pg_mod: Any = importlib.import_module("ray.util.placement_group")
    table = pg_mod.placement_group_table(pg)["bundles_to_node_id"]
    return [str(table[i]) for i in range(len(table))]


def _failed(slot: _cluster.Slot, node: str, message: str) -> Dict[str, Any]:
    return {
        "bundle": list(slot),
        "node_id": node,
        "node_ip": None,
        "hostname": None,
        "gpu": None,
        "device": None,
        "device_source": None,
        "probe": None,
        "error": {"kind": "cluster", "message": message},
        "plans": [],
    }


def _plan_on(
    ray: Any,
    address: str,
    model: str,
    tp: int,
    pp: int,
    argv: List[str],
    layouts: bool,
    deadline: float,
) -> Dict[str, Any]:
    ctx = ray.get_runtime_context()
    driver = str(ctx.get_node_id())
    nodes = [
        {
            "node_id": str(n["NodeID"]),
            "ip": n.get("NodeManagerAddress"),
            "gpus_declared": int(n.get("Resources", {}).get("GPU", 0)),
        }
        for n in ray.nodes()
        if n.get("Alive")
    ]
    # GPUs a previous plan's placement groups still hold come back within moments.
    declared = sum(n["gpus_declared"] for n in nodes)
    free = _settle(ray, declared, min(5.0, _left(deadline)))
    world = tp * pp
    strategies: Any = importlib.import_module("ray.util.scheduling_strategies")
    pg_mod: Any = importlib.import_module("ray.util.placement_group")
    groups: Dict[str, Any] = {}
    notes: List[str] = []
    try:
        if world <= free:
            pg = _placement_group(ray, world, _left(deadline))
            if pg is None:
                raise ClusterError(
                    f"Ray could not place {world} bundles of {{'GPU': 1.0}} (PACK) in time, "
                    f"though it counted {free} free GPUs: check `ray status`, or raise timeout=",
                    kind="placement_timeout",
                )
            groups["ranks"] = pg
        rest = free - world if "ranks" in groups else free
        if rest > 0:
            pg = _placement_group(ray, rest, min(15.0, _left(deadline)))
            if pg is None:
                notes.append(
                    f"Ray counted {rest} more free GPUs but could not place them: they were "
                    "not probed"
                )
            else:
                groups["rest"] = pg
        slots: Dict[_cluster.Slot, str] = {}
        rank_slots: Optional[List[_cluster.Slot]] = None
        for kind, pg in groups.items():
            bundle_nodes = _bundle_nodes(pg)
            for b, node in enumerate(bundle_nodes):
                slots[(kind, b)] = node
            if kind == "ranks":
                rank_slots = [("ranks", b) for b in _cluster.vllm_order(bundle_nodes, driver)]
        order = _cluster.assumed_order(slots, driver)
        candidates = _cluster.layout_candidates(len(slots), tp, pp) if layouts else None
        rank_of = {s: r for r, s in enumerate(rank_slots or [])}
        task = ray.remote(_cluster_task.run)
        refs: Dict[_cluster.Slot, Any] = {}
        for slot in slots:
            job = {
                "model": model,
                "argv": argv,
                "bundle": list(slot),
                "plans": _cluster.plan_specs(
                    tp, pp, rank_of.get(slot), order.index(slot), candidates
                ),
            }
            refs[slot] = task.options(
                num_cpus=0,
                num_gpus=1,
                max_retries=0,
                scheduling_strategy=strategies.PlacementGroupSchedulingStrategy(
                    placement_group=groups[slot[0]],
                    placement_group_bundle_index=slot[1],
                ),
            ).remote(job)
        done = set()
        if refs:
            ready, _ = ray.wait(
                list(refs.values()), num_returns=len(refs), timeout=_left(deadline)
            )
            done = set(ready)
        gpus: Dict[_cluster.Slot, Dict[str, Any]] = {}
        for slot, ref in refs.items():
            if ref not in done:
                try:
                    ray.cancel(ref, force=True)
                except ray.exceptions.RayError:
                    pass  # it finished or failed meanwhile; the answer is dropped either way
                gpus[slot] = _failed(slot, slots[slot], "the probe/plan task did not finish in time")
                continue
            try:
                gpus[slot] = ray.get(ref)
            except ray.exceptions.RayError as e:
                gpus[slot] = _failed(
                    slot,
                    slots[slot],
                    f"the probe/plan task failed (is memplan installed on this node? "
                    f"pip install 'memplan[ray]'): {str(e).splitlines()[-1] if str(e) else e!r}",
                )
    finally:
        for pg in groups.values():
            pg_mod.remove_placement_group(pg)
        if groups:
            _settle(ray, free, min(10.0, _left(deadline)))
    ray_info = {
        "address": address,
        "version": str(getattr(ray, "__version__", "unknown")),
        "driver_node": driver,
        "nodes": len(nodes),
        "gpus_declared": sum(n["gpus_declared"] for n in nodes),
        "gpus_free": free,
    }
    doc = _cluster.assemble(
        model=model,
        tp=tp,
        pp=pp,
        ray_info=ray_info,
        nodes=nodes,
        gpus=gpus,
        rank_slots=rank_slots,
        order=order,
        layouts=candidates,
    )
    doc["warnings"].extend(notes)
    return doc
