//! `--emit-args`: ready-to-paste engine flags that pin a planned KV cache. (The table, the SVG
//! and the JSON are the planner's renderers: `memplan_planner::plan::render`.)

use memplan::kv::KvDtype;
use memplan::Error;
use memplan_planner::{GraphMethod, Plan, StrategyKind};

use super::Engine;

impl Engine {
    /// The engine's name in the plan's `engine_args`.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Sglang => "sglang",
        }
    }
}

/// Ready-to-paste flags that pin the planned KV cache. An error when the engine cannot hold
/// the planned cache (SGLang has no int8 KV cache).
pub fn engine_args(p: &Plan, enforce_eager: bool, e: Engine) -> Result<String, Error> {
    let tp = p.tensor_parallel_size;
    let dtype = p.kv_spec.dtype;
    let seqs = p.max_num_seqs.unwrap_or(256);
    match e {
        Engine::Vllm => {
            // vLLM's --kv-cache-dtype names; its int8 cache with per-token-head f32 scales is
            // exactly the layout memplan sizes for int8.
            let kv = match dtype {
                KvDtype::Fp8E4m3 | KvDtype::Fp8E5m2 => dtype.name(),
                KvDtype::Int8 => "int8_per_token_head",
                _ => "auto",
            };
            let mut s = format!(
                "--kv-cache-memory-bytes {} --max-model-len {} --max-num-seqs {seqs} --max-num-batched-tokens {} --block-size {} --tensor-parallel-size {tp} --kv-cache-dtype {kv}",
                p.kv_budget,
                p.limits.max_model_len,
                p.limits.max_num_batched_tokens,
                p.kv_spec.block_size,
            );
            if enforce_eager && p.graph.strategy == GraphMethod::Strategy(StrategyKind::None) {
                s.push_str(" --enforce-eager");
            }
            Ok(s)
        }
        Engine::Sglang => {
            let kv = match dtype {
                KvDtype::Fp8E4m3 | KvDtype::Fp8E5m2 => dtype.name(),
                KvDtype::Int8 => {
                    return Err(Error::invalid(
                        "--emit-args",
                        "SGLang has no int8 KV cache (its --kv-cache-dtype takes auto, fp8_e4m3, fp8_e5m2 or bf16); plan with --kv-cache-dtype fp8 or auto",
                    ))
                }
                _ => "auto",
            };
            // SGLang sizes its pool as `free after loading - total * (1 - fraction)`, with
            // `total` the free memory before loading, and then caps it at --max-total-tokens.
            // The fraction must therefore be large enough for the planned pool *plus* what the
            // engine holds besides the weights (its context, library workspaces); the planned
            // request covers that, so its fraction (rounded up) lets the pool reach the cap,
            // and the cap keeps it at the planned size.
            let frac =
                ((p.requested as f64 / p.total.max(1) as f64 * 1000.0) - 1e-6).ceil() / 1000.0;
            Ok(format!(
                "--max-total-tokens {} --mem-fraction-static {:.3} --context-length {} --max-running-requests {seqs} --tp-size {tp} --kv-cache-dtype {kv}",
                p.kv.tokens,
                frac.min(1.0),
                p.limits.max_model_len,
            ))
        }
    }
}
