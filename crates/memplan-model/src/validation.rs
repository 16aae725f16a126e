//! Reproducing a logged engine start-up (one line of `engine-startup-logs.jsonl`) from its
//! measured values, within the rounding of the figures the engine printed.
//!
//! ## Tolerance
//!
//! A figure printed as `x` GiB with `d` decimals (at least 2: engines print `round(x, 2)`, so
//! `57.5` means `57.50`) lies in `[x - h, x + h]` with `h = 0.5 * 10^-d` GiB. The budget is
//! computed at both ends of every interval: `kv_lo = ceil((T - hT) * u) - (w + hw) - (a + ha) -
//! (n + hn)` and `kv_hi` with the signs flipped (components), or `[kv - h, kv + h]` when the
//! log only printed the available KV memory. The logged token count must lie between the
//! token counts of `kv_lo` and `kv_hi`. No per-log adjustment exists.
//!
//! Which figures: the components (total, utilisation, weights, activation, non-torch) when all
//! are printed, with the graph estimate included only when the engine's own "Total non KV cache
//! memory" line shows it was subtracted; otherwise the printed available KV memory.
//! Engines without a "GPU KV cache size" line (V0) report all blocks and no null block; V1's
//! line counts every block, the null block included, so the range's upper end is the count the
//! engine prints at `kv_hi` (memplan's own count is the usable one, a block fewer).

use memplan_core::bytes::GIB;
use memplan_core::kv::{KvDtype, KvLimits};
use memplan_core::{Error, Result};
use memplan_planner::budget::{requested_bytes, Request};
use serde_json::Value;

use crate::presets;

/// The outcome of reproducing one log.
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct Reproduction {
    /// Model id.
    pub model: String,
    /// Where the log comes from.
    pub source: String,
    /// `components` or `available_kv`.
    pub basis: &'static str,
    /// Whether the graph estimate was subtracted.
    pub graph_subtracted: bool,
    /// The count compared: `tokens` or `blocks`.
    pub compared: &'static str,
    /// Logged value.
    pub logged: u64,
    /// Planned value at the printed figures.
    pub planned: u64,
    /// Lowest and highest value the printed figures allow.
    pub range: (u64, u64),
    /// Logged within range.
    pub ok: bool,
}

fn decimals(v: &Value) -> u32 {
    let s = v.to_string();
    let d = s.split_once('.').map_or(0, |(_, f)| {
        f.trim_end_matches(|c: char| !c.is_ascii_digit()).len() as u32
    });
    d.max(2)
}

/// A printed GiB figure and its half-unit of rounding, in bytes.
fn gib(e: &Value, key: &str) -> Option<(f64, f64)> {
    let v = e.get(key).filter(|v| v.is_number())?;
    let x = v.as_f64()?;
    Some((
        x * GIB as f64,
        0.5 * 10f64.powi(-(decimals(v) as i32)) * GIB as f64,
    ))
}

fn printed_non_kv(quote: &str) -> Option<f64> {
    let rest = quote.split("Total non KV cache memory:").nth(1)?;
    let num: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    num.parse::<f64>().ok().map(|x| x * GIB as f64)
}

/// Reproduce one log. `Ok(None)` when the log cannot be checked (no preset for its model, no
/// logged count, or not enough printed figures).
pub fn reproduce(e: &Value) -> Result<Option<Reproduction>> {
    reproduce_with(e, None)
}

/// [`reproduce`], looking the model up first in `extra_configs` (JSONL with the presets'
/// layout, for logs whose configs are not shipped), then in the presets.
pub fn reproduce_with(e: &Value, extra_configs: Option<&str>) -> Result<Option<Reproduction>> {
    let s = |k: &str| e.get(k).and_then(Value::as_str);
    let Some(model) = s("model") else {
        return Ok(None);
    };
    let extra = match extra_configs {
        Some(text) => presets::find_in(text, model)?,
        None => None,
    };
    let Some(preset) = extra.or_else(|| presets::find(model).ok()) else {
        return Ok(None);
    };
    let c = &preset.config;
    let u64f = |k: &str| e.get(k).and_then(Value::as_u64);
    let quote = s("quote").unwrap_or("");
    let v0 = !quote.contains("GPU KV cache size");
    let (compared, logged) = match (u64f("kv_cache_tokens"), u64f("num_gpu_blocks")) {
        (Some(t), _) if !v0 => ("tokens", t),
        (_, Some(b)) => ("blocks", b),
        _ => return Ok(None),
    };
    let tp = u64f("num_gpus_tp").unwrap_or(1);
    let kv_dtype = match s("kv_cache_dtype") {
        None | Some("auto") => KvDtype::Bf16,
        Some(k) => k.parse()?,
    };
    let spec = c.kv_spec(kv_dtype, u64f("block_size").unwrap_or(16) as u32, tp)?;
    let mml = u64f("max_model_len")
        .or(c.max_position_embeddings)
        .unwrap_or(8192);
    let limits = KvLimits::new(mml, u64f("max_num_batched_tokens").unwrap_or(2048));

    let util = e.get("gpu_memory_utilization").and_then(Value::as_f64);
    let parts = [
        gib(e, "gpu_total_gib"),
        gib(e, "weights_gib"),
        gib(e, "activation_peak_gib"),
        gib(e, "non_torch_gib"),
    ];
    let (basis, mut graph_subtracted, lo, mid, hi) = match (util, parts) {
        (Some(u), [Some(t), Some(w), Some(a), Some(n)]) => {
            let used = [w, a, n];
            let graph = gib(e, "cuda_graph_estimate_gib");
            let sum = |v: &[(f64, f64)]| v.iter().map(|p| p.0).sum::<f64>();
            let mut subtracted = false;
            if let (Some(g), Some(printed)) = (graph, printed_non_kv(quote)) {
                if (printed - sum(&used) - g.0).abs() < (printed - sum(&used)).abs() {
                    subtracted = true;
                }
            }
            let mut all = used.to_vec();
            if subtracted {
                all.extend(graph);
            }
            let req = |total: f64| {
                requested_bytes(total.max(1.0) as u64, Request::Utilization(u)).map(|r| r as f64)
            };
            let err: f64 = all.iter().map(|p| p.1).sum();
            let lo = req(t.0 - t.1)? - sum(&all) - err;
            let hi = req(t.0 + t.1)? - sum(&all) + err;
            ("components", subtracted, lo, req(t.0)? - sum(&all), hi)
        }
        _ => {
            let Some((kv, h)) = gib(e, "available_kv_gib") else {
                return Ok(None);
            };
            ("available_kv", false, kv - h, kv, kv + h)
        }
    };
    if basis == "available_kv" {
        graph_subtracted = false;
    }
    // (memplan's count, the engine's printed count): V1's "GPU KV cache size" line divides
    // every block, the null block included (`num_blocks // groups * block_size`), where
    // memplan counts the usable ones; the range runs from memplan's count at the low end to
    // the engine's at the high end.
    let size = |b: f64| -> Result<(u64, u64)> {
        let z = spec.size(b.max(0.0) as u64, &limits)?;
        Ok(if compared == "tokens" {
            let printed = z.num_blocks / z.num_groups.max(1) * z.block_size;
            (z.tokens, printed.max(z.tokens))
        } else if v0 {
            (z.num_blocks, z.num_blocks)
        } else {
            (z.usable_blocks, z.num_blocks)
        })
    };
    let (lo_n, _) = size(lo)?;
    let (_, hi_n) = size(hi)?;
    let (planned, _) = size(mid)?;
    let src = s("source").unwrap_or("").to_string();
    Ok(Some(Reproduction {
        model: model.to_string(),
        source: src,
        basis,
        graph_subtracted,
        compared,
        logged,
        planned,
        range: (lo_n, hi_n),
        ok: (lo_n..=hi_n).contains(&logged),
    }))
}

/// Reproduce every line of a JSONL file; lines that cannot be checked are skipped.
pub fn reproduce_all(jsonl: &str) -> Result<Vec<Reproduction>> {
    reproduce_all_with(jsonl, None)
}

/// [`reproduce_all`] with extra configs (see [`reproduce_with`]).
pub fn reproduce_all_with(jsonl: &str, extra_configs: Option<&str>) -> Result<Vec<Reproduction>> {
    let mut out = Vec::new();
    for (i, line) in jsonl
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: Value = memplan_core::json::from_str(line)
            .map_err(|err| Error::invalid(format!("line {}", i + 1), err.to_string()))?;
        if let Some(r) = reproduce_with(&v, extra_configs)
            .map_err(|err| Error::invalid(format!("line {}", i + 1), err.to_string()))?
        {
            out.push(r);
        }
    }
    Ok(out)
}
