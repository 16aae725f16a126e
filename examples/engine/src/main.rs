//! A downstream inference engine that runs its whole measured start-up through memplan:
//! calibrate, load weights, profile run, capture graphs with the strategy chosen from the
//! device's capabilities (post-capture where the device has virtual memory: the engine gets
//! its KV cache's address before capture), plan, and allocate the KV cache the plan allows.
//!
//! `cargo run --manifest-path examples/engine/Cargo.toml [-- DEVICE]` (default `sim:rtx4090`;
//! try `sim:rx7900xtx-rocm6.2` or `sim:arc-a770`, or `cuda:0` with `--features cuda`).
//!
//! `-- --ranks N [--stages M] [DEVICE...]`: the same engine split over N tensor-parallel ranks
//! (times M pipeline stages), one process per rank, each on its own GPU; the ranks exchange
//! their plans as JSON (files standing for the engine's all-gather), combine them and map the
//! fewest blocks of any rank (`src/ranks.rs`).

mod ranks;
mod toy;

use memplan::kv::{AttentionKind, KvDtype, KvLimits, KvSpec, LayerGroup};
use memplan::{Rank, Request, Session};
use toy::ToyEngine;

/// What the engine asks for.
const REQUEST: Request = Request::Utilization(0.9);

/// The request limits: max_model_len, max_num_batched_tokens.
fn limits() -> KvLimits {
    KvLimits::new(32768, 8192)
}

/// The KV cache of a 28-layer model with 2 KV heads of 128 (Qwen2.5-1.5B), on one rank: the
/// layers of its pipeline stage, its share of the KV heads (at least one: heads replicate
/// when there are more ranks than heads).
fn kv_spec(rank: Rank) -> KvSpec {
    let layers = ranks::stage_layers(28, rank);
    let heads = (2 / rank.tensor_parallel_size).max(1) as u32;
    let group = LayerGroup::new(AttentionKind::Full, layers, heads, 128); // layers, KV heads, head dim
    KvSpec::new(vec![group], KvDtype::Bf16, 16) // bf16, 16 tokens per block
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let done = match args.first().map(String::as_str) {
        Some("--ranks") => ranks::launch(&args),
        Some(ranks::WORKER) => ranks::worker(&args[1..]),
        id => one_gpu(id.unwrap_or("sim:rtx4090")),
    };
    match done {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("memplan-example-engine: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The start-up of the engine on one GPU.
fn one_gpu(id: &str) -> Result<(), Box<dyn std::error::Error>> {
    // The start-up, through memplan.
    let dev = memplan::open(id)?;
    let mut engine = ToyEngine::new(dev.clone());
    let mut s = Session::start_for(&dev, &mut engine, REQUEST)? // calibrate within the request
        .with_kv(&kv_spec(Rank::SINGLE), limits()); // the cache to come: judges a failed profile run
    s.check_request(REQUEST)?; // free memory below the request: refused before loading
    s.load_weights(ToyEngine::load)?;
    s.profile_run(|e| e.forward(limits().max_num_batched_tokens))?;
    s.capture_graphs()?; // strategy chosen from the (calibrated) capability
    let plan = s.plan(REQUEST, &kv_spec(Rank::SINGLE), limits())?;
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
