//! The capture kernel through nvrtc (a fake `libnvrtc.so` and the fake driver): nvrtc is asked
//! for the device's architecture and its PTX is loaded; when the driver rejects nvrtc's PTX,
//! the backend falls back to the embedded PTX and says which one it used.

mod fake;

use memplan_backend_cuda::CudaBackend;
use memplan_core::HalDevice;

#[test]
fn nvrtc_first_embedded_ptx_as_fallback() {
    let (Some(drv), Some(nvrtc)) = (fake::load(&[]), fake::load_nvrtc()) else {
        return;
    };
    let mut d = CudaBackend.open_cuda("0").expect("open");
    assert_eq!(
        d.kernel_source(),
        None,
        "no kernel before graph capture is used"
    );
    d.graphs().map(drop).expect("capture");
    assert_eq!(d.kernel_source(), Some("nvrtc"));
    assert_eq!(
        fake::nvrtc_state(nvrtc, "arch"),
        89,
        "compiled for the device's compute capability 8.9"
    );
    assert_eq!(
        fake::nvrtc_state(nvrtc, "programs"),
        0,
        "the nvrtc program was destroyed"
    );
    drop(d);

    std::env::set_var("FAKE_NVRTC_BAD_PTX", "1");
    let mut d = CudaBackend.open_cuda("0").expect("open");
    d.graphs().map(drop).expect("capture still works");
    assert_eq!(d.kernel_source(), Some("embedded PTX"));
    assert_eq!(fake::nvrtc_state(nvrtc, "compiles"), 2);
    assert_eq!(
        fake::state(drv, "modules"),
        1,
        "only the embedded module is loaded"
    );
    drop(d);
    assert_eq!(fake::state(drv, "modules"), 0);
}
