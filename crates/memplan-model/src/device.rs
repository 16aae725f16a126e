//! What a dry run needs to know about the device beyond its total: the class of GPU whose
//! start-up the non-allocator estimate follows, whether its memory is the host's, and which
//! platform the engine runs on. Read from the device's name as the engine prints it (`NVIDIA
//! A100 80GB`, `NVIDIA GB10`, `AMD Instinct MI300X`); a device without a name is classed by its
//! total.
//!
//! The classes are about the memory an engine start-up takes outside its allocator, which
//! depends on the hardware rather than the model:
//!
//! - [`DeviceClass::NvSwitchDatacenter`]: Hopper and Blackwell datacenter GPUs (H100, H200,
//!   H800, H20, GH200, B100, B200, B300, GB200, GB300). Their kernels (FlashAttention 3,
//!   `wgmma`/`tcgen05` GEMMs) load larger images, and on their NVSwitch systems NCCL allocates
//!   NVLink SHARP (NVLS) buffers once tensor parallelism is on.
//! - [`DeviceClass::Standard`]: everything else (Ampere including the A100, Ada, consumer and
//!   workstation Blackwell, AMD Instinct and Radeon, Intel): smaller images, and tensor
//!   parallelism over PCIe or NVLink without NVLS.
//!
//! The figures each class gets are in [`crate::estimate`], with the logs they come from.

use memplan_core::bytes::GIB;

/// The class of GPU the non-allocator estimate follows (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceClass {
    /// Hopper and Blackwell datacenter GPUs.
    NvSwitchDatacenter,
    /// Every other GPU.
    Standard,
}

/// Name fragments of Hopper and Blackwell datacenter GPUs, matched on the lower-cased name's
/// words (`NVIDIA H100 80GB HBM3`, `NVIDIA GH200 480GB`, `NVIDIA B200`).
const DATACENTER: &[&str] = &[
    "h100", "h200", "h800", "h20", "gh200", "b100", "b200", "b300", "gb200", "gb300",
];

/// Name fragments of NVIDIA GPUs whose memory is the host's and that CUDA reports as integrated
/// (`cudaDeviceProp::integrated`): DGX Spark's GB10, Jetson (Orin, Thor).
const INTEGRATED: &[&str] = &["gb10", "jetson", "orin", "thor"];

/// Name fragments of AMD GPUs (the engine runs them on ROCm).
const AMD: &[&str] = &[
    "amd", "instinct", "radeon", "mi300", "mi325", "mi355", "mi250", "gfx",
];

/// Name fragments of Intel GPUs (XPU).
const INTEL: &[&str] = &["intel", "arc(tm)", "data center gpu max"];

fn words(name: &str) -> Vec<String> {
    name.to_ascii_lowercase()
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

fn has_word(name: &str, list: &[&str]) -> bool {
    let w = words(name);
    list.iter().any(|k| w.iter().any(|x| x == k))
}

impl DeviceClass {
    /// The class of a device named `name` (as the engine or the driver prints it) with `total`
    /// bytes. An empty or unrecognised name is classed by size: 70 GiB or more is taken as a
    /// datacenter GPU of the NVSwitch class (H100/H200 rather than an A100, the common case at
    /// that size), anything smaller as standard (no Hopper or Blackwell datacenter part is
    /// smaller).
    pub fn of(name: &str, total: u64) -> DeviceClass {
        let lower = name.to_ascii_lowercase();
        if has_word(name, DATACENTER) {
            return DeviceClass::NvSwitchDatacenter;
        }
        let known = lower.contains("nvidia")
            || lower.contains("geforce")
            || lower.contains("tesla")
            || lower.contains("rtx")
            || lower.contains("a100")
            || has_word(name, INTEGRATED)
            || has_word(name, AMD)
            || has_word(name, INTEL)
            || has_word(
                name,
                &[
                    "a10", "a10g", "a30", "a40", "l4", "l40", "l40s", "v100", "t4",
                ],
            );
        if !known && total >= 70 * GIB {
            DeviceClass::NvSwitchDatacenter
        } else {
            DeviceClass::Standard
        }
    }
}

/// Whether the device named `name` shares the host's memory and CUDA reports it integrated: the
/// engine then reads free memory from the host's available memory (vLLM
/// `utils/mem_utils.py` `MemorySnapshot.measure`, `psutil.virtual_memory().available` when
/// `is_integrated_gpu`), so host allocations of the engine count as device memory.
pub fn unified_memory(name: &str) -> bool {
    has_word(name, INTEGRATED)
}

/// The platform the engine runs a device named `name` on (`rocm`, `xpu`), or `None` for CUDA
/// and unknown names (taken as CUDA).
pub fn platform(name: &str) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase();
    if has_word(name, AMD) || lower.contains("strix") {
        Some("rocm")
    } else if has_word(name, INTEL) || lower.contains("intel") {
        Some("xpu")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_as_engines_print_them() {
        let c = |n: &str, t: u64| DeviceClass::of(n, t * GIB);
        for n in [
            "NVIDIA H100 80GB HBM3",
            "NVIDIA H200",
            "NVIDIA GH200 480GB",
            "NVIDIA B200",
            "NVIDIA H20",
        ] {
            assert_eq!(c(n, 80), DeviceClass::NvSwitchDatacenter, "{n}");
        }
        for n in [
            "NVIDIA A100-SXM4-80GB",
            "NVIDIA A100 80GB PCIe",
            "NVIDIA A10G",
            "NVIDIA GeForce RTX 4090",
            "NVIDIA GB10",
            "AMD Instinct MI300X",
            "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            "NVIDIA L40S",
        ] {
            assert_eq!(c(n, 80), DeviceClass::Standard, "{n}");
        }
        // No name: by size.
        assert_eq!(c("", 79), DeviceClass::NvSwitchDatacenter);
        assert_eq!(c("", 24), DeviceClass::Standard);
        assert!(unified_memory("NVIDIA GB10") && unified_memory("Jetson AGX Orin"));
        assert!(!unified_memory("NVIDIA GH200 480GB") && !unified_memory("NVIDIA H100"));
        assert_eq!(platform("AMD Instinct MI300X"), Some("rocm"));
        assert_eq!(
            platform("AMD Radeon 8060S (Ryzen AI Max+ 395)"),
            Some("rocm")
        );
        assert_eq!(platform("Intel(R) Arc(TM) A770 Graphics"), Some("xpu"));
        assert_eq!(platform("NVIDIA GeForce RTX 4090"), None);
    }
}
