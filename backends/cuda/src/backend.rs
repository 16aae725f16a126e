//! The CUDA [`Backend`]: enumerate devices with the driver API and open them.
//!
//! Creating a [`CudaBackend`] loads nothing; [`Backend::devices`] and [`Backend::open`] load the
//! driver through [`crate::loader::driver`] first and return its error (library not found,
//! driver too old, `cuInit` failed) instead of panicking.

use std::ffi::c_int;

use cudarc::driver::sys::{self, CUdevice_attribute as A};
use memplan_core::{Backend, BackendKind, Device, DeviceDescriptor, DeviceId, Error, Result};

use crate::conv::{self, check};
use crate::device::CudaDevice;
use crate::facts::CudaFacts;
use crate::ffi;
use crate::loader::{driver, Driver, Feature};

/// The CUDA backend (stateless; the driver is process-wide).
#[derive(Debug, Default, Clone, Copy)]
pub struct CudaBackend;

/// Read one integer device attribute.
pub(crate) fn attribute(dev: sys::CUdevice, attr: A) -> Result<i32> {
    let mut v: c_int = 0;
    // SAFETY: `dev` came from cuDeviceGet and `v` is a valid out-pointer; the driver is loaded
    // and initialised (`driver()` succeeded before any device handle exists).
    let res = unsafe { ffi::cuDeviceGetAttribute(&mut v, attr, dev) };
    check("cuDeviceGetAttribute", res)?;
    Ok(v)
}

fn device_count() -> Result<usize> {
    let mut n: c_int = 0;
    // SAFETY: driver loaded and initialised by the caller; `n` is a valid out-pointer.
    check("cuDeviceGetCount", unsafe { ffi::cuDeviceGetCount(&mut n) })?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// Everything enumeration learns about one device.
pub(crate) struct Described {
    pub(crate) handle: sys::CUdevice,
    pub(crate) descriptor: DeviceDescriptor,
    pub(crate) facts: CudaFacts,
    pub(crate) compute_capability: (i32, i32),
    pub(crate) uuid: Option<String>,
}

/// Describe device `ordinal`: name, total memory, attributes, facts for the capability.
pub(crate) fn describe(drv: &Driver, ordinal: usize) -> Result<Described> {
    let ord =
        c_int::try_from(ordinal).map_err(|_| Error::invalid("device ordinal", "too large"))?;
    let mut dev: sys::CUdevice = 0;
    // SAFETY: driver initialised; `dev` is a valid out-pointer.
    check("cuDeviceGet", unsafe { ffi::cuDeviceGet(&mut dev, ord) })?;
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is 256 bytes and its length is passed; the driver NUL-terminates.
    let res = unsafe { ffi::cuDeviceGetName(buf.as_mut_ptr().cast(), buf.len() as c_int, dev) };
    check("cuDeviceGetName", res)?;
    let name = conv::name_from_buffer(&buf);
    let mut total: usize = 0;
    // SAFETY: valid device and out-pointer.
    check("cuDeviceTotalMem_v2", unsafe {
        ffi::cuDeviceTotalMem_v2(&mut total, dev)
    })?;
    let total = Some(total as u64);
    let cc = (
        attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    );
    let flag = |a: A| attribute(dev, a).ok().map(|v| v != 0);
    let mig = conv::mig_profile(&name);
    let facts = CudaFacts {
        driver_version: drv.version,
        integrated: flag(A::CU_DEVICE_ATTRIBUTE_INTEGRATED).unwrap_or(false),
        vmm_attribute: flag(A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED),
        memory_pools_attribute: flag(A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED),
        mig_profile: mig.clone(),
        total_bytes: total,
    };
    let uuid = if drv.require(Feature::Uuid).is_ok() {
        read_uuid(dev, mig.is_some())
    } else {
        None
    };
    let mut properties = vec![
        (
            "compute_capability".to_string(),
            format!("{}.{}", cc.0, cc.1),
        ),
        ("driver_version".to_string(), drv.version.to_string()),
        ("driver_library".to_string(), drv.library.clone()),
        ("integrated".to_string(), facts.integrated.to_string()),
    ];
    if let Some(bus) = pci_bus_id(dev) {
        properties.push(("pci_bus_id".into(), bus));
    }
    if let Some(u) = &uuid {
        properties.push(("uuid".into(), u.clone()));
    }
    if let Some(p) = &mig {
        properties.push(("mig_profile".into(), p.clone()));
    }
    let descriptor = DeviceDescriptor::new(
        DeviceId::new(BackendKind::Cuda, ordinal.to_string()),
        name,
        total,
    )
    .with_properties(properties);
    Ok(Described {
        handle: dev,
        descriptor,
        facts,
        compute_capability: cc,
        uuid,
    })
}

fn read_uuid(dev: sys::CUdevice, mig: bool) -> Option<String> {
    let mut u = sys::CUuuid { bytes: [0; 16] };
    // SAFETY: valid device and out-pointer; symbol presence checked by `require(Feature::Uuid)`.
    let res = unsafe { ffi::cuDeviceGetUuid_v2(&mut u, dev) };
    if let Err(e) = check("cuDeviceGetUuid_v2", res) {
        tracing::warn!("{e}");
        return None;
    }
    Some(conv::uuid_string(&u.bytes.map(|b| b as u8), mig))
}

fn pci_bus_id(dev: sys::CUdevice) -> Option<String> {
    let domain = attribute(dev, A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID).ok()?;
    let bus = attribute(dev, A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID).ok()?;
    let device = attribute(dev, A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID).ok()?;
    Some(format!("{domain:08x}:{bus:02x}:{device:02x}.0"))
}

fn unknown(selector: &str, count: usize) -> Error {
    Error::UnknownDevice {
        id: format!("cuda:{selector}"),
        available: if count == 0 {
            "none".into()
        } else {
            (0..count)
                .map(|i| format!("cuda:{i}"))
                .collect::<Vec<_>>()
                .join(", ")
        },
    }
}

impl CudaBackend {
    /// [`Backend::open`] without the box: the concrete device, for callers that want its
    /// CUDA-only extras ([`CudaDevice::nvml_memory`], [`CudaDevice::kernel_source`]).
    pub fn open_cuda(&self, selector: &str) -> Result<CudaDevice> {
        let drv = driver()?;
        let count = device_count()?;
        let ordinal: usize = selector.parse().map_err(|_| unknown(selector, count))?;
        if ordinal >= count {
            return Err(unknown(selector, count));
        }
        CudaDevice::open(drv, describe(drv, ordinal)?)
    }
}

impl Backend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn devices(&self) -> Result<Vec<DeviceDescriptor>> {
        let drv = driver()?;
        (0..device_count()?)
            .map(|i| describe(drv, i).map(|d| d.descriptor))
            .collect()
    }

    fn open(&self, selector: &str) -> Result<Device> {
        Ok(Device::new(self.open_cuda(selector)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_device_lists_what_exists() {
        let e = unknown("7", 2).to_string();
        assert!(e.contains("cuda:7") && e.contains("cuda:0, cuda:1"), "{e}");
        assert!(unknown("x", 0).to_string().contains("none"));
    }

    #[test]
    fn without_a_driver_every_entry_point_says_why() {
        let b = CudaBackend;
        assert_eq!(b.kind(), BackendKind::Cuda);
        if driver().is_ok() {
            return; // a machine with the driver: covered by the GPU tests
        }
        let e = b.devices().unwrap_err();
        assert!(
            matches!(
                e,
                Error::LibraryNotFound { .. }
                    | Error::DriverCall { .. }
                    | Error::DriverTooOld { .. }
            ),
            "{e}"
        );
        let e = b.open("0").expect_err("no driver, no device");
        assert!(
            e.to_string().contains(&driver().unwrap_err().to_string()),
            "{e}"
        );
    }
}
