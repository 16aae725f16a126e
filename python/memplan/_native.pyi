"""Type stubs of the native module (PyO3). Use the functions of :mod:`memplan` instead."""

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

__version__: str

def run_json(argv: Sequence[str]) -> Tuple[int, str]:
    """Run ``memplan <argv>`` (which must ask for ``--json``) in this process; return its
    exit code and the JSON it would print (the answer, or the error envelope). Never raises
    for a failure of the command: a caught panic is an ``internal`` error envelope."""

def main(argv: Sequence[str]) -> int:
    """Run ``memplan <argv>`` exactly as the binary does (printing to this process's stdout
    and stderr) and return its exit code."""

def _panic_for_test(message: str) -> Tuple[int, str]:
    """Panic inside the wrapper every call runs in; returns the ``internal`` envelope."""

class SimDevice:
    """One simulated GPU (``sim:rtx4090``, ``sim:mi300x,other=4GiB``, ...)."""

    def __init__(self, id: str, private: bool = False) -> None: ...
    @property
    def id(self) -> str: ...
    @property
    def total_bytes(self) -> Optional[int]: ...
    def allocator(self) -> "SimAllocator":
        """The caching allocator an engine allocates from on this GPU (one per GPU)."""
    def allocate(self, bytes: int) -> int:
        """Allocate outside the allocator (a library workspace); a handle for ``free``."""
    def free(self, handle: int) -> None: ...
    def set_other_processes(self, bytes: int) -> None:
        """Memory other processes hold on this GPU."""

class SimAllocator:
    """A PyTorch-like caching allocator on a simulated GPU."""

    def malloc(self, bytes: int) -> int: ...
    def free(self, handle: int) -> None: ...
    def empty_cache(self) -> None: ...
    def synchronize(self) -> None: ...
    def memory_stats(self) -> Dict[str, int]:
        """``{"reserved", "allocated", "peak_allocated", "peak_reserved"}`` in bytes."""
    def reset_peak(self) -> None: ...
    def gpu_id(self) -> str: ...
    def begin_graph_capture(self) -> None: ...
    def end_graph_capture(
        self, kernel_nodes: int, intermediate_bytes: int, alloc_node_bytes: Optional[int] = None
    ) -> int: ...
    def abort_graph_capture(self) -> None: ...
    def destroy_graph(self, handle: int) -> None: ...
    def release_private_pools(self) -> None: ...
    @property
    def live_graphs(self) -> int: ...

class KvRange:
    """The KV cache's address range after a post-capture start-up."""

    @property
    def address(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def mapped_bytes(self) -> int: ...
    @property
    def released(self) -> bool: ...
    def release(self) -> None: ...

def start_up(
    device: Union[str, SimDevice],
    engine: Any,
    *,
    model: str,
    gpu_memory_utilization: Optional[float] = ...,
    kv_cache_memory_bytes: Optional[int] = ...,
    kv_cache_dtype: Optional[str] = ...,
    engine_release: Optional[str] = ...,
    block_size: Optional[int] = ...,
    tensor_parallel_size: Optional[int] = ...,
    tensor_parallel_rank: Optional[int] = ...,
    pipeline_parallel_size: Optional[int] = ...,
    pipeline_parallel_rank: Optional[int] = ...,
    max_model_len: Optional[int] = ...,
    max_num_seqs: Optional[int] = ...,
    max_num_batched_tokens: Optional[int] = ...,
    graph_strategy: Optional[str] = ...,
    exchange: Optional[Callable[[str], Sequence[str]]] = ...,
    alloc_conf: Optional[str] = ...,
) -> Tuple[str, str, Optional[str], Optional[KvRange], int, str]: ...

def combine_plans(plans: List[str]) -> Tuple[int, str]: ...
