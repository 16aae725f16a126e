//! Recurrent-state layers (Mamba, Mamba2, gated DeltaNet, short convolutions) as data: the key names each family
//! uses, and the state bytes per layer and rank as vLLM's `MambaStateShapeCalculator`
//! (`vllm/model_executor/layers/mamba/mamba_utils.py`) shapes them.

use memplan_core::{Error, Param, Result};

use crate::config::Fields;

/// Which state calculator applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StateKind {
    /// Mamba (Jamba): conv `(d_inner/tp, k-1)`, SSM `(d_inner/tp, d_state)`.
    Mamba1,
    /// Mamba2 (Bamba, Nemotron-H, Granite-4.0-H, Falcon-H1, Zamba2): conv
    /// `((d_inner + 2 * groups * d_state)/tp, k-1)`, SSM `(heads/tp, head_dim, d_state)`.
    Mamba2,
    /// Gated DeltaNet (Qwen3-Next, Qwen3.5): conv `((2 * k_dim * k_heads + v_dim * v_heads)/tp,
    /// k-1)`, recurrent `(v_heads/tp, v_dim, k_dim)`.
    GatedDeltaNet,
    /// Short convolution (LFM2): conv `(conv_dim/tp, L_cache-1)` only
    /// (`short_conv_state_shape`; `ShortConv.get_state_shape`, `layers/mamba/short_conv.py`).
    ShortConv,
}

/// The shape facts of a state layer (whole model, before tensor parallelism).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct StateShape {
    /// Calculator.
    pub kind: StateKind,
    /// Mamba: inner size; Mamba2: `heads * head_dim` (or expand * hidden); GDN: unused;
    /// short convolution: the convolution's width (`conv_dim`).
    pub inner: u64,
    /// Mamba/Mamba2: d_state; GDN: key head dim.
    pub state: u64,
    /// Mamba2: groups; GDN: key heads; short convolution: unused.
    pub groups: u64,
    /// Mamba2: SSM heads; GDN: value heads.
    pub heads: u64,
    /// Mamba2: head dim; GDN: value head dim.
    pub head_dim: u64,
    /// Convolution kernel.
    pub conv_kernel: u64,
    /// Mamba: the time-step projection's rank (`mamba_dt_rank`, `time_step_rank`; "auto" or
    /// absent: `ceil(hidden / 16)`, transformers `JambaConfig` / `MambaConfig`); 0 otherwise.
    pub dt_rank: u64,
    /// Bytes of an SSM/recurrent-state element where the family's vLLM rule takes the dtype
    /// from the config while `--mamba-ssm-cache-dtype` is `auto` (vLLM 0.19.0
    /// `model_executor/models/config.py`: `NemotronHForCausalLMConfig`, the config's
    /// `mamba_ssm_cache_dtype`; `Qwen3_5ForConditionalGenerationConfig`, the config's
    /// `mamba_ssm_dtype`); `None`: the engine's default below where
    /// [`ssm_engine_default`](Self::ssm_engine_default), else the Mamba cache dtype (the
    /// model's unless `--mamba-cache-dtype`).
    pub ssm_dtype_bytes: Option<u64>,
    /// The family's rule applies while the config names no SSM dtype, so the engine release's
    /// default decides it (Nemotron-H without `mamba_ssm_cache_dtype`:
    /// `getattr(hf_config, "mamba_ssm_cache_dtype", "float16")` in vLLM 0.19.0,
    /// `DEFAULT_MAMBA_SSM_CACHE_DTYPE = "float32"` from 0.20.0; see
    /// [`SpecOptions::nemotron_h_ssm_default`](crate::kvspec::SpecOptions::nemotron_h_ssm_default)).
    pub ssm_engine_default: bool,
    /// The family's rule runs only from vLLM 0.20.0 for this wrapper (`NemotronH_Nano_VL_V2`:
    /// 0.19.0's `NemotronHNanoVLV2Config` has no `verify_and_update_config`, so its SSM
    /// state is the Mamba cache dtype whatever the config says; vLLM PR 39032 gave it
    /// `NemotronHForCausalLMConfig`'s rule; see
    /// [`SpecOptions::nemotron_h_vl_ssm_rule`](crate::kvspec::SpecOptions::nemotron_h_vl_ssm_rule)).
    pub ssm_rule_from_0_20: bool,
}

/// A Mamba cache dtype other than `auto` (vLLM 0.19.0 `MambaDType`, `vllm/config/cache.py`:
/// `Literal["auto", "float32", "float16"]`), as `--mamba-cache-dtype` (the conv and SSM
/// states) and `--mamba-ssm-cache-dtype` (the SSM/temporal state only) take it
/// (`mamba_utils.py`, `MambaStateDtypeCalculator._mamba_state_dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MambaDtype {
    /// `float32`: 4 bytes.
    Float32,
    /// `float16`: 2 bytes.
    Float16,
}

impl MambaDtype {
    /// Bytes of one element.
    pub fn bytes(self) -> u64 {
        match self {
            MambaDtype::Float32 => 4,
            MambaDtype::Float16 => 2,
        }
    }

    /// vLLM's name.
    pub fn name(self) -> &'static str {
        match self {
            MambaDtype::Float32 => "float32",
            MambaDtype::Float16 => "float16",
        }
    }
}

impl std::fmt::Display for MambaDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for MambaDtype {
    type Err = String;

    /// `float32` or `float16`, any case (`auto` is no dtype: the caller's `None`). vLLM 0.19.0
    /// takes no `bfloat16` here (its argument parser offers auto, float32, float16).
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "float32" => Ok(MambaDtype::Float32),
            "float16" => Ok(MambaDtype::Float16),
            _ => Err(format!(
                "{s:?} is not a Mamba cache dtype; vLLM 0.19.0 takes auto, float32 or float16 (`MambaDType`, vllm/config/cache.py)"
            )),
        }
    }
}

/// Bytes of the state dtype a config names under `key` (vLLM's `STR_DTYPE_TO_TORCH_DTYPE`,
/// `vllm/utils/torch_utils.py`, for the float names).
pub(crate) fn config_dtype_bytes(key: &str, name: &str) -> Result<u64> {
    match name {
        "float32" | "float" => Ok(4),
        "float16" | "half" | "bfloat16" => Ok(2),
        _ => Err(Error::invalid(
            key,
            format!("{name:?} is not a state dtype memplan sizes (float32, float16 or bfloat16)"),
        )),
    }
}

fn div(n: u64, tp: u64, what: &str) -> Result<u64> {
    if tp == 0 || !n.is_multiple_of(tp) {
        return Err(Error::param(
            Param::TensorParallel,
            format!("{tp} does not divide the state's {what} ({n})"),
        ));
    }
    Ok(n / tp)
}

impl StateShape {
    /// Bytes of one layer's state on one of `tp` ranks with activations of `dtype_bytes` and
    /// both Mamba cache dtypes `auto` (`MambaSpec.page_size_bytes` before padding; conv state
    /// in the model dtype, the SSM state in [`ssm_dtype_bytes`](Self::ssm_dtype_bytes), the
    /// newest vLLM's default (float32) where the family's rule leaves it to the engine, or
    /// the model dtype).
    pub fn bytes_per_rank(&self, tp: u64, dtype_bytes: u64) -> Result<u64> {
        self.bytes_per_rank_with(tp, dtype_bytes, None, None, MambaDtype::Float32)
    }

    /// [`bytes_per_rank`](Self::bytes_per_rank) with vLLM's `--mamba-cache-dtype`
    /// (`cache`: conv and SSM state) and `--mamba-ssm-cache-dtype` (`ssm`: the SSM state
    /// only), `None` for `auto` (`mamba_utils.py`, `MambaStateDtypeCalculator._mamba_state_dtype`:
    /// conv in `get_kv_cache_torch_dtype(mamba_cache_dtype, model_dtype)`, the temporal state
    /// in `mamba_ssm_cache_dtype`, or the conv state's dtype when `auto`; the family's rule
    /// sets an `auto` SSM dtype from the config first, `verify_and_update_config`, or to
    /// `engine_default` where the config names none and
    /// [`ssm_engine_default`](Self::ssm_engine_default) says the rule applies).
    pub fn bytes_per_rank_with(
        &self,
        tp: u64,
        dtype_bytes: u64,
        cache: Option<MambaDtype>,
        ssm: Option<MambaDtype>,
        engine_default: MambaDtype,
    ) -> Result<u64> {
        let dtype_bytes = cache.map_or(dtype_bytes, MambaDtype::bytes);
        let ssm_b = ssm
            .map(MambaDtype::bytes)
            .or(self.ssm_dtype_bytes)
            .or(self.ssm_engine_default.then(|| engine_default.bytes()))
            .unwrap_or(dtype_bytes);
        let k = self.conv_kernel.saturating_sub(1);
        let (conv, ssm) = match self.kind {
            StateKind::Mamba1 => {
                let d = div(self.inner, tp, "intermediate size")?;
                (d * k * dtype_bytes, d * self.state * ssm_b)
            }
            StateKind::Mamba2 => {
                // `extra_groups_for_head_shards`: groups are replicated up to tp.
                let groups = if self.groups.is_multiple_of(tp) {
                    self.groups
                } else {
                    tp
                };
                let conv_dim = self.inner + 2 * groups * self.state;
                (
                    div(conv_dim, tp, "conv dim")? * k * dtype_bytes,
                    div(self.heads, tp, "heads")? * self.head_dim * self.state * ssm_b,
                )
            }
            StateKind::ShortConv => (div(self.inner, tp, "conv dim")? * k * dtype_bytes, 0),
            StateKind::GatedDeltaNet => {
                let conv_dim = 2 * self.state * self.groups + self.head_dim * self.heads;
                (
                    div(conv_dim, tp, "conv dim")? * k * dtype_bytes,
                    div(self.heads, tp, "value heads")? * self.head_dim * self.state * ssm_b,
                )
            }
        };
        Ok(conv + ssm)
    }
}

impl StateShape {
    /// Parameters of one state layer's mixer on one of `tp` ranks in a model of width
    /// `hidden`: `(projections, the rest)`. The projections (quantizable, as attention's) take
    /// the hidden state in and out; the rest are the convolution, the SSM's `A`, `D` and
    /// time-step bias, and norms. Shapes from vLLM 0.19.0:
    /// - Mamba (`layers/mamba/mamba_mixer.py`, `MambaMixer.__init__`): `in_proj` hidden x
    ///   2 inner, `x_proj` inner x (dt_rank + 2 d_state), `dt_proj` dt_rank x inner (+ bias),
    ///   `out_proj` inner x hidden; conv inner x kernel (+ bias), `A` inner x d_state, `D`
    ///   inner, the dt/B/C norms.
    /// - Mamba2 (`layers/mamba/mamba_mixer2.py`, `MambaMixer2.__init__`): `in_proj` hidden x
    ///   (2 inner + 2 groups d_state + heads), `out_proj` inner x hidden; conv (inner + 2
    ///   groups d_state) x kernel (+ bias), `A`, `D`, `dt_bias` per head, the gated norm
    ///   (inner). Groups that do not divide `tp` are repeated to `tp`
    ///   (`extra_groups_for_head_shards`).
    /// - Gated DeltaNet (`layers/mamba/gdn_linear_attn.py`, `GatedDeltaNetAttention`):
    ///   `in_proj_qkvz` hidden x (2 key + 2 value dims), `in_proj_ba` hidden x 2 value heads,
    ///   `out_proj` value dim x hidden; conv (2 key + value dims) x kernel, `A_log` and
    ///   `dt_bias` per value head, the gated norm (one value head).
    /// - Short convolution (`layers/mamba/short_conv.py`, `ShortConv`): `in_proj` hidden x 3
    ///   conv dims, `out_proj` conv dim x hidden; conv conv dim x `L_cache`.
    pub fn mixer_params_per_rank(&self, hidden: u64, tp: u64) -> (f64, f64) {
        let f = |n: u64| n as f64;
        let (h, t, k) = (f(hidden), f(tp.max(1)), f(self.conv_kernel));
        match self.kind {
            StateKind::Mamba1 => {
                let (d, n, r) = (f(self.inner) / t, f(self.state), f(self.dt_rank));
                (
                    h * 2.0 * d + d * (r + 2.0 * n) + r * d + d * h,
                    d * k + d + d + d * n + d + r + 2.0 * n,
                )
            }
            StateKind::Mamba2 => {
                let groups = if self.groups.is_multiple_of(tp.max(1)) {
                    self.groups
                } else {
                    tp
                };
                let (d, gn, heads) = (
                    f(self.inner) / t,
                    f(groups * self.state) / t,
                    f(self.heads) / t,
                );
                (
                    h * (2.0 * d + 2.0 * gn + heads) + d * h,
                    (d + 2.0 * gn) * (k + 1.0) + 3.0 * heads + d,
                )
            }
            StateKind::GatedDeltaNet => {
                let (kd, vd, heads) = (
                    f(self.groups * self.state) / t,
                    f(self.heads * self.head_dim) / t,
                    f(self.heads) / t,
                );
                (
                    h * (2.0 * kd + 2.0 * vd) + h * 2.0 * heads + vd * h,
                    (2.0 * kd + vd) * k + 2.0 * heads + f(self.head_dim),
                )
            }
            StateKind::ShortConv => {
                let d = f(self.inner) / t;
                (h * 3.0 * d + d * h, d * k)
            }
        }
    }
}

/// Read a state shape with the family's key names. `hidden` is the model's hidden size.
pub(crate) fn read(
    kind: StateKind,
    f: &Fields<'_>,
    hidden: u64,
    ssm_dtype_bytes: Option<u64>,
) -> Result<StateShape> {
    let first = |keys: &[&str]| -> Result<u64> {
        f.first_positive(keys)?
            .ok_or_else(|| Error::invalid(keys[0], "missing from config.json (state layers)"))
    };
    let expand = |default: u64| -> Result<u64> {
        Ok(f.first_positive(&["mamba_expand", "expand"])?
            .unwrap_or(default)
            * hidden)
    };
    Ok(match kind {
        StateKind::Mamba1 => StateShape {
            kind,
            inner: f
                .first_positive(&["mamba_d_inner", "intermediate_size_mamba"])?
                .map_or_else(|| expand(2), Ok)?,
            state: f
                .first_positive(&["mamba_d_state", "state_size"])?
                .unwrap_or(16),
            groups: 1,
            heads: 0,
            head_dim: 0,
            conv_kernel: f
                .first_positive(&["mamba_d_conv", "conv_kernel"])?
                .unwrap_or(4),
            dt_rank: match ["mamba_dt_rank", "time_step_rank"]
                .into_iter()
                .find_map(|k| f.get(k).map(|v| (k, v)))
            {
                Some((k, v)) if !v.is_string() => f.positive(k)?,
                _ => hidden.div_ceil(16),
            },
            ssm_dtype_bytes,
            ssm_engine_default: false,
            ssm_rule_from_0_20: false,
        },
        StateKind::Mamba2 => {
            let heads = first(&["mamba_n_heads", "mamba_num_heads", "n_mamba_heads"])?;
            let head_dim = first(&["mamba_d_head", "mamba_head_dim", "mamba_headdim"])?;
            // Nemotron-H: heads * head_dim; Falcon-H1: mamba_d_ssm or expand * hidden;
            // Bamba, Granite-4.0-H, Zamba2: expand * hidden.
            let inner = match f.first_positive(&["mamba_d_ssm"])? {
                Some(d) => d,
                None if f.get("mamba_num_heads").is_some() => heads * head_dim,
                None => expand(2)?,
            };
            StateShape {
                kind,
                inner,
                state: first(&["mamba_d_state", "ssm_state_size"])?,
                groups: f
                    .first_positive(&["mamba_n_groups", "n_groups", "mamba_ngroups"])?
                    .unwrap_or(1),
                heads,
                head_dim,
                conv_kernel: f
                    .first_positive(&["mamba_d_conv", "conv_kernel"])?
                    .unwrap_or(4),
                dt_rank: 0,
                ssm_dtype_bytes,
                ssm_engine_default: false,
                ssm_rule_from_0_20: false,
            }
        }
        StateKind::ShortConv => StateShape {
            kind,
            inner: f.first_positive(&["conv_dim"])?.unwrap_or(hidden),
            state: 0,
            groups: 0,
            heads: 0,
            head_dim: 0,
            conv_kernel: first(&["conv_L_cache"])?,
            dt_rank: 0,
            ssm_dtype_bytes,
            ssm_engine_default: false,
            ssm_rule_from_0_20: false,
        },
        StateKind::GatedDeltaNet => StateShape {
            kind,
            inner: 0,
            state: first(&["linear_key_head_dim"])?,
            groups: first(&["linear_num_key_heads"])?,
            heads: first(&["linear_num_value_heads"])?,
            head_dim: first(&["linear_value_head_dim"])?,
            conv_kernel: first(&["linear_conv_kernel_dim"])?,
            dt_rank: 0,
            ssm_dtype_bytes,
            ssm_engine_default: false,
            ssm_rule_from_0_20: false,
        },
    })
}
