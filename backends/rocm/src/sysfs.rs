//! Readers for what the kernel knows and HIP does not say: the amdgpu DRM counters in
//! `/sys/class/drm/card*/device/mem_info_{vram,gtt}_{total,used}` (every user of the VRAM,
//! graphics included) and the host's `/proc/meminfo` (what bounds an APU).
//!
//! The root is injectable ([`SysRoot::at`]) so the readers are tested against a fake tree. A
//! file that is missing or does not parse is an absent reading, never 0.

use std::fs;
use std::path::{Path, PathBuf};

/// The filesystem root the readers look under (`/` on a real system).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysRoot(PathBuf);

/// One amdgpu DRM card's device directory, matched to a HIP device by PCI address.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DrmCard {
    /// `card0`, `card1`, ...
    pub card: String,
    /// Its `device` directory (holding the `mem_info_*` files).
    pub dir: PathBuf,
}

/// The DRM memory counters of one card, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DrmMemory {
    /// `mem_info_vram_total`.
    pub vram_total: u64,
    /// `mem_info_vram_used` (every process and API, graphics included).
    pub vram_used: u64,
    /// `mem_info_gtt_total`, when present (system memory the GPU may map).
    pub gtt_total: Option<u64>,
    /// `mem_info_gtt_used`, when present.
    pub gtt_used: Option<u64>,
}

impl DrmMemory {
    /// `vram_total - vram_used`, `None` when used exceeds total.
    pub fn vram_free(&self) -> Option<u64> {
        self.vram_total.checked_sub(self.vram_used)
    }

    /// `gtt_total - gtt_used`, when both are present and consistent.
    pub fn gtt_free(&self) -> Option<u64> {
        self.gtt_total?.checked_sub(self.gtt_used?)
    }
}

/// The host's memory, from `/proc/meminfo`, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostMemory {
    /// `MemTotal`.
    pub total: u64,
    /// `MemAvailable`.
    pub available: u64,
}

impl SysRoot {
    /// The real system.
    pub fn system() -> Self {
        SysRoot(PathBuf::from("/"))
    }

    /// A fake tree rooted at `path` (tests).
    pub fn at(path: impl Into<PathBuf>) -> Self {
        SysRoot(path.into())
    }

    /// The DRM card whose PCI address is `pci_bus_id` (as `hipDeviceGetPCIBusId` writes it,
    /// `0000:03:00.0`, compared case-insensitively) and that has VRAM counters.
    pub fn find_drm_card(&self, pci_bus_id: &str) -> Option<DrmCard> {
        let want = pci_bus_id.trim().to_ascii_lowercase();
        let drm = self.0.join("sys/class/drm");
        let mut cards: Vec<_> = fs::read_dir(&drm)
            .ok()?
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| {
                n.strip_prefix("card")
                    .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            })
            .collect();
        cards.sort();
        cards.into_iter().find_map(|card| {
            let dir = drm.join(&card).join("device");
            let slot = pci_slot(&dir)?;
            (slot == want && dir.join("mem_info_vram_total").is_file())
                .then_some(DrmCard { card, dir })
        })
    }

    /// `MemTotal` and `MemAvailable` of the host, when `/proc/meminfo` has both.
    pub fn host_memory(&self) -> Option<HostMemory> {
        let text = fs::read_to_string(self.0.join("proc/meminfo")).ok()?;
        Some(HostMemory {
            total: meminfo_field(&text, "MemTotal")?,
            available: meminfo_field(&text, "MemAvailable")?,
        })
    }
}

impl DrmCard {
    /// Read the counters. `None` when the VRAM pair is missing or does not parse.
    pub fn read(&self) -> Option<DrmMemory> {
        Some(DrmMemory {
            vram_total: read_u64(&self.dir.join("mem_info_vram_total"))?,
            vram_used: read_u64(&self.dir.join("mem_info_vram_used"))?,
            gtt_total: read_u64(&self.dir.join("mem_info_gtt_total")),
            gtt_used: read_u64(&self.dir.join("mem_info_gtt_used")),
        })
    }
}

/// The PCI address of a DRM card's device directory: `PCI_SLOT_NAME` in its `uevent`, else
/// the name its symlink resolves to.
fn pci_slot(dir: &Path) -> Option<String> {
    if let Ok(uevent) = fs::read_to_string(dir.join("uevent")) {
        if let Some(v) = uevent
            .lines()
            .find_map(|l| l.strip_prefix("PCI_SLOT_NAME="))
        {
            return Some(v.trim().to_ascii_lowercase());
        }
    }
    let real = fs::canonicalize(dir).ok()?;
    Some(real.file_name()?.to_str()?.to_ascii_lowercase())
}

fn read_u64(path: &Path) -> Option<u64> {
    let v = fs::read_to_string(path).ok()?.trim().parse().ok();
    if v.is_none() {
        tracing::debug!(path = %path.display(), "unreadable DRM counter");
    }
    v
}

/// `Field:   123 kB` → bytes.
fn meminfo_field(text: &str, field: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.split(':').next() == Some(field))?;
    let mut parts = line.split(':').nth(1)?.split_whitespace();
    let n: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") => n.checked_mul(1024),
        None => Some(n),
        Some(_) => None,
    }
}

#[cfg(test)]
#[path = "sysfs_tests.rs"]
mod tests;
