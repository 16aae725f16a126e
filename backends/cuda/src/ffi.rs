//! The driver entry points memplan calls, resolved from the loaded driver library with their
//! result read as a plain integer.
//!
//! cudarc's bindings type `CUresult` as a Rust enum: a code its bindings do not know (one a
//! newer driver added) would be read into that enum, which is undefined behaviour, exactly
//! when a clean error matters most. They also panic on a missing symbol. So memplan calls the
//! driver through these wrappers instead: each resolves its symbol from the library
//! [`crate::loader`] loaded (once, then cached), declares the C signature of `cuda.h` with the
//! result as `c_int`, and returns [`MISSING`] rather than panicking when the library does not
//! export the symbol. cudarc supplies the handle, struct and enum *parameter* types only; no
//! enum is ever read back from the driver (`cuStreamIsCapturing` writes into a `c_int`).

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use std::sync::OnceLock;

use cudarc::driver::sys::{
    CUcontext, CUdevice, CUdevice_attribute, CUdeviceptr, CUfunction, CUgraph, CUgraphExec,
    CUgraphMem_attribute, CUmemAccessDesc, CUmemAllocationGranularity_flags, CUmemAllocationProp,
    CUmemGenericAllocationHandle, CUmodule, CUstream, CUstreamCaptureMode, CUuuid,
};

/// What a wrapper returns when the loaded library does not export its symbol (no driver code
/// is negative).
pub const MISSING: c_int = -1;

static LIB: OnceLock<libloading::Library> = OnceLock::new();

/// Make `lib` the library every wrapper resolves from (the first one installed stays: the
/// driver is loaded once per process).
pub(crate) fn install(lib: libloading::Library) -> &'static libloading::Library {
    LIB.get_or_init(|| lib)
}

fn resolve<F: Copy>(name: &str) -> Option<F> {
    // SAFETY: `F` is the C signature of `name` declared below; the library stays loaded for
    // the life of the process (it lives in a static), so the copied pointer stays valid.
    unsafe { LIB.get()?.get::<F>(name.as_bytes()).ok().map(|s| *s) }
}

macro_rules! driver_api {
    ($( $name:ident ( $($arg:ident : $ty:ty),* ); )*) => {
        $(
            #[doc = concat!("`", stringify!($name), "`; the result code as an integer, [`MISSING`] when the library lacks the symbol.")]
            ///
            /// # Safety
            ///
            /// The caller upholds the driver's contract for this call (valid handles, a current
            /// context where needed, out-pointers valid for writes of their type).
            #[allow(clippy::too_many_arguments)] // cuLaunchKernel has eleven
            pub unsafe fn $name($($arg: $ty),*) -> c_int {
                type F = unsafe extern "C" fn($($ty),*) -> c_int;
                static SYM: OnceLock<F> = OnceLock::new();
                let f = match SYM.get() {
                    Some(f) => *f,
                    None => match resolve::<F>(stringify!($name)) {
                        Some(f) => *SYM.get_or_init(|| f),
                        None => return MISSING,
                    },
                };
                // SAFETY: `f` is the driver's entry point with this signature (cuda.h, result
                // read as int); the caller upholds its contract.
                unsafe { f($($arg),*) }
            }
        )*
    };
}

driver_api! {
    cuDriverGetVersion(version: *mut c_int);
    cuInit(flags: c_uint);
    cuGetErrorName(error: c_int, name: *mut *const c_char);
    cuDeviceGetCount(count: *mut c_int);
    cuDeviceGet(device: *mut CUdevice, ordinal: c_int);
    cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice);
    cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice);
    cuDeviceGetAttribute(value: *mut c_int, attribute: CUdevice_attribute, dev: CUdevice);
    cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice);
    cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, dev: CUdevice);
    cuDevicePrimaryCtxRelease_v2(dev: CUdevice);
    cuCtxSetCurrent(ctx: CUcontext);
    cuCtxSynchronize();
    cuMemGetInfo_v2(free: *mut usize, total: *mut usize);
    cuMemAlloc_v2(ptr: *mut CUdeviceptr, bytes: usize);
    cuMemFree_v2(ptr: CUdeviceptr);
    cuDeviceGetGraphMemAttribute(dev: CUdevice, attribute: CUgraphMem_attribute, value: *mut c_void);
    cuDeviceGraphMemTrim(dev: CUdevice);
    cuStreamCreate(stream: *mut CUstream, flags: c_uint);
    cuStreamDestroy_v2(stream: CUstream);
    cuStreamSynchronize(stream: CUstream);
    cuStreamBeginCapture_v2(stream: CUstream, mode: CUstreamCaptureMode);
    cuStreamEndCapture(stream: CUstream, graph: *mut CUgraph);
    cuStreamIsCapturing(stream: CUstream, status: *mut c_int);
    cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: c_ulonglong);
    cuGraphLaunch(exec: CUgraphExec, stream: CUstream);
    cuGraphExecDestroy(exec: CUgraphExec);
    cuGraphDestroy(graph: CUgraph);
    cuMemAllocAsync(ptr: *mut CUdeviceptr, bytes: usize, stream: CUstream);
    cuMemFreeAsync(ptr: CUdeviceptr, stream: CUstream);
    cuModuleLoadData(module: *mut CUmodule, image: *const c_void);
    cuModuleGetFunction(function: *mut CUfunction, module: CUmodule, name: *const c_char);
    cuModuleUnload(module: CUmodule);
    cuLaunchKernel(
        f: CUfunction,
        grid_x: c_uint,
        grid_y: c_uint,
        grid_z: c_uint,
        block_x: c_uint,
        block_y: c_uint,
        block_z: c_uint,
        shared_bytes: c_uint,
        stream: CUstream,
        params: *mut *mut c_void,
        extra: *mut *mut c_void
    );
    cuMemGetAllocationGranularity(
        granularity: *mut usize,
        prop: *const CUmemAllocationProp,
        option: CUmemAllocationGranularity_flags
    );
    cuMemAddressReserve(
        ptr: *mut CUdeviceptr,
        size: usize,
        alignment: usize,
        addr: CUdeviceptr,
        flags: c_ulonglong
    );
    cuMemAddressFree(ptr: CUdeviceptr, size: usize);
    cuMemCreate(
        handle: *mut CUmemGenericAllocationHandle,
        size: usize,
        prop: *const CUmemAllocationProp,
        flags: c_ulonglong
    );
    cuMemRelease(handle: CUmemGenericAllocationHandle);
    cuMemMap(
        ptr: CUdeviceptr,
        size: usize,
        offset: usize,
        handle: CUmemGenericAllocationHandle,
        flags: c_ulonglong
    );
    cuMemUnmap(ptr: CUdeviceptr, size: usize);
    cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_library_a_call_is_missing_not_a_panic() {
        if LIB.get().is_some() {
            return; // another test of this binary loaded a driver
        }
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out-pointer; without a library nothing is called.
        assert_eq!(unsafe { cuDriverGetVersion(&mut v) }, MISSING);
    }
}
