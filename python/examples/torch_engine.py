"""A PyTorch engine driven through memplan's measured start-up (the GPU check runs it).

    python torch_engine.py [--device N] [--model PRESET]

Maps memplan's engine hooks onto torch.cuda (see memplan.engine's docs): the allocator view
is torch.cuda.memory_stats / empty_cache / reset_peak_memory_stats, graphs are captured with
torch.cuda.graph into one shared pool, and memplan reads the driver's free memory around
every step. A small MLP stands in for the model: what is checked is the protocol against
PyTorch's own accounting, not a model's figures.

Prints one JSON object; `start_up_ok` is the verdict the GPU check reads. Needs a CUDA GPU,
PyTorch with CUDA, and the memplan wheel.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from typing import Any, Dict, List, Optional

import torch

import memplan
from memplan.engine import Engine

MIB = 1 << 20


class TorchEngine(Engine):
    def __init__(self, device: int, hidden: int = 4096, layers: int = 8) -> None:
        self.dev = torch.device("cuda", device)
        self.hidden, self.layers = hidden, layers
        self.model: Optional[torch.nn.Module] = None
        self.graphs: List[Any] = []
        self.pool: Any = None
        self.static: Dict[int, torch.Tensor] = {}
        self.kv_range: Optional[Any] = None
        self.measured: Dict[int, torch.Tensor] = {}

    # the allocator view
    def memory_stats(self) -> Dict[str, int]:
        s = torch.cuda.memory_stats(self.dev)
        return {
            # A key PyTorch does not report is a KeyError, never a 0 taken for a reading.
            "reserved": int(s["reserved_bytes.all.current"]),
            "allocated": int(s["allocated_bytes.all.current"]),
            "peak_allocated": int(s["allocated_bytes.all.peak"]),
            "peak_reserved": int(s["reserved_bytes.all.peak"]),
        }

    def release_cached(self) -> None:
        torch.cuda.synchronize(self.dev)
        torch.cuda.empty_cache()

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.dev)

    # tensors memplan allocates to measure how the caching allocator rounds the KV cache's
    def allocate_tensor(self, nbytes: int) -> int:
        t = torch.empty(nbytes, dtype=torch.uint8, device=self.dev)
        self.measured[id(t)] = t
        return id(t)

    def free_tensor(self, handle: int) -> None:
        del self.measured[handle]

    # the engine's own steps
    def load_weights(self) -> None:
        blocks: List[torch.nn.Module] = []
        for _ in range(self.layers):
            blocks += [torch.nn.Linear(self.hidden, 4 * self.hidden), torch.nn.GELU(),
                       torch.nn.Linear(4 * self.hidden, self.hidden)]
        self.model = torch.nn.Sequential(*blocks).to(self.dev, torch.half).eval()

    def weight_bytes(self) -> int:
        assert self.model is not None
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    @torch.no_grad()
    def profile_run(self) -> None:
        assert self.model is not None
        x = torch.randn(2048, self.hidden, device=self.dev, dtype=torch.half)
        self.model(x)
        del x
        torch.cuda.synchronize(self.dev)
        torch.cuda.empty_cache()

    # graphs
    def graph_sizes(self) -> List[int]:
        return [256, 128, 64, 32, 16, 8, 4, 2, 1]

    @torch.no_grad()
    def warm_up(self, size: int) -> None:
        assert self.model is not None
        if size not in self.static:
            self.static[size] = torch.zeros(size, self.hidden, device=self.dev, dtype=torch.half)
        s = torch.cuda.Stream(self.dev)
        s.wait_stream(torch.cuda.current_stream(self.dev))
        with torch.cuda.stream(s):
            self.model(self.static[size])
        torch.cuda.current_stream(self.dev).wait_stream(s)

    @torch.no_grad()
    def capture_graph(self, size: int) -> None:
        assert self.model is not None
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            self.model(self.static[size])
        self.graphs.append(g)

    def release_graphs(self) -> None:
        self.graphs.clear()
        self.pool = None
        self.static.clear()
        gc.collect()
        torch.cuda.synchronize(self.dev)
        torch.cuda.empty_cache()

    def kernel_nodes_hint(self, size: int) -> Optional[int]:
        return 3 * self.layers

    def alloc_node_bytes_hint(self, size: int) -> Optional[int]:
        return 0  # torch.cuda.graph allocates from its private pool, no allocation nodes


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--model", default="qwen2.5-0.5b-instruct")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    a = ap.parse_args()
    torch.cuda.set_device(a.device)
    torch.zeros(1, device="cuda")  # torch's context first, as an engine has it
    out: Dict[str, Any] = {"torch_version": torch.__version__, "memplan_version": memplan.__version__}
    engine = TorchEngine(a.device)
    try:
        s = memplan.engine.start_up(
            f"cuda:{a.device}",
            engine,
            model=a.model,
            gpu_memory_utilization=a.gpu_memory_utilization,
        )
    except memplan.MemplanError as e:
        out.update(start_up_ok=False, error={"kind": e.kind, "message": e.message})
        print(json.dumps(out, indent=2))
        return 1
    plan, profile = s.plan, s.profile
    weights = engine.weight_bytes()
    measured = profile.get("weights_bytes") or 0
    # the blocks the start-up hands over (the plan's, or fewer where the allocator's rounding
    # of the measured tensors did not fit), then one step served at full size
    kv = int(s.kv_blocks) * int(plan["kv"]["block_bytes"])
    kv_tensor = torch.empty(kv // 2, dtype=torch.half, device=engine.dev) if s.kv_range is None else None
    engine.profile_run()
    free, total = torch.cuda.mem_get_info(a.device)
    checks = {
        # memplan's weights window is the allocator's growth: torch's own parameter bytes,
        # up to the caching allocator's rounding (512 B per tensor, 2 MiB segments)
        "weights_within_2mib": abs(measured - weights) <= 2 * MIB,
        "kv_cache_positive": kv > 0,
        "kv_cache_allocated": kv_tensor is not None or s.kv_range is not None,
        "free_after_kv_nonnegative": free >= 0,
    }
    out.update(
        start_up_ok=all(checks.values()),
        checks=checks,
        torch_weight_bytes=weights,
        plan=plan,
        profile=profile,
        torch_free_after=free,
        torch_total=total,
        post_capture=s.kv_range is not None,
    )
    print(json.dumps(out, indent=2, default=str))
    return 0 if out["start_up_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
