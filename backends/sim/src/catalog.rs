//! The profile catalogue: named GPUs, their totals (with where each figure comes from), their
//! context overhead, and the quirks and declaration of their real platform.
//!
//! Context overheads are typical figures for a context plus runtime libraries (CUDA ~0.4-0.5
//! GiB on recent data-centre parts); they are modelling choices, not measurements.

use memplan_core::bytes::{GIB, MIB};

use crate::declared;
use crate::profile::{DeviceWideSource, SimProfile};
use crate::quirks::Quirks;

const fn q() -> Quirks {
    Quirks::NONE
}

/// ROCm 6.2 on a discrete card with DRM sysfs: deferred release, 4 MiB hidden per capture. Free
/// is composed from hipMemGetInfo and the DRM counters by the real backend, so it sees graphics
/// allocations (no `free_blind_to_graphics`).
const ROCM62: Quirks = Quirks {
    deferred_graph_release: true,
    hidden_bytes_per_capture: 4 * MIB,
    ..q()
};

const RX7900XTX_TOTAL: u64 = 24_560 * MIB;
const RX7900XTX_SRC: &str =
    "24 GiB less 16 MiB: prints as 23.98 GiB, as ROCm engine logs show (data/README)";
const RTX4090_TOTAL: u64 = 24_564 * MIB;
const RTX4090_SRC: &str =
    "24,564 MiB = 23.99 GiB as the CUDA driver / nvidia-smi report it; some vLLM logs \
                           print 23.64 GiB (a display/OS reservation), not modelled here";

/// The catalogue.
pub(crate) static PROFILES: &[SimProfile] = &[
    SimProfile {
        name: "rtx4090",
        vendor_label: "NVIDIA CUDA",
        device_name: "NVIDIA GeForce RTX 4090",
        total_bytes: RTX4090_TOTAL,
        total_source: RTX4090_SRC,
        context_overhead_bytes: 400 * MIB,
        apu_aperture_bytes: None,
        quirks: q(),
        declared: declared::cuda,
        device_wide: DeviceWideSource::DriverFree,
    },
    SimProfile {
        name: "rtx3090",
        vendor_label: "NVIDIA CUDA",
        device_name: "NVIDIA GeForce RTX 3090",
        total_bytes: 24_146 * MIB,
        total_source: "23.58 GiB as vLLM prints it (data/engine-startup-logs.jsonl)",
        context_overhead_bytes: 400 * MIB,
        apu_aperture_bytes: None,
        quirks: q(),
        declared: declared::cuda,
        device_wide: DeviceWideSource::DriverFree,
    },
    SimProfile {
        name: "a100-40gb",
        vendor_label: "NVIDIA CUDA",
        device_name: "NVIDIA A100-SXM4-40GB",
        total_bytes: 40 * GIB,
        total_source: "vendor published 40 GB HBM2 (binary GiB); the driver reports slightly less",
        context_overhead_bytes: 450 * MIB,
        apu_aperture_bytes: None,
        quirks: q(),
        declared: declared::cuda,
        device_wide: DeviceWideSource::DriverFree,
    },
    SimProfile {
        name: "a100-80gb",
        vendor_label: "NVIDIA CUDA",
        device_name: "NVIDIA A100-SXM4-80GB",
        total_bytes: 80 * GIB,
        total_source: "vendor published 80 GB HBM2e (binary GiB); the driver reports slightly less",
        context_overhead_bytes: 450 * MIB,
        apu_aperture_bytes: None,
        quirks: q(),
        declared: declared::cuda,
        device_wide: DeviceWideSource::DriverFree,
    },
    SimProfile {
        name: "h100-80gb",
        vendor_label: "NVIDIA CUDA",
        device_name: "NVIDIA H100 80GB HBM3",
        total_bytes: 81_090 * MIB,
        total_source: "79.19 GiB as vLLM prints it (data/engine-startup-logs.jsonl; 79.22 GiB with older drivers)",
        context_overhead_bytes: 512 * MIB,
        apu_aperture_bytes: None,
        quirks: q(),
        declared: declared::cuda,
        device_wide: DeviceWideSource::DriverFree,
    },
    SimProfile {
        name: "h200",
        vendor_label: "NVIDIA CUDA",
        device_name: "NVIDIA H200",
        total_bytes: 143_771 * MIB,
        total_source: "143,771 MiB as nvidia-smi reports it (data/README)",
        context_overhead_bytes: 512 * MIB,
        apu_aperture_bytes: None,
        quirks: q(),
        declared: declared::cuda,
        device_wide: DeviceWideSource::DriverFree,
    },
    SimProfile {
        name: "l4",
        vendor_label: "NVIDIA CUDA",
        device_name: "NVIDIA L4",
        total_bytes: 24 * GIB,
        total_source: "vendor published 24 GB GDDR6 (binary GiB); the driver reports less (ECC)",
        context_overhead_bytes: 400 * MIB,
        apu_aperture_bytes: None,
        quirks: q(),
        declared: declared::cuda,
        device_wide: DeviceWideSource::DriverFree,
    },
    SimProfile {
        name: "mi300x",
        vendor_label: "AMD ROCm 6.2",
        device_name: "AMD Instinct MI300X",
        total_bytes: 192 * GIB,
        total_source: "vendor published 192 GB HBM3 (binary GiB)",
        context_overhead_bytes: 512 * MIB,
        apu_aperture_bytes: None,
        quirks: ROCM62,
        declared: declared::rocm62_instinct,
        device_wide: DeviceWideSource::DrmSysfs,
    },
    // The DRM counters are the amdgpu kernel driver's, present whatever the ROCm release: the
    // two "no DRM sysfs" profiles model a machine where the backend cannot read them (a
    // container without /sys/class/drm), where only hipMemGetInfo is read.
    SimProfile {
        name: "rx7900xtx-rocm5.4",
        vendor_label: "AMD ROCm 5.4, no DRM sysfs",
        device_name: "AMD Radeon RX 7900 XTX",
        total_bytes: RX7900XTX_TOTAL,
        total_source: RX7900XTX_SRC,
        context_overhead_bytes: 300 * MIB,
        apu_aperture_bytes: None,
        quirks: Quirks { free_process_local: true, graph_pool_attrs_zero: true, ..q() },
        declared: declared::rocm54,
        device_wide: DeviceWideSource::None,
    },
    SimProfile {
        name: "rx7900xtx-rocm5.5",
        vendor_label: "AMD ROCm 5.5, no DRM sysfs",
        device_name: "AMD Radeon RX 7900 XTX",
        total_bytes: RX7900XTX_TOTAL,
        total_source: RX7900XTX_SRC,
        context_overhead_bytes: 300 * MIB,
        apu_aperture_bytes: None,
        quirks: Quirks { free_blind_to_graphics: true, graph_pool_attrs_zero: true, ..q() },
        declared: declared::rocm55,
        device_wide: DeviceWideSource::None,
    },
    SimProfile {
        name: "rx7900xtx-rocm6.2",
        vendor_label: "AMD ROCm 6.2",
        device_name: "AMD Radeon RX 7900 XTX",
        total_bytes: RX7900XTX_TOTAL,
        total_source: RX7900XTX_SRC,
        context_overhead_bytes: 300 * MIB,
        apu_aperture_bytes: None,
        quirks: ROCM62,
        declared: declared::rocm62_desktop,
        device_wide: DeviceWideSource::DrmSysfs,
    },
    SimProfile {
        name: "strix-halo",
        vendor_label: "AMD ROCm, 6.2+ behaviour (APU)",
        device_name: "AMD Radeon 8060S (Ryzen AI Max+ 395)",
        total_bytes: 64 * GIB,
        total_source: "sim assumption: 128 GB LPDDR5X system, GTT limit at half of system RAM = 64 GiB usable",
        context_overhead_bytes: 256 * MIB,
        apu_aperture_bytes: Some(512 * MIB),
        // The real backend bounds the APU's readings by the host's MemAvailable, not the
        // aperture (`apu-wrong-pool=on` reproduces a backend that trusts hipMemGetInfo).
        quirks: ROCM62,
        declared: declared::rocm62_apu,
        device_wide: DeviceWideSource::HostAvailable,
    },
    SimProfile {
        name: "arc-a770",
        vendor_label: "Intel Level Zero (i915, non-root)",
        device_name: "Intel(R) Arc(TM) A770 Graphics",
        total_bytes: 16 * GIB,
        total_source: "vendor published 16 GB GDDR6 (binary GiB)",
        context_overhead_bytes: 256 * MIB,
        apu_aperture_bytes: None,
        quirks: Quirks { free_equals_total: true, sysman_processes: true, no_graph_pool_query: true, ..q() },
        declared: declared::xpu_arc_a770,
        device_wide: DeviceWideSource::DriverFree,
    },
    SimProfile {
        name: "max1550",
        vendor_label: "Intel Level Zero (Sysman)",
        device_name: "Intel(R) Data Center GPU Max 1550",
        total_bytes: 128 * GIB,
        total_source: "vendor published 128 GB HBM2e (binary GiB), both stacks as one device (COMPOSITE mode)",
        context_overhead_bytes: 512 * MIB,
        apu_aperture_bytes: None,
        quirks: Quirks { sysman_processes: true, no_graph_pool_query: true, ..q() },
        declared: declared::xpu_max1550,
        device_wide: DeviceWideSource::DriverFree,
    },
    SimProfile {
        name: "arc-b580-nosysman",
        vendor_label: "Intel Level Zero (no Sysman)",
        device_name: "Intel(R) Arc(TM) B580 Graphics",
        total_bytes: 12 * GIB,
        total_source: "vendor published 12 GB GDDR6 (binary GiB)",
        context_overhead_bytes: 256 * MIB,
        apu_aperture_bytes: None,
        quirks: Quirks { sysman_missing: true, no_graph_pool_query: true, ..q() },
        declared: declared::xpu_no_sysman,
        device_wide: DeviceWideSource::DriverFree,
    },
    SimProfile {
        name: "arc-140v",
        vendor_label: "Intel Level Zero (integrated, shared memory)",
        device_name: "Intel(R) Arc(TM) 140V GPU (16GB)",
        total_bytes: 16 * GIB,
        total_source: "Lunar Lake, 32 GB LPDDR5X on package; the driver exposes half of it to the GPU, as the device name says (16GB)",
        context_overhead_bytes: 256 * MIB,
        apu_aperture_bytes: None,
        // An integrated GPU has no device-local memory for Sysman to report: Sysman's free
        // reading is absent (the `sysman-missing` behaviour), its per-process query lists this
        // process (the backend composes a process-local free from it), the host's MemAvailable
        // counts every process's use of the shared memory.
        quirks: Quirks { sysman_missing: true, sysman_processes: true, no_graph_pool_query: true, ..q() },
        declared: declared::xpu_integrated,
        device_wide: DeviceWideSource::HostAvailable,
    },
    SimProfile {
        name: "broken-stale",
        vendor_label: "broken on purpose (conformance suite)",
        device_name: "Simulated GPU with stale free (broken on purpose)",
        total_bytes: RTX4090_TOTAL,
        total_source: RTX4090_SRC,
        context_overhead_bytes: 400 * MIB,
        apu_aperture_bytes: None,
        quirks: Quirks { stale_free: true, ..q() },
        declared: declared::cuda,
        device_wide: DeviceWideSource::DriverFree,
    },
    // Liars for the conformance suite: each tells one lie a backend could tell, and the suite
    // must fail naming the check that catches it (crates/memplan-conformance/tests/liars.rs).
    SimProfile {
        name: "broken-process-local",
        vendor_label: "broken on purpose (conformance suite)",
        device_name: "Simulated GPU declaring a process-local free reading exact",
        total_bytes: RTX4090_TOTAL,
        total_source: RTX4090_SRC,
        context_overhead_bytes: 400 * MIB,
        apu_aperture_bytes: None,
        quirks: Quirks { free_process_local: true, ..q() },
        declared: declared::cuda,
        device_wide: DeviceWideSource::DriverFree,
    },
    SimProfile {
        name: "broken-total-high",
        vendor_label: "broken on purpose (conformance suite)",
        device_name: "Simulated GPU reporting its total 8 GiB too high",
        total_bytes: RTX4090_TOTAL,
        total_source: RTX4090_SRC,
        context_overhead_bytes: 400 * MIB,
        apu_aperture_bytes: None,
        quirks: Quirks { total_over: 8 * GIB, ..q() },
        declared: declared::cuda,
        device_wide: DeviceWideSource::DriverFree,
    },
    SimProfile {
        name: "broken-total-low",
        vendor_label: "broken on purpose (conformance suite)",
        device_name: "Simulated GPU reporting its total 128 MiB too low",
        total_bytes: RTX4090_TOTAL,
        total_source: RTX4090_SRC,
        context_overhead_bytes: 400 * MIB,
        apu_aperture_bytes: None,
        quirks: Quirks { total_under: 128 * MIB, ..q() },
        declared: declared::cuda,
        device_wide: DeviceWideSource::DriverFree,
    },
    SimProfile {
        name: "broken-leaky-free",
        vendor_label: "broken on purpose (conformance suite)",
        device_name: "Simulated GPU whose free keeps 2 MiB of every allocation",
        total_bytes: RTX4090_TOTAL,
        total_source: RTX4090_SRC,
        context_overhead_bytes: 400 * MIB,
        apu_aperture_bytes: None,
        quirks: Quirks { leak_per_free: 2 * MIB, ..q() },
        declared: declared::cuda,
        device_wide: DeviceWideSource::DriverFree,
    },
    SimProfile {
        name: "broken-leaky-vm",
        vendor_label: "broken on purpose (conformance suite)",
        device_name: "Simulated GPU whose destroy_physical keeps 2 MiB",
        total_bytes: RTX4090_TOTAL,
        total_source: RTX4090_SRC,
        context_overhead_bytes: 400 * MIB,
        apu_aperture_bytes: None,
        quirks: Quirks { leak_per_vm_release: 2 * MIB, ..q() },
        declared: declared::cuda,
        device_wide: DeviceWideSource::DriverFree,
    },
    SimProfile {
        name: "broken-leaky-free-unreadable",
        vendor_label: "broken on purpose (conformance suite)",
        device_name: "Simulated GPU without a free reading whose free keeps 2 MiB of every allocation",
        total_bytes: 12 * GIB,
        total_source: "vendor published 12 GB GDDR6 (binary GiB), as arc-b580-nosysman",
        context_overhead_bytes: 256 * MIB,
        apu_aperture_bytes: None,
        quirks: Quirks { sysman_missing: true, no_graph_pool_query: true, leak_per_free: 2 * MIB, ..q() },
        declared: declared::xpu_no_sysman,
        device_wide: DeviceWideSource::DriverFree,
    },
];
