//! `--emit-args`: ready-to-paste engine flags that reproduce the plan, and only flags the
//! engine accepts. Where the engine cannot hold the planned cache, or would refuse a value,
//! the answer is an error saying so (a usage error, exit 2), never flags that do something
//! else. (The table, the SVG and the JSON are the planner's renderers:
//! `memplan_planner::plan::render`.)
//!
//! The rules, from the engines' own code:
//!
//! - vLLM 0.19: `--kv-cache-dtype` takes `auto` (the model dtype), `float16`, `bfloat16`,
//!   `fp8`, `fp8_e4m3`, `fp8_e5m2` (`CacheDType`, `vllm/config/cache.py`): no `float32` (a
//!   float32 cache is `auto` with `--dtype float32`), no int8. vLLM 0.34's `CacheDType` adds
//!   `int8_per_token_head` (int8 values with per-token-head scales, memplan's int8 layout):
//!   emitted from 0.34 on (the releases between were not checked, so they are refused rather
//!   than guessed).
//! - vLLM block sizes must be a multiple of 16 for its CUDA attention backends
//!   (`FlashAttentionBackend.get_supported_kernel_block_sizes` returns `MultipleOf(16)` in
//!   0.19 and 0.34, `vllm/v1/attention/backends/flash_attn.py`; FlashInfer 16, 32, 64; checked
//!   by `AttentionBackend.supports_block_size`, `vllm/v1/attention/backend.py`).
//! - vLLM's `--block-size` itself takes any positive whole number in every release these
//!   rules cover (`CacheConfig.block_size` in `vllm/config/cache.py`: `SkipValidation[int]`
//!   in 0.19.0 to 0.22.1, `int` with `Field(gt=0)` in 0.23.0 to 0.34.0, read from each
//!   release's wheel; 0.21.0 has none on PyPI). The `BlockSize` literal `[1, 8, 16, 32, 64,
//!   128, 256]` of earlier releases is gone, so the backends' multiple of 16 above is the
//!   check; a literal here would refuse sizes these releases run (48, 528).
//! - The block size is written (`--block-size`, SGLang's `--page-size`) only where one was
//!   given: `--block-size`, or the size a start-up log of the same engine ran with. A plan
//!   that took the release's default leaves it to the engine, which picks the same default
//!   again. A hybrid's block that memplan derived (the attention page aligned to the state
//!   page, such as 528) is vLLM's own result too, computed again at start-up
//!   (`HybridAttentionMambaModelConfig`, `vllm/model_executor/models/config.py`, in 0.19;
//!   `Platform._align_hybrid_block_size`, `vllm/platforms/interface.py`, from 0.20.0), which
//!   takes a `--block-size` only as a floor, and from 0.20.0 also as the kernel alignment: with
//!   prefix caching in `all` mode the block becomes a multiple of lcm(Mamba chunk, that size),
//!   so a 528 written back could move it. It is left out, and the plan's notes say so
//!   ([`block_note`]).
//! - vLLM requires `max_num_batched_tokens >= max_num_seqs` (`SchedulerConfig`,
//!   `vllm/config/scheduler.py`, 0.19 and 0.34).
//! - SGLang 0.5.23: `--kv-cache-dtype` takes `auto`, `fp8_e5m2`, `fp8_e4m3`, `mxfp8`, `bf16`,
//!   `bfloat16`, `nvfp4`, `fp4_mx_block16` (`sglang/srt/arg_groups/fields/model.py`): no
//!   float16 other than `auto` on a float16 model, no float32 other than `auto` with
//!   `--dtype float32`, no int8. `--page-size` is the block size.
//!
//! Flags that change the plan are emitted too: `--dtype` and `--quantization` when given,
//! `--enforce-eager` / `--disable-cuda-graph` for an eager plan, vLLM's
//! `--mamba-cache-dtype` and `--mamba-ssm-cache-dtype` when given, prefix caching as given.
//! SGLang takes the SSM state's dtype as `--mamba-ssm-dtype` (float32, bfloat16, float16:
//! `sglang/srt/arg_groups/fields/exec_.py` in 0.5.23, `server_args.py` in 0.5.14; 0.5.1 has
//! no such flag) and the conv state's only from the environment (`SGLANG_MAMBA_CONV_DTYPE`,
//! `srt/configs/mamba_utils.py` `mamba2_state_dtype`), so `--mamba-cache-dtype` is refused
//! for SGLang, and `--mamba-ssm-cache-dtype` too where the plan's rules are SGLang 0.5.1's.

use memplan::kv::{AttentionKind, KvDtype};
use memplan::Error;
use memplan_model::arch::state::MambaDtype;
use memplan_model::engine::EngineKind;
use memplan_planner::budget::{self, Request};
use memplan_planner::Plan;

use super::Engine;

impl Engine {
    /// The engine's name in the plan's `engine_args`.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Sglang => "sglang",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Engine::Vllm => "vLLM",
            Engine::Sglang => "SGLang",
        }
    }
}

/// What the flags say beyond the plan itself.
#[derive(Debug, Clone)]
pub struct Context {
    /// `--enforce-eager`.
    pub enforce_eager: bool,
    /// `--dtype` as given (`auto` when not).
    pub dtype: String,
    /// The dtype the engine loads the model in (`auto` resolved).
    pub model_dtype: KvDtype,
    /// Online quantization (`--quantization fp8`).
    pub quantization: Option<String>,
    /// vLLM's `--mamba-cache-dtype` (`None`: auto).
    pub mamba_cache_dtype: Option<MambaDtype>,
    /// vLLM's `--mamba-ssm-cache-dtype` (`None`: auto).
    pub mamba_ssm_cache_dtype: Option<MambaDtype>,
    /// vLLM's `--enable-prefix-caching` / `--no-enable-prefix-caching` (`None`: not given).
    pub prefix_caching: Option<bool>,
    /// Whether a count of sequences was given (`--max-num-seqs`, or a start-up log's): where
    /// not, the plan's is a default.
    pub max_num_seqs_given: bool,
    /// `--block-size` as given (`None`: not passed).
    pub block_size: Option<u32>,
    /// The block size a start-up log gave, and the engine that ran with it.
    pub log_block_size: Option<(u32, EngineKind)>,
    /// The engine release (`0.34`) the rules apply to.
    pub version: String,
    /// What the release multiplies the model's `--mem-fraction-static` by once started (SGLang
    /// 0.4.4 to 0.4.8, multimodal models: `EngineRules::static_fraction`); 1.0 elsewhere.
    pub fraction_cut: f64,
}

fn refuse(message: String) -> Error {
    Error::invalid("--emit-args", message)
}

/// Whether a `0.MINOR[.PATCH]` release is at least `0.minor`.
fn release_at_least(version: &str, minor: u32) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, m) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, m) >= (0, minor)
}

/// The engine's name for the planned KV-cache dtype.
fn kv_name(kv: KvDtype, c: &Context, e: Engine) -> Result<&'static str, Error> {
    let model = c.model_dtype;
    let int8 = e == Engine::Vllm && release_at_least(&c.version, 34);
    Ok(match (e, kv) {
        (_, KvDtype::Fp8E4m3) => "fp8_e4m3",
        (_, KvDtype::Fp8E5m2) => "fp8_e5m2",
        (_, KvDtype::Int8) if int8 => "int8_per_token_head",
        (_, k) if k == model => "auto",
        (Engine::Vllm, KvDtype::Bf16) | (Engine::Sglang, KvDtype::Bf16) => "bfloat16",
        (Engine::Vllm, KvDtype::F16) => "float16",
        (_, KvDtype::Int8) => {
            return Err(refuse(format!(
                "{} {} has no int8 KV cache{}; plan with --kv-cache-dtype fp8 (or auto)",
                e.label(),
                c.version,
                if e == Engine::Vllm {
                    " (int8_per_token_head: vLLM 0.34 on)"
                } else {
                    ""
                }
            )))
        }
        (_, k) => {
            return Err(refuse(format!(
                "{} cannot hold a {k} KV cache for a {model} model (its cache is the model dtype unless fp8{}); plan with --dtype {} or another --kv-cache-dtype",
                e.label(),
                if e == Engine::Vllm { ", float16 or bfloat16" } else { " or bfloat16" },
                match k {
                    KvDtype::F32 => "float32",
                    KvDtype::F16 => "float16",
                    _ => "bfloat16",
                }
            )))
        }
    })
}

/// The block size the engine was told, with where from: `--block-size`, or the size a
/// start-up log of the same engine ran with.
fn given_block(c: &Context, e: Engine) -> Option<(u32, &'static str)> {
    let kind = match e {
        Engine::Vllm => EngineKind::Vllm,
        Engine::Sglang => EngineKind::Sglang,
    };
    match (c.block_size, c.log_block_size) {
        (Some(b), _) => Some((b, "")),
        (None, Some((b, k))) if k == kind => Some((b, " (the log's)")),
        _ => None,
    }
}

/// Why `--emit-args vllm` writes no `--block-size` for a hybrid model's plan whose block
/// memplan derived (no block size given): vLLM derives the same block at start-up, and one
/// passed back is only the floor of its alignment. `None` where a block size is written, the
/// engine is not vLLM, or the model has no recurrent-state layers.
pub fn block_note(p: &Plan, c: &Context, e: Engine) -> Option<String> {
    let hybrid = p
        .kv_spec
        .groups
        .iter()
        .any(|g| matches!(g.attention, AttentionKind::State { .. }));
    (e == Engine::Vllm && hybrid && given_block(c, e).is_none()).then(|| {
        format!(
            "--emit-args vllm writes no --block-size: the plan's {}-token block is this hybrid's attention page aligned to its state page, which vLLM computes again at start-up; passed as --block-size it would be only the floor vLLM aligns from (and, with prefix caching in vLLM's `all` mode, could move the block)",
            p.kv_spec.block_size
        )
    })
}

/// Ready-to-paste flags that pin the planned KV cache; an error when the engine would refuse
/// them or could not reproduce the plan.
pub fn engine_args(p: &Plan, c: &Context, e: Engine) -> Result<String, Error> {
    let tp = p.tensor_parallel_size;
    let kv = kv_name(p.kv_spec.dtype, c, e)?;
    let seqs = p.max_num_seqs.unwrap_or(256);
    // The block size is emitted only where the engine was told one: `--block-size`, or the
    // size a log of this engine ran with. Otherwise the plan took the release's default (vLLM
    // `CacheConfig.block_size` left unset: the platform's, raised for hybrid models by
    // `_align_hybrid_block_size`; SGLang's `page_size` 1), which the engine picks again by
    // itself; a flag the user did not set would be one more thing to check, a hybrid's
    // aligned block passed back is only a floor vLLM aligns anew (see the module doc), and a
    // plan made by SGLang's rules has blocks of 1 token, which no vLLM CUDA backend takes.
    let given = given_block(c, e);
    let mut extra = String::new();
    if c.dtype != "auto" {
        extra.push_str(&format!(" --dtype {}", c.dtype));
    }
    if let Some(q) = &c.quantization {
        extra.push_str(&format!(" --quantization {q}"));
    }
    let mamba = [
        ("--mamba-cache-dtype", c.mamba_cache_dtype),
        ("--mamba-ssm-cache-dtype", c.mamba_ssm_cache_dtype),
    ];
    match e {
        Engine::Vllm => {
            for (flag, d) in mamba {
                if let Some(d) = d {
                    extra.push_str(&format!(" {flag} {d}"));
                }
            }
            let block = match given {
                Some((b, from)) if !b.is_multiple_of(16) => {
                    return Err(refuse(format!(
                        "vLLM's attention backends take block sizes that are multiples of 16 (FlashAttention: any multiple of 16; FlashInfer: 16, 32, 64); --block-size {b}{from} would be refused"
                    )))
                }
                Some((b, _)) => format!(" --block-size {b}"),
                None => String::new(),
            };
            let tokens = p.limits.max_num_batched_tokens;
            if tokens < seqs {
                // The count of sequences may be one nobody set (written since it is needed):
                // say so, rather than ask to lower a flag that was not passed.
                let (whence, fix) = match c.max_num_seqs_given {
                    true => ("", "lower --max-num-seqs"),
                    false => (
                        ", written since no --max-num-seqs was given",
                        "pass --max-num-seqs",
                    ),
                };
                return Err(refuse(format!(
                    "vLLM requires max-num-batched-tokens ({tokens}) >= max-num-seqs ({seqs}{whence}); raise --max-num-batched-tokens to {seqs} or more, or {fix} {tokens} or less"
                )));
            }
            if c.enforce_eager {
                extra.push_str(" --enforce-eager");
            }
            match c.prefix_caching {
                Some(true) => extra.push_str(" --enable-prefix-caching"),
                Some(false) => extra.push_str(" --no-enable-prefix-caching"),
                None => {}
            }
            Ok(format!(
                "--kv-cache-memory-bytes {} --max-model-len {} --max-num-seqs {seqs} --max-num-batched-tokens {tokens}{block} --tensor-parallel-size {tp} --kv-cache-dtype {kv}{extra}",
                p.kv_budget_bytes, p.limits.max_model_len,
            ))
        }
        Engine::Sglang => {
            if c.mamba_cache_dtype.is_some() {
                return Err(refuse(
                    "--mamba-cache-dtype is vLLM's flag; SGLang sets the conv state's dtype only from the environment (SGLANG_MAMBA_CONV_DTYPE), so memplan prints no SGLang flag for it (plan without it, or for vLLM)".into(),
                ));
            }
            if let Some(d) = c.mamba_ssm_cache_dtype {
                // The SGLang 0.5.1 to 0.5.13 row (its version reads "0.5"): 0.5.1 has no
                // `--mamba-ssm-dtype`, and the release that added it was not read.
                if c.version == "0.5" {
                    return Err(refuse(format!(
                        "--mamba-ssm-cache-dtype: SGLang takes it as --mamba-ssm-dtype from 0.5.14 on (0.5.1 has no such flag); these rules are SGLang {}'s (plan with --engine sglang@0.5.14 or later, or for vLLM)",
                        c.version
                    )));
                }
                extra.push_str(&format!(" --mamba-ssm-dtype {d}"));
            }
            if c.enforce_eager {
                extra.push_str(" --disable-cuda-graph");
            }
            // SGLang's prefix cache is its radix cache, on by default
            // (`srt/server_args.py` `--disable-radix-cache`).
            if c.prefix_caching == Some(false) {
                extra.push_str(" --disable-radix-cache");
            }
            // SGLang sizes its pool as `free after loading - total * (1 - fraction)`, with
            // `total` the free memory before loading, and then caps it at --max-total-tokens.
            // The fraction must therefore be large enough for the planned pool *plus* what the
            // engine holds besides the weights (its context, library workspaces); the planned
            // request covers that, so its fraction (rounded up) lets the pool reach the cap,
            // and the cap keeps it at the planned size. A plan made from the engine's own
            // readings before and after its weights (a measured start-up under
            // `StartCheck::PoolOfFreeAfterWeights`) carries the fraction whose pool by that
            // rule holds its cache (`Suggestions::engine_static_fraction`), which can be above
            // the request's share where others hold memory: that one is written.
            // Otherwise the request's share of the device: where the memory free at the start
            // was below the request, a plan by the older model of SGLang's rule
            // (`StartCheck::ShareOfFree`, the dry run's) is made within the request's share of
            // that free memory (`requested_bytes` below the request), and the engine, told the
            // request's share, takes it of the free memory itself; the plan's bytes over the
            // total would be taken of it twice. A fixed KV size's request is the plan's.
            // SGLang 0.4.4 to 0.4.8 cut a multimodal model's fraction once started
            // (`ModelRunner.__init__`): the fraction passed is the planned one over that cut.
            let request = match p.request {
                Request::KvCacheBytes(_) => p.requested_bytes,
                r => budget::requested_bytes(p.total_bytes, r).unwrap_or(p.requested_bytes),
            };
            let thousandths = match p.suggestions.engine_static_fraction {
                Some(f) => budget::fraction_flag_thousandths(f, c.fraction_cut),
                None => budget::fraction_thousandths(request, p.total_bytes, c.fraction_cut),
            };
            let frac = f64::from(thousandths) / 1000.0;
            let page = given.map_or(String::new(), |(b, _)| format!(" --page-size {b}"));
            Ok(format!(
                "--max-total-tokens {} --mem-fraction-static {:.3} --context-length {} --max-running-requests {seqs}{page} --tp-size {tp} --kv-cache-dtype {kv}{extra}",
                p.kv.tokens,
                frac,
                p.limits.max_model_len,
            ))
        }
    }
}
