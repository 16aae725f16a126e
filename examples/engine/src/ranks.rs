// Many ranks in many processes, on the facade alone: the recipe of
// docs/measurement-protocol.md ("Many ranks").
//
// `--ranks N [--stages M] [DEVICE...]` starts N x M worker processes of this binary, one per
// rank, each on its own (simulated) GPU. Every worker runs the measured start-up of its rank up
// to its plan, publishes the plan's JSON, waits for every rank's, combines them (the same
// combination on every rank) and maps the fewest blocks of any rank in its own block layout.
// The exchange is files in a fresh directory: a real engine uses its own all-gather
// (torch.distributed, MPI, a Ray collective); what travels is the same `memplan.plan/1` JSON.
// The launcher then checks that every rank mapped the combined number of blocks.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use memplan::{Rank, Session};

use crate::toy::ToyEngine;
use crate::{kv_spec, limits, REQUEST};

/// The argument that makes this binary one rank's worker.
pub const WORKER: &str = "--rank-worker";

/// How long a worker waits for the other ranks' plans, and the launcher for its workers.
const DEADLINE: Duration = Duration::from_secs(120);

type Res<T> = Result<T, Box<dyn Error>>;

/// The layers of `rank`'s pipeline stage out of `layers` (vLLM `get_pp_indices`,
/// `vllm/distributed/utils.py`: `layers / stages` each, the remainder one more each for the
/// stages before the last, counting back from it).
pub fn stage_layers(layers: u32, rank: Rank) -> u32 {
    let (pp, stage) = (
        rank.pipeline_parallel_size as u32,
        rank.pipeline_parallel_rank as u32,
    );
    let (base, rest) = (layers / pp, layers % pp);
    // Stages pp-1-rest .. pp-2 get one more layer each.
    let extra = stage + 1 < pp && stage + 1 + rest >= pp;
    base + u32::from(extra)
}

/// A directory for the exchange, removed when dropped.
struct Exchange(PathBuf);

impl Exchange {
    fn new() -> Res<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .subsec_nanos();
        let dir =
            std::env::temp_dir().join(format!("memplan-ranks-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&dir)?;
        Ok(Exchange(dir))
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn plan_file(dir: &Path, global: u64) -> PathBuf {
    dir.join(format!("plan-{global}.json"))
}

fn mapped_file(dir: &Path, global: u64) -> PathBuf {
    dir.join(format!("mapped-{global}.txt"))
}

/// Write `text` so that readers see all of it or nothing (write aside, then rename).
fn publish(path: &Path, text: &str) -> Res<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// The all-gather: wait until every rank published its plan, then read them all.
fn all_gather(dir: &Path, world: u64) -> Res<Vec<String>> {
    let start = Instant::now();
    loop {
        if dir.join("abort").exists() {
            return Err("another rank failed".into());
        }
        if (0..world).all(|g| plan_file(dir, g).exists()) {
            return (0..world)
                .map(|g| Ok(std::fs::read_to_string(plan_file(dir, g))?))
                .collect();
        }
        if start.elapsed() > DEADLINE {
            return Err(
                format!("the other ranks' plans did not arrive within {DEADLINE:?}").into(),
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One rank: `TP_RANK TP PP_RANK PP DIR DEVICE`.
pub fn worker(args: &[String]) -> Res<()> {
    let [tp_rank, tp, pp_rank, pp, dir, device] = args else {
        return Err(format!("{WORKER} TP_RANK TP PP_RANK PP DIR DEVICE").into());
    };
    let rank =
        Rank::new(tp_rank.parse()?, tp.parse()?)?.with_stage(pp_rank.parse()?, pp.parse()?)?;
    let dir = Path::new(dir);
    let run = || -> Res<()> {
        // The start-up, through memplan, up to the plan.
        let dev = memplan::open(device)?;
        let mut engine = ToyEngine::sharded(dev.clone(), rank.world_size());
        let mut s = Session::start_for(&dev, &mut engine, REQUEST)?
            .with_rank(rank)
            .with_kv(&kv_spec(rank), limits());
        s.check_request(REQUEST)?;
        s.load_weights(ToyEngine::load)?;
        s.profile_run(|e| e.forward(limits().max_num_batched_tokens))?;
        s.capture_graphs()?;
        let own = s.plan(REQUEST, &kv_spec(rank), limits())?;

        // Exchange the plans, combine, map the fewest blocks of any rank.
        publish(&plan_file(dir, rank.global()), &own.to_json())?;
        let all = all_gather(dir, rank.world_size())?;
        let combined = memplan::combine_json(&all)?;
        let kv = s.into_kv_cache(&combined)?;
        let bytes = match &kv.range {
            Some(range) => range.mapped_bytes(),
            None => engine.alloc(kv.bytes)?.bytes(),
        };
        println!(
            "{rank} on {device}: planned {} blocks, maps {} ({bytes} bytes, {})",
            own.kv.num_blocks,
            kv.num_blocks,
            if kv.range.is_some() {
                "mapped where its graphs point"
            } else {
                "allocated"
            }
        );
        publish(
            &mapped_file(dir, rank.global()),
            &format!("{} {}", kv.num_blocks, kv.bytes),
        )
    };
    run().map_err(|e| {
        let _ = std::fs::write(dir.join("abort"), "");
        format!("{rank}: {e}").into()
    })
}

/// Wait for every worker; on a failure or the deadline, tell the others and stop them.
fn wait_all(children: &mut [Child], dir: &Path) -> Res<()> {
    let start = Instant::now();
    let mut done = vec![false; children.len()];
    while done.iter().any(|d| !d) {
        for (i, c) in children.iter_mut().enumerate() {
            if done[i] {
                continue;
            }
            if let Some(status) = c.try_wait()? {
                done[i] = true;
                if !status.success() {
                    let _ = std::fs::write(dir.join("abort"), "");
                    stop(children);
                    return Err(format!("rank {i} failed ({status})").into());
                }
            }
        }
        if start.elapsed() > DEADLINE {
            stop(children);
            return Err(format!("the ranks did not finish within {DEADLINE:?}").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn stop(children: &mut [Child]) {
    for c in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// `--ranks N [--stages M] [DEVICE...]`: one device for every rank, one per rank, or none
/// (each rank on `sim:rtx4090`, the last on `sim:l4`: a mixed machine, so one rank limits).
pub fn launch(args: &[String]) -> Res<()> {
    let mut tp = 0u64;
    let mut pp = 1u64;
    let mut devices = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--ranks" => tp = it.next().ok_or("--ranks N")?.parse()?,
            "--stages" => pp = it.next().ok_or("--stages M")?.parse()?,
            d => devices.push(d.to_string()),
        }
    }
    let world = Rank::new(0, tp)?.with_stage(0, pp)?.world_size();
    let device_of = |g: u64| match devices.len() {
        0 if g + 1 == world && world > 1 => "sim:l4".to_string(),
        0 => "sim:rtx4090".to_string(),
        1 => devices[0].clone(),
        _ => devices[g as usize].clone(),
    };
    if devices.len() > 1 && devices.len() as u64 != world {
        return Err(format!(
            "{world} ranks need 1 or {world} devices, not {}",
            devices.len()
        )
        .into());
    }
    let ex = Exchange::new()?;
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for stage in 0..pp {
        for r in 0..tp {
            let g = stage * tp + r;
            let dir = ex.0.to_string_lossy().into_owned();
            let spawned = Command::new(&exe)
                .arg(WORKER)
                .args([r, tp, stage, pp].map(|n| n.to_string()))
                .args([dir, device_of(g)])
                .spawn();
            match spawned {
                Ok(c) => children.push(c),
                Err(e) => {
                    stop(&mut children);
                    return Err(e.into());
                }
            }
        }
    }
    wait_all(&mut children, &ex.0)?;

    // What every rank mapped, against the combination of every rank's plan.
    let plans = (0..world)
        .map(|g| std::fs::read_to_string(plan_file(&ex.0, g)))
        .collect::<Result<Vec<_>, _>>()?;
    let combined = memplan::combine_json(&plans)?;
    let ranks = combined
        .ranks
        .as_ref()
        .ok_or("the combined plan has no ranks")?;
    for r in &ranks.per_rank {
        let g = r.rank.global();
        let text = std::fs::read_to_string(mapped_file(&ex.0, g))?;
        let want = format!("{} {}", ranks.num_blocks, r.mapped_bytes);
        if text != want {
            return Err(
                format!("rank {g} mapped {text:?}, the combined plan says {want:?}").into(),
            );
        }
    }
    let limiting = match ranks.limiting {
        Some(i) => format!(
            "the fewest, those of {} on {}",
            ranks.per_rank[i].rank,
            ranks.per_rank[i].device.as_deref().unwrap_or("?")
        ),
        None => "every rank fits the same".into(),
    };
    println!(
        "{world} ranks (tensor-parallel {tp}, pipeline stages {pp}) in {world} processes: every rank maps {} blocks ({limiting}); KV cache {} tokens",
        ranks.num_blocks, combined.kv_cache_tokens
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_split_layers_as_vllm() {
        let split = |layers, pp| -> Vec<u32> {
            (0..pp)
                .map(|s| stage_layers(layers, Rank::new(0, 1).unwrap().with_stage(s, pp).unwrap()))
                .collect()
        };
        // vLLM get_pp_indices: the remainder goes to the stages before the last.
        assert_eq!(split(80, 3), vec![27, 27, 26]);
        assert_eq!(split(28, 2), vec![14, 14]);
        assert_eq!(split(28, 1), vec![28]);
        assert_eq!(split(30, 4), vec![7, 8, 8, 7]);
    }
}
