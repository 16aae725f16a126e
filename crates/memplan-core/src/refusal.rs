//! The typed halves of two errors: [`Param`] names a planning parameter by concept (a front end
//! maps it to its own flag), and [`Refusal`] says why a plan does not fit and carries what still
//! helps (the utilisation that would fit, the longest max model length that fits).

use serde::Serialize;
use std::fmt;

use crate::bytes::fmt_bytes;

/// A planning parameter, named by concept. Library errors carry it
/// ([`Error::InvalidParam`](crate::Error::InvalidParam)); the command line maps it to its flag
/// (`Utilization` to `--gpu-memory-utilization`), an engine to its own option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Param {
    /// Fraction of the device the engine may use.
    Utilization,
    /// An absolute byte budget for everything.
    MemoryBudget,
    /// A fixed KV-cache size.
    KvCacheBytes,
    /// The device's total memory.
    DeviceTotal,
    /// The longest request, in tokens.
    MaxModelLen,
    /// Requests per step.
    MaxNumSeqs,
    /// Tokens per step.
    MaxNumBatchedTokens,
    /// Tensor-parallel ranks.
    TensorParallel,
    /// The batch sizes graphs are captured for.
    CaptureSizes,
    /// Tokens per KV block.
    BlockSize,
    /// The model's dtype.
    Dtype,
    /// The KV cache's dtype.
    KvCacheDtype,
    /// Weight quantization.
    Quantization,
    /// The graph-memory strategy.
    GraphStrategy,
    /// The device.
    Device,
    /// The per-rank plans to combine.
    Ranks,
    /// Pipeline-parallel stages.
    PipelineParallel,
    /// The engine release whose sizing rules apply (`vllm@0.19`).
    Engine,
    /// An engine's start-up log to read figures from.
    EngineLog,
    /// The model (a preset, a hub id, a directory, a file).
    Model,
    /// A simulation scenario (a shipped name or a file).
    Scenario,
    /// Memory the engine holds outside its allocator (context growth, library workspaces,
    /// communication buffers): vLLM's "non-torch memory", which a plan may be given in place
    /// of its own figure.
    NonTorchBytes,
}

impl Param {
    /// The concept in words, as errors print it.
    pub fn concept(self) -> &'static str {
        match self {
            Param::Utilization => "GPU memory utilisation",
            Param::MemoryBudget => "memory budget",
            Param::KvCacheBytes => "KV cache size",
            Param::DeviceTotal => "device total",
            Param::MaxModelLen => "max model length",
            Param::MaxNumSeqs => "requests per step",
            Param::MaxNumBatchedTokens => "tokens per step",
            Param::TensorParallel => "tensor-parallel ranks",
            Param::CaptureSizes => "graph capture sizes",
            Param::BlockSize => "KV block size",
            Param::Dtype => "model dtype",
            Param::KvCacheDtype => "KV cache dtype",
            Param::Quantization => "quantization",
            Param::GraphStrategy => "graph strategy",
            Param::Device => "device",
            Param::Ranks => "ranks",
            Param::PipelineParallel => "pipeline-parallel stages",
            Param::Engine => "engine release",
            Param::EngineLog => "engine start-up log",
            Param::Model => "model",
            Param::Scenario => "scenario",
            Param::NonTorchBytes => "non-torch memory",
        }
    }
}

impl fmt::Display for Param {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.concept())
    }
}

/// Why a plan cannot be satisfied, with what still helps. Carried by
/// [`Error::DoesNotFit`](crate::Error::DoesNotFit); its `Display` names concepts, and a front
/// end that wants its own wording (flags) matches on the variant.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Refusal {
    /// Free memory at start-up is below what the engine requests.
    FreeBelowRequested {
        /// Free bytes.
        free: u64,
        /// Device total.
        total: u64,
        /// Requested bytes.
        requested: u64,
        /// The request in words (`GPU memory utilisation 0.95`).
        request: String,
        /// Bytes this process's allocator holds, when known.
        held_by_allocator: Option<u64>,
    },
    /// The consumers (weights, activation, ...) leave no room for a KV cache in the requested
    /// memory, though they fit on the device.
    NoRoomForKv {
        /// Every consumer, `(name, bytes)`.
        consumers: Vec<(String, u64)>,
        /// Their sum.
        used: u64,
        /// Requested bytes.
        requested: u64,
        /// Device total.
        total: u64,
        /// The smallest utilisation (4 decimals) that leaves room for a KV cache, when at most 1.
        utilization_that_fits: Option<f64>,
        /// Free memory at the start, before the engine loaded anything, where the device read
        /// it. When it is below what `utilization_that_fits` would request, raising the
        /// utilisation cannot help: the rest of the device is held outside the engine.
        #[serde(skip_serializing_if = "Option::is_none")]
        free_at_start: Option<u64>,
    },
    /// The consumers exceed the device itself.
    ExceedsDevice {
        /// Every consumer, `(name, bytes)`.
        consumers: Vec<(String, u64)>,
        /// Their sum.
        used: u64,
        /// Device total.
        total: u64,
    },
    /// A fixed KV cache plus the consumers exceed the device.
    FixedKvExceedsDevice {
        /// The fixed KV-cache size.
        kv: u64,
        /// The consumers' sum.
        used: u64,
        /// Device total.
        total: u64,
    },
    /// One request of the max model length does not fit in the KV cache.
    RequestDoesNotFit {
        /// The max model length asked for.
        max_model_len: u64,
        /// Blocks one such request needs.
        blocks_per_request: u64,
        /// Blocks that fit.
        usable_blocks: u64,
        /// The KV cache's bytes.
        kv_bytes: u64,
        /// The longest max model length that fits, when at least one block does.
        max_model_len_fit: Option<u64>,
        /// What the room kept for the allocator's rounding of the cache's tensors took, where
        /// that is what stood in the way (see [`RoundingReserve`]).
        #[serde(skip_serializing_if = "Option::is_none")]
        rounding: Option<RoundingReserve>,
        /// The memory physically there when the plan was made, where that, not the request,
        /// is what stood in the way (see [`MemoryNowCap`]).
        #[serde(skip_serializing_if = "Option::is_none")]
        capped: Option<MemoryNowCap>,
    },
    /// The engine admits requests shorter than its pool where one of `max_model_len` does not
    /// fit ([`LongRequests::CapByPool`](crate::kv::LongRequests::CapByPool)), but the pool
    /// holds fewer tokens than the engine needs to start at all.
    PoolTooSmall {
        /// Tokens the pool holds.
        pool_tokens: u64,
        /// The fewest the engine starts with.
        least_tokens: u64,
        /// The KV cache's bytes.
        kv_bytes: u64,
        /// What the room kept for the allocator's rounding of the cache's tensors took, where
        /// that is what stood in the way (see [`RoundingReserve`]).
        #[serde(skip_serializing_if = "Option::is_none")]
        rounding: Option<RoundingReserve>,
        /// The memory physically there when the plan was made, where that, not the request,
        /// is what stood in the way (see [`MemoryNowCap`]).
        #[serde(skip_serializing_if = "Option::is_none")]
        capped: Option<MemoryNowCap>,
    },
    /// Capturing the engine's graphs ran out of device memory during profiling, before any KV
    /// cache existed: they cannot fit next to one either.
    GraphsDoNotFit {
        /// The batch size whose warm-up or capture failed.
        size: u32,
        /// Graphs captured before it in this phase.
        captured: usize,
        /// Graph sizes the engine captures.
        graphs: usize,
        /// Bytes the failing allocation asked for.
        requested: u64,
        /// Free memory before the phase, when the device reads it.
        free: Option<u64>,
    },
}

/// The room a measured plan keeps beside the KV cache for the engine's caching allocator
/// rounding each of the cache's allocations up on its own: carried by a refusal where that
/// room is what the cache lacked (the cache sized without it would start, or it left no
/// block), so the refusal names it rather than an unexplained empty cache.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RoundingReserve {
    /// Bytes left for the KV cache before the reserve.
    pub room: u64,
    /// Bytes of `room` kept for the rounding (`room` less the cache's bytes): the rounding the
    /// plan takes the allocations to need at most, up to `room`.
    pub reserve: u64,
    /// Allocations the engine makes for the cache, each rounded on its own.
    pub allocations: u64,
    /// The most the plan takes one allocation to be rounded up by: the allocator's granule
    /// as the plan keeps it (an expandable segment's page, where the allocations are packed).
    pub granule: u64,
    /// The most the plan takes every allocation's rounding to be, together (what power-of-two
    /// divisions add first included, where the allocator declares them).
    pub most: u64,
    /// The allocations in words (`a K and a V tensor for each of 34 layers, allocated apart`).
    pub layout: String,
    /// What would round the cache less, in words (an allocator configuration, an engine
    /// release that allocates fewer tensors); empty where the plan knows of nothing.
    pub fewer: String,
}

impl RoundingReserve {
    /// `: <room> was left for the KV cache, and the plan keeps <reserve> of it for ...`, the
    /// clause a refusal adds after what fits.
    fn write(&self, f: &mut dyn fmt::Write) -> fmt::Result {
        write!(
            f,
            ": {} was left for the KV cache, and the plan keeps {} of it for the caching allocator's rounding of the cache's {} allocations ({}), each of which the allocator's granule may round up by as much as {} ({} for all of them)",
            fmt_bytes(self.room),
            fmt_bytes(self.reserve.min(self.room)),
            self.allocations,
            self.layout,
            fmt_bytes(self.granule),
            fmt_bytes(self.most)
        )
    }

    /// What lowers the reserve, as the end of a refusal's remedies.
    fn write_remedy(&self, f: &mut dyn fmt::Write) -> fmt::Result {
        if self.fewer.is_empty() {
            return Ok(());
        }
        write!(f, "; or have the cache rounded less: {}", self.fewer)
    }
}

/// The memory physically there when the plan was made (what a free reading, a device-wide
/// reading or an allocation probe found, less what the engine still takes beside the cache:
/// its activation peak, graphs still to capture) capped the KV cache below what the request's
/// budget left it: carried by a refusal where the budget alone would have held a cache the
/// engine starts with, so the refusal says that a larger share of the device cannot help
/// (other processes hold the rest) instead of asking for one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryNowCap {
    /// Bytes the request's budget left the KV cache.
    pub budget: u64,
    /// Bytes the memory there left it.
    pub cap: u64,
    /// What found the memory there, in words (`driver free memory`, `an allocation probe`).
    pub source: String,
}

impl MemoryNowCap {
    /// `; the memory there now ...`, the clause a refusal adds after what fits.
    fn write(&self, f: &mut dyn fmt::Write) -> fmt::Result {
        write!(
            f,
            "; the memory physically there when the plan was made ({}) leaves the KV cache {}, less than the {} the request's budget leaves it, once the engine's activation peak, the graphs it still captures and what the reading may be off by are counted: memory held outside this engine (other processes) takes the rest of the request's share",
            self.source,
            fmt_bytes(self.cap),
            fmt_bytes(self.budget)
        )
    }

    /// The remedy where the memory there, not the request, is short.
    fn write_remedy(&self, f: &mut dyn fmt::Write, name: &dyn Fn(Param) -> String) -> fmt::Result {
        write!(
            f,
            "free the memory held outside this engine or start where it is free (a larger {} cannot help), or ",
            name(Param::Utilization),
        )?;
        write_shrink_peak(f, name)
    }
}

/// `shrink what else the engine holds ...`: the remedy that lowers the other consumers (the
/// activation peak grows with the tokens per step), the end of every remedy where not even one
/// block fits.
fn write_shrink_peak(f: &mut dyn fmt::Write, name: &dyn Fn(Param) -> String) -> fmt::Result {
    write!(
        f,
        "shrink what else the engine holds (a smaller {} lowers the activation peak)",
        name(Param::MaxNumBatchedTokens)
    )
}

/// The consumers' sum in words. A consumer is named as the plan's JSON names it, except the
/// memory outside the engine's allocator (`non_allocator`), which is named as what sets it
/// ([`Param::NonTorchBytes`]: the concept, with the front end's name where it has its own).
fn parts(consumers: &[(String, u64)], used: u64, name: &dyn Fn(Param) -> String) -> String {
    let v: Vec<String> = consumers
        .iter()
        .map(|(n, b)| {
            let n = match n.as_str() {
                "non_allocator" => {
                    let p = Param::NonTorchBytes;
                    match name(p) {
                        own if own != p.concept() => format!("{} ({own})", p.concept()),
                        _ => p.concept().to_string(),
                    }
                }
                _ => n.clone(),
            };
            format!("{n} {}", fmt_bytes(*b))
        })
        .collect();
    format!("{} = {}", v.join(" + "), fmt_bytes(used))
}

impl Refusal {
    /// The refusal in words, each parameter that would help named by `name`: a front end
    /// passes its own names (flags), `Display` passes the concepts ([`Param::concept`]).
    pub fn describe(&self, name: &dyn Fn(Param) -> String) -> String {
        let mut s = String::new();
        // Writing into a String cannot fail.
        let _ = self.write(&mut s, name);
        s
    }

    fn write(&self, f: &mut dyn fmt::Write, name: &dyn Fn(Param) -> String) -> fmt::Result {
        match self {
            Refusal::FreeBelowRequested {
                free,
                total,
                requested,
                request,
                held_by_allocator,
            } => {
                let used = total.saturating_sub(*free);
                write!(
                    f,
                    "free memory on the device ({} of {}) is less than requested ({request}, {}); ",
                    fmt_bytes(*free),
                    fmt_bytes(*total),
                    fmt_bytes(*requested)
                )?;
                match held_by_allocator {
                    Some(r) => write!(f, "{} is in use: {} held by this process's allocator, {} outside it (other processes, driver contexts, graphics)", fmt_bytes(used), fmt_bytes((*r).min(used)), fmt_bytes(used.saturating_sub(*r)))?,
                    None => write!(f, "{} is in use by other processes, driver contexts or graphics (this process holds no allocator memory yet)", fmt_bytes(used))?,
                }
                f.write_str("; lower the request or free the memory")
            }
            Refusal::NoRoomForKv {
                consumers,
                used,
                requested,
                total,
                utilization_that_fits,
                free_at_start,
            } => {
                write!(
                    f,
                    "no memory left for the KV cache: {} exceeds the requested {} by {}; ",
                    parts(consumers, *used, name),
                    fmt_bytes(*requested),
                    fmt_bytes(used.saturating_sub(*requested))
                )?;
                match (utilization_that_fits, free_at_start) {
                    // Raising the utilisation would request more than is free: the memory the
                    // engine lacks is held outside it, so say that instead of a flag that
                    // would only move the refusal to the free-memory check.
                    (_, Some(free)) if *used >= *free => write!(
                        f,
                        "only {} of the device's {} was free at the start ({} held by other processes, driver contexts or graphics), less than the engine needs before any KV cache; free that memory, or use more tensor-parallel ranks, a quantized model or a larger device",
                        fmt_bytes(*free),
                        fmt_bytes(*total),
                        fmt_bytes(total.saturating_sub(*free))
                    ),
                    (Some(u), _) => write!(
                        f,
                        "{} {u:.4} or more would leave room for a KV cache",
                        name(Param::Utilization)
                    ),
                    (None, _) => f.write_str("even the whole device leaves no room for a KV cache"),
                }
            }
            Refusal::ExceedsDevice {
                consumers,
                used,
                total,
            } => write!(
                f,
                "the model does not fit on this device: {} exceeds the device total {} by {}; use more tensor-parallel ranks, a quantized model or a larger device",
                parts(consumers, *used, name),
                fmt_bytes(*total),
                fmt_bytes(used.saturating_sub(*total))
            ),
            Refusal::FixedKvExceedsDevice { kv, used, total } => write!(
                f,
                "a KV cache of {} plus {} for everything else exceeds the device total {}",
                fmt_bytes(*kv),
                fmt_bytes(*used),
                fmt_bytes(*total)
            ),
            Refusal::RequestDoesNotFit {
                max_model_len,
                blocks_per_request,
                usable_blocks,
                kv_bytes,
                max_model_len_fit,
                rounding,
                capped,
            } => {
                write!(
                    f,
                    "one request of {max_model_len} tokens needs {blocks_per_request} KV blocks but only {usable_blocks} fit in {}",
                    fmt_bytes(*kv_bytes)
                )?;
                if let Some(r) = rounding {
                    r.write(f)?;
                }
                if let Some(c) = capped {
                    c.write(f)?;
                }
                f.write_str("; ")?;
                match (max_model_len_fit, capped) {
                    (Some(n), _) => write!(
                        f,
                        "the longest {} that fits is {n}",
                        name(Param::MaxModelLen)
                    )?,
                    (None, Some(c)) => {
                        f.write_str("not even one block fits: ")?;
                        c.write_remedy(f, name)?
                    }
                    // The KV cache needs more memory, from whichever parameter sets it, or the
                    // other consumers less.
                    (None, None) => {
                        write!(
                            f,
                            "not even one block fits: give the KV cache more memory ({} or {}, or a larger device) or ",
                            name(Param::Utilization),
                            name(Param::KvCacheBytes),
                        )?;
                        write_shrink_peak(f, name)?
                    }
                }
                rounding.as_ref().map_or(Ok(()), |r| r.write_remedy(f))
            }
            Refusal::PoolTooSmall {
                pool_tokens,
                least_tokens,
                kv_bytes,
                rounding,
                capped,
            } => {
                write!(
                    f,
                    "the KV cache's {} hold a pool of {pool_tokens} tokens, fewer than the {least_tokens} the engine needs to start (it admits requests shorter than its pool, but not from a pool this small)",
                    fmt_bytes(*kv_bytes)
                )?;
                if let Some(r) = rounding {
                    r.write(f)?;
                }
                if let Some(c) = capped {
                    c.write(f)?;
                }
                f.write_str(if rounding.is_some() || capped.is_some() {
                    "; "
                } else {
                    ": "
                })?;
                match capped {
                    Some(c) => c.write_remedy(f, name)?,
                    None => write!(
                        f,
                        "give the KV cache more memory ({} or {}, or a larger device)",
                        name(Param::Utilization),
                        name(Param::KvCacheBytes)
                    )?,
                }
                rounding.as_ref().map_or(Ok(()), |r| r.write_remedy(f))
            }
            Refusal::GraphsDoNotFit {
                size,
                captured,
                graphs,
                requested,
                free,
            } => Self::write_graphs(f, (*size, *captured, *graphs, *requested, *free), name),
        }
    }
}

impl Refusal {
    fn write_graphs(
        f: &mut dyn fmt::Write,
        (size, captured, graphs, requested, free): (u32, usize, usize, u64, Option<u64>),
        name: &dyn Fn(Param) -> String,
    ) -> fmt::Result {
        write!(
            f,
            "the engine's graphs do not fit: capturing batch size {size} (after {captured} of {graphs} sizes) could not allocate {}",
            fmt_bytes(requested)
        )?;
        if let Some(free) = free {
            write!(f, " with {} free before the graph phase", fmt_bytes(free))?;
        }
        write!(
            f,
            ", and the KV cache has yet to be allocated; capture fewer or smaller sizes ({}), run eagerly, or give the engine more memory",
            name(Param::CaptureSizes)
        )
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe(&|p| p.concept().to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_room() -> Refusal {
        Refusal::NoRoomForKv {
            consumers: vec![
                ("weights".into(), 3 << 30),
                ("non_allocator".into(), 1 << 30),
            ],
            used: 4 << 30,
            requested: 2 << 30,
            total: 8 << 30,
            utilization_that_fits: Some(0.5001),
            free_at_start: None,
        }
    }

    fn reserve(fewer: &str) -> RoundingReserve {
        RoundingReserve {
            room: 3 << 29,
            reserve: 3 << 29,
            allocations: 68,
            granule: 40 << 20,
            most: 68 * (40 << 20),
            layout: "a K and a V tensor for each of 34 layers".into(),
            fewer: fewer.into(),
        }
    }

    #[test]
    fn a_refusal_names_the_rounding_reserve_that_took_the_room() {
        let r = Refusal::RequestDoesNotFit {
            max_model_len: 8192,
            blocks_per_request: 902,
            usable_blocks: 0,
            kv_bytes: 0,
            max_model_len_fit: None,
            rounding: Some(reserve("expandable segments")),
            capped: None,
        };
        let text = r.to_string();
        assert!(
            text.contains("only 0 fit in 0 B: 1.50 GiB was left for the KV cache, and the plan keeps 1.50 GiB of it for the caching allocator's rounding of the cache's 68 allocations (a K and a V tensor for each of 34 layers), each of which the allocator's granule may round up by as much as 40.00 MiB (2.66 GiB for all of them); not even one block fits"),
            "{text}"
        );
        assert!(
            text.ends_with("; or have the cache rounded less: expandable segments"),
            "{text}"
        );
        // An engine that starts with a shorter pool: its own rule, the reserve named; nothing
        // to suggest, nothing said.
        let r = Refusal::PoolTooSmall {
            pool_tokens: 0,
            least_tokens: 2,
            kv_bytes: 0,
            rounding: Some(reserve("")),
            capped: None,
        };
        let text = r.to_string();
        assert!(
            text.contains("fewer than the 2 the engine needs to start (it admits requests shorter than its pool, but not from a pool this small): 1.50 GiB was left"),
            "{text}"
        );
        assert!(
            text.ends_with("for all of them); give the KV cache more memory (GPU memory utilisation or KV cache size, or a larger device)"),
            "{text}"
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["rounding"]["most"], 68u64 * (40 << 20), "{json}");
        // Without a reserve, the JSON has no `rounding` and the message is as it was.
        let r = Refusal::PoolTooSmall {
            pool_tokens: 1,
            least_tokens: 2,
            kv_bytes: 1 << 20,
            rounding: None,
            capped: None,
        };
        assert!(serde_json::to_value(&r).unwrap().get("rounding").is_none());
        assert!(r
            .to_string()
            .contains("pool this small): give the KV cache"));
    }

    #[test]
    fn a_pool_the_memory_there_left_too_small_asks_for_that_memory_not_a_larger_share() {
        let r = Refusal::PoolTooSmall {
            pool_tokens: 0,
            least_tokens: 2,
            kv_bytes: 0,
            rounding: None,
            capped: Some(MemoryNowCap {
                budget: 3 << 30,
                cap: 0,
                source: "driver free memory".into(),
            }),
        };
        let text = r.to_string();
        assert!(
            text.contains("pool this small); the memory physically there when the plan was made (driver free memory) leaves the KV cache 0 B, less than the 3.00 GiB the request's budget leaves it"),
            "{text}"
        );
        assert!(
            text.contains(
                "the rest of the request's share; free the memory held outside this engine"
            ),
            "{text}"
        );
        assert!(!text.contains("give the KV cache more memory"), "{text}");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["capped"]["budget"], 3u64 << 30, "{json}");
        assert_eq!(json["capped"]["source"], "driver free memory", "{json}");
    }

    #[test]
    fn the_memory_outside_the_allocator_is_named_as_what_sets_it() {
        let r = no_room();
        let text = r.to_string();
        assert!(
            text.contains("weights 3.00 GiB + non-torch memory 1.00 GiB = 4.00 GiB"),
            "{text}"
        );
        let flags = r.describe(&|p| match p {
            Param::NonTorchBytes => "--non-torch-bytes".into(),
            p => p.concept().into(),
        });
        assert!(
            flags.contains("+ non-torch memory (--non-torch-bytes) 1.00 GiB ="),
            "{flags}"
        );
        assert!(!flags.contains("non_allocator"), "{flags}");
        // The JSON keeps the plan's own name.
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains("\"non_allocator\""), "{json}");
    }
}
