//! A downstream inference engine that runs its whole measured start-up through memplan:
//! calibrate, load weights, profile run, capture graphs with the strategy chosen from the
//! device's capabilities (post-capture where the device has virtual memory: the engine gets
//! its KV cache's address before capture), plan, and allocate the KV cache the plan allows.
//!
//! `cargo run --manifest-path examples/engine/Cargo.toml [-- DEVICE]` (default `sim:rtx4090`;
//! try `sim:rx7900xtx-rocm6.2` or `sim:arc-a770`, or `cuda:0` with `--features cuda`).

mod toy;

use memplan::kv::{AttentionKind, KvDtype, KvLimits, KvSpec, LayerGroup};
use memplan::{Request, Session};
use toy::ToyEngine;

/// The KV cache of a 28-layer model with 2 KV heads of 128 (Qwen2.5-1.5B).
fn kv_spec() -> KvSpec {
    let layer = LayerGroup::new(AttentionKind::Full, 28, 2, 128); // layers, KV heads, head dim
    KvSpec::new(vec![layer], KvDtype::Bf16, 16) // bf16, 16 tokens per block
}

fn main() -> memplan::Result<()> {
    let id = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "sim:rtx4090".into());
    let request = Request::Utilization(0.9);
    let limits = KvLimits::new(32768, 8192); // max_model_len, max_num_batched_tokens

    // The start-up, through memplan.
    let dev = memplan::open_shared(&id)?;
    let mut engine = ToyEngine::new(dev.clone());
    let mut s = Session::start(&dev, &mut engine)?; // calibrate, release cache, baseline
    s.check_request(request)?; // free memory below the request: refused before loading
    s.load_weights(ToyEngine::load)?;
    s.profile_run(|e| e.forward(limits.max_num_batched_tokens))?;
    s.capture_graphs()?; // strategy chosen from the (calibrated) capability
    let plan = s.plan(request, &kv_spec(), limits)?;
    let kv = s.into_kv_cache(&plan)?; // this rank's blocks; post-capture: mapped there

    // The engine allocates.
    let kv_bytes = match &kv.range {
        Some(range) => range.mapped_bytes(),
        None => engine.alloc(kv.bytes)?.bytes(),
    };
    println!("{plan}");
    match (&kv.range, engine.kv_address) {
        (Some(range), Some(bound)) => {
            assert_eq!(
                range.address(),
                bound,
                "the KV cache is where the graphs point"
            );
            println!("KV cache: {} blocks, {kv_bytes} bytes mapped at {bound:#x}, the address the {} graphs were captured against", kv.num_blocks, engine.graphs());
        }
        _ => println!(
            "KV cache: {} blocks, {kv_bytes} bytes allocated after the graph phase ({} strategy)",
            kv.num_blocks, plan.graph.strategy
        ),
    }
    Ok(())
}
