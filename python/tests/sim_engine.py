"""A small engine written in Python against memplan's engine hooks, on a simulated GPU.

It allocates as a PyTorch engine would (weights as tensors, an activation peak, a library
workspace outside the allocator, graphs captured into a private pool), through
``SimDevice.allocator()`` in place of ``torch.cuda``; the figures it uses are its own, and
the tests judge memplan's measurements against what this engine actually allocated.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from memplan.engine import Engine, SimDevice

MIB = 1 << 20
GIB = 1 << 30


class PyEngine(Engine):
    def __init__(
        self,
        device: SimDevice,
        weights: int = 3 * GIB,
        activation: int = 600 * MIB,
        workspace: int = 256 * MIB,
        sizes: Optional[List[int]] = None,
        intermediate_per_token: int = 2 * MIB,
        kernel_nodes: int = 150,
        post_capture: bool = False,
        fail_capture_at: Optional[int] = None,
    ) -> None:
        self.device = device
        self.alloc = device.allocator()
        self.weights, self.activation, self.workspace = weights, activation, workspace
        self.sizes = [512, 256, 128, 64, 32, 16, 8, 4, 2, 1] if sizes is None else sizes
        self.intermediate_per_token = intermediate_per_token
        self.kernel_nodes = kernel_nodes
        self.post_capture = post_capture
        self.fail_capture_at = fail_capture_at
        self.tensors: List[int] = []
        self.graphs: List[int] = []
        self.capturing = False
        self.captures = 0
        self.kv_range: Optional[Tuple[int, int]] = None
        self.calls: List[str] = []

    # allocator view
    def memory_stats(self) -> Dict[str, int]:
        return self.alloc.memory_stats()

    def release_cached(self) -> None:
        self.calls.append("release_cached")
        self.alloc.empty_cache()

    def reset_peak(self) -> None:
        self.alloc.reset_peak()

    def gpu_id(self) -> Optional[str]:
        return self.alloc.gpu_id()

    # the engine's steps
    def load_weights(self) -> None:
        self.calls.append("load_weights")
        n = 8
        for _ in range(n):
            self.tensors.append(self.alloc.malloc(self.weights // n))

    def profile_run(self) -> None:
        self.calls.append("profile_run")
        act = self.alloc.malloc(self.activation)
        self.device.allocate(self.workspace)  # cuBLAS-like workspace, held from now on
        self.alloc.free(act)
        self.alloc.empty_cache()

    # graphs
    def graph_sizes(self) -> List[int]:
        return list(self.sizes)

    def warm_up(self, size: int) -> None:
        self.calls.append(f"warm_up {size}")
        b = self.alloc.malloc(self.intermediate_per_token * size)
        self.alloc.free(b)

    def capture_graph(self, size: int) -> None:
        self.calls.append(f"capture {size}")
        self.alloc.begin_graph_capture()
        self.capturing = True
        n, self.captures = self.captures, self.captures + 1
        if self.fail_capture_at == n:
            raise RuntimeError(f"injected failure capturing size {size}")
        g = self.alloc.end_graph_capture(self.kernel_nodes, self.intermediate_per_token * size)
        self.capturing = False
        self.graphs.append(g)

    def release_graphs(self) -> None:
        self.calls.append("release_graphs")
        if self.capturing:
            self.alloc.abort_graph_capture()
            self.capturing = False
        for g in self.graphs:
            self.alloc.destroy_graph(g)
        self.graphs.clear()
        self.alloc.release_private_pools()

    def supports_post_capture(self) -> bool:
        return self.post_capture

    def bind_kv_range(self, address: int, size: int) -> None:
        self.calls.append("bind_kv_range")
        self.kv_range = (address, size)


class SyncingEngine(PyEngine):
    """The same engine with the optional ``synchronize`` hook (``torch.xpu.synchronize()``):
    on a device that cannot synchronize itself, what its ``empty_cache`` gave back while work
    was in flight returns to the driver only then."""

    def synchronize(self) -> None:
        self.calls.append("synchronize")
        self.alloc.synchronize()
