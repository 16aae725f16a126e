"""The measured start-up from a Python engine: memplan's engine hooks as a Python class.

An engine subclasses :class:`Engine` and implements the hooks; memplan runs the start-up in
its own order (release cached memory, baseline; load weights; profile run; graph phase with a
strategy chosen from the device's capabilities, teardown on every path; plan) and calls back
into the engine at each step. The engine keeps control of *what* runs, memplan of *when* it is
measured.

How a PyTorch engine maps the hooks (the GPU check runs this mapping on real hardware)::

    memory_stats()    -> s = torch.cuda.memory_stats(dev)
                         {"reserved": s["reserved_bytes.all.current"],
                          "allocated": s["allocated_bytes.all.current"],
                          "peak_allocated": s["allocated_bytes.all.peak"],
                          "peak_reserved": s["reserved_bytes.all.peak"]}
    release_cached()  -> torch.cuda.synchronize(); torch.cuda.empty_cache()
    reset_peak()      -> torch.cuda.reset_peak_memory_stats(dev)
    load_weights()    -> model.to(dev)            (or the engine's loader)
    profile_run()     -> one forward pass at max_num_batched_tokens + the sampler,
                         then torch.cuda.empty_cache() as engines do
    graph_sizes()     -> the capture sizes, largest first (vLLM's cudagraph_capture_sizes)
    warm_up(n)        -> one eager forward pass at batch size n
    capture_graph(n)  -> g = torch.cuda.CUDAGraph()
                         with torch.cuda.graph(g, pool=self.pool): forward(static_inputs[n])
                         self.graphs.append(g)    (self.pool = torch.cuda.graph_pool_handle())
    release_graphs()  -> del self.graphs[:]; self.pool = None; gc.collect();
                         torch.cuda.synchronize(); torch.cuda.empty_cache()
    synchronize()     -> torch.xpu.synchronize(dev)   (optional, not on the base class:
                         called before each reading only on a device that cannot
                         synchronize itself, Intel's Level Zero; without it memplan warns
                         ``readings_not_synchronized``)

memplan reads the device's own free memory (the driver, ``torch.cuda.mem_get_info``'s
source) around each step; a PyTorch engine's ``torch.cuda.mem_get_info()`` must agree with
``memplan.probe("cuda:0")["memory"]["driver"]["free"]`` to within a few MiB (the GPU check
verifies it).

Without a GPU, :class:`SimDevice` is a simulated GPU and :meth:`SimDevice.allocator` the
caching allocator a Python engine allocates from on it (it behaves as PyTorch's: freed blocks
stay cached, capture goes into a private pool), so the same engine code runs in tests.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from . import _native
from ._errors import ArgumentTypeError, UsageError, a_type
from ._release import installed_release

__all__ = ["Engine", "start_up", "StartUp", "KvRange", "SimDevice", "SimAllocator", "AllocatorStats"]

#: ``{"reserved": int, "allocated": int, "peak_allocated": int}``, bytes, and optionally
#: ``"peak_reserved": int`` (the activation peak then counts the segments the allocator held).
AllocatorStats = Dict[str, int]

SimDevice = _native.SimDevice
SimAllocator = _native.SimAllocator
KvRange = _native.KvRange


class Engine:
    """The hooks an engine implements so memplan can measure its start-up.

    Required: :meth:`memory_stats`, :meth:`release_cached`, :meth:`reset_peak` (the allocator
    view), :meth:`load_weights`, :meth:`profile_run`, and for an engine with graphs
    :meth:`graph_sizes`, :meth:`capture_graph`, :meth:`release_graphs`. The rest are optional
    knowledge. An exception raised by a hook stops the start-up after memplan's teardown and
    is re-raised to the caller as it was.
    """

    # -- the allocator view ------------------------------------------------------------
    def memory_stats(self) -> AllocatorStats:
        """The caching allocator now: bytes ``reserved`` (held from the driver, cached or in
        use), ``allocated`` (in use) and ``peak_allocated`` since :meth:`reset_peak`; optionally
        ``peak_reserved`` since :meth:`reset_peak` (without it memplan rounds the allocated
        peak up by 2 MiB and warns)."""
        raise NotImplementedError("memory_stats")

    def release_cached(self) -> None:
        """Give every cached, unused block back to the driver (``torch.cuda.empty_cache``)."""
        raise NotImplementedError("release_cached")

    def reset_peak(self) -> None:
        """Reset ``peak_allocated`` to ``allocated`` (and ``peak_reserved`` to ``reserved``)."""
        raise NotImplementedError("reset_peak")

    # Optional, not on the base class: ``allocate_tensor(nbytes) -> int`` and
    # ``free_tensor(handle)``. One tensor of ``nbytes`` from the engine's allocator, kept until
    # freed (PyTorch: ``t = torch.empty(nbytes, dtype=torch.uint8, device=dev)``, keep ``t`` in
    # a dict under ``id(t)`` and return that; ``free_tensor`` deletes it). Where the engine
    # allocates its KV cache after the start-up, memplan allocates the plan's layout this way
    # (the release's: one tensor per layer up to vLLM 0.28, one backing buffer of whole blocks
    # from 0.29.0), reads what the allocator reserved, frees it, and hands over the
    # blocks that fit (:attr:`StartUp.kv_blocks`): the one way to know how the allocator rounds
    # tensors of that size. Raise ``memplan.OutOfMemoryError`` (or let
    # ``torch.OutOfMemoryError`` through) when the device cannot hold it.

    def gpu_id(self) -> Optional[str]:
        """Which GPU the allocator allocates on, in the device's terms (a
        :class:`SimAllocator`'s ``gpu_id()``), or ``None`` (the default): where both the device
        and this hook name a GPU and they differ, the start-up is refused with a
        :class:`UsageError`, since nothing the engine allocates would show in the readings."""
        return None

    # -- the engine's own steps --------------------------------------------------------
    def load_weights(self) -> None:
        """Load the model's weights onto the device."""
        raise NotImplementedError("load_weights")

    def profile_run(self) -> None:
        """Run the largest step the engine will run (the activation peak)."""
        raise NotImplementedError("profile_run")

    # -- graphs ------------------------------------------------------------------------
    def graph_sizes(self) -> List[int]:
        """Batch sizes the engine captures, in capture order (largest first); empty for an
        eager engine (the default)."""
        return []

    def warm_up(self, size: int) -> None:
        """One eager pass at ``size`` right before its capture (memory it frees stays
        cached). Where nothing will measure the engine's allocation of its KV cache (no
        ``allocate_tensor``, no post-capture range), memplan also calls it before the plan at a
        few odd sizes of at most ``max_num_batched_tokens`` that are no graph size, each after
        :meth:`release_cached`, to learn the allocator's rounding from what each reserves (the
        dummy run of that many tokens an engine warms up with)."""

    def capture_graph(self, size: int) -> None:
        """Capture the graph of ``size`` and keep it alive until :meth:`release_graphs`."""
        raise NotImplementedError("capture_graph")

    def release_graphs(self) -> None:
        """Destroy every graph, abort a capture in progress, release their pool. Must succeed
        when nothing was captured."""

    def supports_post_capture(self) -> bool:
        """Whether the engine can capture its graphs against a KV cache whose memory is
        mapped afterwards (it takes the KV address range before capture): enables the
        ``post-capture`` strategy where the device has virtual memory management."""
        return False

    def bind_kv_range(self, address: int, size: int) -> None:
        """Post-capture: the KV cache's reserved address range, before the first capture, so
        the graphs can point into the KV cache. Memory is mapped there when the start-up
        ends (:attr:`StartUp.kv_range`)."""
        raise NotImplementedError("bind_kv_range (needed with supports_post_capture)")

    def kernel_nodes_hint(self, size: int) -> Optional[int]:
        """Kernel nodes in the graph of ``size``, when known (for the conservative bound)."""
        return None

    def alloc_node_bytes_hint(self, size: int) -> Optional[int]:
        """Bytes of graph memory-allocation nodes in the graph of ``size``, when known."""
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} engine>"


#: Hooks :class:`Engine` leaves to each engine (its versions raise ``NotImplementedError``).
_REQUIRED = ("memory_stats", "release_cached", "reset_peak", "load_weights", "profile_run")


def _check_engine(engine: object) -> None:
    """Refuse what cannot be an engine before anything runs: an object without the hooks, or
    an :class:`Engine` subclass that left a required hook (or, with graphs, ``capture_graph``)
    unimplemented. :class:`memplan.ArgumentTypeError` (a ``TypeError``) naming them."""
    if isinstance(engine, type):
        raise ArgumentTypeError(
            f"engine={engine!r} is a class; pass an instance (engine=MyEngine(...))",
            kind="type",
            exit_code=2,
        )
    if not isinstance(engine, Engine):
        # Duck-typed engines: the native side names every hook the object lacks.
        return
    cls = type(engine)
    missing = [h for h in _REQUIRED if getattr(cls, h, None) is getattr(Engine, h)]
    if cls.graph_sizes is not Engine.graph_sizes and cls.capture_graph is Engine.capture_graph:
        missing.append("capture_graph")
    if missing:
        raise ArgumentTypeError(
            f"{cls.__name__} does not implement {', '.join(m + '()' for m in missing)}: "
            "memplan.engine.Engine leaves these hooks to each engine",
            kind="type",
            exit_code=2,
        )


@dataclass
class StartUp:
    """What a measured start-up produced."""

    #: This rank's plan: the ``memplan.plan/1`` document ``memplan plan --json`` prints, from
    #: the measured figures (``kv_cache_tokens``, ``kv_cache_bytes``, ``graph``, ``warnings``...).
    plan: Dict[str, Any]
    #: Everything the session measured: every step's snapshots and windows, the capability
    #: trusted, the graph estimate.
    profile: Dict[str, Any]
    #: Post-capture: the KV cache's range, mapped where the graphs point (release it, or drop
    #: it, to give it back). ``None``: allocate the KV cache yourself: :attr:`kv_blocks` blocks
    #: of ``plan["kv"]["block_bytes"]``.
    kv_range: Optional["_native.KvRange"]
    #: With ``exchange``: the plan combined from every rank's, whose ``ranks["num_blocks"]``
    #: this rank mapped (the fewest of any rank). ``None`` without an exchange.
    combined: Optional[Dict[str, Any]] = None
    #: The KV blocks this rank allocates (mapped, with :attr:`kv_range`): the plan's (or the
    #: combined plan's) count, or fewer where the session measured that the engine's allocator
    #: rounds its tensors past what the plan kept (:meth:`Engine.allocate_tensor`,
    #: ``kv_cache_shrunk`` in :attr:`kv_warnings`), or, without an exchange, more where it
    #: measured a granule finer than the rounding the plan kept room for (a combined plan's
    #: count is never exceeded). ``0`` only where this object was built by hand.
    kv_blocks: int = 0
    #: What the session said of the KV cache (``{"code", "message", ...}``):
    #: ``kv_cache_shrunk``, or ``kv_allocation_unmeasured`` where the engine offers no
    #: :meth:`Engine.allocate_tensor` and the allocator's rounding of the cache's tensors is
    #: bounded from what it reserved for the engine's own allocations, not measured.
    kv_warnings: List[Dict[str, Any]] = field(default_factory=list)


#: An exchange of the ranks' plans: called with this rank's plan (``memplan.plan/1`` JSON
#: text), returns every rank's plan (JSON texts, this rank's among them): an all-gather.
Exchange = Callable[[str], Sequence[str]]


def start_up(
    device: Union[str, Any],
    engine: Engine,
    *,
    model: Union[str, "os.PathLike[str]"],
    gpu_memory_utilization: Optional[float] = None,
    kv_cache_memory_bytes: Optional[int] = None,
    kv_cache_dtype: Optional[str] = None,
    engine_release: Optional[str] = None,
    block_size: Optional[int] = None,
    tensor_parallel_size: int = 1,
    tensor_parallel_rank: int = 0,
    pipeline_parallel_size: int = 1,
    pipeline_parallel_rank: int = 0,
    max_model_len: Optional[int] = None,
    max_num_seqs: Optional[int] = None,
    max_num_batched_tokens: Optional[int] = None,
    graph_strategy: Optional[str] = None,
    exchange: Optional[Exchange] = None,
    alloc_conf: Optional[str] = None,
) -> StartUp:
    """Run ``engine``'s start-up on ``device`` through memplan's measured protocol (the
    facade's ``Session``: calibrate, release cache and baseline, check the request, load
    weights, profile run, graph phase, plan, KV cache) and return what it measured.

    Every setting left ``None`` takes the same default as :func:`memplan.plan` for this
    model on this device (one function decides both): the engine release's request (vLLM
    0.34: free / total at the start, the plan's notes say so), block size, requests and
    tokens per step, the rank's KV layout and sizing rules. The release itself is the one
    installed in this interpreter (vLLM, else SGLang: :mod:`memplan._release`), and the newest
    vLLM release memplan knows, as the dry run's, only where neither is installed. So with the
    release named (or no engine installed) a start-up and a dry run of the same model on the
    same GPU differ only by what one measured and the other estimated (the plans'
    ``consumers``) and by the free memory each started from.

    Args:
        device: a :class:`SimDevice` (the one the engine allocates on), or a device id
            (``"cuda:0"``; a ``"sim:..."`` id opens the same simulated GPU as a live
            ``SimDevice`` of that id).
        engine: the hooks (:class:`Engine`).
        model: the model whose KV cache is sized (a preset, directory or config.json, as
            :func:`memplan.plan` takes).
        gpu_memory_utilization: fraction of the device, in (0, 1]; or
        kv_cache_memory_bytes: a fixed KV cache size instead (default: the release's request).
        kv_cache_dtype: ``bf16``, ``fp16``, ``fp8``, ... (default: the model's dtype).
        engine_release: the engine release whose rules and defaults apply (``vllm@0.19``,
            ``sglang``), as ``--engine``. Default: the release installed in this interpreter
            (``vllm``'s package version, else ``sglang``'s: the engine this start-up runs in),
            the plan's ``notes`` say so; where neither is installed, the newest vLLM release
            memplan knows. An installed release memplan has no rules for (newer than its
            table, or older) is refused, naming it: pass ``engine_release`` to choose.
        block_size, max_model_len, max_num_seqs, max_num_batched_tokens: as the engine flags
            of the same names (default: the release's, for this device and model).
        tensor_parallel_size, tensor_parallel_rank, pipeline_parallel_size,
            pipeline_parallel_rank: this process's place in the deployment (ranks count from
            0); the plan sizes this rank's share (its stage's layers, its share of the KV
            heads) and reports it (``rank``, ``tensor_parallel_size``,
            ``pipeline_parallel_size``).
        graph_strategy: force a strategy (``full``, ``sampled``, ``conservative``, ...);
            default: chosen from the device's capabilities.
        exchange: several ranks: called with this rank's plan (JSON text) after planning,
            returns every rank's plans (an all-gather;
            :func:`memplan.distributed.exchanger` builds one from ``torch.distributed``, MPI,
            a Ray collective or any all-gather function); the plans are combined and this rank maps
            the fewest blocks of any (:attr:`StartUp.combined`).
        alloc_conf: the caching allocator's options as the engine runs them (PyTorch's
            ``PYTORCH_ALLOC_CONF`` string, e.g. ``"expandable_segments:True"``); the plan takes
            the KV cache's tensors to round and share segments as they say. Default: read
            from this process's environment as PyTorch in this process reads it
            (``PYTORCH_ALLOC_CONF``, else ``PYTORCH_CUDA_ALLOC_CONF``, else
            ``PYTORCH_HIP_ALLOC_CONF``); none set is PyTorch's default configuration. The
            plan's notes say where it came from; a malformed string is a ``UsageError``
            naming the option.

    Raises:
        ArgumentTypeError: an argument of the wrong type (``engine`` without the hooks, a
            ``float`` block size, an ``exchange`` that is not callable), before anything runs.
        UsageError, DoesNotFitError, MeasurementError: as :func:`memplan.plan`; a value out of
            range is a ``UsageError`` naming the argument; a hook whose answer cannot be right
            (``memory_stats()`` saying ``allocated`` > ``reserved``, a size that is no int) a
            ``MeasurementError`` naming the hook; an exception raised by one of the engine's
            hooks, or by ``exchange``, is re-raised as it was, after memplan's teardown.
    """
    _check_engine(engine)
    if not isinstance(model, (str, os.PathLike)):
        raise ArgumentTypeError(
            f"model={model!r} is {a_type(model)}; model takes a str or a path",
            kind="type",
            exit_code=2,
        )
    installed = None
    if engine_release is None:
        installed = installed_release()
        if installed is not None:
            release, version = installed
            if "@" not in release:
                raise UsageError(
                    f"the installed {release} reports version {version!r}, which names no "
                    f"release; pass engine_release (e.g. 'vllm@0.19') to choose the rules",
                    kind="usage",
                    exit_code=2,
                )
            engine_release = release
    try:
        plan, profile, combined, kv, kv_blocks, kv_warnings = _native.start_up(
            device,
            engine,
            model=os.fspath(model),
            gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            kv_cache_dtype=kv_cache_dtype,
            engine_release=engine_release,
            block_size=block_size,
            tensor_parallel_size=tensor_parallel_size,
            tensor_parallel_rank=tensor_parallel_rank,
            pipeline_parallel_size=pipeline_parallel_size,
            pipeline_parallel_rank=pipeline_parallel_rank,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            graph_strategy=graph_strategy,
            exchange=exchange,
            alloc_conf=alloc_conf,
        )
    except UsageError as e:
        if installed is None or installed[0] not in e.message:
            raise
        # The release came from this interpreter, not from the caller: say where.
        message = (
            f"{e.message} (the release installed here: {installed[0].split('@')[0]} "
            f"{installed[1]}; pass engine_release to size for another)"
        )
        envelope = dict(e.envelope)
        if isinstance(envelope.get("error"), dict):
            envelope["error"] = {**envelope["error"], "message": message}
        raise UsageError(message, kind=e.kind, exit_code=e.exit_code, envelope=envelope) from e
    measured = json.loads(plan)
    if installed is not None and isinstance(measured.get("notes"), list):
        measured["notes"].append(
            f"engine release: {installed[0]}, from the {installed[0].split('@')[0]} "
            f"{installed[1]} installed in this interpreter (engine_release was not given)"
        )
    return StartUp(
        plan=measured,
        profile=json.loads(profile),
        kv_range=kv,
        combined=None if combined is None else json.loads(combined),
        kv_blocks=kv_blocks,
        kv_warnings=json.loads(kv_warnings),
    )
