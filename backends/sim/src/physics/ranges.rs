//! The ranges of every hidden quantity: the world (public evidence, cited) and the adversarial
//! share of the seeds (wider than the evidence). `docs/simulator-physics.md` has one row per
//! [`Quantity`].

use memplan_core::bytes::{KIB, MIB};
use serde::Serialize;

/// One hidden quantity: its world range (public evidence), its adversarial range (wider, drawn
/// on [`ADVERSARIAL_PER_MILLE`](super::ADVERSARIAL_PER_MILLE) of the seeds) and where the world range comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Quantity {
    /// Short name (the row of `docs/simulator-physics.md`).
    pub name: &'static str,
    /// Unit of the bounds: `bytes`, `per mille`, `nodes`, `synchronizes`.
    pub unit: &'static str,
    /// Inclusive world range.
    pub world: (u64, u64),
    /// Inclusive adversarial range.
    pub adversarial: (u64, u64),
    /// Public sources of the world range.
    pub evidence: &'static str,
}

impl Quantity {
    /// The range of a regime.
    pub const fn range(&self, adversarial: bool) -> (u64, u64) {
        if adversarial {
            self.adversarial
        } else {
            self.world
        }
    }
}

/// Driver memory of a graph's executable object, per kernel node.
pub const EXEC_PER_KERNEL_NODE: Quantity = Quantity {
    name: "executable bytes per kernel node",
    unit: "bytes",
    world: (2 * KIB, 72 * KIB),
    adversarial: (KIB, 512 * KIB),
    evidence: "~2.7 KB/node (JBjoernskov/Twin4Build#134: 2.0 GiB outside the allocator for ~800k \
               nodes, torch 2.11, CUDA 12.8); ~10 KB/node (NVIDIA/cccl#3768, executable graph \
               cache); ~66 KB/node (NVIDIA developer forum 'Increasing memory footprint with large \
               task graphs': 500 -> 2000 empty-kernel nodes took 362 -> 458 MB, driver 470, CUDA \
               11.2)",
};

/// How much a graph's kernel-node count varies over the capture sizes, per mille of the
/// engine's base count (kernels chosen per batch size: split-K reductions, different GEMM
/// tiles). World: grows with the size; adversarial: any size may have more, in no order.
pub const KERNEL_NODE_SPREAD: Quantity = Quantity {
    name: "kernel-node spread over capture sizes",
    unit: "per mille",
    world: (0, 160),
    adversarial: (0, 1000),
    evidence: "AtomaAI/atoma-infer#186: one decode step captured at buckets 1, 8, 32, 64 gave \
               79-91 nodes (+15%)",
};

/// Per-capture variation of the executable object's size, per mille either way: the same
/// graph captured twice does not cost exactly the same.
pub const CAPTURE_JITTER: Quantity = Quantity {
    name: "capture-to-capture jitter of the executable object",
    unit: "per mille",
    world: (0, 24),
    adversarial: (0, 300),
    evidence: "no public figure for the same graph captured twice; vllm-project/vllm#22897 and \
               #23184 show neighbouring sizes taking 24, 26, 26, 28, 26 MiB (size effects, which \
               the kernel-node spread and intermediate jitter draw); the world range allows a \
               small variation, the adversarial one a large one",
};

/// Driver memory a library allocates on the engine's first capture and keeps (cuBLAS
/// workspace taken with `cudaMallocAsync` outside the caching allocator, communicator
/// buffers registered on first capture).
pub const LAZY_FIRST_CAPTURE: Quantity = Quantity {
    name: "memory allocated lazily on the first capture",
    unit: "bytes",
    world: (0, 40 * MIB),
    adversarial: (0, 768 * MIB),
    evidence: "pytorch/pytorch#124250 (CUDA >= 12.2: cuBLAS allocates its workspace with \
               cudaMallocAsync outside the caching allocator during capture), paiml/entrenar#325 \
               (a 32 MB cuBLAS workspace pre-allocated for capture), NVIDIA/nccl#1234 (NCCL >= \
               2.19 raises the memory taken during capture)",
};

/// Per-capture memory a runtime keeps after the graph is destroyed (where the platform has
/// it; on any platform in the adversarial regime).
pub const HIDDEN_PER_CAPTURE: Quantity = Quantity {
    name: "per-capture memory the runtime keeps",
    unit: "bytes",
    world: (3 * MIB, 6 * MIB),
    adversarial: (0, 24 * MIB),
    evidence: "ROCm/pytorch#2286: with HSA_DISABLE_FRAGMENT_ALLOCATOR=1 each hipGraph capture \
               took 0.003906 GiB (4 MiB) and never returned it (ROCm 6.x, HSA fragment \
               allocator); pytorch/pytorch#83461: before CUDA 12.2 cuBLAS took a new workspace \
               per captured graph",
};

/// Synchronizes after which a destroyed graph's driver memory returns (world: 1 where the
/// platform defers the release, 0 elsewhere; adversarial: any platform, and more synchronizes
/// than a planner may care to wait for, so that a plan has to notice memory that has not come
/// back rather than assume it has).
pub const RELEASE_AFTER_SYNCS: Quantity = Quantity {
    name: "synchronizes before a destroyed graph's memory returns",
    unit: "synchronizes",
    world: (0, 1),
    adversarial: (0, 17),
    evidence: "ROCm >= 6.2: hipGraphExecDestroy frees at the next synchronize (DESIGN.md vendor \
               table); kekzl/imp#13: CUDA graph instantiation reserves per-device memory that \
               survives cudaGraphExecDestroy until cudaDeviceGraphMemTrim",
};

/// Per mille of an eager warm-up's memory that stays cached in the allocator.
pub const WARMUP_LEFT_CACHED: Quantity = Quantity {
    name: "share of a warm-up left cached",
    unit: "per mille",
    world: (600, 1000),
    adversarial: (0, 1000),
    evidence: "PyTorch's caching allocator keeps freed blocks until empty_cache \
               (c10/cuda/CUDACachingAllocator.cpp); how much of a warm-up's working set is still \
               cached depends on the kernels that ran",
};

/// Context and runtime libraries: the profile's typical figure scaled by this.
pub const CONTEXT_SCALE: Quantity = Quantity {
    name: "context and runtime libraries, of the profile's figure",
    unit: "per mille",
    world: (800, 1200),
    adversarial: (500, 2100),
    evidence: "non-torch memory 0.24-0.35 GiB in the single-GPU vLLM logs of shared/data \
               (engine-startup-logs.jsonl), 2.07 GiB in one H100 log (llm-d-planner#205)",
};

/// Noise of an approximate free (or device-wide) reading, per mille of the platform's real
/// tolerance. World: a small share, at most [`READ_NOISE_MAX`](super::READ_NOISE_MAX); adversarial: up to the
/// tolerance itself, and on a device that declares a tolerance smaller than its platform's
/// (`declare-exact`) above the declared one, up to [`WRONG_DECLARATION_NOISE_MAX`](super::WRONG_DECLARATION_NOISE_MAX).
pub const READ_NOISE: Quantity = Quantity {
    name: "reading noise, of the platform's tolerance",
    unit: "per mille",
    world: (0, 125),
    adversarial: (0, 1000),
    evidence: "ROCm/legacy-rocm-build#1909 (an AMD maintainer: rocm-smi's DRM reading and \
               hipMemGetInfo 'might not align perfectly if memory is being used at the time'); \
               ROCm/legacy-rocm-build#6389 (idle RX 7900 GRE, ROCm 7.2.1: hipMemGetInfo free \
               16332 MiB, amdgpu 16170 MiB: an offset, which the declared tolerance covers, not \
               noise); vllm-project/vllm#12126 (vLLM's profiling test allows windows of the \
               CUDA reading 'a small error (<10 MiB in practice)' from the runtime, \
               tests/test_utils.py); vllm-project/vllm#56830 (GB10 unified memory, vLLM alone: \
               free grew 82.94 -> 90.17 GiB during profiling: the host's other memory, drawn \
               by the neighbour scenarios, not as noise). No public figure isolates \
               read-to-read jitter of an idle device: the world share is a modelling choice \
               below these, the adversarial range reaches the whole tolerance",
};

/// Variation of a graph's intermediate memory around the scenario's per-token figure, per
/// mille either way (kernels pick tiles and workspaces per batch size).
pub const INTERMEDIATE_JITTER: Quantity = Quantity {
    name: "intermediate memory's departure from linear in the batch size",
    unit: "per mille",
    world: (0, 100),
    adversarial: (0, 600),
    evidence: "vllm-project/vllm#23184 log: capture sizes 280 and 272 took 26 MiB and 6 MiB, so \
               graph memory is not linear in the batch size",
};

/// Large-allocation rounding of the caching allocator (adversarial only; the world uses
/// PyTorch's constants, [`AllocatorRules::PYTORCH`](super::AllocatorRules::PYTORCH)).
pub const ROUND_LARGE: Quantity = Quantity {
    name: "large-allocation rounding of the caching allocator",
    unit: "bytes",
    world: (2 * MIB, 2 * MIB),
    adversarial: (512 * KIB, 40 * MIB),
    evidence: "PyTorch CUDACachingAllocator.cpp: kRoundLarge rounds the segment of a request of \
               10 MiB and more to 2 MiB (the same constants in c10/xpu/XPUCachingAllocator.cpp); \
               expandable_segments (off by default) maps 20 MiB pages per segment, not per \
               allocation: allocations are packed into the pages, so the 20 MiB is rounding of \
               the pool, within the adversarial range as a per-allocation granule",
};

/// Every quantity, in the order of `docs/simulator-physics.md`.
pub const QUANTITIES: [Quantity; 11] = [
    EXEC_PER_KERNEL_NODE,
    KERNEL_NODE_SPREAD,
    CAPTURE_JITTER,
    LAZY_FIRST_CAPTURE,
    HIDDEN_PER_CAPTURE,
    RELEASE_AFTER_SYNCS,
    WARMUP_LEFT_CACHED,
    CONTEXT_SCALE,
    READ_NOISE,
    INTERMEDIATE_JITTER,
    ROUND_LARGE,
];
