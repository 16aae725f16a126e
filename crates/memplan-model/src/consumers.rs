//! The other memory users engines add, as small pure functions: a speculative-decoding draft
//! model, LoRA adapters, the multimodal encoder cache and encoder profiling, CPU weight
//! offload, and pipeline parallelism's per-stage layer split. Each returns bytes (or a
//! layer range) with the rule it follows; the dry run adds them to its consumers.

use memplan_core::kv::{KvSpec, LayerGroup};
use memplan_core::{Error, Param, Result};
use memplan_planner::{Consumer, ConsumerKind, Plan, PlanBuilder, Rank};

use crate::config::ModelConfig;
use crate::dryrun::DryRun;

const GIB: f64 = (1u64 << 30) as f64;

/// The weights consumer with a draft model's and LoRA's bytes added and `--cpu-offload-gb`
/// taken away, the basis saying so.
pub fn adjust_weights(w: Consumer, extra: &[(u64, String)], cpu_offload: u64) -> Consumer {
    if extra.is_empty() && cpu_offload == 0 {
        return w;
    }
    let mut bytes = w.bytes;
    let mut basis = w.provenance.basis().to_string();
    for (b, why) in extra {
        bytes = bytes.saturating_add(*b);
        basis.push_str(&format!("; plus {:.2} GiB {why}", *b as f64 / GIB));
    }
    let off = cpu_offload.min(bytes);
    if off > 0 {
        bytes -= off;
        basis.push_str(&format!(
            "; minus {:.2} GiB kept in host memory (CPU offload)",
            off as f64 / GIB
        ));
    }
    Consumer::estimated(ConsumerKind::Weights, bytes, basis)
}

/// The activation consumer with the multimodal encoder cache and the vision encoder's
/// profiling pass added (estimated), when the model has a vision tower and the figure was
/// not given.
pub fn with_encoder(
    a: Consumer,
    estimate: bool,
    c: &ModelConfig,
    batched: u64,
    db: u64,
) -> Consumer {
    match encoder_bytes(c, batched, db).filter(|_| estimate) {
        Some((cache, profile)) => Consumer::estimated(
            ConsumerKind::Activation,
            a.bytes.saturating_add(cache).saturating_add(profile),
            format!(
                "{}; plus the multimodal encoder cache {:.2} GiB and the vision encoder's profiling pass {:.2} GiB (estimated)",
                a.provenance.basis(),
                cache as f64 / GIB,
                profile as f64 / GIB
            ),
        ),
        None => a,
    }
}

/// Plan every pipeline stage on its own layers and keep the one with the fewest blocks.
pub fn plan_stages(d: &DryRun, pp: u64) -> Result<Plan> {
    let mut best: Option<(u64, Plan)> = None;
    let mut lines = Vec::new();
    for i in 0..pp {
        let p = plan_stage(d, pp, i)?;
        let (start, end) = stage_layers(d, pp, i)?;
        lines.push(format!(
            "stage {i}: layers {start}..{end}, {} KV blocks",
            p.kv.num_blocks
        ));
        if best
            .as_ref()
            .is_none_or(|(_, b)| p.kv.num_blocks < b.kv.num_blocks)
        {
            best = Some((i, p));
        }
    }
    let (i, mut p) = best.ok_or_else(|| {
        Error::param(
            Param::PipelineParallel,
            "must be > 0 (1 = no pipeline parallelism)",
        )
    })?;
    p.notes.push(format!(
        "pipeline parallelism: {}; the engine sizes every stage like stage {i} (fewest blocks)",
        lines.join("; ")
    ));
    Ok(p)
}

/// The layer range `[start, end)` of stage `stage` of `pp` (vLLM's split, [`pp_layers`]).
fn stage_layers(d: &DryRun, pp: u64, stage: u64) -> Result<(u64, u64)> {
    pp_layers(d.model.config.num_layers, pp)?
        .get(stage as usize)
        .copied()
        .ok_or_else(|| {
            Error::param(
                Param::PipelineParallel,
                format!(
                    "stage {stage} of {pp} stages (stages count from 0 to {})",
                    pp - 1
                ),
            )
        })
}

/// Plan one pipeline stage on its own layers: what the rank of that stage holds (its layers'
/// weights, the embeddings on the first stage, the LM head on the last) and the KV cache of
/// its layers only. Every rank of a pipeline-parallel deployment plans its own stage; the
/// engine then sizes every stage like the one with the fewest blocks (combine the ranks'
/// plans).
pub fn plan_stage(d: &DryRun, pp: u64, i: u64) -> Result<Plan> {
    crate::dryrun::without_free_after_weights(resolve_stage(d, pp, i)?).build()
}

/// [`plan_stage`]'s plan builder, before it is built: the stage's consumers, KV cache, limits
/// and rules (a measured start-up of that stage's rank takes its settings from here).
pub fn resolve_stage(d: &DryRun, pp: u64, i: u64) -> Result<PlanBuilder> {
    let c = &d.model.config;
    let (start, end) = stage_layers(d, pp, i)?;
    let db = crate::dtype_bytes(c.torch_dtype.as_deref().unwrap_or("bfloat16")).unwrap_or(2);
    let tp = d.tensor_parallel.max(1);
    let given = d
        .given
        .iter()
        .find(|(k, _)| *k == ConsumerKind::Weights)
        .map(|g| g.1);
    let full = match (given, &d.model.checkpoint) {
        (Some(w), _) => w,
        (None, Some(s)) => s.per_rank_as(tp, db, c.quantization.is_some()),
        (None, None) => crate::weights::weight_bytes(c, tp, db, c.quantization.as_ref())?,
    };
    let stage_est = stage_weight_bytes(c, tp, db, pp, i, (start, end))?;
    let whole_est = crate::weights::weight_bytes(c, tp, db, c.quantization.as_ref())?;
    let l = c.num_layers.max(1);
    let mut stage = d.clone();
    let mut sc = c.clone();
    sc.layers = c
        .layers
        .iter()
        .enumerate()
        .filter(|(j, _)| (start..end).contains(&(*j as u64 % l)))
        .map(|(_, k)| *k)
        .collect();
    sc.layer_shapes = c
        .layer_shapes
        .iter()
        .enumerate()
        .filter(|(j, _)| (start..end).contains(&(*j as u64)))
        .map(|(_, s)| *s)
        .collect();
    sc.blocks = c
        .blocks
        .iter()
        .enumerate()
        .filter(|(j, _)| (start..end).contains(&(*j as u64)))
        .map(|(_, b)| *b)
        .collect();
    sc.num_layers = end - start;
    stage.model.config = sc;
    // The estimate of the stage's share, applied to the whole model's figure (the same
    // figure when the weights are estimated; a measured or checkpoint figure is split in the
    // estimate's proportions).
    let w = if full == whole_est || whole_est == 0 {
        stage_est
    } else {
        (u128::from(full) * u128::from(stage_est) / u128::from(whole_est)) as u64
    };
    stage.given.retain(|(k, _)| *k != ConsumerKind::Weights);
    // The stage's own activation peak: only the last stage samples.
    stage.runs_sampler = i + 1 == pp;
    let mut b = stage.resolve()?.builder;
    let basis = format!(
        "pipeline stage {i} of {pp}: layers {start}..{end} of the model's weights{}{}",
        if i == 0 || c.family == crate::config::Family::Gemma {
            " + embeddings"
        } else {
            ""
        },
        if i + 1 == pp { " + LM head" } else { "" }
    );
    b = b
        .consumer(Consumer::estimated(ConsumerKind::Weights, w, basis))
        .pipeline_parallel(pp);
    if let Some(rank) = d.extras.rank(tp)?.filter(|r| r.pipeline_parallel_rank == i) {
        b = b.rank(rank);
    }
    Ok(b)
}

/// The weight bytes one rank of stage `i` of `pp` holds, layers `start..end` (vLLM
/// `make_layers` over `get_pp_indices`): its layers' own parameters
/// ([`crate::weights::params_by_stage`]), the rotary cache (every stage builds its own), the
/// vision tower (multimodal wrappers build it on every rank: `llava.py`, `gemma3_mm.py`),
/// and the token embedding on the first stage and the LM head and final norm on the last
/// (`llama.py` `LlamaModel`: `embed_tokens` on the first rank, and on the last when the head
/// is tied to it). Gemma builds `embed_tokens` (and Gemma 3n / 4's per-layer input table) on
/// every rank (`gemma2.py`, `gemma3.py`, `gemma3n.py`, `gemma4.py`), its tied head reading it.
pub fn stage_weight_bytes(
    c: &ModelConfig,
    tp: u64,
    db: u64,
    pp: u64,
    i: u64,
    (start, end): (u64, u64),
) -> Result<u64> {
    use crate::weights::{param_bytes, params_by_stage, rotary_bytes, ParamCount};
    let p = params_by_stage(c, tp)?;
    let q = c.quantization.as_ref();
    let (first, last) = (i == 0, i + 1 == pp);
    let mut held = ParamCount::default();
    let mut add = |x: &ParamCount| {
        held.attention += x.attention;
        held.mlp += x.mlp;
        held.shared_mlp += x.shared_mlp;
        held.other += x.other;
    };
    for x in p.layers.iter().take(end as usize).skip(start as usize) {
        add(x);
    }
    add(&p.vision);
    let gemma = c.family == crate::config::Family::Gemma;
    if first || gemma {
        add(&p.embed);
    }
    if last {
        add(&p.head);
        if c.tie_word_embeddings && !first && !gemma {
            add(&p.embed);
        }
    }
    param_bytes(&held, db, q)?
        .checked_add(rotary_bytes(c, db)?)
        .ok_or_else(|| Error::invalid("model", "weight bytes overflow 64 bits"))
}

/// Other memory users of a deployment (all off by default).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Extras {
    /// A draft model for speculative decoding and the tokens it proposes per step.
    pub draft: Option<(ModelConfig, u64)>,
    /// LoRA: `--max-loras` slots of `--max-lora-rank`.
    pub lora: Option<(u64, u64)>,
    /// `--cpu-offload-gb`, in bytes.
    pub cpu_offload: u64,
    /// Pipeline-parallel stages (`--pipeline-parallel-size`, 1 = off).
    pub pipeline_parallel: u64,
    /// Plan only this stage (`--pipeline-stage`, from 0): one rank's plan, for ranks that
    /// plan their own device and combine afterwards. `None`: every stage, the fewest blocks.
    pub pipeline_stage: Option<u64>,
    /// The tensor-parallel rank the plan is for (`--tensor-parallel-rank`, from 0). With it
    /// or a stage, the plan says which [`Rank`] it is, so the ranks' plans combine.
    pub tensor_parallel_rank: Option<u64>,
}

impl Extras {
    /// The same extras with a draft model proposing `tokens` per step.
    pub fn with_draft(mut self, config: ModelConfig, tokens: u64) -> Self {
        self.draft = Some((config, tokens));
        self
    }

    /// The same extras with `slots` LoRA slots of rank `rank`.
    pub fn with_lora(mut self, slots: u64, rank: u64) -> Self {
        self.lora = Some((slots, rank));
        self
    }

    /// The same extras with `bytes` of weights offloaded to the CPU.
    pub fn with_cpu_offload(mut self, bytes: u64) -> Self {
        self.cpu_offload = bytes;
        self
    }

    /// The same extras with `stages` pipeline-parallel stages (1 = off).
    pub fn with_pipeline_parallel(mut self, stages: u64) -> Self {
        self.pipeline_parallel = stages;
        self
    }

    /// The same extras planning only pipeline stage `stage` (from 0; `None`: every stage).
    pub fn with_pipeline_stage(mut self, stage: Option<u64>) -> Self {
        self.pipeline_stage = stage;
        self
    }

    /// The same extras for tensor-parallel rank `rank` (from 0) of the plan's stage.
    pub fn with_tensor_parallel_rank(mut self, rank: Option<u64>) -> Self {
        self.tensor_parallel_rank = rank;
        self
    }

    /// The rank a plan of one rank is for: given a stage or a tensor-parallel rank (the other
    /// defaults to 0), `Some`; otherwise `None` (a plan for every rank alike). A
    /// tensor-parallel rank of a pipeline-parallel deployment needs its stage.
    pub fn rank(&self, tensor_parallel: u64) -> Result<Option<Rank>> {
        let pp = self.pipeline_parallel.max(1);
        match (self.tensor_parallel_rank, self.pipeline_stage) {
            (None, None) => Ok(None),
            (Some(_), None) if pp > 1 => Err(Error::param(
                Param::PipelineParallel,
                format!("a tensor-parallel rank of {pp} pipeline stages needs its stage"),
            )),
            (r, s) => Ok(Some(
                Rank::new(r.unwrap_or(0), tensor_parallel.max(1))?
                    .with_stage(s.unwrap_or(0), pp)?,
            )),
        }
    }
}

/// vLLM `get_pp_indices` (`vllm/distributed/utils.py`): `layers // pp` per stage, the
/// remainder one each to the stages before the last, counting back from it.
pub fn pp_layers(layers: u64, pp: u64) -> Result<Vec<(u64, u64)>> {
    if pp == 0 || pp > layers {
        return Err(Error::param(
            Param::PipelineParallel,
            format!("{pp} stages for {layers} layers (1 to the layer count)"),
        ));
    }
    let mut parts = vec![layers / pp; pp as usize];
    let rem = (layers % pp) as usize;
    for i in 2..rem + 2 {
        let n = parts.len();
        parts[n - i] += 1;
    }
    let mut out = Vec::with_capacity(parts.len());
    let mut start = 0;
    for p in parts {
        out.push((start, start + p));
        start += p;
    }
    Ok(out)
}

/// The KV spec with a draft model's layers added: vLLM allocates the draft's attention
/// layers in the same pool (`get_kv_cache_spec` over target and draft layers), so every
/// block holds them too.
pub fn with_draft_layers(target: &KvSpec, draft: &KvSpec) -> KvSpec {
    let mut groups: Vec<LayerGroup> = target.groups.clone();
    for g in &draft.groups {
        match groups.iter_mut().find(|t| {
            t.attention == g.attention
                && t.kv_heads == g.kv_heads
                && t.head_dim_k == g.head_dim_k
                && t.head_dim_v == g.head_dim_v
        }) {
            Some(t) => t.num_layers += g.num_layers,
            None => groups.push(g.clone()),
        }
    }
    KvSpec::new(groups, target.dtype, target.block_size)
}

/// LoRA weight slots vLLM pre-allocates (`vllm/lora/layers`): for each of `max_loras` slots
/// and each layer, A (`rank x in`) and B (`out x rank`) for the QKV, output, gate/up and down
/// projections; column-parallel layers split B, row-parallel ones split A across `tp`.
pub fn lora_bytes(c: &ModelConfig, tp: u64, max_loras: u64, rank: u64, dtype_bytes: u64) -> u64 {
    let tp = tp.max(1);
    let (h, hd) = (c.hidden_size, c.head_dim);
    let q = c.num_heads.saturating_mul(hd);
    let kv = c.num_kv_heads.saturating_mul(hd);
    let inter = match c.moe {
        // Experts are not LoRA targets in vLLM's default module list; the dense MLP is.
        Some(m) => m
            .shared_intermediate
            .max(c.intermediate_size.min(m.expert_intermediate)),
        None => c.intermediate_size,
    };
    // Saturating sums: a size past 2^64 bytes fits no device, and the plan then says so.
    let parts = [
        3 * h,
        q.saturating_add(kv.saturating_mul(2)) / tp, // qkv: A (3 slices), B split
        q / tp,                                      // o_proj: A split, B whole
        h,
        2 * h, // gate_up
        inter.saturating_mul(2) / tp,
        inter / tp, // down
        h,
    ];
    let per_layer = parts.iter().fold(0u64, |a, b| a.saturating_add(*b));
    per_layer
        .saturating_mul(rank)
        .saturating_mul(c.num_layers)
        .saturating_mul(max_loras)
        .saturating_mul(dtype_bytes)
}

/// The multimodal encoder cache: embeddings of up to `max(max_num_batched_tokens,
/// tokens of one item)` tokens in the language model's hidden size (vLLM
/// `compute_encoder_budget`, `EncoderCacheManager`), plus the vision tower's profiling pass
/// over one item (an estimate: a few activations of the tower's width per patch).
pub fn encoder_bytes(
    c: &ModelConfig,
    max_num_batched_tokens: u64,
    dtype_bytes: u64,
) -> Option<(u64, u64)> {
    let v = c.vision?;
    // One 1024 x 1024 image at the tower's patch size: the largest item a default
    // processor produces for most wrappers.
    let patches = (1024 / v.patch.max(1)).pow(2);
    // Saturating: a size past 2^64 bytes fits no device, and the plan then says so.
    let cache = max_num_batched_tokens
        .max(patches)
        .saturating_mul(c.hidden_size)
        .saturating_mul(dtype_bytes);
    let profile = patches
        .saturating_mul(v.hidden.saturating_mul(4).saturating_add(v.intermediate))
        .saturating_mul(dtype_bytes);
    Some((cache, profile))
}

#[cfg(test)]
mod tests {
    use super::*;
    use memplan_core::kv::{AttentionKind, KvDtype};

    #[test]
    fn pipeline_stages_split_as_vllm() {
        // 80 layers on 3 stages: 26 each, the 2 left over go to stages 1 and 0 (counted
        // back from the one before the last): [27, 27, 26].
        assert_eq!(pp_layers(80, 3).unwrap(), vec![(0, 27), (27, 54), (54, 80)]);
        assert_eq!(
            pp_layers(32, 4).unwrap(),
            vec![(0, 8), (8, 16), (16, 24), (24, 32)]
        );
        // 61 layers on 2 stages: [31, 30].
        assert_eq!(pp_layers(61, 2).unwrap(), vec![(0, 31), (31, 61)]);
        assert!(pp_layers(4, 8).is_err() && pp_layers(4, 0).is_err());
    }

    #[test]
    fn draft_layers_join_the_pool_and_lora_slots_scale() {
        let g = |n, h| LayerGroup::new(AttentionKind::Full, n, h, 128);
        let t = KvSpec::new(vec![g(32, 8)], KvDtype::Bf16, 16);
        let d = KvSpec::new(vec![g(1, 8)], KvDtype::Bf16, 16);
        assert_eq!(with_draft_layers(&t, &d).groups[0].num_layers, 33);
        let d = KvSpec::new(vec![g(2, 4)], KvDtype::Bf16, 16);
        assert_eq!(with_draft_layers(&t, &d).groups.len(), 2);
        let c = crate::presets::find("llama-3.1-8b-instruct")
            .unwrap()
            .config;
        let one = lora_bytes(&c, 1, 1, 16, 2);
        assert_eq!(lora_bytes(&c, 1, 4, 16, 2), 4 * one);
        assert_eq!(lora_bytes(&c, 1, 1, 64, 2), 4 * one);
        // Llama 8B, rank 16: (3*4096 + 6144 + 4096 + 4096 + 8192 + 28672 + 14336 + 4096)
        // * 16 * 32 layers * 2 bytes.
        assert_eq!(
            one,
            (3 * 4096 + 6144 + 4096 + 4096 + 8192 + 28672 + 14336 + 4096) * 16 * 32 * 2
        );
    }

    fn dry(extras: Extras) -> DryRun {
        let m = crate::Model::load("llama-3.1-8b-instruct").unwrap();
        DryRun::new(m, 80 << 30)
            .max_model_len(Some(8192))
            .enforce_eager(true)
            .device_name("H100")
            .extras(extras)
    }

    /// The weights one pipeline stage of `model` (from `tests/data/weight-configs.jsonl`)
    /// holds at `pp` stages, TP 1.
    fn stage_weights(model: &str, pp: u64) -> Vec<u64> {
        stage_weights_of(model, crate::arch::tests_weights::real(model), pp)
    }

    /// The weights one pipeline stage of the model `c` holds at `pp` stages, TP 1.
    fn stage_weights_of(model: &str, c: ModelConfig, pp: u64) -> Vec<u64> {
        let m = crate::Model {
            name: model.into(),
            source: crate::Source::Preset(model.into()),
            config: c,
            checkpoint: None,
        };
        let d = DryRun::new(m, 640 << 30)
            .max_model_len(Some(4096))
            .enforce_eager(true)
            .device_name("H100");
        (0..pp)
            .map(|i| {
                plan_stage(&d, pp, i)
                    .unwrap()
                    .consumers
                    .bytes(ConsumerKind::Weights)
            })
            .collect()
    }

    #[test]
    fn pipeline_stages_hold_their_own_layers_weights() {
        // Nemotron-3-Nano at PP 2: 52 blocks as [26, 26] (`get_pp_indices`). The first 26
        // are 12 Mamba2, 3 attention and 11 MoE blocks, the last 26 are 11, 3 and 12: the
        // last stage holds one MoE block (1.3B parameters) more. Per block (counted in
        // `arch::tests_weights`): Mamba2 38,744,896, attention 23,399,040, MoE 1,297,468,032
        // parameters; the first stage adds the embedding 131,072 x 2688, the last the head
        // and final norm, all bf16; no rotary cache (`NemotronHAttention` has no rotary
        // embedding).
        use crate::arch::tests_weights::{NANO_ATTN, NANO_EMB, NANO_MAMBA, NANO_MOE};
        let first = 12 * NANO_MAMBA + 3 * NANO_ATTN + 11 * NANO_MOE + NANO_EMB;
        let last = 11 * NANO_MAMBA + 3 * NANO_ATTN + 12 * NANO_MOE + NANO_EMB + 2688;
        assert_eq!(
            stage_weights("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", 2),
            vec![2 * first, 2 * last]
        );
        // Gemma 4 31B at PP 2 (60 layers as [30, 30], each half with 25 sliding and 5 full
        // layers): Gemma builds `embed_tokens` on every rank (gemma4.py `Gemma4Model`, its
        // tied head reading it) and the multimodal wrapper its vision tower on every rank
        // (gemma4_mm.py), so both stages hold the embedding and the tower, not half of the
        // tower each. Counted from the shapes (gemma4.py `Gemma4DecoderLayer`), hidden 5376:
        // - a sliding layer (32 heads, 16 KV heads of 256): q 5376 x 8192 = 44,040,192, k
        //   and v 2 x 5376 x 4096 = 44,040,192, o 8192 x 5376 = 44,040,192; the MLP (gate, up,
        //   down) 3 x 5376 x 21504 = 346,816,512; four norms 4 x 5376 = 21,504: 478,958,592;
        // - a full layer (`global_head_dim` 512, `attention_k_eq_v` with 4 KV heads, K's
        //   weights loaded into both the K and V slots of the QKV projection): q 5376 x 16384
        //   = 88,080,384, k and v 2 x 5376 x 2048 = 22,020,096, o 16384 x 5376 = 88,080,384;
        //   the same MLP and norms: 545,018,880 (q/k norms left out);
        // - the vision tower (transformers `Gemma4VisionModel`, which gemma4_mm.py builds with
        //   `AutoModel.from_config`; width 1152, 16 heads of 72, MLP 4304, patch 16): the
        //   patch embedder's `input_proj` 3 x 16^2 x 1152 = 884,736 and
        //   `position_embedding_table` 2 x 10240 x 1152 = 23,592,960; per layer q, k, v, o
        //   4 x 1152^2 = 5,308,416, q/k norms 2 x 72, four norms 4 x 1152, the gated MLP
        //   (`Gemma4VisionMLP` gate/up/down) 3 x 1152 x 4304 = 14,874,624: 20,187,792, x 27 =
        //   545,070,384; `std_bias`/`std_scale` (`standardize`) 2 x 1152; the embedder's
        //   projection 1152 x 5376 = 6,193,152: 575,743,536 (the generic ViT count gave
        //   447,329,664: a 2-matrix MLP, no position table, a 5376^2 projector);
        // - the embedding 262,144 x 5376 on both, the final norm on the last; the rotary cache
        //   262,144 x 256 on each; bf16.
        let (sliding, full) = (478_958_592, 545_018_880);
        let half = 25 * sliding + 5 * full;
        assert_eq!(half, 14_699_059_200);
        let (emb, tower) = (262_144 * 5376, 575_743_536);
        let c = crate::arch::tests_weights::real("google/gemma-4-31B (fine-tune)");
        let p = crate::weights::params_by_stage(&c, 1).unwrap();
        assert_eq!((p.layers[0].total(), p.layers[5].total()), (sliding, full));
        assert_eq!((p.embed.total(), p.vision.total()), (emb, tower));
        // With the language model it is the checkpoint (index total_size 62,546,177,752,
        // bf16) to the parameter, less the V slots vLLM adds to the 10 full layers (10 x 5376
        // x 2048) and plus what memplan leaves out: q/k norms (50 x 2 x 256 + 10 x 2 x 512)
        // and the 60 layer scalars.
        let all = crate::weights::params_per_rank(&c, 1).unwrap().total();
        assert_eq!(all - 10 * 5376 * 2048 + 35_840 + 60, 62_546_177_752 / 2);
        let rope = 262_144 * 256 * 2;
        assert_eq!(
            stage_weights("google/gemma-4-31B (fine-tune)", 2),
            vec![
                2 * (half + emb + tower) + rope,
                2 * (half + emb + tower + 5376) + rope
            ]
        );
    }

    #[test]
    fn pipeline_stages_hold_moe_layers_where_the_config_puts_them() {
        // Qwen1.5-MoE-A2.7B's shapes on 8 layers with `decoder_sparse_step` 2: vLLM builds
        // routed experts where `(layer_idx not in mlp_only_layers) and (num_experts > 0 and
        // (layer_idx + 1) % decoder_sparse_step == 0)` (qwen2_moe.py `Qwen2MoeDecoderLayer`),
        // layers 1, 3, 5 and 7, so each stage of PP 2 ([4, 4]) holds two dense and two MoE
        // layers. Counted from the tensor shapes, hidden 2048, bf16:
        // - attention: q, k, v and o 4 x 2048 x 2048 = 16,777,216, q/k/v biases 3 x 2048 =
        //   6,144; two norms 2 x 2048 = 4,096;
        // - dense MLP (`Qwen2MoeMLP`): 3 x 2048 x 5632 = 34,603,008; a dense layer 51,390,464;
        // - MoE (`Qwen2MoeSparseMoeBlock`): 60 experts 60 x 3 x 2048 x 1408 = 519,045,120, the
        //   shared expert 3 x 2048 x 5632 = 34,603,008, the router 2048 x 60 = 122,880 (the
        //   shared expert's gate, 2048, left out); an MoE layer 570,558,464;
        // - the embedding 151,936 x 2048 = 311,164,928 on stage 0, the untied head of the same
        //   size and the final norm 2048 on stage 1; the rotary cache 8192 x 128 on each.
        // Stage 0: 2 x (311,164,928 + 2 x 51,390,464 + 2 x 570,558,464) + 2,097,152 =
        // 3,112,222,720 bytes. Counted as four dense layers then four MoE ones it was
        // 1,035,550,720 (stage 1 over by as much).
        let config = |only: &[u64]| {
            ModelConfig::from_value(&serde_json::json!({
                "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
                "hidden_size": 2048, "num_hidden_layers": 8, "num_attention_heads": 16,
                "num_key_value_heads": 16, "intermediate_size": 5632,
                "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
                "num_experts": 60, "num_experts_per_tok": 4, "decoder_sparse_step": 2,
                "mlp_only_layers": only, "vocab_size": 151936,
                "max_position_embeddings": 8192, "tie_word_embeddings": false,
                "torch_dtype": "bfloat16"}))
            .unwrap()
        };
        let c = config(&[]);
        assert_eq!(
            c.moe_layers,
            [false, true, false, true, false, true, false, true]
        );
        let (dense, moe, emb, rope) = (51_390_464, 570_558_464, 311_164_928, 8192 * 128 * 2);
        let first = 2 * (emb + 2 * dense + 2 * moe) + rope;
        assert_eq!(first, 3_112_222_720);
        let last = 2 * (2 * dense + 2 * moe + emb + 2048) + rope;
        assert_eq!(stage_weights_of("qwen2-moe-8", c, 2), vec![first, last]);
        // `mlp_only_layers` [1]: layer 1 dense too, MoE at 3, 5 and 7 only.
        let c = config(&[1]);
        assert_eq!(
            stage_weights_of("qwen2-moe-8", c, 2),
            vec![2 * (emb + 3 * dense + moe) + rope, last]
        );
    }

    #[test]
    fn pipeline_stages_hold_their_layers_and_the_smallest_wins() {
        let one = dry(Extras::default()).plan().unwrap();
        let two = dry(Extras {
            pipeline_parallel: 2,
            ..Extras::default()
        })
        .plan()
        .unwrap();
        // Half the layers per stage: a block holds 16 layers, not 32.
        assert_eq!(two.kv.block_bytes * 2, one.kv.block_bytes);
        assert!(two.kv.num_blocks > one.kv.num_blocks);
        assert!(
            two.notes
                .iter()
                .any(|n| n.contains("stage 1: layers 16..32")),
            "{:?}",
            two.notes
        );
    }

    #[test]
    fn one_stage_is_one_ranks_plan_and_the_fewest_blocks_is_the_deployments() {
        let pp = |stage| {
            dry(Extras::default()
                .with_pipeline_parallel(3)
                .with_pipeline_stage(stage))
            .plan()
        };
        let all = pp(None).unwrap();
        let stages: Vec<Plan> = (0..3).map(|i| pp(Some(i)).unwrap()).collect();
        // 32 layers on 3 stages: [11, 11, 10]; the first holds the embeddings, the last the
        // LM head, so their weights differ from the middle stage's.
        let blocks: Vec<u64> = stages.iter().map(|p| p.kv.num_blocks).collect();
        assert_eq!(blocks.iter().min(), Some(&all.kv.num_blocks), "{blocks:?}");
        assert_eq!(stages[2].kv.block_bytes * 11, stages[0].kv.block_bytes * 10);
        let w = |p: &Plan| p.consumers.bytes(ConsumerKind::Weights);
        assert!(w(&stages[0]) > w(&stages[1]) && w(&stages[2]) < w(&stages[0]));
        assert!(
            stages[1]
                .notes
                .iter()
                .any(|n| n.contains("stage 1 of 3 only")),
            "{:?}",
            stages[1].notes
        );
        let e = pp(Some(3)).unwrap_err().to_string();
        assert!(e.contains("stage 3 of 3 stages"), "{e}");
        // Each stage's plan says which rank it is; the whole deployment's says PP.
        let rank = stages[1].rank.expect("a stage's plan names its rank");
        assert_eq!(
            (rank.pipeline_parallel_rank, rank.pipeline_parallel_size),
            (1, 3)
        );
        assert_eq!(
            (stages[1].pipeline_parallel_size, all.pipeline_parallel_size),
            (3, 3)
        );
        assert!(all.rank.is_none());
        // Without pipeline parallelism, stage 0 is the whole model.
        let one = dry(Extras::default().with_pipeline_stage(Some(0)))
            .plan()
            .unwrap();
        assert_eq!(
            one.kv.num_blocks,
            dry(Extras::default()).plan().unwrap().kv.num_blocks
        );
    }

    #[test]
    fn draft_lora_and_offload_move_the_budget() {
        let base = dry(Extras::default()).plan().unwrap();
        let w = |p: &Plan| p.consumers.bytes(ConsumerKind::Weights);
        let draft = crate::presets::find("qwen2.5-0.5b-instruct")
            .unwrap()
            .config;
        let d = dry(Extras {
            draft: Some((draft, 3)),
            ..Extras::default()
        })
        .plan()
        .unwrap();
        assert!(w(&d) > w(&base) && d.kv.block_bytes > base.kv.block_bytes);
        let l = dry(Extras {
            lora: Some((4, 16)),
            cpu_offload: 2 << 30,
            ..Extras::default()
        })
        .plan()
        .unwrap();
        let c = crate::presets::find("llama-3.1-8b-instruct")
            .unwrap()
            .config;
        assert_eq!(w(&l), w(&base) + lora_bytes(&c, 1, 4, 16, 2) - (2 << 30));
    }
}
