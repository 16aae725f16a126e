//! Scenario files for `memplan simulate` (TOML; documented in `docs/scenarios.md`).
//!
//! A scenario names a simulated device (a `sim` selector with modifiers), the world around it
//! (other processes, graphics allocations, a neighbour that changes its memory during
//! profiling), the engine's request, the model's memory (weights, activation peak, library
//! workspace), its KV cache and its graphs. The shipped scenarios are embedded in the binary
//! ([`SHIPPED`]) and loadable by name; any other path is read from disk.

use memplan_core::bytes::parse_bytes;
use memplan_core::kv::{AttentionKind, KvDtype, KvLimits, KvSpec, LayerGroup};
use memplan_core::{Error, Result};
use serde::{Deserialize, Serialize};

use crate::budget::Request;

/// The scenarios shipped with memplan: `(name, TOML)`.
pub const SHIPPED: &[(&str, &str)] = &[
    (
        "fp8-24g",
        include_str!("../../../../scenarios/fp8-24g.toml"),
    ),
    (
        "bf16-24g",
        include_str!("../../../../scenarios/bf16-24g.toml"),
    ),
    (
        "deferred-release-24g",
        include_str!("../../../../scenarios/deferred-release-24g.toml"),
    ),
    (
        "process-local-24g",
        include_str!("../../../../scenarios/process-local-24g.toml"),
    ),
    (
        "free-equals-total",
        include_str!("../../../../scenarios/free-equals-total.toml"),
    ),
    (
        "unified-memory-apu",
        include_str!("../../../../scenarios/unified-memory-apu.toml"),
    ),
    (
        "neighbour-frees",
        include_str!("../../../../scenarios/neighbour-frees.toml"),
    ),
    (
        "neighbour-takes",
        include_str!("../../../../scenarios/neighbour-takes.toml"),
    ),
    (
        "shared-pool",
        include_str!("../../../../scenarios/shared-pool.toml"),
    ),
];

/// A byte quantity in a scenario: an integer or a string with a unit (`"512MiB"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ByteValue {
    /// Bytes.
    Int(u64),
    /// With a unit.
    Str(String),
}

impl ByteValue {
    /// The bytes, or an error naming the field.
    pub fn bytes(&self, field: &str) -> Result<u64> {
        match self {
            ByteValue::Int(b) => Ok(*b),
            ByteValue::Str(s) => parse_bytes(field, s),
        }
    }
}

fn zero() -> ByteValue {
    ByteValue::Int(0)
}
fn yes() -> bool {
    true
}
fn one() -> u32 {
    1
}
fn sixteen() -> u32 {
    16
}
fn batched() -> u64 {
    8192
}

/// A change of the memory other processes hold, applied at the synchronize that opens a step.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NeighbourChange {
    /// The step it happens before: `load_weights`, `profile_run` or `graph_phase`.
    pub before: String,
    /// What other processes hold from then on.
    pub bytes: ByteValue,
}

/// The engine's request: exactly one of the two.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestSpec {
    /// `--gpu-memory-utilization`.
    pub gpu_memory_utilization: Option<f64>,
    /// An absolute byte budget.
    pub memory_budget: Option<ByteValue>,
}

/// The model's memory.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// Weights.
    pub weights: ByteValue,
    /// Number of weight tensors the weights are loaded as.
    #[serde(default = "one")]
    pub weight_tensors: u32,
    /// Activation peak of the profile run (and of a burst at full concurrency).
    pub activation_peak: ByteValue,
    /// Library workspace taken outside the allocator during the profile run.
    #[serde(default = "zero")]
    pub workspace: ByteValue,
}

/// The KV cache (one full-attention layer group).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvToml {
    /// Cache dtype (`bf16`, `fp8`, ...).
    pub dtype: String,
    /// Tokens per block.
    #[serde(default = "sixteen")]
    pub block_size: u32,
    /// Layers.
    pub layers: u32,
    /// KV heads per layer.
    pub kv_heads: u32,
    /// Head dim (K and V).
    pub head_dim: u32,
    /// Longest request.
    pub max_model_len: u64,
    /// Tokens per scheduler step.
    #[serde(default = "batched")]
    pub max_num_batched_tokens: u64,
}

/// The engine's graphs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GraphsToml {
    /// Sizes to capture; default: the engine's list `1, 2, 4, 8, 16, ..., max_capture_size`.
    pub sizes: Option<Vec<u32>>,
    /// Largest size of the default list.
    pub max_capture_size: Option<u32>,
    /// Kernel nodes per graph.
    pub kernel_nodes: u32,
    /// Intermediate memory per token of batch (goes to the shared private pool).
    pub intermediate_per_token: ByteValue,
    /// Memory an eager warm-up of one token of batch leaves cached before the capture.
    #[serde(default = "zero")]
    pub warmup_per_token: ByteValue,
    /// Graph allocation-node bytes per graph (block tables, scale buffers).
    #[serde(default = "zero")]
    pub alloc_node_bytes: ByteValue,
    /// Whether the engine can size its KV cache after capture.
    #[serde(default = "yes")]
    pub post_capture: bool,
}

/// A scenario file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name.
    pub name: String,
    /// What it reproduces.
    #[serde(default)]
    pub description: String,
    /// `sim` selector, e.g. `rtx4090` or `rx7900xtx-rocm6.2,declare-exact,graphics=300MiB`.
    pub device: String,
    /// Calibrate before planning (the automatic choice then uses the calibrated capability).
    #[serde(default = "yes")]
    pub calibrate: bool,
    /// Memory held by other processes at start.
    #[serde(default = "zero")]
    pub other_processes: ByteValue,
    /// Changes of other processes' memory during profiling.
    #[serde(default)]
    pub neighbour: Vec<NeighbourChange>,
    /// The request.
    pub request: RequestSpec,
    /// The model.
    pub model: ModelSpec,
    /// The KV cache.
    pub kv: KvToml,
    /// The graphs.
    pub graphs: GraphsToml,
}

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
}

/// The engine's default capture sizes up to `max`: 1, 2, 4, then every multiple of 8.
pub fn default_sizes(max: u32) -> Vec<u32> {
    let mut v: Vec<u32> = [1, 2, 4].into_iter().filter(|s| *s <= max).collect();
    v.extend((8..=max).step_by(8));
    v
}

impl Scenario {
    /// Parse TOML; errors name the scenario and the field.
    pub fn from_toml(origin: &str, text: &str) -> Result<Self> {
        toml::from_str(text)
            .map_err(|e| Error::invalid(format!("scenario {origin}"), e.to_string()))
    }

    /// A shipped scenario by name, or a file path.
    pub fn load(name_or_path: &str) -> Result<Self> {
        if let Some((_, text)) = SHIPPED.iter().find(|(n, _)| *n == name_or_path) {
            return Self::from_toml(name_or_path, text);
        }
        let text = std::fs::read_to_string(name_or_path).map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                let names: Vec<_> = SHIPPED.iter().map(|(n, _)| *n).collect();
                Error::invalid(
                    "--scenario",
                    format!(
                        "{name_or_path:?} is neither a shipped scenario ({}) nor a file",
                        names.join(", ")
                    ),
                )
            } else {
                Error::Io {
                    path: name_or_path.into(),
                    source,
                }
            }
        })?;
        Self::from_toml(name_or_path, &text)
    }

    /// Resolve every quantity; errors name the field.
    pub fn resolve(self) -> Result<Setup> {
        let f = |field: &str| format!("scenario {}: {field}", self.name);
        let request = match (
            &self.request.gpu_memory_utilization,
            &self.request.memory_budget,
        ) {
            (Some(u), None) => Request::Utilization(*u),
            (None, Some(b)) => Request::Bytes(b.bytes(&f("request.memory_budget"))?),
            _ => {
                return Err(Error::invalid(
                    f("request"),
                    "give exactly one of gpu_memory_utilization and memory_budget",
                ))
            }
        };
        let k = &self.kv;
        let dtype: KvDtype = k
            .dtype
            .parse()
            .map_err(|e: Error| Error::invalid(f("kv.dtype"), e.to_string()))?;
        let kv = KvSpec {
            groups: vec![LayerGroup {
                attention: AttentionKind::Full,
                num_layers: k.layers,
                kv_heads: k.kv_heads,
                head_dim_k: k.head_dim,
                head_dim_v: k.head_dim,
            }],
            dtype,
            block_size: k.block_size,
        };
        kv.validate()
            .map_err(|e| Error::invalid(f("kv"), e.to_string()))?;
        let limits = KvLimits {
            max_model_len: k.max_model_len,
            max_num_batched_tokens: k.max_num_batched_tokens,
            max_len_limit: k.max_model_len.max(1) * 4,
        };
        let g = &self.graphs;
        let mut sizes = match (&g.sizes, g.max_capture_size) {
            (Some(s), None) => s.clone(),
            (None, Some(m)) => default_sizes(m),
            (None, None) => Vec::new(),
            (Some(_), Some(_)) => {
                return Err(Error::invalid(
                    f("graphs"),
                    "give sizes or max_capture_size, not both",
                ))
            }
        };
        if sizes.contains(&0) {
            return Err(Error::invalid(f("graphs.sizes"), "a graph size of 0"));
        }
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        let neighbour = self
            .neighbour
            .iter()
            .map(|n| {
                if !["load_weights", "profile_run", "graph_phase"].contains(&n.before.as_str()) {
                    return Err(Error::invalid(
                        f("neighbour.before"),
                        format!(
                            "{:?}: expected load_weights, profile_run or graph_phase",
                            n.before
                        ),
                    ));
                }
                Ok((n.before.clone(), n.bytes.bytes(&f("neighbour.bytes"))?))
            })
            .collect::<Result<Vec<_>>>()?;
        let weight_tensors = self.model.weight_tensors;
        if weight_tensors == 0 {
            return Err(Error::invalid(f("model.weight_tensors"), "must be > 0"));
        }
        Ok(Setup {
            request,
            kv,
            limits,
            other_processes: self.other_processes.bytes(&f("other_processes"))?,
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
            scenario: self,
        })
    }
}
