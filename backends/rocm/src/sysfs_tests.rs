//! The sysfs readers against a fake tree in a temporary directory.

use super::*;
use std::sync::atomic::{AtomicU32, Ordering};

/// A fresh fake root, removed on drop.
struct FakeRoot(PathBuf);

impl FakeRoot {
    fn new() -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "memplan-rocm-sysfs-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).expect("temp dir");
        FakeRoot(p)
    }

    fn write(&self, rel: &str, text: &str) {
        let p = self.0.join(rel);
        fs::create_dir_all(p.parent().expect("has parent")).expect("mkdir");
        fs::write(p, text).expect("write");
    }

    /// A card with a uevent and VRAM counters.
    fn card(&self, n: u32, slot: &str, total: u64, used: u64) {
        let d = format!("sys/class/drm/card{n}/device");
        self.write(
            &format!("{d}/uevent"),
            &format!("DRIVER=amdgpu\nPCI_CLASS=30000\nPCI_SLOT_NAME={slot}\n"),
        );
        self.write(&format!("{d}/mem_info_vram_total"), &format!("{total}\n"));
        self.write(&format!("{d}/mem_info_vram_used"), &format!("{used}\n"));
    }
}

impl Drop for FakeRoot {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[test]
fn finds_the_card_of_the_device_by_pci_address() {
    let root = FakeRoot::new();
    root.card(0, "0000:03:00.0", 24 << 30, 1 << 30);
    root.card(1, "0000:83:00.0", 64 << 30, 5 << 30);
    // A connector entry and a render node must be ignored.
    root.write("sys/class/drm/card1-DP-1/status", "connected\n");
    root.write("sys/class/drm/renderD128/dev", "226:128\n");
    let sys = SysRoot::at(&root.0);
    let card = sys.find_drm_card("0000:83:00.0").expect("card1 matches");
    assert_eq!(card.card, "card1");
    let m = card.read().expect("counters");
    assert_eq!(
        (m.vram_total, m.vram_used, m.vram_free()),
        (64 << 30, 5 << 30, Some(59 << 30))
    );
    assert_eq!(m.gtt_total, None);
    assert_eq!(m.gtt_free(), None);
    // HIP may print the address in upper case.
    assert_eq!(
        sys.find_drm_card("0000:03:00.0").map(|c| c.card),
        Some("card0".into())
    );
    assert_eq!(sys.find_drm_card("0000:0A:00.0"), None);
}

#[test]
fn a_card_without_vram_counters_is_not_a_match() {
    let root = FakeRoot::new();
    root.write(
        "sys/class/drm/card0/device/uevent",
        "PCI_SLOT_NAME=0000:03:00.0\n",
    );
    assert_eq!(SysRoot::at(&root.0).find_drm_card("0000:03:00.0"), None);
}

#[test]
fn unparsable_counters_are_absent_not_zero() {
    let root = FakeRoot::new();
    root.card(0, "0000:03:00.0", 24 << 30, 0);
    root.write("sys/class/drm/card0/device/mem_info_vram_used", "garbage\n");
    root.write("sys/class/drm/card0/device/mem_info_gtt_total", "1024\n");
    let card = SysRoot::at(&root.0)
        .find_drm_card("0000:03:00.0")
        .expect("card");
    assert_eq!(card.read(), None);
    root.write("sys/class/drm/card0/device/mem_info_vram_used", "100\n");
    let m = card.read().expect("now it parses");
    assert_eq!(m.gtt_total, Some(1024));
    assert_eq!(m.gtt_used, None);
}

#[test]
fn used_above_total_has_no_free() {
    let m = DrmMemory {
        vram_total: 10,
        vram_used: 11,
        gtt_total: Some(5),
        gtt_used: Some(2),
    };
    assert_eq!(m.vram_free(), None);
    assert_eq!(m.gtt_free(), Some(3));
}

#[test]
fn missing_drm_tree_is_none() {
    let root = FakeRoot::new();
    assert_eq!(SysRoot::at(&root.0).find_drm_card("0000:03:00.0"), None);
}

#[cfg(unix)]
#[test]
fn symlinked_device_without_uevent_matches_by_link_target() {
    let root = FakeRoot::new();
    let pci = root.0.join("sys/devices/pci0000:00/0000:c1:00.0");
    fs::create_dir_all(&pci).expect("mkdir");
    fs::write(pci.join("mem_info_vram_total"), "512\n").expect("write");
    fs::write(pci.join("mem_info_vram_used"), "128\n").expect("write");
    let card = root.0.join("sys/class/drm/card2");
    fs::create_dir_all(&card).expect("mkdir");
    std::os::unix::fs::symlink(&pci, card.join("device")).expect("symlink");
    let found = SysRoot::at(&root.0)
        .find_drm_card("0000:C1:00.0")
        .expect("match by link");
    assert_eq!(found.read().and_then(|m| m.vram_free()), Some(384));
}

#[test]
fn host_meminfo() {
    let root = FakeRoot::new();
    root.write(
        "proc/meminfo",
        "MemTotal:       65536000 kB\nMemFree:         1000 kB\nMemAvailable:   32768000 kB\n",
    );
    let h = SysRoot::at(&root.0).host_memory().expect("meminfo");
    assert_eq!(
        h,
        HostMemory {
            total: 65_536_000 * 1024,
            available: 32_768_000 * 1024
        }
    );
    root.write("proc/meminfo", "MemTotal: 10 kB\n");
    assert_eq!(
        SysRoot::at(&root.0).host_memory(),
        None,
        "MemAvailable missing"
    );
    root.write("proc/meminfo", "MemTotal: 10 MB\nMemAvailable: 5 kB\n");
    assert_eq!(SysRoot::at(&root.0).host_memory(), None, "unknown unit");
}
