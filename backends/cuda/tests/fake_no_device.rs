//! Against a fake driver whose `cuInit` returns `CUDA_ERROR_NO_DEVICE` (a driver installed in a
//! container without `--gpus`): every entry point reports the call and the code, nothing panics.

mod fake;

use memplan_backend_cuda::CudaBackend;
use memplan_core::{Backend, Error};

#[test]
fn no_device_is_a_driver_call_error() {
    let Some(_) = fake::load(&["-DFAKE_NO_DEVICE"]) else {
        return;
    };
    let e = CudaBackend.devices().expect_err("no device");
    assert!(
        matches!(&e, Error::DriverCall { call, code: 100, name } if call == "cuInit" && name == "CUDA_ERROR_NO_DEVICE"),
        "{e}"
    );
    assert_eq!(e.to_string(), "cuInit failed: CUDA_ERROR_NO_DEVICE (100)");
    let e = CudaBackend.open("0").expect_err("no device");
    assert_eq!(e.to_string(), "cuInit failed: CUDA_ERROR_NO_DEVICE (100)");
}
