//! The fake vendor runtime: what a real backend loads at run time (`libcuda.so.1`,
//! `libamdhip64.so`, `libze_loader.so.1`) is here a Rust module with the same shape: C-style
//! functions that write into out-parameters and return an integer status code, one device
//! per process, state behind a lock. Replace this file with your vendor's library (a `-sys`
//! crate and `libloading`), and `loader.rs` with the code that finds it.
//!
//! The device: [`TOTAL`] bytes; opening a context takes [`CONTEXT`]; allocations are rounded
//! up to [`PAGE`]; virtual memory in [`GRANULE`]s; graph capture records kernel nodes (each
//! costs [`EXEC_BYTES_PER_NODE`] of driver memory once instantiated) and allocation nodes
//! (served from a graph pool that keeps its memory until trimmed). Work runs synchronously, so
//! `synchronize` has nothing to wait for. The device lives in this process: another process
//! that loads the runtime gets a device of its own.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// A status code, as C runtimes return them.
pub type Status = i32;
/// Success.
pub const SUCCESS: Status = 0;
/// `fake_init` was not called.
pub const ERROR_NOT_INITIALIZED: Status = 1;
/// A bad argument (zero size, unknown handle, misaligned address).
pub const ERROR_INVALID_VALUE: Status = 2;
/// Not enough device memory.
pub const ERROR_OUT_OF_MEMORY: Status = 3;
/// No device with that ordinal.
pub const ERROR_INVALID_DEVICE: Status = 4;
/// A call that needs (or forbids) a capture in progress.
pub const ERROR_CAPTURE_STATE: Status = 5;

/// The runtime's version, `major * 1000 + minor * 10` (as CUDA packs it).
pub const VERSION: u32 = 2010;
/// Device memory.
pub const TOTAL: u64 = 8 << 30;
/// What a context holds from its creation.
pub const CONTEXT: u64 = 96 << 20;
/// Rounding of raw allocations.
pub const PAGE: u64 = 2 << 20;
/// Virtual-memory granularity.
pub const GRANULE: u64 = 2 << 20;
/// Driver memory of one instantiated kernel node.
pub const EXEC_BYTES_PER_NODE: u64 = 16 << 10;

#[derive(Default)]
struct State {
    initialized: bool,
    contexts: u32,
    next_handle: u64,
    raw: BTreeMap<u64, u64>,
    ranges: BTreeMap<u64, u64>,
    physical: BTreeMap<u64, u64>,
    maps: BTreeMap<u64, u64>,
    capture: Option<(u64, u64)>,
    graphs: BTreeMap<u64, (u64, u64)>,
    execs: BTreeMap<u64, (u64, u64)>,
    pool_used: u64,
    pool_reserved: u64,
}

impl State {
    fn used(&self) -> u64 {
        let ctx = if self.contexts > 0 { CONTEXT } else { 0 };
        let exec: u64 = self.execs.values().map(|e| e.0).sum();
        [
            self.raw.values().sum::<u64>(),
            self.physical.values().sum::<u64>(),
            exec,
            self.pool_reserved,
        ]
        .into_iter()
        .fold(ctx, u64::saturating_add)
    }

    fn take(&self, bytes: u64) -> Result<(), Status> {
        if bytes > TOTAL.saturating_sub(self.used()) {
            Err(ERROR_OUT_OF_MEMORY)
        } else {
            Ok(())
        }
    }

    fn handle(&mut self) -> u64 {
        self.next_handle += 1;
        // Addresses that look like device pointers, never null.
        0x7e00_0000_0000 + self.next_handle * GRANULE
    }
}

static STATE: Mutex<State> = Mutex::new(State {
    initialized: false,
    contexts: 0,
    next_handle: 0,
    raw: BTreeMap::new(),
    ranges: BTreeMap::new(),
    physical: BTreeMap::new(),
    maps: BTreeMap::new(),
    capture: None,
    graphs: BTreeMap::new(),
    execs: BTreeMap::new(),
    pool_used: 0,
    pool_reserved: 0,
});

/// Run `f` on the state of an initialised runtime.
fn with<T>(f: impl FnOnce(&mut State) -> Result<T, Status>) -> Result<T, Status> {
    let mut s = STATE.lock().unwrap_or_else(|e| e.into_inner());
    if !s.initialized {
        return Err(ERROR_NOT_INITIALIZED);
    }
    f(&mut s)
}

fn status<T>(r: Result<T, Status>, out: &mut T) -> Status {
    match r {
        Ok(v) => {
            *out = v;
            SUCCESS
        }
        Err(e) => e,
    }
}

fn done(r: Result<(), Status>) -> Status {
    r.err().unwrap_or(SUCCESS)
}

fn device(ordinal: i32) -> Result<(), Status> {
    if ordinal == 0 {
        Ok(())
    } else {
        Err(ERROR_INVALID_DEVICE)
    }
}

/// Initialise the runtime.
pub fn fake_init() -> Status {
    STATE.lock().unwrap_or_else(|e| e.into_inner()).initialized = true;
    SUCCESS
}

/// The runtime's version.
pub fn fake_get_version(version: &mut u32) -> Status {
    status(with(|_| Ok(VERSION)), version)
}

/// How many devices.
pub fn fake_device_count(count: &mut i32) -> Status {
    status(with(|_| Ok(1)), count)
}

/// A device attribute: 1 = virtual memory supported, 2 = graph capture supported.
pub fn fake_device_attribute(ordinal: i32, attribute: i32, value: &mut i32) -> Status {
    status(
        with(|_| {
            device(ordinal)?;
            match attribute {
                1 | 2 => Ok(1),
                _ => Err(ERROR_INVALID_VALUE),
            }
        }),
        value,
    )
}

/// Create (or retain) the device's context.
pub fn fake_ctx_retain(ordinal: i32) -> Status {
    done(with(|s| {
        device(ordinal)?;
        if s.contexts == 0 {
            s.take(CONTEXT)?;
        }
        s.contexts += 1;
        Ok(())
    }))
}

/// Release the device's context.
pub fn fake_ctx_release(ordinal: i32) -> Status {
    done(with(|s| {
        device(ordinal)?;
        s.contexts = s.contexts.checked_sub(1).ok_or(ERROR_INVALID_VALUE)?;
        Ok(())
    }))
}

/// Free and total device memory.
pub fn fake_mem_get_info(ordinal: i32, free: &mut u64, total: &mut u64) -> Status {
    let mut both = (0, 0);
    let r = status(
        with(|s| {
            device(ordinal)?;
            Ok((TOTAL - s.used().min(TOTAL), TOTAL))
        }),
        &mut both,
    );
    (*free, *total) = both;
    r
}

/// Graph-pool memory: used by live allocation nodes, reserved by the pool.
pub fn fake_graph_mem_get(ordinal: i32, used: &mut u64, reserved: &mut u64) -> Status {
    let mut both = (0, 0);
    let r = status(
        with(|s| {
            device(ordinal)?;
            Ok((s.pool_used, s.pool_reserved))
        }),
        &mut both,
    );
    (*used, *reserved) = both;
    r
}

/// Wait for all work (there is none in flight: work runs synchronously).
pub fn fake_synchronize(ordinal: i32) -> Status {
    done(with(|s| {
        device(ordinal)?;
        if s.capture.is_some() {
            return Err(ERROR_CAPTURE_STATE);
        }
        Ok(())
    }))
}

/// Allocate `bytes` (rounded up to a page).
pub fn fake_malloc(ordinal: i32, bytes: u64, address: &mut u64) -> Status {
    status(
        with(|s| {
            device(ordinal)?;
            if bytes == 0 || s.capture.is_some() {
                return Err(ERROR_INVALID_VALUE);
            }
            let rounded = bytes
                .checked_next_multiple_of(PAGE)
                .ok_or(ERROR_OUT_OF_MEMORY)?;
            s.take(rounded)?;
            let a = s.handle();
            s.raw.insert(a, rounded);
            Ok(a)
        }),
        address,
    )
}

/// Free an allocation.
pub fn fake_free(ordinal: i32, address: u64) -> Status {
    done(with(|s| {
        device(ordinal)?;
        s.raw.remove(&address).map(drop).ok_or(ERROR_INVALID_VALUE)
    }))
}

/// Virtual-memory granularity.
pub fn fake_mem_granularity(granularity: &mut u64) -> Status {
    status(with(|_| Ok(GRANULE)), granularity)
}

/// Reserve address space.
pub fn fake_mem_address_reserve(bytes: u64, base: &mut u64) -> Status {
    status(
        with(|s| {
            if bytes == 0 || !bytes.is_multiple_of(GRANULE) {
                return Err(ERROR_INVALID_VALUE);
            }
            let b = s.handle();
            // Leave the range's span free of other handles.
            s.next_handle += bytes / GRANULE;
            s.ranges.insert(b, bytes);
            Ok(b)
        }),
        base,
    )
}

/// Free address space.
pub fn fake_mem_address_free(base: u64) -> Status {
    done(with(|s| {
        s.ranges.remove(&base).map(drop).ok_or(ERROR_INVALID_VALUE)
    }))
}

/// Create physical memory.
pub fn fake_mem_create(bytes: u64, handle: &mut u64) -> Status {
    status(
        with(|s| {
            if bytes == 0 || !bytes.is_multiple_of(GRANULE) {
                return Err(ERROR_INVALID_VALUE);
            }
            s.take(bytes)?;
            let h = s.handle();
            s.physical.insert(h, bytes);
            Ok(h)
        }),
        handle,
    )
}

/// Release physical memory.
pub fn fake_mem_release(handle: u64) -> Status {
    done(with(|s| {
        s.physical
            .remove(&handle)
            .map(drop)
            .ok_or(ERROR_INVALID_VALUE)
    }))
}

/// Map physical memory at `address`.
pub fn fake_mem_map(address: u64, bytes: u64, handle: u64) -> Status {
    done(with(|s| {
        if s.physical.get(&handle) != Some(&bytes) || s.maps.contains_key(&address) {
            return Err(ERROR_INVALID_VALUE);
        }
        s.maps.insert(address, bytes);
        Ok(())
    }))
}

/// Unmap.
pub fn fake_mem_unmap(address: u64) -> Status {
    done(with(|s| {
        s.maps.remove(&address).map(drop).ok_or(ERROR_INVALID_VALUE)
    }))
}

/// Begin capturing the device's stream.
pub fn fake_stream_begin_capture(ordinal: i32) -> Status {
    done(with(|s| {
        device(ordinal)?;
        if s.capture.is_some() {
            return Err(ERROR_CAPTURE_STATE);
        }
        s.capture = Some((0, 0));
        Ok(())
    }))
}

/// Record kernels and an allocation node of `alloc_bytes` (0: none) into the capture.
pub fn fake_stream_record(kernels: u32, alloc_bytes: u64) -> Status {
    done(with(|s| {
        let c = s.capture.as_mut().ok_or(ERROR_CAPTURE_STATE)?;
        c.0 = c.0.saturating_add(u64::from(kernels));
        c.1 = c.1.saturating_add(alloc_bytes);
        Ok(())
    }))
}

/// End the capture: a graph.
pub fn fake_stream_end_capture(graph: &mut u64) -> Status {
    status(
        with(|s| {
            let c = s.capture.take().ok_or(ERROR_CAPTURE_STATE)?;
            let g = s.handle();
            s.graphs.insert(g, c);
            Ok(g)
        }),
        graph,
    )
}

/// Instantiate a graph: its kernel nodes take driver memory, its allocation node the pool's.
pub fn fake_graph_instantiate(graph: u64, exec: &mut u64) -> Status {
    status(
        with(|s| {
            let (nodes, alloc) = *s.graphs.get(&graph).ok_or(ERROR_INVALID_VALUE)?;
            let bytes = nodes.saturating_mul(EXEC_BYTES_PER_NODE);
            let grow = s
                .pool_used
                .saturating_add(alloc)
                .saturating_sub(s.pool_reserved);
            s.take(bytes.saturating_add(grow))?;
            s.pool_reserved += grow;
            s.pool_used += alloc;
            let e = s.handle();
            s.execs.insert(e, (bytes, alloc));
            Ok(e)
        }),
        exec,
    )
}

/// Launch an instantiated graph (and wait: work runs synchronously).
pub fn fake_graph_launch(exec: u64) -> Status {
    done(with(|s| {
        if s.capture.is_some() {
            return Err(ERROR_CAPTURE_STATE);
        }
        s.execs.get(&exec).map(drop).ok_or(ERROR_INVALID_VALUE)
    }))
}

/// Destroy an executable graph: its driver memory returns, its allocation node leaves the pool
/// (which keeps the memory until trimmed).
pub fn fake_graph_exec_destroy(exec: u64) -> Status {
    done(with(|s| {
        let (_, alloc) = s.execs.remove(&exec).ok_or(ERROR_INVALID_VALUE)?;
        s.pool_used -= alloc;
        Ok(())
    }))
}

/// Destroy a graph.
pub fn fake_graph_destroy(graph: u64) -> Status {
    done(with(|s| {
        s.graphs.remove(&graph).map(drop).ok_or(ERROR_INVALID_VALUE)
    }))
}

/// Abandon the capture in progress.
pub fn fake_stream_abort_capture() -> Status {
    done(with(|s| {
        s.capture.take().map(drop).ok_or(ERROR_CAPTURE_STATE)
    }))
}

/// Return the graph pool's unused memory.
pub fn fake_graph_mem_trim(ordinal: i32) -> Status {
    done(with(|s| {
        device(ordinal)?;
        s.pool_reserved = s.pool_used;
        Ok(())
    }))
}
