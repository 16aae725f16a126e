//! Enumeration: what a HIP device is (name, arch, memory, APU or not, PCI address, DRM card)
//! and which runtime families it lacks, gathered into the inputs of the capability table.
//!
//! The arch name comes from the device-properties struct, whose layout changed in HIP 6
//! (`hipDeviceProp_tR0600`): memplan calls whichever symbol the runtime has and reads
//! `gcnArchName` at that layout's offset (both checked by tests/layout.rs).

use std::ffi::{c_char, c_int, c_void};

use memplan_core::{BackendKind, DeviceDescriptor, DeviceId, Result};

use crate::conv::{
    c_buf_to_string, check, ATTR_INTEGRATED, ATTR_VMM_SUPPORTED, PROPS_BUFFER_BYTES,
    PROPS_R0000_GCN_ARCH_NAME, PROPS_R0600_GCN_ARCH_NAME,
};
use crate::facts::{ApiFamily, Inputs};
use crate::loader::Api;
use crate::sysfs::{DrmCard, SysRoot};

/// What enumeration learns about a device beyond its descriptor.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Probe {
    /// The descriptor.
    pub descriptor: DeviceDescriptor,
    /// The inputs of the capability table.
    pub inputs: Inputs,
    /// Its DRM card, when the counters exist.
    pub drm: Option<DrmCard>,
}

/// Describe device `ordinal` (cheap: a few attribute queries and sysfs reads).
pub fn probe(api: &Api, ordinal: c_int, sys: &SysRoot) -> Result<Probe> {
    api.set_device(ordinal)?;
    let mut name = [0u8; 256];
    // SAFETY: writes at most `len` bytes (including the NUL) into a buffer of that size.
    check("hipDeviceGetName", unsafe {
        (api.sym.hipDeviceGetName)(name.as_mut_ptr().cast::<c_char>(), 256, ordinal)
    })?;
    let mut total: usize = 0;
    // SAFETY: writes one size_t through a valid pointer.
    check("hipDeviceTotalMem", unsafe {
        (api.sym.hipDeviceTotalMem)(&mut total, ordinal)
    })?;
    let integrated = attribute(api, ATTR_INTEGRATED, ordinal)?.is_some_and(|v| v != 0);
    // An attribute older runtimes may not know: any failure means "not supported".
    let vmm_attribute = match attribute(api, ATTR_VMM_SUPPORTED, ordinal) {
        Ok(v) => v.is_some_and(|v| v != 0),
        Err(e) => {
            tracing::debug!(%e, "virtual-memory attribute unreadable");
            false
        }
    };
    let mut bus = [0u8; 64];
    // SAFETY: writes at most `len` bytes into a buffer of that size.
    let rc =
        unsafe { (api.sym.hipDeviceGetPCIBusId)(bus.as_mut_ptr().cast::<c_char>(), 64, ordinal) };
    let pci = if rc == 0 { c_buf_to_string(&bus) } else { None };
    let drm = pci.as_deref().and_then(|p| sys.find_drm_card(p));
    let id = DeviceId::new(BackendKind::Rocm, ordinal.to_string());
    let mut properties = vec![
        ("runtime".to_string(), format!("HIP {}", api.runtime)),
        ("library".to_string(), api.library.clone()),
        (
            "integrated".to_string(),
            if integrated { "yes (APU)" } else { "no" }.to_string(),
        ),
    ];
    if let Some(d) = api.driver {
        properties.push(("driver".into(), format!("HIP {d}")));
    }
    match gcn_arch_name(api, ordinal) {
        Some(a) => properties.push(("arch".into(), a)),
        None => properties.push(("arch".into(), "unreadable".into())),
    }
    if let Some(p) = &pci {
        properties.push(("pci".into(), p.clone()));
    }
    if let Some(c) = &drm {
        properties.push(("drm".into(), c.card.clone()));
    }
    let descriptor = DeviceDescriptor::new(
        id,
        c_buf_to_string(&name).unwrap_or_else(|| format!("HIP device {ordinal}")),
        Some(total as u64),
    )
    .with_properties(properties);
    let inputs = Inputs {
        runtime: api.runtime,
        integrated,
        drm_vram: drm.is_some(),
        vmm_attribute,
        lacks: lacks(api),
    };
    Ok(Probe {
        descriptor,
        inputs,
        drm,
    })
}

/// `hipDeviceGetAttribute`; `None` when the runtime does not know the attribute (an older
/// runtime answers hipErrorInvalidValue), an error for anything else.
fn attribute(api: &Api, attr: c_int, ordinal: c_int) -> Result<Option<c_int>> {
    let mut v: c_int = 0;
    // SAFETY: writes one int through a valid pointer.
    match unsafe { (api.sym.hipDeviceGetAttribute)(&mut v, attr, ordinal) } {
        0 => Ok(Some(v)),
        1 => Ok(None),
        rc => check("hipDeviceGetAttribute", rc).map(|_| None),
    }
}

/// `gcnArchName` from the device properties, read from the layout the runtime's symbol uses
/// (`hipGetDevicePropertiesR0600` on HIP >= 6, `hipGetDeviceProperties` before), into a zeroed
/// buffer larger than either layout. `None` unless it reads as a `gfx...` string.
fn gcn_arch_name(api: &Api, ordinal: c_int) -> Option<String> {
    let (f, offset) = match (
        api.sym.hipGetDevicePropertiesR0600,
        api.sym.hipGetDeviceProperties,
    ) {
        (Some(f), _) => (f, PROPS_R0600_GCN_ARCH_NAME),
        (None, Some(f)) => (f, PROPS_R0000_GCN_ARCH_NAME),
        (None, None) => return None,
    };
    let mut buf = vec![0u64; PROPS_BUFFER_BYTES / 8];
    // SAFETY: the buffer is zeroed, 8-byte aligned and larger than every hipDeviceProp_t layout
    // (checked by tests/layout.rs against the header); the runtime writes within its layout.
    let rc = unsafe { f(buf.as_mut_ptr().cast::<c_void>(), ordinal) };
    if rc != 0 {
        tracing::debug!(rc, "hipGetDeviceProperties failed; arch unknown");
        return None;
    }
    let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let arch = c_buf_to_string(bytes.get(offset..offset + 256)?)?;
    arch.starts_with("gfx").then_some(arch)
}

fn lacks(api: &Api) -> Vec<ApiFamily> {
    let s = &api.sym;
    let mut v = Vec::new();
    let capture = [
        s.hipStreamBeginCapture.is_some(),
        s.hipStreamEndCapture.is_some(),
        s.hipGraphInstantiate.is_some(),
        s.hipGraphLaunch.is_some(),
    ];
    let capture_teardown = [
        s.hipGraphExecDestroy.is_some(),
        s.hipGraphDestroy.is_some(),
        s.hipMemsetAsync.is_some(),
    ];
    let stream = [
        s.hipStreamCreateWithFlags.is_some(),
        s.hipStreamDestroy.is_some(),
        s.hipStreamSynchronize.is_some(),
    ];
    if !(capture
        .iter()
        .chain(&capture_teardown)
        .chain(&stream)
        .all(|b| *b))
    {
        v.push(ApiFamily::Capture);
    }
    if s.hipDeviceGetGraphMemAttribute.is_none() {
        v.push(ApiFamily::GraphPoolQuery);
    }
    let vmm = [
        s.hipMemGetAllocationGranularity.is_some(),
        s.hipMemAddressReserve.is_some(),
        s.hipMemAddressFree.is_some(),
        s.hipMemCreate.is_some(),
        s.hipMemRelease.is_some(),
        s.hipMemMap.is_some(),
        s.hipMemUnmap.is_some(),
        s.hipMemSetAccess.is_some(),
    ];
    if !vmm.iter().all(|b| *b) {
        v.push(ApiFamily::VirtualMemory);
    }
    v
}
