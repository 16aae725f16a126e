//! [`Rank`]: where one process sits in a tensor- and pipeline-parallel deployment.
//!
//! An engine runs one process per GPU. Each process measures its own device and plans its own
//! KV cache; the plans are then combined ([`crate::plan::combine_ranks`]) and every rank maps the
//! combined size. A rank's place is its tensor-parallel rank within its pipeline stage and the
//! stage itself; the global rank follows vLLM's layout (`vllm/distributed/parallel_state.py`,
//! `initialize_model_parallel`: ranks are laid out `[pp][tp]`, so the global rank is
//! `pipeline_parallel_rank * tensor_parallel_size + tensor_parallel_rank`).

use std::fmt;

use memplan_core::{Error, Param, Result};
use serde::{Deserialize, Serialize};

/// One rank of a deployment: its tensor-parallel rank within its pipeline stage, and the
/// stage. Build one with [`Rank::new`] (and [`Rank::with_stage`]); [`Rank::SINGLE`] is a
/// one-GPU deployment. The field names are the plan's JSON keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Rank {
    /// This process's rank among the tensor-parallel ranks of its stage (0-based).
    pub tensor_parallel_rank: u64,
    /// Tensor-parallel ranks per pipeline stage.
    pub tensor_parallel_size: u64,
    /// This process's pipeline stage (0-based).
    pub pipeline_parallel_rank: u64,
    /// Pipeline stages.
    pub pipeline_parallel_size: u64,
}

impl Default for Rank {
    fn default() -> Self {
        Rank::SINGLE
    }
}

/// Ranks beyond this are not a deployment but a mistake (the largest public deployments run
/// thousands of GPUs; a size above this is refused before it can overflow anything).
pub const MAX_RANKS: u64 = 1 << 20;

fn check(param: Param, what: &str, rank: u64, size: u64) -> Result<()> {
    if size == 0 {
        return Err(Error::param(param, format!("the {what} size must be > 0")));
    }
    if size > MAX_RANKS {
        return Err(Error::param(
            param,
            format!("the {what} size {size} is beyond {MAX_RANKS}"),
        ));
    }
    if rank >= size {
        return Err(Error::param(
            param,
            format!("rank {rank} is not below the {what} size {size} (ranks count from 0)"),
        ));
    }
    Ok(())
}

impl Rank {
    /// A deployment of one GPU.
    pub const SINGLE: Rank = Rank {
        tensor_parallel_rank: 0,
        tensor_parallel_size: 1,
        pipeline_parallel_rank: 0,
        pipeline_parallel_size: 1,
    };

    /// Tensor-parallel rank `rank` of `size` (one pipeline stage). Errors: a size of 0 or
    /// beyond [`MAX_RANKS`], a rank not below the size.
    pub fn new(rank: u64, size: u64) -> Result<Rank> {
        check(Param::TensorParallel, "tensor-parallel", rank, size)?;
        Ok(Rank {
            tensor_parallel_rank: rank,
            tensor_parallel_size: size,
            ..Rank::SINGLE
        })
    }

    /// The same tensor-parallel rank in pipeline stage `stage` of `stages`.
    pub fn with_stage(self, stage: u64, stages: u64) -> Result<Rank> {
        check(Param::PipelineParallel, "pipeline-parallel", stage, stages)?;
        self.check_world(stages)?;
        Ok(Rank {
            pipeline_parallel_rank: stage,
            pipeline_parallel_size: stages,
            ..self
        })
    }

    fn check_world(&self, stages: u64) -> Result<()> {
        match self.tensor_parallel_size.checked_mul(stages) {
            Some(w) if w <= MAX_RANKS => Ok(()),
            _ => Err(Error::param(
                Param::PipelineParallel,
                format!(
                    "{} tensor-parallel ranks times {stages} stages is beyond {MAX_RANKS} ranks",
                    self.tensor_parallel_size
                ),
            )),
        }
    }

    /// Check a rank read from elsewhere (a plan's JSON): every field as [`Rank::new`] and
    /// [`Rank::with_stage`] check them.
    pub fn validate(&self) -> Result<()> {
        check(
            Param::TensorParallel,
            "tensor-parallel",
            self.tensor_parallel_rank,
            self.tensor_parallel_size,
        )?;
        check(
            Param::PipelineParallel,
            "pipeline-parallel",
            self.pipeline_parallel_rank,
            self.pipeline_parallel_size,
        )?;
        self.check_world(self.pipeline_parallel_size)
    }

    /// Every rank of the deployment (`tensor_parallel_size * pipeline_parallel_size`).
    pub fn world_size(&self) -> u64 {
        self.tensor_parallel_size * self.pipeline_parallel_size
    }

    /// The global rank: `pipeline_parallel_rank * tensor_parallel_size + tensor_parallel_rank`
    /// (vLLM's layout, see the module docs).
    pub fn global(&self) -> u64 {
        self.pipeline_parallel_rank * self.tensor_parallel_size + self.tensor_parallel_rank
    }

    /// Whether `other` belongs to the same deployment (same sizes).
    pub fn same_deployment(&self, other: &Rank) -> bool {
        self.tensor_parallel_size == other.tensor_parallel_size
            && self.pipeline_parallel_size == other.pipeline_parallel_size
    }
}

impl fmt::Display for Rank {
    /// `rank 3 of 4 (tensor 1 of 2, stage 1 of 2)` with pipeline stages, `rank 1 of 2`
    /// without, `rank 0 of 1` for one GPU.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {} of {}", self.global(), self.world_size())?;
        if self.pipeline_parallel_size > 1 {
            write!(
                f,
                " (tensor {} of {}, stage {} of {})",
                self.tensor_parallel_rank,
                self.tensor_parallel_size,
                self.pipeline_parallel_rank,
                self.pipeline_parallel_size
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_are_laid_out_stage_major() {
        let r = Rank::new(1, 2).unwrap().with_stage(1, 2).unwrap();
        assert_eq!((r.global(), r.world_size()), (3, 4));
        assert_eq!(r.to_string(), "rank 3 of 4 (tensor 1 of 2, stage 1 of 2)");
        assert_eq!(Rank::SINGLE.to_string(), "rank 0 of 1");
        assert!(r.validate().is_ok());
    }

    #[test]
    fn impossible_ranks_are_refused_naming_the_parameter() {
        for (rank, size) in [(0, 0), (2, 2), (0, MAX_RANKS + 1)] {
            let e = Rank::new(rank, size).unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::InvalidParam {
                        param: Param::TensorParallel,
                        ..
                    }
                ),
                "{e}"
            );
        }
        let e = Rank::new(0, 2).unwrap().with_stage(3, 2).unwrap_err();
        assert!(matches!(
            e,
            Error::InvalidParam {
                param: Param::PipelineParallel,
                ..
            }
        ));
        let e = Rank::new(0, MAX_RANKS)
            .unwrap()
            .with_stage(0, 2)
            .unwrap_err();
        assert!(e.to_string().contains("beyond"), "{e}");
        let bad = Rank {
            tensor_parallel_rank: 5,
            ..Rank::SINGLE
        };
        assert!(bad.validate().is_err());
    }
}
