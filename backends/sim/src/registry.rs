//! The process-wide registry of open simulated GPUs: opening the same selector twice while the
//! first handle is alive gives the same GPU, as opening `cuda:0` twice gives the same device.
//! Keyed by the full selector (profile and modifiers, trimmed and lower-cased), so
//! `rtx4090` and `rtx4090,other=4GiB` are two GPUs. A GPU nobody holds any more is forgotten:
//! the next open starts a fresh one (a new process on real hardware starts fresh too).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use memplan_core::Result;

use crate::gpu::{Shared, SimGpu};
use crate::state::State;

type Entry = (Weak<Shared>, Weak<Mutex<State>>);

fn registry() -> &'static Mutex<HashMap<String, Entry>> {
    static OPEN: OnceLock<Mutex<HashMap<String, Entry>>> = OnceLock::new();
    OPEN.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The key of a selector.
pub(crate) fn key(selector: &str) -> String {
    selector_of(selector).to_ascii_lowercase()
}

/// A selector as given, or a device id (`sim:rtx4090`, the id `memplan::open` takes) without
/// its backend: one id names a simulated GPU everywhere.
pub(crate) fn selector_of(id: &str) -> &str {
    let id = id.trim();
    match id.get(..4) {
        Some(p) if p.eq_ignore_ascii_case("sim:") => id[4..].trim(),
        _ => id,
    }
}

impl SimGpu {
    /// The GPU open under this selector in this process, or a newly opened one (see
    /// [`SimGpu::open`] for selectors; the device id `sim:rtx4090` and the selector
    /// `rtx4090` name the same GPU). `memplan::open("sim:...")` goes through here; use
    /// [`SimGpu::open`] for a private GPU nobody else can open.
    pub fn shared(selector: &str) -> Result<Self> {
        let k = key(selector);
        // A panic elsewhere cannot leave the map inconsistent: entries are inserted whole.
        let mut open = registry().lock().unwrap_or_else(|e| e.into_inner());
        if let Some((s, st)) = open.get(&k) {
            if let (Some(shared), Some(state)) = (s.upgrade(), st.upgrade()) {
                return Ok(SimGpu { shared, state });
            }
        }
        let gpu = SimGpu::open(selector_of(selector))?;
        open.retain(|_, (s, _)| s.strong_count() > 0);
        open.insert(k, (Arc::downgrade(&gpu.shared), Arc::downgrade(&gpu.state)));
        Ok(gpu)
    }
}
