"""What runs on each GPU of a Ray cluster for :func:`memplan.ray.plan_cluster`: find which
memplan device this task's GPU is, probe it, and plan the stages asked for on it.

It runs inside a Ray worker process that Ray placed on one GPU (a ``{"GPU": 1}`` bundle of a
placement group, ``num_gpus=1``), so it reads only its own GPU, as the engine's worker would.
The answer is plain JSON-able data; a failure is reported in the answer (``"error"``), never
raised, so one bad GPU does not hide the readings of the others.

Which device a GPU is:

1. ``MEMPLAN_RAY_DEVICES`` in the node's environment (set where ``ray start`` runs, so every
   worker on that node inherits it): whitespace-separated memplan device ids, the i-th for
   the node's GPU i (Ray's GPU id). Simulated GPUs are declared this way
   (``MEMPLAN_RAY_DEVICES="sim:h100-80gb sim:h100-80gb,other=20GiB" ray start --num-gpus 2 ...``),
   and so can a real GPU whose backend memplan should not guess (``rocm:0``).
2. Otherwise a real GPU: the first available backend with devices (``cuda``, ``rocm``,
   ``xpu``), at the ordinal this process sees Ray's GPU id at: Ray narrows
   ``CUDA_VISIBLE_DEVICES`` (``HIP_VISIBLE_DEVICES``, ``ZE_AFFINITY_MASK``) to the task's GPUs, so the ordinal is the id's place in that
   list; where Ray was told not to set it (vLLM sets ``RAY_EXPERIMENTAL_NOSET_*``), the
   ordinal is Ray's id itself.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Dict, List, Optional, Tuple

#: The node's GPU-to-device map (see the module docs).
DEVICES_ENV = "MEMPLAN_RAY_DEVICES"

# The variable each backend's runtime narrows its devices with, as Ray sets it per task
# (Ray 2.60, ray/_private/accelerators/: nvidia_gpu.py CUDA_VISIBLE_DEVICES, amd_gpu.py
# HIP_VISIBLE_DEVICES (ROCR_VISIBLE_DEVICES where only that one is set), intel_gpu.py
# ZE_AFFINITY_MASK (ONEAPI_DEVICE_SELECTOR in older releases)).
_VISIBLE = {
    "cuda": ("CUDA_VISIBLE_DEVICES",),
    "rocm": ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"),
    "xpu": ("ZE_AFFINITY_MASK", "ONEAPI_DEVICE_SELECTOR"),
}


def _error(kind: str, message: str) -> Dict[str, str]:
    return {"kind": kind, "message": message}


def _mapped(gpu: int, env: str) -> Tuple[Optional[str], Optional[Dict[str, str]]]:
    ids = env.split()
    if gpu < len(ids):
        return ids[gpu], None
    return None, _error(
        "usage",
        f"{DEVICES_ENV} on this node lists {len(ids)} device(s) ({env!r}) but Ray gave this "
        f"task GPU {gpu}: list one memplan device id per GPU the node declares (--num-gpus)",
    )


def _ordinal(backend: str, gpu: int) -> int:
    for var in _VISIBLE.get(backend, ()):
        value = os.environ.get(var)
        if value is None:
            continue
        # ONEAPI_DEVICE_SELECTOR is "level_zero:0,1"; the others are "0,1".
        visible = [v.strip() for v in value.split(":")[-1].split(",") if v.strip()]
        if str(gpu) in visible:
            return visible.index(str(gpu))
    return gpu


def _real(gpu: int) -> Tuple[Optional[str], Optional[Dict[str, str]]]:
    from . import MemplanError, backends

    try:
        answer = backends()
    except MemplanError as e:
        return None, _error(e.kind, f"listing memplan's backends failed: {e.message}")
    reasons: List[str] = []
    for b in answer.get("backends", []):
        name = str(b.get("backend"))
        if name == "sim":
            continue
        if b.get("status") == "available" and b.get("devices"):
            return f"{name}:{_ordinal(name, gpu)}", None
        reasons.append(f"{name}: {b.get('reason', b.get('status'))}")
    return None, _error(
        "unavailable",
        f"no memplan device for Ray GPU {gpu}: {DEVICES_ENV} is not set on this node and no GPU "
        f"backend sees a device here ({'; '.join(reasons) or 'no GPU backend compiled in'})",
    )


def _plan(device: str, model: str, argv: List[str], spec: Dict[str, int]) -> Dict[str, Any]:
    from . import MemplanError, _run

    cmd = [
        "plan",
        f"--model={model}",
        f"--device={device}",
        f"--tensor-parallel-size={spec['tp']}",
        f"--pipeline-parallel-size={spec['pp']}",
        f"--pipeline-stage={spec['stage']}",
        f"--tensor-parallel-rank={spec['tp_rank']}",
        *argv,
        "--json",
    ]
    try:
        return {"spec": spec, "plan": _run(cmd)}
    except MemplanError as e:
        return {"spec": spec, "error": e.envelope.get("error", _error(e.kind, e.message))}


def run(job: Dict[str, Any]) -> Dict[str, Any]:
    """The task's body: ``job`` = ``{"model", "argv", "plans": [{"tp", "pp", "stage",
    "tp_rank"}...],
    "bundle": [placement group index, bundle index]}``; returns where it ran, the device,
    its probe and each plan (or the error of each)."""
    import importlib

    ray: Any = importlib.import_module("ray")
    ctx = ray.get_runtime_context()
    gpus = [int(g) for g in ray.get_gpu_ids()]
    out: Dict[str, Any] = {
        "bundle": job["bundle"],
        "node_id": ctx.get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
        "hostname": socket.gethostname(),
        "gpu": gpus[0] if gpus else None,
        "device": None,
        "device_source": None,
        "probe": None,
        "error": None,
        "plans": [],
    }
    if len(gpus) != 1:
        out["error"] = _error("usage", f"the task was given {len(gpus)} GPUs, not one: {gpus}")
        return out
    env = os.environ.get(DEVICES_ENV)
    if env is not None:
        device, err = _mapped(gpus[0], env)
        out["device_source"] = DEVICES_ENV
    else:
        device, err = _real(gpus[0])
        out["device_source"] = "backend"
    out["device"] = device
    if device is None:
        out["error"] = err
        return out
    from . import MemplanError, probe

    try:
        out["probe"] = probe(device)
    except MemplanError as e:
        out["error"] = e.envelope.get("error", _error(e.kind, e.message))
        return out
    out["plans"] = [_plan(device, job["model"], list(job["argv"]), s) for s in job["plans"]]
    return out
