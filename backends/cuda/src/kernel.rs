//! The trivial kernel recorded into captured graphs.
//!
//! `memplan_touch(p, n)` writes `p[i] = i` for the first `n` threads when `p` is not null, so a
//! graph allocation node recorded beside it is really used. It is compiled with nvrtc for the
//! device's architecture when nvrtc can be loaded (it ships with the CUDA toolkit and PyTorch
//! wheels, not with the driver); otherwise, or when the driver rejects nvrtc's PTX (a newer
//! toolkit than driver), the hand-written PTX below is loaded and JIT-compiled by the driver.
//! Which one ran is recorded (`Kernel::source`).

use std::ffi::{c_void, CString};

use cudarc::driver::sys;
use memplan_core::{Error, Result};

use crate::conv::check;
use crate::ffi;

/// The kernel in CUDA C, for nvrtc.
pub const CUDA_SOURCE: &str = r#"
extern "C" __global__ void memplan_touch(unsigned int* p, unsigned int n) {
    unsigned int i = threadIdx.x;
    if (p != 0 && i < n) { p[i] = i; }
}
"#;

/// The same kernel in PTX (ISA 6.4, CUDA 10.1; sm_52, JIT-compiled for any newer GPU).
pub const EMBEDDED_PTX: &str = r#"
.version 6.4
.target sm_52
.address_size 64

.visible .entry memplan_touch(
    .param .u64 memplan_touch_param_0,
    .param .u32 memplan_touch_param_1
)
{
    .reg .pred %p<4>;
    .reg .b32 %r<3>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [memplan_touch_param_0];
    ld.param.u32 %r1, [memplan_touch_param_1];
    mov.u32 %r2, %tid.x;
    setp.eq.s64 %p1, %rd1, 0;
    setp.ge.u32 %p2, %r2, %r1;
    or.pred %p3, %p1, %p2;
    @%p3 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r2, 4;
    add.s64 %rd4, %rd2, %rd3;
    st.global.u32 [%rd4], %r2;
DONE:
    ret;
}
"#;

/// The kernel's name in both sources.
pub const NAME: &str = "memplan_touch";
/// [`NAME`], NUL-terminated for `cuModuleGetFunction`.
const NAME_C: &std::ffi::CStr = c"memplan_touch";

/// A loaded kernel.
#[derive(Debug)]
pub(crate) struct Kernel {
    module: sys::CUmodule,
    function: sys::CUfunction,
    source: &'static str,
}

// SAFETY: module and function handles belong to the context, which may be used from any thread
// once current; the owner makes it current before every use.
unsafe impl Send for Kernel {}

fn nvrtc_ptx(cc: (i32, i32)) -> std::result::Result<String, String> {
    // SAFETY: only tries to load the library; no nvrtc symbol is called unless it loads.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err("libnvrtc could not be loaded".into());
    }
    let opts = cudarc::nvrtc::CompileOptions {
        options: vec![format!("--gpu-architecture=compute_{}{}", cc.0, cc.1)],
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(CUDA_SOURCE, opts)
        .map_err(|e| format!("nvrtc: {e:?}"))?;
    // Not `Ptx::to_src`, which panics on bytes that are not UTF-8.
    ptx_text(ptx.as_bytes().ok_or("nvrtc returned no PTX image")?)
}

/// The PTX text of nvrtc's NUL-terminated image.
fn ptx_text(image: &[u8]) -> std::result::Result<String, String> {
    let end = image.iter().position(|&b| b == 0).unwrap_or(image.len());
    String::from_utf8(image[..end].to_vec())
        .map_err(|_| "nvrtc returned PTX that is not UTF-8".to_string())
}

fn load(ptx: &str, source: &'static str) -> Result<Kernel> {
    // Bad input to the driver, not a measurement: `Kernel::load` falls back to the embedded PTX.
    let image = CString::new(ptx)
        .map_err(|_| Error::invalid(format!("{source} PTX image"), "contains a NUL byte"))?;
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: context current (caller); `image` is a NUL-terminated PTX string that outlives the call.
    check("cuModuleLoadData", unsafe {
        ffi::cuModuleLoadData(&mut module, image.as_ptr() as *const c_void)
    })?;
    let mut function: sys::CUfunction = std::ptr::null_mut();
    // SAFETY: `module` was just loaded; `name` is NUL-terminated.
    let res = unsafe { ffi::cuModuleGetFunction(&mut function, module, NAME_C.as_ptr()) };
    if let Err(e) = check("cuModuleGetFunction", res) {
        // SAFETY: unloading the module loaded above, on the error path.
        let _ = unsafe { ffi::cuModuleUnload(module) };
        return Err(e);
    }
    Ok(Kernel {
        module,
        function,
        source,
    })
}

impl Kernel {
    /// Compile (nvrtc) or take the embedded PTX, and load it into the current context.
    pub(crate) fn load(cc: (i32, i32)) -> Result<Kernel> {
        match nvrtc_ptx(cc) {
            Ok(ptx) => match load(&ptx, "nvrtc") {
                Ok(k) => return Ok(k),
                Err(e) => tracing::info!("nvrtc PTX rejected ({e}); loading the embedded PTX"),
            },
            Err(why) => tracing::info!("{why}; loading the embedded PTX"),
        }
        load(EMBEDDED_PTX, "embedded PTX")
    }

    /// `nvrtc` or `embedded PTX`.
    pub(crate) fn source(&self) -> &'static str {
        self.source
    }

    /// Launch one block of 32 threads on `stream` (recorded as a kernel node when capturing).
    pub(crate) fn launch(&self, stream: sys::CUstream, ptr: u64, n: u32) -> Result<()> {
        let (mut p, mut n) = (ptr, n);
        let mut params = [
            (&mut p as *mut u64).cast::<c_void>(),
            (&mut n as *mut u32).cast::<c_void>(),
        ];
        // SAFETY: the function takes (u64 pointer, u32), matching `params`; the argument values
        // are copied by the driver during the call; `stream` is a live stream of this context.
        let res = unsafe {
            ffi::cuLaunchKernel(
                self.function,
                1,
                1,
                1,
                32,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        check("cuLaunchKernel", res)
    }

    /// Unload the module.
    pub(crate) fn unload(self) {
        // SAFETY: the module was loaded by `load` and is unloaded once (self is consumed).
        if let Err(e) = check("cuModuleUnload", unsafe {
            ffi::cuModuleUnload(self.module)
        }) {
            tracing::warn!("{e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_image_is_cut_at_its_nul() {
        assert_eq!(
            ptx_text(b".version 8.0\0junk").as_deref(),
            Ok(".version 8.0")
        );
        assert_eq!(ptx_text(b"no nul").as_deref(), Ok("no nul"));
        assert!(ptx_text(&[0xff, 0xfe, 0]).is_err());
    }

    #[test]
    fn sources_name_the_same_kernel() {
        assert_eq!(NAME_C.to_str(), Ok(NAME));
        assert!(CUDA_SOURCE.contains(&format!("void {NAME}(")));
        assert!(EMBEDDED_PTX.contains(&format!(".entry {NAME}(")));
        assert!(!EMBEDDED_PTX.contains('\0') && !CUDA_SOURCE.contains('\0'));
        // Every predicate/register used is declared within the declared counts.
        assert!(EMBEDDED_PTX.contains(".reg .pred %p<4>") && EMBEDDED_PTX.contains("%p3"));
    }
}
