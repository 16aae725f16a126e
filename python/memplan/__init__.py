"""memplan from Python: how much GPU memory can an inference engine's KV cache take, and how
sure is that answer?

Every function here runs the ``memplan`` command line's own code, in this process, and
returns the same JSON it prints with ``--json``, as plain Python data (same keys, same
``"schema"`` version)::

    >>> import memplan
    >>> p = memplan.plan(model="qwen2.5-1.5b-instruct", device="sim:rtx4090")
    >>> p["kv_cache_tokens"] > 0
    True
    >>> p["engine_args"]["vllm"]          # flags that pin the same KV budget in vLLM
    '--kv-cache-memory-bytes ... --max-model-len 32768 ...'

Failures raise :class:`MemplanError` (subclasses :class:`UsageError`,
:class:`MeasurementError`, :class:`DoesNotFitError` and its :class:`OutOfMemoryError`,
:class:`InternalError`), never a bare
``RuntimeError`` and never a Rust panic. An argument of the wrong Python type raises
:class:`ArgumentTypeError` (a ``UsageError`` and a ``TypeError``) before anything runs; a
number out of range raises :class:`UsageError` (a ``ValueError``), never an
``OverflowError``. The measured start-up from a Python engine lives in
:mod:`memplan.engine`.
"""

from __future__ import annotations

import json
import numbers
import operator
import os
from typing import Any, Dict, List, Optional, Sequence, Union

from . import _native
from ._errors import (
    ArgumentTypeError,
    ClusterError,
    DoesNotFitError,
    InternalError,
    MeasurementError,
    MemplanError,
    OutOfMemoryError,
    UsageError,
    a_type,
    from_envelope,
)

__all__ = [
    "plan",
    "probe",
    "devices",
    "backends",
    "simulate",
    "main",
    "MemplanError",
    "UsageError",
    "ArgumentTypeError",
    "MeasurementError",
    "DoesNotFitError",
    "OutOfMemoryError",
    "InternalError",
    "ClusterError",
    "__version__",
]

__version__: str = _native.__version__

#: A value for one engine flag: a number, a string (byte flags also take units such as
#: ``"20GiB"``), a bool for a switch (``enforce_eager=True``), or a list for a comma-separated
#: flag (``cudagraph_capture_sizes=[1, 2, 4]``). ``None`` leaves the CLI's default.
FlagValue = Union[str, int, float, bool, Sequence[Union[str, int]], None]

# Switches the API sets itself; passing them as keywords would change the output format.
_RESERVED = frozenset({"json", "emit_args", "help", "version", "log"})


def _run(argv: List[str], keywords: Optional[Dict[str, FlagValue]] = None) -> Any:
    """Run one CLI invocation (``--json`` already in ``argv``) and decode its answer.
    ``keywords``: the Python keywords behind the flags, to name them in a usage error."""
    code, text = _native.run_json(argv)
    try:
        data = json.loads(text)
    except ValueError:
        raise InternalError(
            f"memplan {' '.join(argv)} exited {code} with output that is not JSON: {text[:200]!r}",
            kind="internal",
            exit_code=code,
        ) from None
    if code == 0:
        return data
    error = from_envelope(code, data)
    for key in keywords or {}:
        flag = "--" + key.replace("_", "-")
        if isinstance(error, UsageError) and f"unexpected argument '{flag}" in error.message:
            error.message = f"unknown keyword {key}= (`memplan {argv[0]}` has no {flag})"
            error.args = (error.message,)
    raise error


# The Python types each known flag takes (the value's range is the command line's to check).
_INT = "an int"
_NUMBER = "a number"
_BYTES = "a byte count (an int, or a str with units such as '24GiB')"
_STR = "a str"
_BOOL = "a bool"
_SIZES = "a list of ints"
_TYPES: Dict[str, str] = {
    **{
        k: _INT
        for k in (
            "max_model_len",
            "max_num_seqs",
            "max_num_batched_tokens",
            "block_size",
            "tensor_parallel_size",
            "pipeline_parallel_size",
            "pipeline_stage",
            "num_speculative_tokens",
            "max_loras",
            "max_lora_rank",
            "seed",
        )
    },
    **{k: _NUMBER for k in ("gpu_memory_utilization", "cpu_offload_gb")},
    **{
        k: _BYTES
        for k in (
            "total_memory",
            "kv_cache_memory_bytes",
            "weights_bytes",
            "activation_bytes",
            "non_torch_bytes",
            "graph_bytes",
        )
    },
    **{
        k: _STR
        for k in (
            "device",
            "dtype",
            "kv_cache_dtype",
            "mamba_cache_dtype",
            "mamba_ssm_cache_dtype",
            "quantization",
            "graph_strategy",
            "engine",
            "speculative_model",
            "strategy",
            "alloc_conf",
        )
    },
    "enforce_eager": _BOOL,
    "enable_prefix_caching": _BOOL,
    "cudagraph_capture_sizes": _SIZES,
}
# Switches whose False is a choice, not the default: ``False`` gives ``--no-<flag>`` (vLLM's
# ``--no-enable-prefix-caching``), ``None`` leaves the engine release's default.
_NEGATABLE = frozenset({"enable_prefix_caching"})


def _is_int(v: object) -> bool:
    """An int (or anything with ``__index__``, such as a numpy integer), not a bool."""
    if isinstance(v, bool):
        return False
    try:
        operator.index(v)  # type: ignore[arg-type]
    except TypeError:
        return False
    return True


def _type_ok(kind: str, v: object) -> bool:
    if kind == _INT:
        return _is_int(v)
    if kind == _NUMBER:
        return not isinstance(v, bool) and (isinstance(v, numbers.Real) or _is_int(v))
    if kind == _BYTES:
        return isinstance(v, str) or _is_int(v)
    if kind == _STR:
        return isinstance(v, str)
    if kind == _BOOL:
        return isinstance(v, bool)
    if kind == _SIZES:
        return isinstance(v, (list, tuple)) and all(_is_int(x) for x in v)
    return True


def _check_types(values: Dict[str, object]) -> None:
    """Refuse a known flag's value of the wrong Python type (``None`` leaves the default)."""
    for key, value in values.items():
        kind = _TYPES.get(key)
        if value is None or kind is None or _type_ok(kind, value):
            continue
        raise ArgumentTypeError(
            f"{key}={value!r} is {a_type(value)}; {key} takes {kind}",
            kind="type",
            exit_code=2,
        )


def _flag_args(flags: Dict[str, FlagValue]) -> List[str]:
    """Keyword arguments as CLI flags: ``max_model_len=4096`` -> ``--max-model-len=4096``."""
    out: List[str] = []
    for key, value in flags.items():
        if key in _RESERVED:
            raise UsageError(
                f"{key}=: memplan sets this itself (the API always returns the JSON answer)",
                kind="usage",
                exit_code=2,
            )
        if not key.isidentifier() or key.startswith("_"):
            raise UsageError(f"{key!r} is not a flag name", kind="usage", exit_code=2)
        name = "--" + key.replace("_", "-")
        _check_types({key: value})
        if value is False and key in _NEGATABLE:
            out.append("--no-" + key.replace("_", "-"))
            continue
        if value is None or value is False:
            continue
        if value is True:
            out.append(name)
        elif isinstance(value, (list, tuple)) and all(
            isinstance(v, str) or _is_int(v) for v in value
        ):
            out.append(f"{name}={','.join(str(operator.index(v)) if _is_int(v) else str(v) for v in value)}")
        elif isinstance(value, float):
            out.append(f"{name}={value!r}")
        elif isinstance(value, (str, os.PathLike)):
            out.append(f"{name}={os.fspath(value)}")
        elif _is_int(value):
            out.append(f"{name}={operator.index(value)}")  # type: ignore[arg-type]
        else:
            raise ArgumentTypeError(
                f"{key}={value!r} is {a_type(value)}; expected a number, a str, a bool or a list",
                kind="type",
                exit_code=2,
            )
    return out


def plan(
    model: Union[str, "os.PathLike[str]"],
    device: Optional[str] = None,
    *,
    total_memory: Union[int, str, None] = None,
    gpu_memory_utilization: Optional[float] = None,
    kv_cache_memory_bytes: Union[int, str, None] = None,
    dtype: Optional[str] = None,
    kv_cache_dtype: Optional[str] = None,
    quantization: Optional[str] = None,
    max_model_len: Optional[int] = None,
    max_num_seqs: Optional[int] = None,
    max_num_batched_tokens: Optional[int] = None,
    block_size: Optional[int] = None,
    tensor_parallel_size: Optional[int] = None,
    cudagraph_capture_sizes: Optional[Sequence[int]] = None,
    enforce_eager: Optional[bool] = None,
    graph_strategy: Optional[str] = None,
    weights_bytes: Union[int, str, None] = None,
    activation_bytes: Union[int, str, None] = None,
    non_torch_bytes: Union[int, str, None] = None,
    graph_bytes: Union[int, str, None] = None,
    alloc_conf: Optional[str] = None,
    **engine_flags: FlagValue,
) -> Dict[str, Any]:
    """Plan the KV cache of ``model`` on ``device``: ``memplan plan --json``.

    Args:
        model: a shipped preset (``"qwen2.5-1.5b-instruct"``), a model directory with
            ``config.json`` (safetensors headers give exact weights), a ``config.json`` path,
            or whatever else ``memplan plan --model`` accepts.
        device: ``"sim:rtx4090"``, ``"cuda:0"``, ... (:func:`devices` lists them); optional
            with ``total_memory``.
        total_memory: plan for a device of this total (bytes, or ``"79.19GiB"``).
        gpu_memory_utilization: fraction of the device the engine may use, in (0, 1].
        kv_cache_memory_bytes .. graph_bytes: as the CLI flags of the same name (vLLM's flag
            names with underscores); byte values take ints or strings with units.
        alloc_conf: the engine's caching-allocator configuration, PyTorch's option string
            (``"expandable_segments:True"``), as ``--alloc-conf``; ``None`` reads
            ``PYTORCH_ALLOC_CONF``, else ``PYTORCH_CUDA_ALLOC_CONF``, else
            ``PYTORCH_HIP_ALLOC_CONF`` as PyTorch does. The plan notes it and where it came
            from (a dry run keeps no room for the allocator's rounding).
        **engine_flags: any other ``memplan plan`` flag, spelled with underscores. A keyword
            the CLI does not know raises :class:`UsageError`.

    Every flag left ``None`` keeps the CLI's default, so the answer equals
    ``memplan plan --json`` with the same flags.

    Returns:
        The plan as a dict with the keys of ``memplan plan --json`` (``"schema":
        "memplan.plan/1"``, ``"kv_cache_tokens"``, ``"kv_cache_bytes"``, ``"kv"``,
        ``"consumers"``, ``"graph"``, ``"engine_args"``, ``"warnings"``, ...).

    Raises:
        UsageError: a flag value out of range, an unknown model, device or keyword.
        DoesNotFitError: the model does not fit the requested memory.
        MeasurementError: the device could not be read.
    """
    flags: Dict[str, FlagValue] = {
        "total_memory": total_memory,
        "gpu_memory_utilization": gpu_memory_utilization,
        "kv_cache_memory_bytes": kv_cache_memory_bytes,
        "dtype": dtype,
        "kv_cache_dtype": kv_cache_dtype,
        "quantization": quantization,
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
        "block_size": block_size,
        "tensor_parallel_size": tensor_parallel_size,
        "cudagraph_capture_sizes": cudagraph_capture_sizes,
        "enforce_eager": enforce_eager,
        "graph_strategy": graph_strategy,
        "weights_bytes": weights_bytes,
        "activation_bytes": activation_bytes,
        "non_torch_bytes": non_torch_bytes,
        "graph_bytes": graph_bytes,
        "alloc_conf": alloc_conf,
    }
    flags.update(engine_flags)
    _check_types({"device": device})
    if not isinstance(model, (str, os.PathLike)):
        raise ArgumentTypeError(
            f"model={model!r} is {a_type(model)}; model takes a str or a path",
            kind="type",
            exit_code=2,
        )
    argv = ["plan", f"--model={os.fspath(model)}"]
    if device is not None:
        argv.append(f"--device={device}")
    argv += _flag_args(flags)
    argv.append("--json")
    result: Dict[str, Any] = _run(argv, engine_flags)
    return result


def probe(device: str, calibrate: bool = False) -> Dict[str, Any]:
    """Read every memory layer of ``device`` and its declared capabilities:
    ``memplan probe DEVICE --json``; with ``calibrate=True`` also calibrate (allocate known
    sizes, capture a graph, map virtual memory) and confirm or downgrade each reading.

    Returns the dict of ``memplan probe --json`` (``"device"``, ``"descriptor"``,
    ``"memory"``, ``"derived"``, ``"capability"``, and ``"calibration"`` when calibrated).

    Raises:
        UsageError: an unknown device id.
        MeasurementError: the backend is unavailable here or a reading failed.
    """
    if not isinstance(device, str):
        raise ArgumentTypeError(
            f"device={device!r} is {a_type(device)}; device takes a str",
            kind="type",
            exit_code=2,
        )
    if not isinstance(calibrate, bool):
        raise ArgumentTypeError(
            f"calibrate={calibrate!r} is {a_type(calibrate)}; calibrate takes a bool",
            kind="type",
            exit_code=2,
        )
    argv = ["probe", "--json"]
    if calibrate:
        argv.append("--calibrate")
    argv += ["--", device]
    result: Dict[str, Any] = _run(argv)
    return result


def backends() -> Dict[str, Any]:
    """Every compiled-in backend, available or not (with the reason): the whole answer of
    ``memplan devices --json``, ``{"schema": ..., "backends": [...]}``."""
    result: Dict[str, Any] = _run(["devices", "--json"])
    return result


def devices() -> List[Dict[str, Any]]:
    """Every device of every available backend, as the device entries of
    ``memplan devices --json`` (``"id"``, ``"name"``, ``"total_bytes"``, ``"properties"``).
    Unavailable backends and their reasons are in :func:`backends`."""
    return [d for b in backends()["backends"] for d in b.get("devices", [])]


def simulate(
    scenario: Union[str, "os.PathLike[str]"],
    strategy: Optional[str] = None,
    seed: Optional[int] = None,
) -> Dict[str, Any]:
    """Run a whole engine start-up on a simulated device and judge each graph strategy
    against the ground truth: ``memplan simulate --json``.

    Args:
        scenario: a shipped scenario name (``"fp8-24g"``) or a scenario TOML file.
        strategy: ``auto`` (the default; also what ``None`` means), ``all``,
            ``post-capture``, ``full``, ``sampled``, ``conservative``, ``none`` (the strategy
            that reserves nothing, named as a string) or ``vllm-legacy``.
        seed: the simulator's seed (``--seed``), where the CLI offers one; else the
            scenario's own.

    Raises:
        UsageError: an unknown scenario or strategy, or a malformed scenario file.
        MemplanError: of kind ``"did_not_start"`` (exit code 1) when the scenario's engine
            started in no run, so nothing was simulated: the model does not fit the device,
            the start-up check refused the device, or the device misreported its memory. The
            message says why; ``help["simulation"]`` holds the report, each run's
            ``"failed"`` saying why it did not start. A run that started and then ran out of
            memory is a result, not an error.
    """
    _check_types({"strategy": strategy, "seed": seed})
    if not isinstance(scenario, (str, os.PathLike)):
        raise ArgumentTypeError(
            f"scenario={scenario!r} is {a_type(scenario)}; scenario takes a name or a path",
            kind="type",
            exit_code=2,
        )
    argv = ["simulate", f"--scenario={os.fspath(scenario)}"]
    if strategy is not None:
        argv.append(f"--strategy={strategy}")
    if seed is not None:
        argv.append(f"--seed={operator.index(seed)}")
    argv.append("--json")
    result: Dict[str, Any] = _run(argv)
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``memplan`` command line with ``argv`` (default: ``sys.argv[1:]``), printing
    as the binary does; returns its exit code (0 success, 1 failure, 2 usage).
    ``memplan cluster ...`` is the Python package's own command (:mod:`memplan.ray`)."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["cluster"]:
        from . import _cluster_cli

        return _cluster_cli.main(args[1:])
    return int(_native.main(args))
