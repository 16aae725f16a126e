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
    /// `(step, bytes)` neighbour changes before a step ([`NEIGHBOUR_STEPS`], or after the plan
    /// [`AFTER_PLAN_STEPS`]).
    pub neighbour: Vec<(String, u64)>,
    /// `(step, after_capture, bytes)` neighbour changes between two captures of a step
    /// ([`CAPTURE_STEPS`]), in step and capture order.
    pub neighbour_captures: Vec<(String, u32, u64)>,
    /// The engine's caching-allocator options, pinned (`[allocator]`; `None`: drawn per seed),
    /// with the garbage-collection threshold it states beside them.
    pub allocator: Option<(memplan_backend_sim::EngineOptions, Option<f64>)>,
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

/// The steps after the plan a neighbour change may come before (`neighbour.before`): it lands
/// at once, the plan already made. `kv_cache`: after the plan, before the KV cache is allocated
/// (by the session through the engine's hook, or by the engine); `engine_capture`: after the KV
/// cache, before the engine captures its graphs (whether or not it captures any); `serve`:
/// before the serving burst. No plan made at start-up can see them: the oracle is the plan's
/// world, and an out-of-memory that only their memory caused is theirs
/// ([`crate::report::Outcome::oom_others_after_plan`]).
pub const AFTER_PLAN_STEPS: [&str; 3] = ["kv_cache", "engine_capture", "serve"];

/// The steps whose graph captures a neighbour change may land between (`neighbour.during`,
/// with `after_capture`): `graph_phase`, the session's graph phase before the plan (the plan is
/// judged as any other: the session sees the captures happen), and `engine_capture`, the
/// engine's own capture after the plan (as [`AFTER_PLAN_STEPS`]).
pub const CAPTURE_STEPS: [&str; 2] = ["graph_phase", "engine_capture"];

/// Largest `max_split_size_mb` or `large_segment_size_mb` of a scenario's `[allocator]`, in
/// MiB (1 TiB: more than any simulated device holds).
pub const MAX_ALLOCATOR_MB: u64 = 1 << 20;
/// Largest `roundup_power2_divisions` count.
pub const MAX_DIVISIONS: u64 = 1 << 16;

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
    /// The same setup with every change of other processes after the plan left out (they hold
    /// what they held at the plan from then on), or `None` where it has none.
    pub fn calm_after_plan(&self) -> Option<Setup> {
        let after = |step: &str| AFTER_PLAN_STEPS.contains(&step);
        let late = self.neighbour.iter().any(|(s, _)| after(s))
            || self.neighbour_captures.iter().any(|(s, _, _)| after(s));
        late.then(|| {
            let mut calm = self.clone();
            calm.neighbour.retain(|(s, _)| !after(s));
            calm.neighbour_captures.retain(|(s, _, _)| !after(s));
            calm
        })
    }

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
                    "data did not match any variant of untagged enum DivisionsToml",
                    "expected a division count (0 or a power of two) or a table of counts by interval ({ \"256\" = 4, \">\" = 1 })",
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
        let (neighbour, neighbour_captures) = self.resolve_neighbours(&sizes)?;
        let allocator = self
            .allocator
            .as_ref()
            .map(|a| resolve_allocator(a, &f))
            .transpose()?;
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
        .chain(self.neighbour.iter().enumerate().map(|(i, n)| {
            (
                f(&format!("neighbour[{i}].bytes")),
                others,
                n.bytes.bytes("bytes").ok(),
            )
        }));
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
            neighbour_captures,
            allocator,
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

impl Scenario {
    /// The neighbour changes, checked: before a step (`(step, bytes)`, one a step) and between
    /// captures (`(step, after_capture, bytes)`, one a capture, sorted), each naming its key
    /// where it is wrong.
    #[allow(clippy::type_complexity)]
    fn resolve_neighbours(
        &self,
        sizes: &[u32],
    ) -> Result<(Vec<(String, u64)>, Vec<(String, u32, u64)>)> {
        let f = |field: &str| format!("scenario {}: {field}", self.name);
        let mut before: Vec<(String, u64)> = Vec::new();
        let mut between: Vec<(String, u32, u64)> = Vec::new();
        for (i, n) in self.neighbour.iter().enumerate() {
            let key = |x: &str| f(&format!("neighbour[{i}].{x}"));
            let bytes = n.bytes.bytes(&key("bytes"))?;
            match (&n.before, &n.during, n.after_capture) {
                (Some(_), Some(_), _) => {
                    return Err(Error::invalid(
                        key("during"),
                        "give before (a step) or during (with after_capture), not both",
                    ))
                }
                (Some(_), None, Some(_)) => {
                    return Err(Error::invalid(
                        key("after_capture"),
                        "only with during (the step whose captures the change lands between)",
                    ))
                }
                (Some(step), None, None) => {
                    if !NEIGHBOUR_STEPS.contains(&step.as_str())
                        && !AFTER_PLAN_STEPS.contains(&step.as_str())
                    {
                        return Err(Error::invalid(
                            key("before"),
                            format!(
                                "{step:?}: expected load_weights, profile_run, graph_phase or plan (before the plan), or kv_cache, engine_capture or serve (after it)"
                            ),
                        ));
                    }
                    // Each is what other processes hold from its step on: two at one step would
                    // leave one silently unused (the changes apply in step order, not file
                    // order).
                    if let Some(j) = self.neighbour[..i]
                        .iter()
                        .position(|m| m.before.as_deref() == Some(step))
                    {
                        return Err(Error::invalid(
                            key("before"),
                            format!(
                                "{step:?} is neighbour[{j}]'s step too: give one change per step (what other processes hold from then on)"
                            ),
                        ));
                    }
                    before.push((step.clone(), bytes));
                }
                (None, Some(step), at) => {
                    if !CAPTURE_STEPS.contains(&step.as_str()) {
                        return Err(Error::invalid(
                            key("during"),
                            format!(
                                "{step:?}: expected graph_phase (the session's captures, before the plan) or engine_capture (the engine's, after it)"
                            ),
                        ));
                    }
                    if sizes.is_empty() {
                        return Err(Error::invalid(
                            key("during"),
                            "the engine captures no graph (graphs gives no sizes): there is no capture to land between; use before",
                        ));
                    }
                    let most = sizes.len();
                    let at = match at {
                        None => {
                            return Err(Error::invalid(
                                key("after_capture"),
                                format!("missing: give the captures of {step} the change lands after (1..={most})"),
                            ))
                        }
                        Some(k) if k == 0 || k as usize > most => {
                            return Err(Error::invalid(
                                key("after_capture"),
                                format!(
                                    "{k} is outside 1..={most} (the engine captures {most} graph sizes)"
                                ),
                            ))
                        }
                        Some(k) => k,
                    };
                    if let Some(j) = self.neighbour[..i].iter().position(|m| {
                        m.during.as_deref() == Some(step) && m.after_capture == Some(at)
                    }) {
                        return Err(Error::invalid(
                            key("after_capture"),
                            format!(
                                "capture {at} of {step} is neighbour[{j}]'s too: give one change per capture (what other processes hold from then on)"
                            ),
                        ));
                    }
                    between.push((step.clone(), at, bytes));
                }
                (None, None, _) => {
                    return Err(Error::invalid(
                        key("before"),
                        "missing: give before (a step) or during (with after_capture)",
                    ))
                }
            }
        }
        let order = |step: &str| CAPTURE_STEPS.iter().position(|s| *s == step);
        between.sort_by_key(|(step, at, _)| (order(step), *at));
        Ok((before, between))
    }
}

/// The `[allocator]` options as the simulated allocator follows them, checked as PyTorch
/// checks them (`c10/core/AllocatorConfig.cpp`: `max_split_size_mb` at least 20, the 20 MiB
/// segment; `large_segment_size_mb` more than the 10 MiB of `kMinLargeAlloc`; each division
/// count 0 or a power of two; the collection threshold inside (0, 1)), and bounded, each error
/// naming its key.
fn resolve_allocator(
    a: &crate::scenario::AllocatorToml,
    f: &dyn Fn(&str) -> String,
) -> Result<(memplan_backend_sim::EngineOptions, Option<f64>)> {
    use crate::scenario::DivisionsToml;
    let mb = |key: &str, v: Option<u64>, least: u64| -> Result<Option<u64>> {
        match v {
            Some(m) if !(least..=MAX_ALLOCATOR_MB).contains(&m) => Err(Error::invalid(
                f(&format!("allocator.{key}")),
                format!("{m} is outside {least}..={MAX_ALLOCATOR_MB} (MiB)"),
            )),
            v => Ok(v),
        }
    };
    let max_split = mb("max_split_size_mb", a.max_split_size_mb, 20)?;
    let large_segment_mb = mb("large_segment_size_mb", a.large_segment_size_mb, 11)?;
    let count = |key: String, d: u64| -> Result<u32> {
        if d > MAX_DIVISIONS || (d > 0 && !d.is_power_of_two()) {
            return Err(Error::invalid(
                key,
                format!("{d}: divisions are 0 (none) or a power of two up to {MAX_DIVISIONS}"),
            ));
        }
        Ok(d as u32)
    };
    let key = f("allocator.roundup_power2_divisions");
    let mut divisions = [0u32; 16];
    match &a.roundup_power2_divisions {
        None => {}
        Some(DivisionsToml::All(d)) => divisions = [count(key, *d)?; 16],
        Some(DivisionsToml::ByInterval(t)) => {
            // PyTorch's list form: each named interval (a power of two of MiB, from 1 MiB),
            // the smallest fills the intervals below it, `>` every interval above the largest
            // named.
            let mut named: Vec<(usize, u32)> = Vec::new();
            let mut rest = None;
            for (k, d) in t {
                let at = format!("{key}.{k:?}");
                let d = count(at.clone(), *d)?;
                if k == ">" {
                    rest = Some(d);
                    continue;
                }
                let mib: u64 = k.parse().ok().filter(|m: &u64| m.is_power_of_two() && *m <= 1 << 16).ok_or_else(|| {
                    Error::invalid(
                        at,
                        format!("{k:?}: name an interval by its start in MiB, a power of two from 1 to 65536, or \">\" for every interval after the last named"),
                    )
                })?;
                // 32 GiB and above share the last interval, as PyTorch clamps them.
                named.push(((mib.trailing_zeros() as usize).min(15), d));
            }
            named.sort_unstable();
            if let Some((first, d)) = named.first() {
                divisions[..*first].fill(*d);
            }
            for (i, d) in &named {
                divisions[*i] = *d;
            }
            if let Some(d) = rest {
                let from = named.last().map_or(0, |(i, _)| i + 1);
                divisions[from..].fill(d);
            }
        }
    }
    let gc = match a.garbage_collection_threshold {
        Some(g) if !(g.is_finite() && g > 0.0 && g < 1.0) => {
            return Err(Error::invalid(
                f("allocator.garbage_collection_threshold"),
                format!("{g} is outside (0, 1)"),
            ))
        }
        g => g,
    };
    Ok((
        memplan_backend_sim::EngineOptions {
            expandable: a.expandable_segments,
            max_split: max_split.map(|m| m * memplan_core::bytes::MIB),
            divisions,
            large_segment_mb,
        },
        gc,
    ))
}
