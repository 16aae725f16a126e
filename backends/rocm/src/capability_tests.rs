//! The capability table at the runtime versions that matter (5.2, 5.4, 5.6, 6.2, 7.x) and on
//! the device kinds that change it (DRM sysfs, APU, virtual memory, missing symbols).

use super::*;
use memplan_core::{GraphRelease, Reading};

fn at(major: u32, minor: u32) -> Inputs {
    Inputs {
        runtime: HipVersion::new(major, minor, 0),
        integrated: false,
        drm_vram: false,
        vmm_attribute: false,
        lacks: Vec::new(),
    }
}

#[test]
fn rocm_5_2_is_process_local_without_pool_attributes() {
    let d = declare(&at(5, 2));
    assert_eq!(d.free, FreeSource::HipProcessLocal);
    assert_eq!(
        d.capability.reading(Reading::DriverFree).label(),
        "process-local"
    );
    assert_eq!(d.pool, PoolAttrs::Absent);
    assert!(d
        .capability
        .reading(Reading::GraphPool)
        .detail()
        .contains("< 5.3"));
    assert_eq!(d.capability.facts.graph_release, GraphRelease::Immediate);
    assert_eq!(d.capability.facts.hidden_bytes_per_capture, None);
    assert!(d.capability.facts.graph_capture.is_supported());
    assert!(!d.capability.facts.virtual_memory.is_supported());
}

#[test]
fn rocm_5_4_has_a_stub_pool_query() {
    let d = declare(&at(5, 4));
    assert_eq!(d.free, FreeSource::HipProcessLocal);
    assert_eq!(d.pool, PoolAttrs::Stub);
    let why = d.capability.reading(Reading::GraphPool).to_string();
    assert!(
        why.starts_with("unavailable") && why.contains("stub returning 0"),
        "{why}"
    );
    assert!(!d.capability.facts.graph_pool_attributes.is_supported());
}

#[test]
fn rocm_5_5_is_device_wide_but_still_stubbed() {
    let d = declare(&at(5, 5));
    assert_eq!(d.free, FreeSource::HipDeviceWide);
    assert_eq!(d.pool, PoolAttrs::Stub);
}

#[test]
fn rocm_5_6_is_approximate_with_real_pool_attributes() {
    let d = declare(&at(5, 6));
    assert_eq!(d.free, FreeSource::HipDeviceWide);
    let free = d.capability.reading(Reading::DriverFree);
    assert!(
        matches!(free, Reliability::Approximate { tolerance_bytes, .. } if tolerance_bytes == BLIND_TO_GRAPHICS_TOLERANCE)
    );
    assert!(free.detail().contains("blind to graphics"));
    assert_eq!(d.pool, PoolAttrs::Real);
    assert!(d.capability.reading(Reading::GraphPool).is_exact());
    assert_eq!(d.capability.facts.graph_release, GraphRelease::Immediate);
}

#[test]
fn rocm_6_2_defers_graph_release_and_hides_4_mib() {
    let d = declare(&at(6, 2));
    assert_eq!(d.capability.facts.graph_release, GraphRelease::AtNextSync);
    assert_eq!(d.capability.facts.hidden_bytes_per_capture, Some(4 * MIB));
    assert_eq!(d.pool, PoolAttrs::Real);
    // 6.1 does not.
    assert_eq!(
        declare(&at(6, 1)).capability.facts.graph_release,
        GraphRelease::Immediate
    );
}

#[test]
fn rocm_7_keeps_every_6_2_rule() {
    for minor in [0, 1, 2] {
        let d = declare(&at(7, minor));
        assert_eq!(d.free, FreeSource::HipDeviceWide);
        assert_eq!(d.capability.facts.graph_release, GraphRelease::AtNextSync);
        assert_eq!(d.capability.facts.hidden_bytes_per_capture, Some(4 * MIB));
        assert!(d.capability.facts.graph_pool_attributes.is_supported());
    }
}

#[test]
fn drm_sysfs_makes_even_old_runtimes_device_wide() {
    for (major, minor) in [(5, 2), (6, 2)] {
        let d = declare(&Inputs {
            drm_vram: true,
            ..at(major, minor)
        });
        assert_eq!(d.free, FreeSource::HipAndDrm);
        assert!(d
            .capability
            .reading(Reading::DriverFree)
            .sees_whole_device());
    }
}

#[test]
fn apus_are_unified_and_host_bounded() {
    let d = declare(&Inputs {
        integrated: true,
        drm_vram: true,
        ..at(6, 2)
    });
    assert_eq!(d.free, FreeSource::HostBounded);
    assert!(d.capability.facts.unified_memory);
    assert!(d
        .capability
        .reading(Reading::DriverFree)
        .detail()
        .contains("MemAvailable"));
    assert_eq!(
        d.capability.reading(Reading::DriverTotal).label(),
        "approximate"
    );
    assert!(!declare(&at(6, 2)).capability.facts.unified_memory);
}

#[test]
fn virtual_memory_needs_the_attribute_and_the_symbols() {
    assert!(declare(&Inputs {
        vmm_attribute: true,
        ..at(6, 2)
    })
    .capability
    .facts
    .virtual_memory
    .is_supported());
    let no_syms = declare(&Inputs {
        vmm_attribute: true,
        lacks: vec![ApiFamily::VirtualMemory],
        ..at(6, 0)
    });
    let vm = no_syms.capability.facts.virtual_memory.to_string();
    assert!(
        vm.starts_with("no (") && vm.contains("lacks a virtual-memory function"),
        "{vm}"
    );
}

#[test]
fn hip_before_5_4_gets_no_virtual_memory_whatever_the_device_says() {
    // HIP 5.2 exports hipMemCreate, but with an older hipMemAllocationProp layout.
    let d = declare(&Inputs {
        vmm_attribute: true,
        ..at(5, 3)
    });
    assert!(d
        .capability
        .facts
        .virtual_memory
        .to_string()
        .contains("hipMemAllocationProp"));
    assert!(declare(&Inputs {
        vmm_attribute: true,
        ..at(5, 4)
    })
    .capability
    .facts
    .virtual_memory
    .is_supported());
}

#[test]
fn missing_symbols_downgrade_whatever_the_version_says() {
    let d = declare(&Inputs {
        lacks: vec![ApiFamily::GraphPoolQuery, ApiFamily::Capture],
        ..at(6, 2)
    });
    assert_eq!(d.pool, PoolAttrs::Absent);
    assert!(!d.capability.facts.graph_capture.is_supported());
    assert!(d
        .capability
        .facts
        .graph_capture
        .to_string()
        .contains("stream-capture"));
}

#[test]
fn notes_name_only_the_rules_in_effect() {
    let d = declare(&at(6, 2));
    let n = &d.capability.notes;
    assert!(n[0].contains("6.2.0"));
    // Overridden rows leave no note: 6.2 is not "ROCm <= 5.4", nor "ROCm < 5.3".
    assert!(
        !n.iter()
            .any(|s| s.contains("<= 5.4") || s.contains("< 5.3") || s.contains("< 6.2")),
        "{n:?}"
    );
    for want in [
        "ROCm >= 5.5",
        "ROCm >= 5.6",
        "a destroyed graph's memory",
        "~4 MiB",
        "stream capture",
    ] {
        assert!(n.iter().any(|s| s.contains(want)), "missing {want}: {n:?}");
    }
    // Runtime note + free, pool, release, hidden, capture, vmm.
    assert_eq!(n.len(), 7, "{n:?}");
}

#[test]
fn a_different_table_gives_a_different_answer() {
    let table = [rule(
        When::Always,
        Set::Free(FreeSource::HipDeviceWide, 7),
        "test row",
    )];
    let d = declare_with(&table, &at(5, 2));
    assert_eq!(d.free, FreeSource::HipDeviceWide);
    assert!(matches!(
        d.capability.reading(Reading::DriverFree),
        Reliability::Approximate {
            tolerance_bytes: 7,
            ..
        }
    ));
}
