//! Presenting a dry run: the arithmetic table, a one-line memory bar, `--json`, `--svg` and
//! `--emit-args`.

use memplan::bytes::{fmt_bytes, GIB};
use memplan::kv::KvDtype;
use memplan::Error;
use memplan_model::dryrun::{DryRun, GraphReserve, PlanInput};
use serde_json::{json, Value};

use super::{Engine, Flags};

/// Everything the renderers need, resolved once.
pub struct View<'a> {
    device: &'a str,
    input: &'a PlanInput,
    plan: &'a DryRun,
    strategy: &'static str,
}

/// One segment of the memory picture.
struct Segment {
    label: &'static str,
    glyph: char,
    color: &'static str,
    bytes: u64,
}

impl<'a> View<'a> {
    /// Collect the pieces.
    pub fn new(device: &'a str, input: &'a PlanInput, plan: &'a DryRun, args: &Flags) -> Self {
        let strategy = if args.enforce_eager || input.graph_reserve == GraphReserve::None {
            "none"
        } else if plan.graph.source == "measured" {
            "measured"
        } else {
            "conservative"
        };
        View {
            device,
            input,
            plan,
            strategy,
        }
    }

    fn segments(&self) -> Vec<Segment> {
        let b = &self.plan.budget;
        let c = &b.consumers;
        let kv = self.plan.sizing.used_bytes;
        vec![
            Segment {
                label: "weights",
                glyph: 'W',
                color: "#4e79a7",
                bytes: c.weights,
            },
            Segment {
                label: "activation",
                glyph: 'A',
                color: "#f28e2b",
                bytes: c.activation,
            },
            Segment {
                label: "non-allocator",
                glyph: 'N',
                color: "#e15759",
                bytes: c.non_allocator,
            },
            Segment {
                label: "graph reserve",
                glyph: 'G',
                color: "#b07aa1",
                bytes: c.graph_reserve,
            },
            Segment {
                label: "KV cache",
                glyph: 'K',
                color: "#59a14f",
                bytes: kv,
            },
            Segment {
                label: "requested, unused",
                glyph: '.',
                color: "#d3d3d3",
                bytes: b.kv_budget - kv,
            },
            Segment {
                label: "not requested",
                glyph: ' ',
                color: "#ffffff",
                bytes: b.total - b.requested,
            },
        ]
    }

    /// The `--json` object.
    pub fn json(&self) -> Value {
        let (p, b, z) = (self.plan, &self.plan.budget, &self.plan.sizing);
        let fig = |f: &memplan_model::dryrun::Figure| json!({"bytes": f.bytes, "source": f.source, "basis": f.basis});
        json!({
            "device": self.device,
            "model": self.input.model.name,
            "total_bytes": b.total,
            "requested_bytes": b.requested,
            "weights_bytes": b.consumers.weights,
            "activation_bytes": b.consumers.activation,
            "non_torch_bytes": b.consumers.non_allocator,
            "graph_reserve_bytes": b.consumers.graph_reserve,
            "graph_strategy": self.strategy,
            "graph_estimate_bytes": p.graph_estimate.bytes,
            "kv_cache_bytes": b.kv_budget,
            "kv_cache_used_bytes": z.used_bytes,
            "num_blocks": z.usable_blocks,
            "num_blocks_with_null": z.num_blocks,
            "kv_cache_tokens": z.tokens,
            "max_concurrency": (z.max_concurrency * 100.0).floor() / 100.0,
            "max_model_len": p.max_model_len,
            "max_model_len_fit": z.max_model_len_fit,
            "max_num_seqs": p.max_num_seqs,
            "max_num_batched_tokens": p.max_num_batched_tokens,
            "tensor_parallel_size": self.input.tensor_parallel,
            "kv_cache_dtype": p.kv_spec.dtype.name(),
            "block_size": p.kv_spec.block_size,
            "page_bytes": z.page_bytes,
            "block_bytes": z.block_bytes,
            "kv_groups": z.num_groups,
            "figures": {"weights": fig(&p.weights), "activation": fig(&p.activation), "non_torch": fig(&p.non_torch), "graph": fig(&p.graph)},
            "suggestions": b.suggestions,
            "engine_args": {"vllm": engine_args(self, Engine::Vllm).ok(), "sglang": engine_args(self, Engine::Sglang).ok()},
            "warnings": p.warnings,
        })
    }
}

/// Ready-to-paste flags that pin the planned KV cache. An error when the engine cannot hold
/// the planned cache (SGLang has no int8 KV cache).
pub fn engine_args(v: &View<'_>, e: Engine) -> Result<String, Error> {
    let (p, b) = (v.plan, &v.plan.budget);
    let tp = v.input.tensor_parallel;
    let dtype = p.kv_spec.dtype;
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
                "--kv-cache-memory-bytes {} --max-model-len {} --max-num-seqs {} --max-num-batched-tokens {} --block-size {} --tensor-parallel-size {} --kv-cache-dtype {kv}",
                b.kv_budget,
                p.max_model_len,
                p.max_num_seqs,
                p.max_num_batched_tokens,
                p.kv_spec.block_size,
                tp,
            );
            if v.strategy == "none" && v.input.enforce_eager {
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
            let frac = ((b.requested as f64 / b.total as f64 * 1000.0) - 1e-6).ceil() / 1000.0;
            Ok(format!(
                "--max-total-tokens {} --mem-fraction-static {:.3} --context-length {} --max-running-requests {} --tp-size {tp} --kv-cache-dtype {kv}",
                p.sizing.tokens,
                frac.min(1.0),
                p.max_model_len,
                p.max_num_seqs
            ))
        }
    }
}

/// The one-line memory bar (the planner's, so `plan` and `simulate` draw the same picture).
fn bar(v: &View<'_>) -> String {
    v.plan.budget.bar(v.plan.sizing.used_bytes, 64)
}

fn gib(b: u64) -> f64 {
    b as f64 / GIB as f64
}

/// The human-readable table.
pub fn table(v: &View<'_>) -> String {
    let (p, b, z) = (v.plan, &v.plan.budget, &v.plan.sizing);
    let c = &b.consumers;
    let mut o = format!("memplan plan: {} on {}\n\n", v.input.model.name, v.device);
    let mut row =
        |k: &str, val: String, note: &str| o.push_str(&format!("  {k:<24} {val:>14}   {note}\n"));
    row("total", fmt_bytes(b.total), "");
    row(
        "requested",
        fmt_bytes(b.requested),
        &format!("{:.4} of total", b.requested as f64 / b.total as f64),
    );
    row("- weights", fmt_bytes(c.weights), &p.weights.basis);
    row(
        "- activation peak",
        fmt_bytes(c.activation),
        &p.activation.basis,
    );
    row(
        "- non-allocator",
        fmt_bytes(c.non_allocator),
        &p.non_torch.basis,
    );
    row(
        "- graph reserve",
        fmt_bytes(c.graph_reserve),
        &format!("strategy {}: {}", v.strategy, p.graph.basis),
    );
    row(
        "= KV cache budget",
        fmt_bytes(b.kv_budget),
        &format!("{:.2} GiB", gib(b.kv_budget)),
    );
    row(
        "page / block",
        format!("{} / {}", fmt_bytes(z.page_bytes), fmt_bytes(z.block_bytes)),
        &format!(
            "{} group(s) of {} layer(s), {} KV, {} tokens per block",
            z.num_groups, z.group_size, p.kv_spec.dtype, p.kv_spec.block_size
        ),
    );
    row(
        "blocks",
        format!("{}", z.usable_blocks),
        "usable (plus one null block)",
    );
    row("KV cache tokens", format!("{}", z.tokens), "");
    row(
        "max concurrency",
        format!("{:.2}x", (z.max_concurrency * 100.0).floor() / 100.0),
        &format!("at max-model-len {}", p.max_model_len),
    );
    row(
        "longest max-model-len",
        z.max_model_len_fit
            .map_or_else(|| "none".into(), |n| n.to_string()),
        "for one request",
    );
    o.push_str("\nsuggestions:\n");
    if let Some(u) = b.suggestions.utilization_without_graph_reserve {
        o.push_str(&format!("  --gpu-memory-utilization {u:.4}   same KV budget in an engine that does not reserve graph memory\n"));
    }
    o.push_str(&format!(
        "  --kv-cache-memory-bytes {}   fills the requested memory\n",
        b.suggestions.kv_bytes_fill_requested
    ));
    o.push_str(&format!(
        "  --kv-cache-memory-bytes {}   fills the whole device (no headroom)\n",
        b.suggestions.kv_bytes_fill_device
    ));
    o.push_str(&format!("\n{}\n", bar(v)));
    let legend: Vec<String> = v
        .segments()
        .iter()
        .filter(|s| s.glyph != ' ')
        .map(|s| format!("{}={}", s.glyph, s.label))
        .collect();
    o.push_str(&format!(" {}\n", legend.join(" ")));
    for w in &p.warnings {
        o.push_str(&format!("warning: {w}\n"));
    }
    o
}

/// A stacked bar of the device memory.
pub fn svg(v: &View<'_>) -> String {
    let (w, h, x0) = (900.0, 48.0, 10.0);
    let total = v.plan.budget.total.max(1) as f64;
    let mut x = x0;
    let mut out = format!("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"920\" height=\"150\" font-family=\"sans-serif\" font-size=\"12\">\n<text x=\"10\" y=\"18\">{} on {}: {:.2} GiB total</text>\n", esc(&v.input.model.name), esc(v.device), gib(v.plan.budget.total));
    let mut ly = 100.0;
    let mut lx = x0;
    for s in v.segments() {
        let sw = s.bytes as f64 / total * w;
        out.push_str(&format!("<rect x=\"{x:.1}\" y=\"30\" width=\"{sw:.1}\" height=\"{h}\" fill=\"{}\" stroke=\"#333\" stroke-width=\"0.5\"><title>{}: {}</title></rect>\n", s.color, s.label, fmt_bytes(s.bytes)));
        x += sw;
        out.push_str(&format!("<rect x=\"{lx:.0}\" y=\"{:.0}\" width=\"10\" height=\"10\" fill=\"{}\" stroke=\"#333\" stroke-width=\"0.5\"/><text x=\"{:.0}\" y=\"{ly:.0}\">{} {}</text>\n", ly - 9.0, s.color, lx + 14.0, s.label, fmt_bytes(s.bytes)));
        lx += 220.0;
        if lx > 800.0 {
            lx = x0;
            ly += 18.0;
        }
    }
    out.push_str("</svg>\n");
    out
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
