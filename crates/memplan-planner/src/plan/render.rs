//! Presenting a [`Plan`]: the text table with a memory bar ([`text`]), the SVG picture
//! ([`svg`]). `memplan plan` and `memplan simulate` print plans through these; the JSON is the
//! plan's `Serialize`. Parameter names in suggestions come from the caller ([`Names`]): the
//! library speaks in concepts ([`concept_names`]), the command line in its flags.

use memplan_core::bytes::{fmt_bytes, GIB};
use memplan_core::Param;

use super::{ConsumerKind, Plan};
use crate::Warning;

/// How a front end names parameters (`Param::Utilization` as `--gpu-memory-utilization`).
pub type Names = dyn Fn(Param) -> String;

/// The library's names: concepts in words.
pub fn concept_names(p: Param) -> String {
    p.concept().to_string()
}

/// One segment of the memory picture.
struct Segment {
    label: &'static str,
    glyph: char,
    color: &'static str,
    bytes: u64,
}

fn segments(p: &Plan) -> Vec<Segment> {
    let mut v: Vec<Segment> = p
        .consumers
        .iter()
        .map(|c| Segment {
            label: c.kind.label(),
            glyph: c.kind.glyph(),
            color: c.kind.color(),
            bytes: c.bytes,
        })
        .collect();
    let used = p.kv.used_bytes;
    v.push(Segment {
        label: "KV cache",
        glyph: 'K',
        color: "#59a14f",
        bytes: used,
    });
    v.push(Segment {
        label: "requested, unused",
        glyph: '.',
        color: "#d3d3d3",
        bytes: p
            .requested_bytes
            .saturating_sub(p.consumers.total().unwrap_or(u64::MAX).saturating_add(used)),
    });
    v.push(Segment {
        label: "not requested",
        glyph: ' ',
        color: "#ffffff",
        bytes: p.total_bytes.saturating_sub(p.requested_bytes),
    });
    v
}

/// The one-line memory bar over the device total, `cells` wide between brackets. Cells are
/// rounded to the nearest and never overflow the bar.
pub fn bar(p: &Plan, cells: u64) -> String {
    let t = u128::from(p.total_bytes.max(1));
    let to_cells = |b: u64| ((u128::from(b) * u128::from(cells) + t / 2) / t) as u64;
    let mut s = String::from("[");
    let mut used = 0u64;
    for seg in segments(p)
        .iter()
        .filter(|s| s.glyph != '.' && s.glyph != ' ')
    {
        let n = to_cells(seg.bytes).min(cells - used);
        s.extend(std::iter::repeat_n(seg.glyph, n as usize));
        used += n;
    }
    let requested = to_cells(p.requested_bytes).clamp(used, cells);
    s.extend(std::iter::repeat_n('.', (requested - used) as usize));
    s.extend(std::iter::repeat_n(' ', (cells - requested) as usize));
    s.push(']');
    s
}

fn gib(b: u64) -> f64 {
    b as f64 / GIB as f64
}

/// Where the plan warns that graph memory is not reserved, what capture adds to the
/// utilisation suggested without a graph reserve, with the figure that warning states (the
/// caller may have put a measured one there): `u + graphs / total`, rounded up to 4 decimals.
fn capture_beyond(p: &Plan, u: f64) -> String {
    let graphs = p.warnings.iter().find_map(|w| match w {
        Warning::GraphMemoryNotReserved { estimate } => Some(*estimate),
        _ => None,
    });
    match graphs {
        Some(g) if g > 0 && p.total_bytes > 0 => {
            let all = ((u + g as f64 / p.total_bytes as f64) * 1e4).ceil() / 1e4;
            format!(
                "; graph capture takes about {} beyond it (the warning's figure): {all:.4} of the device in all{}",
                fmt_bytes(g),
                if all > 1.0 { ", more than it has" } else { "" }
            )
        }
        _ => String::new(),
    }
}

/// The text table: the arithmetic from the device total down to KV blocks, tokens and
/// concurrency, each consumer with its provenance, the graph strategy and why, the
/// suggestions (named by `names`), the memory bar and every warning.
pub fn text(p: &Plan, names: &Names) -> String {
    let title = match (&p.model, &p.device) {
        (Some(m), Some(d)) => format!("plan: {m} on {d}\n\n"),
        (Some(m), None) => format!("plan: {m}\n\n"),
        (None, Some(d)) => format!("plan on {d}\n\n"),
        (None, None) => String::new(),
    };
    let mut o = title;
    if let Some(e) = &p.engine {
        o.push_str(&format!("  engine rules: {e}\n"));
    }
    let mut row =
        |k: &str, val: String, note: &str| o.push_str(&format!("  {k:<24} {val:>14}   {note}\n"));
    row("total", fmt_bytes(p.total_bytes), "");
    row(
        "requested",
        fmt_bytes(p.requested_bytes),
        &format!(
            "{:.4} of total ({})",
            p.requested_bytes as f64 / p.total_bytes.max(1) as f64,
            p.request.describe()
        ),
    );
    for c in p.consumers.iter() {
        let note = if c.kind == ConsumerKind::Graphs {
            format!(
                "{} ±{}: {}",
                p.graph.strategy,
                fmt_bytes(p.graph.uncertainty_bytes),
                c.provenance.basis()
            )
        } else {
            let (label, basis) = (c.provenance.label(), c.provenance.basis());
            match basis.strip_prefix(label) {
                // A basis that already says what it is ("estimate: ...").
                Some(rest) if rest.starts_with(':') => basis.to_string(),
                _ => format!("{label}: {basis}"),
            }
        };
        row(&format!("- {}", c.kind.label()), fmt_bytes(c.bytes), &note);
    }
    // The budget, and beside it what the KV cache gets when that is less: the cap, or the
    // rounding the plan keeps.
    let granted = match p.capped_by_free_bytes {
        Some(cap) => {
            let by = p.physical_check.map_or("free memory", |c| c.short());
            format!("capped by {by} at {} (see the warning)", fmt_bytes(cap))
        }
        None if p.kv_cache_bytes < p.kv_budget_bytes => format!(
            "all for the KV cache but {} kept for allocator rounding",
            fmt_bytes(p.kv_budget_bytes - p.kv_cache_bytes)
        ),
        None => "all of it for the KV cache".to_string(),
    };
    row("= KV cache budget", fmt_bytes(p.kv_budget_bytes), &granted);
    let z = &p.kv;
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
        z.usable_blocks.to_string(),
        "usable (plus one null block)",
    );
    row("KV cache tokens", z.tokens.to_string(), "");
    row(
        "max concurrency",
        format!("{:.2}x", (z.max_concurrency * 100.0).floor() / 100.0),
        &format!("at max model length {}", p.limits.max_model_len),
    );
    row(
        "longest max model length",
        z.max_model_len_fit
            .map_or_else(|| "none".into(), |n| n.to_string()),
        "for one request",
    );
    o.push_str(&format!(
        "\ngraph strategy: {} ({})\n",
        p.graph.strategy, p.graph.why
    ));
    if let Some(e) = p
        .graph
        .estimate
        .as_ref()
        .filter(|e| !e.explanation.is_empty())
    {
        o.push_str(&format!("  {}\n", e.explanation));
    }
    let s = &p.suggestions;
    o.push_str("\nsuggestions:\n");
    if let Some(u) = s.utilization_without_graph_reserve {
        o.push_str(&format!(
            "  {} {u:.4}   same KV budget in an engine that does not reserve graph memory{}\n",
            names(Param::Utilization),
            capture_beyond(p, u)
        ));
    }
    if let Some(f) = s.engine_static_fraction {
        o.push_str(&format!(
            "  static fraction {f:.3}   (SGLang's --mem-fraction-static) lets the engine's own pool rule, its free memory after the weights less its slack, reach this KV cache\n"
        ));
    }
    let kv = names(Param::KvCacheBytes);
    o.push_str(&format!(
        "  {kv} {} ({})   fills the requested memory\n",
        s.kv_bytes_fill_requested,
        fmt_bytes(s.kv_bytes_fill_requested)
    ));
    o.push_str(&format!(
        "  {kv} {} ({})   fills the whole device (no headroom)\n",
        s.kv_bytes_fill_device,
        fmt_bytes(s.kv_bytes_fill_device)
    ));
    o.push_str(&format!("\n{}\n", bar(p, 64)));
    let legend: Vec<String> = segments(p)
        .iter()
        .filter(|s| s.glyph != ' ')
        .map(|s| format!("{}={}", s.glyph, s.label))
        .collect();
    o.push_str(&format!(" {}\n", legend.join(" ")));
    for n in &p.notes {
        o.push_str(&format!("note: {n}\n"));
    }
    for w in &p.warnings {
        o.push_str(&format!("warning: {w}\n"));
    }
    o
}

/// A stacked bar of the device memory, one rectangle per consumer, the KV cache and what is
/// left, with a legend.
pub fn svg(p: &Plan) -> String {
    let (w, h, x0, bar_y) = (900.0, 48.0, 10.0, 58.0);
    let total = p.total_bytes.max(1) as f64;
    let mut x = x0;
    let title = match (&p.model, &p.device) {
        (Some(m), Some(d)) => format!("{m} on {d}"),
        (Some(m), None) => m.clone(),
        (None, Some(d)) => d.clone(),
        (None, None) => "plan".into(),
    };
    // A background (the picture reads the same on a dark page), the title, the headline
    // figures, the bar, a marker where the requested memory ends, and the legend.
    let fit =
        p.kv.max_model_len_fit
            .map_or_else(|| "none".to_string(), |n| n.to_string());
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"920\" height=\"200\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect x=\"0\" y=\"0\" width=\"920\" height=\"200\" fill=\"#ffffff\"/>\n\
         <text x=\"10\" y=\"18\" font-weight=\"bold\">{}: {:.2} GiB total</text>\n\
         <text x=\"10\" y=\"38\">KV cache {} tokens; max concurrency {:.2}x at {} tokens; longest max-model-len {}</text>\n",
        esc(&title),
        gib(p.total_bytes),
        p.kv.tokens,
        (p.kv.max_concurrency * 100.0).floor() / 100.0,
        p.limits.max_model_len,
        fit
    );
    let mut ly = 150.0;
    let mut lx = x0;
    for s in segments(p) {
        let sw = s.bytes as f64 / total * w;
        out.push_str(&format!("<rect x=\"{x:.1}\" y=\"{bar_y}\" width=\"{sw:.1}\" height=\"{h}\" fill=\"{}\" stroke=\"#333\" stroke-width=\"0.5\"><title>{}: {}</title></rect>\n", s.color, s.label, fmt_bytes(s.bytes)));
        x += sw;
        out.push_str(&format!("<rect x=\"{lx:.0}\" y=\"{:.0}\" width=\"10\" height=\"10\" fill=\"{}\" stroke=\"#333\" stroke-width=\"0.5\"/><text x=\"{:.0}\" y=\"{ly:.0}\">{} {}</text>\n", ly - 9.0, s.color, lx + 14.0, s.label, fmt_bytes(s.bytes)));
        lx += 220.0;
        if lx > 800.0 {
            lx = x0;
            ly += 18.0;
        }
    }
    let mx = x0 + p.requested_bytes.min(p.total_bytes) as f64 / total * w;
    let anchor = if mx > 700.0 { "end" } else { "start" };
    out.push_str(&format!(
        "<line x1=\"{mx:.1}\" y1=\"{:.0}\" x2=\"{mx:.1}\" y2=\"{:.0}\" stroke=\"#000\" stroke-width=\"2\" stroke-dasharray=\"4 3\"/>\n\
         <text x=\"{mx:.1}\" y=\"{:.0}\" text-anchor=\"{anchor}\">requested {} ends here</text>\n",
        bar_y - 6.0,
        bar_y + h + 6.0,
        bar_y + h + 20.0,
        fmt_bytes(p.requested_bytes)
    ));
    out.push_str("</svg>\n");
    out
}

/// XML text: markup characters escaped, characters XML 1.0 forbids (controls) dropped.
fn esc(s: &str) -> String {
    s.chars()
        .filter(|c| !c.is_control())
        .collect::<String>()
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
