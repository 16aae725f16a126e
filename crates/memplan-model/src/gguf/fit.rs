//! The llama.cpp answer for a GGUF model: which `-c` and how many GPU layers (`-ngl`) fit a
//! budget. Sizes are computed in 128 bits from 64-bit inputs (a layer's bytes, heads times
//! key length, a context): no product of such values can wrap, so extreme but well-formed
//! head counts and key lengths give an answer (often "nothing fits"), never an overflow.

use memplan_core::{Error, Result};

use super::Info;
use crate::ModelConfig;

/// llama.cpp's KV cache types: bytes per element (`ggml_type_size / ggml_blck_size`) as a
/// fraction (numerator, denominator).
pub fn kv_type_bytes(t: &str) -> Result<(u64, u64)> {
    Ok(match t {
        "f16" => (2, 1),
        "q8_0" => (34, 32),
        "q4_0" => (18, 32),
        other => {
            return Err(Error::invalid(
                "llama.cpp KV cache type",
                format!("{other:?}: llama.cpp KV types are f16, q8_0, q4_0"),
            ))
        }
    })
}

/// A llama.cpp answer: the longest `-c` with every layer on the GPU, else the most layers.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Fit {
    /// Layers on the GPU (`-ngl`); `n_layers + 1` means the output head too.
    pub ngl: u64,
    /// Context (`-c`).
    pub ctx: u64,
    /// Bytes on the GPU for weights.
    pub weight_bytes: u64,
    /// Bytes of KV cache on the GPU.
    pub kv_bytes: u64,
}

/// What fits in `budget` GPU bytes for `ctx` tokens (or the longest context with all
/// layers offloaded when it is below `ctx`): KV per layer and token is
/// `kv_heads * (k + v) * bytes(kv_type)`; `overhead` (compute buffers) is subtracted first.
pub fn fit(
    info: &Info,
    c: &ModelConfig,
    budget: u64,
    overhead: u64,
    kv_type: &str,
    ctx: u64,
) -> Result<Fit> {
    let (num, den) = kv_type_bytes(kv_type)?;
    let wide = u128::from;
    // Products of 64-bit factors in 128 bits, saturating: a config's dimensions are capped at
    // 2^40 by its reader, but nothing here relies on it.
    let per_layer_token = wide(c.num_kv_heads)
        .saturating_mul(wide(c.head_dim))
        .saturating_mul(2 * wide(num))
        .div_ceil(wide(den));
    let n = info.layer_bytes.len() as u64;
    let avail = wide(budget.saturating_sub(overhead));
    // Weights of the first `g` layers (and the output head once every layer is on the GPU).
    let mut prefix = Vec::with_capacity(info.layer_bytes.len() + 1);
    prefix.push(0u128);
    for b in &info.layer_bytes {
        prefix.push(prefix.last().copied().unwrap_or(0) + wide(*b));
    }
    let weights = |ngl: u64| -> u128 {
        prefix[ngl.min(n) as usize] + if ngl > n { wide(info.output_bytes) } else { 0 }
    };
    let kv = |ngl: u64, ctx: u64| -> u128 {
        wide(ngl.min(n))
            .saturating_mul(per_layer_token)
            .saturating_mul(wide(ctx))
    };
    let need = |ngl: u64, ctx: u64| weights(ngl).saturating_add(kv(ngl, ctx));
    // Every value returned is at most `avail`, itself a u64.
    let narrow = |v: u128| u64::try_from(v).unwrap_or(u64::MAX);
    let all = n + 1;
    if need(all, ctx) <= avail {
        // Everything fits at the requested context: report the longest context that fits.
        let w = weights(all);
        let longest = narrow((avail - w) / wide(n.max(1)).saturating_mul(per_layer_token.max(1)));
        let ctx = longest.min(c.derived_max_len.unwrap_or(longest)).max(ctx);
        return Ok(Fit {
            ngl: all,
            ctx,
            weight_bytes: narrow(w),
            kv_bytes: narrow(kv(all, ctx)),
        });
    }
    let ngl = (0..=all)
        .rev()
        .find(|g| need(*g, ctx) <= avail)
        .unwrap_or(0);
    Ok(Fit {
        ngl,
        ctx,
        weight_bytes: narrow(weights(ngl)),
        kv_bytes: narrow(kv(ngl, ctx)),
    })
}
