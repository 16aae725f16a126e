//! Print what the xpu backend sees: each device with its declared capability and one driver
//! reading, or why the backend is unavailable. Exits 0 either way (an unavailable backend is an
//! answer, not a failure).
//!
//! `cargo run -p memplan-backend-xpu --example xpu_devices`
//! (`MEMPLAN_LEVEL_ZERO_LOADER=/no/such.so` shows the missing-loader path).

use memplan_backend_xpu::XpuBackend;
use memplan_core::Backend;

fn main() {
    let backend = XpuBackend::new();
    let devices = match backend.devices() {
        Ok(d) => d,
        Err(e) => {
            println!("xpu: unavailable: {e}");
            return;
        }
    };
    println!("xpu: available, {} device(s)", devices.len());
    for d in devices {
        println!("{} {} total={:?}", d.id, d.name, d.total_bytes);
        for (k, v) in &d.properties {
            println!("  {k}: {v}");
        }
        match backend.open(&d.id.selector) {
            Ok(dev) => {
                print!("{}", dev.capabilities());
                match dev.driver_memory() {
                    Ok(m) => println!("  reading: total={:?} free={:?}", m.total, m.free),
                    Err(e) => println!("  reading failed: {e}"),
                }
            }
            Err(e) => println!("  open failed: {e}"),
        }
    }
}
