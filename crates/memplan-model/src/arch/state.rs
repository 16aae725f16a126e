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
    /// The SSM/recurrent state is kept in float32 whatever the model dtype (Nemotron-H's
    /// `mamba_ssm_cache_dtype` default, `NemotronHForCausalLMConfig`).
    pub ssm_f32: bool,
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
    /// Bytes of one layer's state on one of `tp` ranks with activations of `dtype_bytes`
    /// (`MambaSpec.page_size_bytes` before padding; conv state in the model dtype).
    pub fn bytes_per_rank(&self, tp: u64, dtype_bytes: u64) -> Result<u64> {
        let ssm_b = if self.ssm_f32 { 4 } else { dtype_bytes };
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
    ssm_f32: bool,
) -> Result<StateShape> {
    let first = |keys: &[&str]| -> Result<u64> {
        f.first(keys)?
            .ok_or_else(|| Error::invalid(keys[0], "missing from config.json (state layers)"))
    };
    let expand = |default: u64| -> Result<u64> {
        Ok(f.first(&["mamba_expand", "expand"])?.unwrap_or(default) * hidden)
    };
    Ok(match kind {
        StateKind::Mamba1 => StateShape {
            kind,
            inner: f
                .first(&["mamba_d_inner", "intermediate_size_mamba"])?
                .map_or_else(|| expand(2), Ok)?,
            state: f.first(&["mamba_d_state", "state_size"])?.unwrap_or(16),
            groups: 1,
            heads: 0,
            head_dim: 0,
            conv_kernel: f.first(&["mamba_d_conv", "conv_kernel"])?.unwrap_or(4),
            dt_rank: match ["mamba_dt_rank", "time_step_rank"]
                .into_iter()
                .find_map(|k| f.get(k).map(|v| (k, v)))
            {
                Some((k, v)) if !v.is_string() => f.positive(k)?,
                _ => hidden.div_ceil(16),
            },
            ssm_f32,
        },
        StateKind::Mamba2 => {
            let heads = first(&["mamba_n_heads", "mamba_num_heads", "n_mamba_heads"])?;
            let head_dim = first(&["mamba_d_head", "mamba_head_dim", "mamba_headdim"])?;
            // Nemotron-H: heads * head_dim; Falcon-H1: mamba_d_ssm or expand * hidden;
            // Bamba, Granite-4.0-H, Zamba2: expand * hidden.
            let inner = match f.first(&["mamba_d_ssm"])? {
                Some(d) => d,
                None if f.get("mamba_num_heads").is_some() => heads * head_dim,
                None => expand(2)?,
            };
            StateShape {
                kind,
                inner,
                state: first(&["mamba_d_state", "ssm_state_size"])?,
                groups: f
                    .first(&["mamba_n_groups", "n_groups", "mamba_ngroups"])?
                    .unwrap_or(1),
                heads,
                head_dim,
                conv_kernel: f.first(&["mamba_d_conv", "conv_kernel"])?.unwrap_or(4),
                dt_rank: 0,
                ssm_f32,
            }
        }
        StateKind::ShortConv => StateShape {
            kind,
            inner: f.first(&["conv_dim"])?.unwrap_or(hidden),
            state: 0,
            groups: 0,
            heads: 0,
            head_dim: 0,
            conv_kernel: first(&["conv_L_cache"])?,
            dt_rank: 0,
            ssm_f32,
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
            ssm_f32,
        },
    })
}
