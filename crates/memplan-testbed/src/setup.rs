//! Resolving a [`Scenario`] into a [`Setup`]: every byte quantity parsed, the KV spec built, the
//! graph sizes listed largest first. Errors name the scenario and the field.

use memplan_core::kv::{AttentionKind, KvAllocation, KvDtype, KvLimits, KvSpec, LayerGroup};
use memplan_core::{Error, Param, Result};
use serde::Serialize;

use crate::scenario::{KvAttention, Scenario, SHIPPED};
use memplan_planner::budget::Request;

/// The scenario with every quantity resolved.
#[derive(Debug, Clone, Serialize)]
pub struct Setup {
    /// The scenario as written.
    pub scenario: Scenario,
    /// The request.
    pub request: Request,
    /// KV spec.
    pub kv: KvSpec,
    /// KV limits.
    pub limits: KvLimits,
    /// Other processes at start.
    pub other_processes: u64,
    /// `(step, bytes)` neighbour changes.
    pub neighbour: Vec<(String, u64)>,
    /// Weights, tensors, activation peak, workspace.
    pub weights: u64,
    /// Weight tensors.
    pub weight_tensors: u32,
    /// Activation peak.
    pub activation_peak: u64,
    /// Workspace.
    pub workspace: u64,
    /// Graph sizes, largest first.
    pub sizes: Vec<u32>,
    /// Kernel nodes per graph.
    pub kernel_nodes: u32,
    /// Intermediate per token.
    pub intermediate_per_token: u64,
    /// Warm-up per token.
    pub warmup_per_token: u64,
    /// Alloc-node bytes per graph.
    pub alloc_node_bytes: u64,
    /// Seed of the simulated device's physics (`memplan simulate --seed N`).
    pub seed: u64,
    /// Pin the physics to one end of every range (`low`, `high`), or draw (`None`).
    pub physics: Option<String>,
    /// Whether the engine hands memplan its kernel-node and allocation-node figures.
    pub hints: bool,
    /// Whether the engine offers the session its KV allocation hook
    /// (`Engine::allocate_kv_cache`): with it the session measures the engine's allocation and
    /// shrinks it to the plan; without it the engine allocates the plan's blocks itself after
    /// the session, as an engine that does not implement the hook does.
    pub kv_hook: bool,
    /// Whether the engine's allocator offers the session tensors
    /// (`AllocatorView::allocate_tensor`, a PyTorch engine's `torch.empty`): without the hook,
    /// the session then measures the plan's own layout through it; with neither, the plan's
    /// rounding rules are all that stands between the engine and an out-of-memory.
    pub allocator_tensors: bool,
    /// How the engine allocates its KV cache ([`crate::kv::EngineKv::of_setup`]): one tensor
    /// per layer as vLLM 0.19.0 does (the default), or one backing allocation as vLLM 0.29.0
    /// does (`vllm/v1/worker/utils.py`, `allocate_kv_cache`), the rest of its arithmetic
    /// still 0.19.0's.
    pub kv_allocation: KvAllocation,
    /// The allocation the session's sizing rules name (`SizingRules::kv_allocation`): the
    /// engine's, unless a test names another.
    pub planned_kv_allocation: KvAllocation,
    /// What the engine does at start-up where its KV cache cannot hold one request of
    /// `max_model_len` ([`crate::scenario::StartRule`]); the session is told the same
    /// (`SizingRules::long_requests`).
    pub start_rule: crate::scenario::StartRule,
}

/// The steps a neighbour change may come before (`neighbour.before`): it lands in the quiet
/// window that opens the step. `plan`: after the graph phase (its teardown included), before
/// the plan: at once, before anything the plan step does (its warm-ups for the allocator's
/// granule, where nothing measures the KV cache's allocation, or its allocation probe), since
/// that step opens with no synchronize of its own.
pub const NEIGHBOUR_STEPS: [&str; 4] = ["load_weights", "profile_run", "graph_phase", "plan"];

/// The KV cache dtypes a scenario's `kv.dtype` takes, as an error says them (the names
/// `KvDtype`'s parser accepts, its aliases left out).
const KV_DTYPES: &str =
    "give the cache's dtype: bf16, fp16, fp32, fp8 (e4m3), fp8_e4m3, fp8_e5m2, int8 or fp8_ds_mla (MLA only)";

/// Largest `kv.max_model_len` of a scenario (2^30 tokens).
pub const MAX_MODEL_LEN: u64 = 1 << 30;
/// Largest `kv.max_num_batched_tokens` (2^30).
pub const MAX_BATCHED_TOKENS: u64 = 1 << 30;
/// Most layer groups (`[[kv.groups]]`): models have two or three kinds of layers.
pub const MAX_KV_GROUPS: usize = 64;
/// Most layers of a scenario's model in all: each is one simulated allocation of the engine's
/// KV cache, as each weight tensor is (see [`MAX_WEIGHT_TENSORS`]). The deepest published
/// models have a few hundred (Llama-3.1-405B's config.json: 126 layers; DeepSeek-V3: 61); a run
/// of this many takes about a second, where the simulated allocator's best-fit search over
/// every segment made 65,536 take minutes.
pub const MAX_KV_LAYERS: u32 = 1 << 13;
/// Largest `kv.block_size`.
pub const MAX_BLOCK_SIZE: u64 = 4096;
/// Largest `graphs.max_capture_size` (the default list up to it has 515 sizes).
pub const MAX_CAPTURE_SIZE: u32 = 4096;
/// Most graph sizes after merging duplicates (each is captured once per strategy).
pub const MAX_GRAPH_SIZES: usize = 1024;
/// Most weight tensors: each is one simulated allocation, and the simulated allocator's cost
/// grows with the square of their number (one run of the automatic choice in a release build:
/// 1,024 take 0.07 s, 16,384 about 1 s, 65,536 about 15 s). A mixture-of-experts checkpoint
/// holds tens of thousands (three per expert per layer), so 2^16.
pub const MAX_WEIGHT_TENSORS: u32 = 1 << 16;

/// The engine's default capture sizes up to `max`: 1, 2, 4, then every multiple of 8.
pub fn default_sizes(max: u32) -> Vec<u32> {
    let mut v: Vec<u32> = [1, 2, 4].into_iter().filter(|s| *s <= max).collect();
    v.extend((8..=max).step_by(8));
    v
}

impl Setup {
    /// The device selector with the seed (and pinned physics) appended.
    pub fn selector(&self) -> String {
        let mut s = format!("{},seed={}", self.scenario.device, self.seed);
        if let Some(p) = &self.physics {
            s.push_str(&format!(",physics={p}"));
        }
        s
    }
}

impl Scenario {
    /// Parse TOML; errors name the file, the scenario (where its `name` reads as a string),
    /// the line and column, and the key path of the value at fault (`kv.layers`), on one line
    /// (the toml crate's own message quotes the line with a caret under it, over several
    /// lines, and names no key).
    pub fn from_toml(origin: &str, text: &str) -> Result<Self> {
        serde_path_to_error::deserialize(toml::Deserializer::new(text)).map_err(|e| {
            // The `scenario NAME: ` every other error of the file starts with, where the text
            // is TOML and its name a string (an error in the name itself leaves it out).
            let scenario = toml::from_str::<toml::Table>(text)
                .ok()
                .and_then(|t| t.get("name")?.as_str().map(str::to_owned))
                .map(|n| format!("scenario {n}: "))
                .unwrap_or_default();
            let path = e.path().to_string();
            let key = if path.is_empty() || path == "." {
                String::new()
            } else {
                format!("{path}: ")
            };
            let inner = e.into_inner();
            let at = inner
                .span()
                .and_then(|s| text.get(..s.start))
                .map(|before| {
                    let line = before.matches('\n').count() + 1;
                    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                    format!(" at line {line}, column {column}")
                })
                .unwrap_or_default();
            // serde names the Rust type a count is read into; say what it takes.
            let message = inner
                .message()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .replace(
                    "expected u32",
                    "expected a whole number from 0 to 4294967295",
                )
                .replace(
                    "expected u64",
                    "expected a whole number from 0 to 18446744073709551615",
                );
            Error::file(
                origin,
                format!("{scenario}TOML parse error{at}: {key}{message}"),
            )
        })
    }

    /// A shipped scenario by name, or a file path.
    pub fn load(name_or_path: &str) -> Result<Self> {
        if let Some((_, text)) = SHIPPED.iter().find(|(n, _)| *n == name_or_path) {
            return Self::from_toml(name_or_path, text);
        }
        let path = std::path::Path::new(name_or_path);
        let text = memplan_core::input::read_text(path, memplan_core::input::SCENARIO).map_err(|e| {
            // A link that leads nowhere is a file name the user gave: its own error names it.
            let no_entry = std::fs::symlink_metadata(path).is_err();
            if no_entry && matches!(&e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound) {
                let names: Vec<_> = SHIPPED.iter().map(|(n, _)| *n).collect();
                Error::param(
                    Param::Scenario,
                    format!(
                        "{name_or_path:?} is neither a shipped scenario ({}) nor a file",
                        names.join(", ")
                    ),
                )
            } else {
                e
            }
        })?;
        Self::from_toml(name_or_path, &text)
    }

    /// Resolve every quantity; errors name the field.
    pub fn resolve(self) -> Result<Setup> {
        // Every error and report names the scenario: a blank name would name nothing
        // (`scenario : kv.dtype: ...`).
        if self.name.trim().is_empty() {
            return Err(Error::invalid(
                "name",
                format!(
                    "{:?} is blank: give the scenario a name (its errors and reports say it)",
                    self.name
                ),
            ));
        }
        let f = |field: &str| format!("scenario {}: {field}", self.name);
        let request = match (
            &self.request.gpu_memory_utilization,
            &self.request.memory_budget,
        ) {
            (Some(u), None) if u.is_finite() && *u > 0.0 && *u <= 1.0 => Request::Utilization(*u),
            (Some(u), None) => {
                return Err(Error::invalid(
                    f("request.gpu_memory_utilization"),
                    format!("{u} is outside (0, 1]"),
                ))
            }
            (None, Some(b)) => match b.bytes(&f("request.memory_budget"))? {
                0 => {
                    return Err(Error::invalid(
                        f("request.memory_budget"),
                        "must be more than 0 bytes",
                    ))
                }
                n => Request::Bytes(n),
            },
            _ => {
                return Err(Error::invalid(
                    f("request"),
                    "give exactly one of gpu_memory_utilization and memory_budget",
                ))
            }
        };
        let k = &self.kv;
        // The cache's own dtype, as docs/scenarios.md lists it. `auto` (the engines' default:
        // the model's dtype) is not one: a scenario gives its weights in bytes, not a model
        // dtype to take the cache's from.
        let dtype: KvDtype = match k.dtype.trim().to_ascii_lowercase().as_str() {
            "auto" => Err(format!(
                "{:?} takes the model's dtype, and a scenario has none; {KV_DTYPES}",
                k.dtype
            )),
            _ => k
                .dtype
                .parse()
                .map_err(|_| format!("unknown dtype {:?}; {KV_DTYPES}", k.dtype)),
        }
        .map_err(|why| Error::invalid(f("kv.dtype"), why))?;
        let written = k
            .layer_groups()
            .map_err(|(key, why)| Error::invalid(f(key), why))?;
        if written.len() > MAX_KV_GROUPS {
            return Err(Error::invalid(
                f("kv.groups"),
                format!(
                    "{} layer groups; at most {MAX_KV_GROUPS} (write layers of one shape and attention as one group)",
                    written.len()
                ),
            ));
        }
        let many = !k.groups.is_empty();
        // The field of group `i`: `kv.groups[i].x` or, in the one-group form, `kv.x`.
        let key = |i: usize, x: &str| {
            if many {
                f(&format!("kv.groups[{i}].{x}"))
            } else {
                f(&format!("kv.{x}"))
            }
        };
        let mut groups = Vec::with_capacity(written.len());
        let mut layers = 0u32;
        for (i, g) in written.iter().enumerate() {
            if g.layers == 0 {
                return Err(Error::invalid(key(i, "layers"), "must be at least 1"));
            }
            layers = match layers.checked_add(g.layers) {
                Some(n) if n <= MAX_KV_LAYERS => n,
                _ => {
                    return Err(Error::invalid(
                        key(i, "layers"),
                        format!("more than {MAX_KV_LAYERS} layers in all (each is a tensor the engine allocates)"),
                    ))
                }
            };
            for (x, v) in [("kv_heads", g.kv_heads), ("head_dim", g.head_dim)] {
                if v == 0 {
                    return Err(Error::invalid(key(i, x), "must be at least 1"));
                }
            }
            if dtype == KvDtype::Fp8DsMla && g.attention != KvAttention::Mla {
                return Err(Error::invalid(
                    f("kv.dtype"),
                    "fp8_ds_mla is a layout of MLA latents: give every layer group attention = \"mla\"",
                ));
            }
            let attention = match (g.attention, g.window) {
                (KvAttention::Sliding, None) => {
                    return Err(Error::invalid(
                        key(i, "window"),
                        "missing: a sliding group needs its window in tokens (config.json's sliding_window)",
                    ))
                }
                (KvAttention::Sliding, Some(0)) => {
                    return Err(Error::invalid(key(i, "window"), "must be at least 1 token"))
                }
                (KvAttention::Sliding, Some(w)) if w > MAX_MODEL_LEN => {
                    return Err(Error::invalid(
                        key(i, "window"),
                        format!("{w} is outside 1..={MAX_MODEL_LEN}"),
                    ))
                }
                (KvAttention::Sliding, Some(w)) => AttentionKind::SlidingWindow { window: w },
                (other, Some(_)) => {
                    return Err(Error::invalid(
                        key(i, "window"),
                        format!(
                            "a window with attention = \"{}\": only sliding layers have one",
                            if other == KvAttention::Mla { "mla" } else { "full" }
                        ),
                    ))
                }
                (KvAttention::Full, None) => AttentionKind::Full,
                (KvAttention::Mla, None) => {
                    // vLLM keeps MLA's latent as one KV head (`MLAAttentionSpec`, num_kv_heads
                    // 1 per rank) and lays `fp8_ds_mla` out for DeepSeek's 512 + 64 latent
                    // only.
                    if g.kv_heads != 1 {
                        return Err(Error::invalid(
                            key(i, "kv_heads"),
                            format!(
                                "{} with attention = \"mla\": an MLA latent is one KV head",
                                g.kv_heads
                            ),
                        ));
                    }
                    if dtype == KvDtype::Fp8DsMla && g.head_dim != 576 {
                        return Err(Error::invalid(
                            key(i, "head_dim"),
                            format!(
                                "{} with fp8_ds_mla: that layout holds a 512 + 64 latent (576)",
                                g.head_dim
                            ),
                        ));
                    }
                    if dtype == KvDtype::Int8 {
                        return Err(Error::invalid(
                            f("kv.dtype"),
                            "int8 with attention = \"mla\": the test-bed's engine has no per-token scales for an MLA latent; use bf16, fp16, fp32, fp8 or fp8_ds_mla",
                        ));
                    }
                    AttentionKind::Mla
                }
            };
            let group = LayerGroup::new(attention, g.layers, g.kv_heads, g.head_dim);
            groups.push(if attention == AttentionKind::Mla {
                group.with_head_dim_v(0)
            } else {
                group
            });
        }
        // The ranges first: a block size of 0 is `kv.block_size`'s error, as one of 4097 is,
        // not the KV spec's own check's (`kv: KV block size: ...`).
        for (key, v, max) in [
            ("kv.max_model_len", k.max_model_len, MAX_MODEL_LEN),
            (
                "kv.max_num_batched_tokens",
                k.max_num_batched_tokens,
                MAX_BATCHED_TOKENS,
            ),
            ("kv.block_size", u64::from(k.block_size), MAX_BLOCK_SIZE),
        ] {
            if v == 0 || v > max {
                return Err(Error::invalid(f(key), format!("{v} is outside 1..={max}")));
            }
        }
        let kv = KvSpec::new(groups, dtype, k.block_size);
        kv.validate()
            .map_err(|e| Error::invalid(f("kv"), e.to_string()))?;
        // The engine's own layout must exist: pages that overflow, or pages of a hybrid model
        // that vLLM 0.19.0 cannot bring to one size (`unify_kv_cache_spec_page_size` raises
        // where the largest page is not a multiple of another), leave it none.
        if crate::kv::EngineKv::of(k).is_none() {
            // Say which group: the first whose page overflows, else one whose page does not
            // divide the largest (`kv.groups[i]`, or `kv` in the one-group form).
            let group = |i: usize| {
                if many {
                    f(&format!("kv.groups[{i}]"))
                } else {
                    f("kv")
                }
            };
            let dtype = k.dtype.to_ascii_lowercase();
            let pages: Vec<Option<u64>> = written
                .iter()
                .map(|g| {
                    crate::kv::token_bytes(g, &dtype)?
                        .checked_mul(u64::from(k.block_size))
                        .filter(|p| *p > 0)
                })
                .collect();
            if let Some(i) = pages.iter().position(Option::is_none) {
                return Err(Error::invalid(
                    group(i),
                    "the engine has no KV layout for these layers: a page (block_size x kv_heads x head_dim x the dtype's bytes, K and V) overflows 64 bits",
                ));
            }
            let pages: Vec<u64> = pages.into_iter().flatten().collect();
            let largest = pages.iter().copied().max().unwrap_or(0);
            let at = pages.iter().position(|p| *p == largest).unwrap_or(0);
            if let Some(i) = pages.iter().position(|p| largest % p != 0) {
                return Err(Error::invalid(
                    group(i),
                    format!(
                        "its page of {} bytes does not divide kv.groups[{at}]'s of {largest} bytes (the largest), and vLLM 0.19.0 cannot unify pages that do not (unify_kv_cache_spec_page_size): give the groups' kv_heads x head_dim multiples of each other",
                        pages[i]
                    ),
                ));
            }
            return Err(Error::invalid(
                f(if many { "kv.groups" } else { "kv" }),
                "the engine has no KV layout for these layers (vLLM 0.19.0's kv_cache_utils.py)",
            ));
        }
        let limits = KvLimits::new(k.max_model_len, k.max_num_batched_tokens)
            .with_max_len_limit(k.max_model_len.max(1).saturating_mul(4));
        let g = &self.graphs;
        let mut sizes = match (&g.sizes, g.max_capture_size) {
            (Some(s), None) => s.clone(),
            (None, Some(m)) if (1..=MAX_CAPTURE_SIZE).contains(&m) => default_sizes(m),
            (None, Some(m)) => {
                return Err(Error::invalid(
                    f("graphs.max_capture_size"),
                    format!("{m} is outside 1..={MAX_CAPTURE_SIZE}"),
                ))
            }
            (None, None) => Vec::new(),
            (Some(_), Some(_)) => {
                return Err(Error::invalid(
                    f("graphs"),
                    "give sizes or max_capture_size, not both",
                ))
            }
        };
        if sizes.iter().any(|s| *s == 0 || *s > 1 << 20) {
            return Err(Error::invalid(
                f("graphs.sizes"),
                "graph sizes must lie in 1..=1048576",
            ));
        }
        if g.kernel_nodes > 1 << 20 {
            return Err(Error::invalid(
                f("graphs.kernel_nodes"),
                "at most 1048576 kernel nodes per graph",
            ));
        }
        // Duplicates are merged, as engines merge them (vLLM dedups its capture sizes).
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        sizes.dedup();
        if sizes.len() > MAX_GRAPH_SIZES {
            return Err(Error::invalid(
                f("graphs.sizes"),
                format!("{} distinct sizes; at most {MAX_GRAPH_SIZES}", sizes.len()),
            ));
        }
        let neighbour = self
            .neighbour
            .iter()
            .enumerate()
            .map(|(i, n)| {
                if !NEIGHBOUR_STEPS.contains(&n.before.as_str()) {
                    return Err(Error::invalid(
                        f(&format!("neighbour[{i}].before")),
                        format!(
                            "{:?}: expected load_weights, profile_run, graph_phase or plan",
                            n.before
                        ),
                    ));
                }
                // Each is what other processes hold from its step on: two at one step would
                // leave one silently unused (the changes apply in step order, not file order).
                if let Some(j) = self.neighbour[..i].iter().position(|m| m.before == n.before) {
                    return Err(Error::invalid(
                        f(&format!("neighbour[{i}].before")),
                        format!(
                            "{:?} is neighbour[{j}]'s step too: give one change per step (what other processes hold from then on)",
                            n.before
                        ),
                    ));
                }
                Ok((
                    n.before.clone(),
                    n.bytes.bytes(&f(&format!("neighbour[{i}].bytes")))?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let weight_tensors = self.model.weight_tensors;
        if weight_tensors == 0 || weight_tensors > MAX_WEIGHT_TENSORS {
            return Err(Error::invalid(
                f("model.weight_tensors"),
                format!("{weight_tensors} is outside 1..={MAX_WEIGHT_TENSORS}"),
            ));
        }
        // A selector that does not open is the file's error, said when it is loaded (an unknown
        // profile or modifier, a quirk value that does not parse), not a harness error later.
        memplan_backend_sim::SimGpu::check_selector(&self.device)
            .map_err(|e| Error::invalid(f("device"), e.to_string()))?;
        // The device's own `other=` and the scenario's `other_processes` say the same thing:
        // one silently overriding the other would simulate a world nobody wrote.
        let other = self.other_processes.bytes(&f("other_processes"))?;
        if other > 0
            && self
                .device
                .split(',')
                .skip(1)
                .any(|m| m.trim().to_ascii_lowercase().starts_with("other="))
        {
            return Err(Error::invalid(
                f("other_processes"),
                "the device selector has other= too; give the memory of other processes once",
            ));
        }
        // Other processes that hold the whole device leave no room for any process to start:
        // a world no engine meets, said where it was written, not as an out-of-memory of
        // whatever ran first. A neighbour's bytes are what other processes hold from its step
        // on: the same rule.
        let (profile, quirks, mods) = memplan_backend_sim::SimGpu::selector_profile(&self.device)
            .map_err(|e| Error::invalid(f("device"), e.to_string()))?;
        // A size quirk at or above the device's memory describes no device a run meets: memory
        // kept per capture, per free or per mapping released that no capture, free or release
        // could leave, a free reading in steps no allocation crosses. Said when the file is
        // loaded, not as an out-of-memory of calibration on every seed. (`total-under` and
        // `total-over` are a backend's misreport, any size: a start-up on a device that reports
        // no memory did not start, said as such.)
        for (key, bytes) in [
            ("hidden-bytes-per-capture", quirks.hidden_bytes_per_capture),
            ("free-step", quirks.free_step),
            ("leak-per-free", quirks.leak_per_free),
            ("leak-per-vm-release", quirks.leak_per_vm_release),
        ] {
            if bytes >= profile.total_bytes {
                return Err(Error::invalid(
                    f("device"),
                    format!(
                        "{key}={}: not below the device's memory ({} on {}); give less than the device has",
                        memplan_core::bytes::fmt_bytes(bytes),
                        memplan_core::bytes::fmt_bytes(profile.total_bytes),
                        profile.name
                    ),
                ));
            }
        }
        // A world that is not there: every run would fail to join it.
        if let Some(dir) = mods.world.as_deref().filter(|d| !d.is_dir()) {
            return Err(Error::invalid(
                f("device"),
                format!(
                    "world={}: not a directory (`world=DIR` names the directory of a simulated GPU another process shares)",
                    dir.display()
                ),
            ));
        }
        // The seed of a run's physics is the run's (`memplan simulate --seed N`, a battery's or
        // a sweep's seed range), appended to the selector: one in the file too would be given
        // twice, and every run of the file would fail.
        if let Some(seed) = mods.seed {
            return Err(Error::invalid(
                f("device"),
                format!(
                    "seed={seed}: a scenario's seed is the run's (`memplan simulate --seed N`, the battery's seeds), not the file's; remove it, and pin the physics with physics= or regime= where that is what is meant"
                ),
            ));
        }
        // Graphics allocations (`graphics=`) are memory the device holds for the display
        // whatever the vendor: the same rule.
        let others = "other processes";
        let held = [
            (f("other_processes"), others, Some(other)),
            (f("device"), others, mods.other_processes),
            (f("device"), "graphics allocations", mods.graphics),
        ]
        .into_iter()
        .chain(
            neighbour
                .iter()
                .enumerate()
                .map(|(i, (_, b))| (f(&format!("neighbour[{i}].bytes")), others, Some(*b))),
        );
        for (field, who, bytes) in held {
            if let Some(b) = bytes.filter(|b| *b >= profile.total_bytes) {
                return Err(Error::invalid(
                    field,
                    format!(
                        "{who} holding {} leave nothing of the device's {} ({}) for this one",
                        memplan_core::bytes::fmt_bytes(b),
                        memplan_core::bytes::fmt_bytes(profile.total_bytes),
                        profile.name
                    ),
                ));
            }
        }
        let setup = Setup {
            request,
            kv,
            limits,
            other_processes: other,
            neighbour,
            weights: self.model.weights.bytes(&f("model.weights"))?,
            weight_tensors,
            activation_peak: self
                .model
                .activation_peak
                .bytes(&f("model.activation_peak"))?,
            workspace: self.model.workspace.bytes(&f("model.workspace"))?,
            sizes,
            kernel_nodes: g.kernel_nodes,
            intermediate_per_token: g
                .intermediate_per_token
                .bytes(&f("graphs.intermediate_per_token"))?,
            warmup_per_token: g.warmup_per_token.bytes(&f("graphs.warmup_per_token"))?,
            alloc_node_bytes: g.alloc_node_bytes.bytes(&f("graphs.alloc_node_bytes"))?,
            seed: memplan_backend_sim::DEFAULT_SEED,
            physics: None,
            hints: g.engine_hints,
            kv_hook: self.engine.kv_hook,
            allocator_tensors: self.engine.allocator_tensors,
            kv_allocation: self.engine.kv_allocation,
            planned_kv_allocation: self.engine.kv_allocation,
            start_rule: self.engine.start_rule,
            scenario: self,
        };
        // A layout the engine could lay out one way but not the way `[engine]` allocates it
        // (K and V apart beside MLA layers, pooled apart by SGLang and not modelled here).
        if crate::kv::EngineKv::of(&setup.scenario.kv).is_some()
            && crate::kv::EngineKv::of_setup(&setup).is_none()
        {
            return Err(Error::invalid(
                format!("scenario {}: engine.kv_allocation", setup.scenario.name),
                format!(
                    "the engine cannot allocate this cache {}: K and V apart beside MLA layers is not modelled",
                    serde_json::to_string(&setup.kv_allocation).unwrap_or_default()
                ),
            ));
        }
        Ok(setup)
    }
}
