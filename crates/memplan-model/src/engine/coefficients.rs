//! The figures a dry run fits on public start-up logs, per release group, for what the
//! engine measures at start-up and its code does not determine: the V1 sampler's peak per
//! logit, the non-torch growth by device class, communication buffers, the buffers the
//! allocator keeps, the graph pool's intercept and what the V2 runner's graph profiler measures
//! beyond the capture. Terms read from the engine's code (the V2 sampler, its per-request
//! state, the host token table on unified memory) are computed, not fitted, and are not here.
//!
//! Each release row of [`super::VLLM`] carries one [`Coefficients`] set; the plan's notes and
//! each estimate's basis name the set (`vLLM 0.29-0.34 coefficients`) and the logs behind it.
//! The figures fitted on logs of the validation corpus (`data/validation-logs.jsonl`) are
//! listed in [`FITS`] with the log each came from: a coefficient is the mean of its fits, and
//! the validation tables report every log that fitted one with the coefficient refitted
//! without it (leave-one-out), so a log never validates a figure fitted on itself.

use memplan_core::bytes::GIB;

const fn gib(x: f64) -> u64 {
    (x * GIB as f64) as u64
}

/// One release group's fitted figures (bytes unless said).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Coefficients {
    /// The releases these figures are used for, as notes name them (`vLLM 0.29-0.34`).
    pub set: &'static str,
    /// The logs and code the figures come from.
    pub fitted_on: &'static str,
    /// The V1 runner's dummy sampler: peak bytes per logit (rows x vocabulary): 3.5 fp32
    /// copies (logits, probabilities, sort buffers).
    pub sampler_v1_bytes_per_logit: u64,
    /// Non-torch growth on a Hopper/Blackwell datacenter GPU (kernel images, library handles).
    pub non_torch_datacenter: u64,
    /// Non-torch growth on every other GPU.
    pub non_torch_other: u64,
    /// Communication buffers with tensor parallelism on the NVSwitch class (NCCL NVLS).
    pub comm_nvls: u64,
    /// Communication buffers with tensor parallelism elsewhere (PCIe, NVLink without NVLS).
    pub comm_other: u64,
    /// Non-torch growth per stage with pipeline parallelism alone.
    pub pipeline_stage: u64,
    /// Buffers the allocator keeps besides the weights and the sampler state, counted where
    /// the release counts consumed memory (0.27+); `0` where it does not.
    pub kept_buffers: u64,
    /// The graph pool's fixed part (observed intercept of captured graph memory).
    pub graph_fixed: u64,
    /// What the V2 runner's graph profiler measures beyond the capture (0.29+, where it is
    /// subtracted); `0` where the V2 runner's graph memory is not subtracted.
    pub v2_graph_profiling: u64,
}

/// vLLM 0.19: every figure from its H100 profile runs (the shared corpus's six logs with
/// every figure printed and llm-d-planner's TP/PP sensitivity runs); the non-torch growth of
/// other GPUs from the 0.26.0 16 GB log (no 0.19 log of another GPU prints it).
pub const VLLM_019: Coefficients = Coefficients {
    set: "vLLM 0.19",
    fitted_on: "vLLM 0.19.0 H100 logs (sampler, datacenter non-torch, NVLS buffers, per-stage growth, graph intercept); other GPUs' non-torch growth from the 0.26.0 16 GB log and NCCL buffers without NVLS from an RTX 4090 TP 2 log",
    sampler_v1_bytes_per_logit: 14,
    non_torch_datacenter: GIB / 4,
    non_torch_other: gib(0.07),
    comm_nvls: gib(1.82),
    comm_other: gib(0.18),
    pipeline_stage: gib(0.07),
    kept_buffers: 0,
    graph_fixed: gib(0.35),
    v2_graph_profiling: 0,
};

/// vLLM 0.20 to 0.26: the same accounting (`weights + torch peak + non-torch increase`) and
/// the same V1 dummy sampler (`_dummy_sampler_run` builds the same metadata in 0.20.1 and
/// 0.26.0; 0.26 adds a warm-up call of `forward_native` on the same logits, sequential, so
/// the peak is one call's). The non-torch growth of non-datacenter GPUs is the 0.26.0 log's.
///
/// From 0.20 the worker sets up the distributed environment before its memory snapshot
/// (`v1/worker/gpu_worker.py` `Worker.init_device`: "Initialize the distributed environment
/// BEFORE taking memory snapshot"), so NCCL's and the custom all-reduce's buffers set up there
/// are outside what the profile run counts: without NVLS, tensor parallelism adds nothing
/// counted (a 0.28 Turing TP 2 log). NVLS buffers, which NCCL allocates at the first NVLS
/// collective (in the profile run), stay counted: no later datacenter log contradicts 0.19's.
pub const VLLM_020_026: Coefficients = Coefficients {
    set: "vLLM 0.20-0.26",
    fitted_on: "the vLLM 0.26.0 16 GB log (non-torch 0.07 GiB); no communication growth without NVLS (init_device sets the distributed environment up before its snapshot; a 0.28 Turing TP 2 log); no 0.20-0.26 log prints a datacenter GPU's non-torch, sampler or NVLS figures, so those are vLLM 0.19.0's H100 figures, the code they come from being unchanged",
    comm_other: 0,
    ..VLLM_019
};

/// vLLM 0.27 and 0.28: consumed accounting, so the buffers the allocator keeps count.
pub const VLLM_027_028: Coefficients = Coefficients {
    set: "vLLM 0.27-0.28",
    fitted_on: "kept buffers on the vLLM 0.27.1 RTX 4090 and 0.31.0 A100 logs; non-torch 0.07 GiB from the 0.26.0 16 GB log; no communication growth without NVLS (a 0.28 Turing TP 2 log); datacenter, sampler and NVLS figures vLLM 0.19.0's (no later log prints them)",
    kept_buffers: gib(0.07),
    ..VLLM_020_026
};

/// vLLM 0.29 to 0.34: every model on the V2 runner, whose graph memory is profiled and
/// subtracted.
pub const VLLM_029_034: Coefficients = Coefficients {
    set: "vLLM 0.29-0.34",
    fitted_on: "V2 graph profiler surplus on the vLLM 0.30.0 RTX 4070 Laptop and 0.31.0 A100 logs; kept buffers on the 0.27.1 RTX 4090 and 0.31.0 A100 logs; non-torch 0.07 GiB from the 0.26.0 16 GB log; no communication growth without NVLS (a 0.28 Turing TP 2 log); datacenter and NVLS figures vLLM 0.19.0's (no later log prints them)",
    v2_graph_profiling: gib(0.26),
    ..VLLM_027_028
};

/// SGLang: its static fraction holds weights and the KV pool only, so these figures never
/// reach its KV budget; the activation and graph terms it reports are vLLM 0.19's.
pub const SGLANG: Coefficients = Coefficients {
    set: "SGLang (vLLM 0.19's figures, outside the static fraction)",
    fitted_on: "vLLM 0.19.0 H100 logs; SGLang's KV budget does not depend on them",
    ..VLLM_019
};

/// A coefficient fitted on logs of the validation corpus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Term {
    /// [`Coefficients::non_torch_other`].
    NonTorchOther,
    /// [`Coefficients::kept_buffers`].
    KeptBuffers,
    /// [`Coefficients::v2_graph_profiling`].
    V2GraphProfiling,
    /// [`Coefficients::comm_other`] from 0.20 (`0`: nothing counted).
    CommOther,
    /// vLLM 0.19's H100 figures, fitted together on llm-d-planner's logs (the shared corpus):
    /// the V1 sampler's bytes per logit, the datacenter non-torch growth (the value tracked
    /// here), NVLS buffers, per-stage growth, the graph intercept. Not refitted per log.
    H100Figures,
}

impl Term {
    /// The coefficient's name in tables and messages.
    pub fn name(self) -> &'static str {
        match self {
            Term::NonTorchOther => "non-torch growth (non-datacenter GPUs)",
            Term::KeptBuffers => "kept buffers",
            Term::V2GraphProfiling => "V2 graph profiler surplus",
            Term::CommOther => "communication growth without NVLS (0.20+)",
            Term::H100Figures => {
                "vLLM 0.19 H100 figures (V1 sampler, datacenter non-torch, NVLS, graph intercept)"
            }
        }
    }

    /// The coefficient's bytes in `c`.
    pub fn get(self, c: &Coefficients) -> u64 {
        match self {
            Term::NonTorchOther => c.non_torch_other,
            Term::KeptBuffers => c.kept_buffers,
            Term::V2GraphProfiling => c.v2_graph_profiling,
            Term::CommOther => c.comm_other,
            Term::H100Figures => c.non_torch_datacenter,
        }
    }

    /// `c` with the coefficient set to `bytes` (a set that does not use it is unchanged).
    pub fn set(self, c: &mut Coefficients, bytes: u64) {
        let slot = match self {
            Term::NonTorchOther => &mut c.non_torch_other,
            Term::KeptBuffers => &mut c.kept_buffers,
            Term::V2GraphProfiling => &mut c.v2_graph_profiling,
            Term::CommOther => &mut c.comm_other,
            Term::H100Figures => &mut c.non_torch_datacenter,
        };
        if *slot != 0 {
            *slot = bytes;
        }
    }
}

/// One log's value of a fitted coefficient.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Fit {
    /// The coefficient.
    pub term: Term,
    /// A fragment of the corpus line's `source` that names the log (the llm-d-planner logs
    /// share one thread).
    pub log: &'static str,
    /// What the log gives for the coefficient, GiB.
    pub gib: f64,
    /// How the value was read from the log.
    pub how: &'static str,
}

/// Every fit on a corpus log; each coefficient of [`Term`] is the mean of its fits.
pub const FITS: &[Fit] = &[
    Fit {
        term: Term::H100Figures,
        log: "llm-d-incubation/llm-d-planner#205",
        gib: 0.25,
        how: "vLLM 0.19.0, H100 80GB, eight logs of the shared corpus with every figure printed: non-torch 0.24-0.25 GiB (the other figures in docs/model-validation.md)",
    },
    Fit {
        term: Term::NonTorchOther,
        log: "code index id 69421856836",
        gib: 0.07,
        how: "vLLM 0.26.0, 16 GB card: the post-start report's non-torch memory",
    },
    Fit {
        term: Term::KeptBuffers,
        log: "code index ids 70682754770",
        gib: 0.061,
        how: "vLLM 0.31.0, A100 80GB, Llama-3.1-8B: consumed 15.26 - weights 15.0 - non-torch 0.07 - V2 sampler state 0.13 GiB",
    },
    Fit {
        term: Term::KeptBuffers,
        log: "code index id 61815222665",
        gib: 0.078,
        how: "vLLM 0.27.1, RTX 4090, Qwen2.5-0.5B-Instruct: consumed 1.23 - weights 0.93 - non-torch 0.07 - V2 sampler state 0.15 GiB",
    },
    Fit {
        term: Term::V2GraphProfiling,
        log: "code index ids 70682754770",
        gib: 0.31,
        how: "vLLM 0.31.0, A100 80GB, Llama-3.1-8B: logged minus planned non-KV memory with the surplus at 0",
    },
    Fit {
        term: Term::V2GraphProfiling,
        log: "code index ids 71535514190",
        gib: 0.21,
        how: "vLLM 0.30.0, RTX 4070 Laptop, Qwen2.5-1.5B-Instruct: the same, its weights' 0.10 GiB above the architecture's count set aside",
    },
    Fit {
        term: Term::CommOther,
        log: "code index id 67109588529 (a Turing (sm_75) vLLM fork's campaign notes, 'macro gate' runs of 2026-09-07 on 24 GB cards: LLM(model=Qwen2.5-1.5B-Instruct, dtype='float16', max_model_len=4096, gpu_memory_utilization=0.9, enforce_eager=True, enable_prefix_caching=False, attention_backend='TRITON_ATTN'), tensor parallelism 2",
        gib: 0.0,
        how: "vLLM 0.28.1rc1 fork, 24 GB Turing, TP 2, Qwen2.5-1.5B-Instruct: consumed 1.71 - weights 1.5 = 0.21 GiB, less than non-torch, kept buffers and the V2 sampler state alone (0.29 GiB): no communication growth counted",
    },
];

/// The mean of `term`'s fits, leaving out the log whose source contains `without` (`None`
/// when no other fit remains).
pub fn refit(term: Term, without: Option<&str>) -> Option<u64> {
    let v: Vec<f64> = FITS
        .iter()
        .filter(|f| f.term == term && without.is_none_or(|w| !w.contains(f.log)))
        .map(|f| f.gib)
        .collect();
    (!v.is_empty()).then(|| (v.iter().sum::<f64>() / v.len() as f64 * GIB as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every set's fitted coefficient is the mean of its fits (within 0.005 GiB, the
    /// precision the logs print).
    #[test]
    fn coefficients_are_the_mean_of_their_fits() {
        for c in [VLLM_019, VLLM_020_026, VLLM_027_028, VLLM_029_034] {
            for t in [
                Term::NonTorchOther,
                Term::KeptBuffers,
                Term::V2GraphProfiling,
                Term::CommOther,
                Term::H100Figures,
            ] {
                let have = t.get(&c);
                // 0.19's communication figure comes from an older log, not these fits.
                if have == 0 || (t == Term::CommOther && c == VLLM_019) {
                    continue;
                }
                let want = refit(t, None).unwrap();
                assert!(have.abs_diff(want) < GIB / 200, "{} {t:?}", c.set);
            }
        }
        // Leaving a log out refits on the others; a term's only log leaves nothing.
        let without_a100 = refit(
            Term::KeptBuffers,
            Some("... code index ids 70682754770 ..."),
        );
        assert_eq!(without_a100, Some(gib(0.078)));
        assert_eq!(
            refit(Term::NonTorchOther, Some("code index id 69421856836")),
            None
        );
        let mut c = VLLM_019;
        Term::KeptBuffers.set(&mut c, 1);
        assert_eq!(c.kept_buffers, 0, "a set that does not count it keeps 0");
    }
}
