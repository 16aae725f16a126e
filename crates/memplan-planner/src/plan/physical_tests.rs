//! Memory held by others: which reading bounds the plan, and the named blind spot.

use super::*;
use crate::budget::Request;
use crate::plan::{Plan, PlanBuilder};
use crate::warning::Warning;
use memplan_core::bytes::GIB;
use memplan_core::kv::{AttentionKind, KvDtype, KvLimits, KvSpec, LayerGroup};
use memplan_core::{ProfilingCapability, Refusal, Result};

const TOTAL: u64 = 24 * GIB;
const WEIGHTS: u64 = 3 * GIB;

fn process_local() -> Reliability {
    Reliability::process_local(0, "counts only this process")
}

/// A snapshot: driver free as read, this process's allocator holding `reserved`, and the
/// device-wide reading.
fn snap(free: u64, reserved: u64, available: Option<u64>) -> MemoryInfo {
    let mut s = MemoryInfo::default();
    s.driver.total = Some(TOTAL);
    s.driver.free = Some(free);
    s.allocator.reserved = Some(reserved);
    s.allocator.allocated = Some(reserved);
    s.device.available = available;
    s
}

/// A start-up that loaded 3 GiB of weights while others held `others` bytes the free reading
/// `free` may or may not see; the device-wide reading `device` sees them when offered.
fn profile(free: Reliability, device: Reliability, others: u64, offered: bool) -> Profile {
    let mut c = ProfilingCapability::exact_discrete();
    c.set(Reading::DriverFree, free.clone());
    c.set(Reading::DeviceAvailable, device);
    let local = !free.sees_whole_device();
    let seen = |used: u64| {
        if local {
            TOTAL - used
        } else {
            TOTAL - used - others
        }
    };
    let avail = |used: u64| offered.then_some(TOTAL - used - others);
    let mut p = Profile::new(c, snap(seen(GIB), 0, avail(GIB)));
    p.last = snap(seen(GIB + WEIGHTS), WEIGHTS, avail(GIB + WEIGHTS));
    p.weights_bytes = Some(WEIGHTS);
    p.weights_held_bytes = Some(WEIGHTS);
    p.activation_peak_bytes = Some(GIB);
    p.non_allocator_growth = Some(0);
    p
}

fn builder(p: &Profile, request: Request) -> Result<PlanBuilder> {
    let spec = KvSpec::new(
        vec![LayerGroup::new(AttentionKind::Full, 28, 2, 128)],
        KvDtype::Bf16,
        16,
    );
    let limits = KvLimits::new(4096, 8192).with_max_len_limit(1 << 20);
    PlanBuilder::from_profile(p, "test", request, spec, limits)
}

fn plan(p: &Profile, request: Request) -> Result<Plan> {
    builder(p, request)?.build()
}

fn drm() -> Reliability {
    Reliability::Approximate {
        tolerance_bytes: 16 << 20,
        why: "device-wide counters".into(),
    }
}

#[test]
fn a_process_local_free_reading_is_bounded_by_the_device_wide_one() {
    // 8 GiB taken by others during the start-up: the process-local reading cannot see them,
    // the device-wide can.
    let mut p = profile(process_local(), drm(), 8 * GIB, true);
    p.baseline.device.available = Some(TOTAL - GIB);
    let planned = plan(&p, Request::Bytes(16 * GIB)).unwrap();
    assert_eq!(planned.physical_check, Some(PhysicalCheck::DeviceAvailable));
    let physically_free = TOTAL - GIB - WEIGHTS - 8 * GIB;
    assert!(
        planned.kv_cache_bytes + GIB <= physically_free,
        "{} + activation fits in {physically_free}",
        planned.kv_cache_bytes
    );
    assert!(planned.warnings.iter().any(|w| matches!(
        w,
        Warning::KvCappedByAvailableMemory {
            source: PhysicalCheck::DeviceAvailable,
            ..
        }
    )));
    // The start-up check uses it too: 0.9 of the device is not free with 8 GiB held.
    let p = profile(process_local(), drm(), 8 * GIB, true);
    let e = plan(&p, Request::Utilization(0.9)).unwrap_err();
    assert!(
        matches!(e.refusal(), Some(Refusal::FreeBelowRequested { .. })),
        "{e}"
    );
}

#[test]
fn with_neither_reading_the_blind_spot_is_named() {
    let p = profile(
        process_local(),
        Reliability::Unavailable {
            reason: "no device-wide counters".into(),
        },
        8 * GIB,
        false,
    );
    let b = builder(&p, Request::Bytes(16 * GIB)).unwrap();
    assert!(b.is_blind());
    let plan = b.clone().build().unwrap();
    assert_eq!(plan.physical_check, None, "nothing bounded it");
    let w = plan
        .warnings
        .iter()
        .find(|w| matches!(w, Warning::OtherProcessesUnseen { .. }))
        .expect("named");
    let text = w.to_string();
    assert!(
        text.contains("counts only this process") && text.contains("no device-wide counters"),
        "{text}"
    );
    assert_eq!(w.to_json()["code"], "other_processes_unseen");
    // A probe that found 10 GiB caps the plan; one that found everything leaves it.
    let capped = b.clone().probed(10 * GIB, false).build().unwrap();
    assert_eq!(capped.physical_check, Some(PhysicalCheck::Probe));
    assert!(capped.kv_cache_bytes + GIB <= 10 * GIB);
    let need = b.needs(plan.kv_cache_bytes);
    let whole = b.probed(need, true).build().unwrap();
    assert_eq!(whole.kv_cache_bytes, plan.kv_cache_bytes);
    assert_eq!(whole.physical_check, Some(PhysicalCheck::Probe));
}

#[test]
fn a_free_reading_that_cannot_see_this_process_is_suspect() {
    // Declared exact, but reads free == total while the allocator holds the weights (what a
    // stack that hides all usage reports): not trusted; the device-wide reading bounds.
    let mut p = profile(Reliability::Exact, drm(), 8 * GIB, true);
    p.baseline.driver.free = Some(TOTAL);
    p.last.driver.free = Some(TOTAL);
    assert!(matches!(judge(&p), Physical::DeviceWide { .. }));
    // The device-wide one too: blind, and both reasons say why.
    p.last.device.available = Some(TOTAL);
    match judge(&p) {
        Physical::Blind {
            free_reading,
            device_wide,
        } => {
            assert!(free_reading.starts_with("suspect"), "{free_reading}");
            assert!(device_wide.starts_with("suspect"), "{device_wide}");
        }
        other => panic!("{other:?}"),
    }
    // A tolerance of half the device says nothing either.
    let whole = Reliability::Approximate {
        tolerance_bytes: TOTAL,
        why: "free == total".into(),
    };
    let p = profile(whole.clone(), whole, 0, true);
    assert!(matches!(judge(&p), Physical::Blind { .. }));
}

#[test]
fn an_unread_device_wide_value_is_not_zero() {
    // Declared, but the snapshot has no value (the files vanished): blind, never a 0 cap.
    let p = profile(process_local(), drm(), 0, false);
    match judge(&p) {
        Physical::Blind { device_wide, .. } => {
            assert!(device_wide.contains("not read"), "{device_wide}")
        }
        other => panic!("{other:?}"),
    }
    // A free reading that sees the whole device needs nothing else.
    let p = profile(Reliability::Exact, drm(), 2 * GIB, true);
    assert_eq!(judge(&p), Physical::FreeSeesAll);
    let plan = plan(&p, Request::Bytes(16 * GIB)).unwrap();
    assert_eq!(plan.physical_check, Some(PhysicalCheck::DriverFree));
}

#[test]
fn a_process_local_tolerance_widens_the_margin_and_its_locality_picks_the_check() {
    // The same start-up twice, nobody else on the device: the free reading process-local and
    // exact for this process, then process-local within 512 MiB. The tolerance comes off the
    // cap by free memory (a margin, as for an approximate reading); the locality sends the
    // physical check to the device-wide reading in both.
    let exact = profile(process_local(), drm(), 0, true);
    let loose = profile(
        Reliability::process_local(512 << 20, "counted in 512 MiB steps"),
        drm(),
        0,
        true,
    );
    let request = Request::Bytes(23 * GIB);
    let a = plan(&exact, request).unwrap();
    let b = plan(&loose, request).unwrap();
    for p in [&a, &b] {
        assert_eq!(p.physical_check, Some(PhysicalCheck::DeviceAvailable));
    }
    assert!(
        a.kv_cache_bytes >= b.kv_cache_bytes + 400 * (1 << 20),
        "the 512 MiB tolerance is a margin: {} vs {}",
        a.kv_cache_bytes,
        b.kv_cache_bytes
    );
    assert!(b
        .warnings
        .iter()
        .any(|w| matches!(w, Warning::KvCappedByFreeMemory { .. })));
}

#[test]
fn a_refusal_names_the_memory_there_where_it_not_the_request_left_no_room() {
    // Others took 19.5 GiB during the start-up, seen by the device-wide reading: what is there
    // leaves the KV cache nothing beside the activation peak, where the request's 16 GiB would
    // have left it 11 GiB. More of the device cannot help: the refusal says so, and names the
    // reading that found it.
    let mut p = profile(process_local(), drm(), 39 * GIB / 2, true);
    p.baseline.device.available = Some(TOTAL - GIB);
    let e = plan(&p, Request::Bytes(16 * GIB)).unwrap_err();
    let Some(Refusal::RequestDoesNotFit {
        usable_blocks: 0,
        capped: Some(c),
        ..
    }) = e.refusal()
    else {
        panic!("{e}");
    };
    assert!(c.cap < c.budget && c.budget > 10 * GIB, "{c:?}");
    assert_eq!(c.source, PhysicalCheck::DeviceAvailable.to_string());
    let text = e.to_string();
    assert!(
        text.contains("(the device-wide available memory) leaves the KV cache"),
        "{text}"
    );
    assert!(
        text.contains("a larger GPU memory utilisation cannot help"),
        "{text}"
    );
    assert!(!text.contains("give the KV cache more memory"), "{text}");
    // A request whose own budget holds no request either: the request is short too, and the
    // refusal asks for more of it as before.
    let e = plan(&p, Request::Bytes(4 * GIB + 64 * (1 << 20))).unwrap_err();
    assert!(
        matches!(
            e.refusal(),
            Some(Refusal::RequestDoesNotFit { capped: None, .. })
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("give the KV cache more memory"),
        "{e}"
    );
}
