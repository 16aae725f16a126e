//! Scenarios written outside the repository, of the kinds the shipped ones do not cover, run
//! the way `memplan simulate --scenario FILE --strategy auto --json` runs them (the same library
//! call), over several seeds: the automatic choice never runs out of memory, gets 99% of the
//! oracle where it measured the graph memory, or refuses start-up with a clear reason when
//! nothing fits.
//!
//! Memory other processes hold where the free reading cannot see it: the planner bounds the
//! KV cache by the device-wide reading, or, where the device has none, names the blind spot
//! and checks the plan with an allocation probe.

use memplan_planner::{PhysicalCheck, StrategyKind};
use memplan_testbed::{simulate_seeded, StrategyArg};

fn scenario(
    name: &str,
    device: &str,
    request: &str,
    model: &str,
    graphs: &str,
    extra: &str,
) -> String {
    format!(
        "name = \"{name}\"\ndevice = \"{device}\"\n{extra}\n[request]\n{request}\n\n[model]\n{model}\n\n\
         [kv]\ndtype = \"bf16\"\nlayers = 28\nkv_heads = 4\nhead_dim = 128\nmax_model_len = 32768\n\n[graphs]\n{graphs}\n"
    )
}

const SMALL_MODEL: &str =
    "weights = \"3GiB\"\nweight_tensors = 300\nactivation_peak = \"1.2GiB\"\nworkspace = \"128MiB\"";
const GRAPHS: &str =
    "max_capture_size = 256\nkernel_nodes = 96\nintermediate_per_token = \"128KiB\"\nwarmup_per_token = \"256KiB\"";

fn write(name: &str, text: &str) -> std::path::PathBuf {
    // Scratch space cargo gives integration tests (inside the target directory), per process.
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("memplan-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{name}.toml"));
    std::fs::write(&file, text).unwrap();
    file
}

/// The automatic choice's plan on seed 0 names the blind spot and was checked by a probe.
fn names_the_blind_spot(name: &str, text: &str) {
    let file = write(name, text);
    let r = simulate_seeded(file.to_str().unwrap(), StrategyArg::Auto, 0).unwrap();
    let plan = r.runs[0].plan.as_ref().expect("a plan");
    assert!(
        plan.warnings
            .iter()
            .any(|w| w.code() == "other_processes_unseen"),
        "{:?}",
        plan.warnings
    );
    assert_eq!(plan.physical_check, Some(PhysicalCheck::Probe));
    assert!(
        plan.capped_by_free_bytes.is_some(),
        "the probe found less than the budget"
    );
}

/// Run a scenario file on seeds 0..n with the automatic choice; every failure as a line.
fn check(name: &str, text: &str, seeds: u64) -> Vec<String> {
    let file = write(name, text);
    let mut bad = Vec::new();
    for seed in 0..seeds {
        let r = simulate_seeded(file.to_str().unwrap(), StrategyArg::Auto, seed).unwrap();
        let json = serde_json::to_string(&r).expect("the report serialises");
        assert!(json.contains("\"runs\""));
        let a = &r.runs[0];
        if let Some(oom) = &a.oom {
            // Weights that do not fit fail while loading, before any plan: a clear refusal.
            if !(oom.starts_with("during profiling") && a.plan.is_none()) {
                bad.push(format!(
                    "{name} seed {seed}: {} ran out of memory: {oom}",
                    a.strategy
                ));
            }
            continue;
        }
        if let Some(f) = &a.failed {
            // A refusal, or a model the engine alone cannot load either (the oracle shows it).
            let clear =
                f.starts_with("start-up refused") || f.starts_with("the model does not fit");
            if !clear || f.len() < 40 {
                bad.push(format!("{name} seed {seed}: unclear failure: {f}"));
            }
            continue;
        }
        let measured = matches!(a.strategy, StrategyKind::PostCapture | StrategyKind::Full);
        match a.kv_vs_oracle {
            Some(x) if measured && x < 0.99 => bad.push(format!(
                "{name} seed {seed}: {} got {x:.4} of the oracle",
                a.strategy
            )),
            Some(x) if x > 1.005 => bad.push(format!(
                "{name} seed {seed}: {} got {x:.4} of the oracle",
                a.strategy
            )),
            _ => {}
        }
    }
    bad
}

#[test]
fn tight_memory_is_planned_or_refused_clearly() {
    let mut bad = Vec::new();
    for (n, weights) in [
        ("tight", "19GiB"),
        ("nothing-fits", "23GiB"),
        ("overfull", "30GiB"),
    ] {
        let model = format!(
            "weights = \"{weights}\"\nweight_tensors = 400\nactivation_peak = \"1.5GiB\"\nworkspace = \"256MiB\""
        );
        let t = scenario(
            n,
            "rtx4090",
            "gpu_memory_utilization = 0.95",
            &model,
            GRAPHS,
            "",
        );
        bad.extend(check(n, &t, 3));
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn large_graph_sets_are_measured_to_the_byte() {
    let graphs =
        "max_capture_size = 1024\nkernel_nodes = 400\nintermediate_per_token = \"512KiB\"\n\
                  warmup_per_token = \"512KiB\"\nalloc_node_bytes = \"4MiB\"";
    let mut bad = Vec::new();
    for device in ["h100-80gb", "mi300x", "rx7900xtx-rocm6.2"] {
        let t = scenario(
            "large-graphs",
            device,
            "gpu_memory_utilization = 0.92",
            SMALL_MODEL,
            graphs,
            "",
        );
        bad.extend(check(&format!("large-graphs-{device}"), &t, 2));
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn unified_memory_with_neighbours_never_runs_out() {
    let extra = "other_processes = \"8GiB\"\n\n[[neighbour]]\nbefore = \"graph_phase\"\nbytes = \"12GiB\"\n";
    let t = scenario(
        "apu-neighbours",
        "strix-halo",
        "memory_budget = \"40GiB\"",
        "weights = \"18GiB\"\nweight_tensors = 400\nactivation_peak = \"2GiB\"",
        GRAPHS,
        extra,
    );
    let bad = check("apu-neighbours", &t, 3);
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn a_visible_neighbour_taking_memory_is_planned_around() {
    let extra =
        "other_processes = \"2GiB\"\n\n[[neighbour]]\nbefore = \"profile_run\"\nbytes = \"6GiB\"\n";
    let mut bad = Vec::new();
    for device in ["rtx4090", "rx7900xtx-rocm6.2", "max1550"] {
        let t = scenario(
            "visible-neighbour",
            device,
            "gpu_memory_utilization = 0.9",
            SMALL_MODEL,
            GRAPHS,
            extra,
        );
        bad.extend(check(&format!("visible-neighbour-{device}"), &t, 2));
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn other_processes_invisible_to_a_process_local_reading() {
    let extra = "other_processes = \"6GiB\"\n";
    let t = scenario(
        "invisible",
        "rx7900xtx-rocm5.4",
        "gpu_memory_utilization = 0.9",
        SMALL_MODEL,
        GRAPHS,
        extra,
    );
    let bad = check("invisible", &t, 4);
    assert!(bad.is_empty(), "{bad:#?}");
    names_the_blind_spot("invisible", &t);
}

#[test]
fn other_processes_on_a_device_without_a_free_reading() {
    let extra = "other_processes = \"5GiB\"\n";
    let t = scenario(
        "no-free",
        "arc-b580-nosysman",
        "gpu_memory_utilization = 0.9",
        SMALL_MODEL,
        GRAPHS,
        extra,
    );
    let bad = check("no-free", &t, 4);
    assert!(bad.is_empty(), "{bad:#?}");
    names_the_blind_spot("no-free", &t);
}

#[test]
fn an_integrated_gpu_without_a_free_reading_is_bounded_by_the_host() {
    // No free reading at all; the host's available memory sees the neighbour that arrives
    // before the graph phase, and bounds the KV cache.
    let extra =
        "other_processes = \"3GiB\"\n\n[[neighbour]]\nbefore = \"graph_phase\"\nbytes = \"6GiB\"\n";
    let t = scenario(
        "integrated",
        "arc-140v",
        "memory_budget = \"10GiB\"",
        SMALL_MODEL,
        GRAPHS,
        extra,
    );
    let bad = check("integrated", &t, 4);
    assert!(bad.is_empty(), "{bad:#?}");
    let file = write("integrated", &t);
    let r = simulate_seeded(file.to_str().unwrap(), StrategyArg::Auto, 0).unwrap();
    let plan = r.runs[0].plan.as_ref().expect("a plan");
    // The host's figure caps the plan; where its tolerance is wider than a probe's resolution,
    // an allocation probe checks what is physically there instead.
    assert!(
        matches!(
            plan.physical_check,
            Some(PhysicalCheck::DeviceAvailable | PhysicalCheck::Probe)
        ),
        "{:?}",
        plan.physical_check
    );
    assert!(plan.capped_by_free_bytes.is_some(), "{:?}", plan.warnings);
    assert!(plan
        .warnings
        .iter()
        .all(|w| w.code() != "other_processes_unseen"));
}

/// The error loading `text` gives (a file the tester wrote that must not load).
fn load_error(text: &str) -> String {
    memplan_testbed::Scenario::from_toml("bad.toml", text)
        .and_then(|s| s.resolve())
        .map(|_| ())
        .unwrap_err()
        .to_string()
}

/// A small valid scenario named `bad` on `device`, `from` replaced by `to`.
fn small(device: &str, from: &str, to: &str) -> String {
    let text = scenario(
        "bad",
        device,
        "gpu_memory_utilization = 0.9",
        SMALL_MODEL,
        GRAPHS,
        "",
    );
    assert!(text.contains(from), "{from}");
    text.replace(from, to)
}

#[test]
fn a_kv_dtype_of_auto_is_refused_with_a_list_that_does_not_offer_it() {
    assert!(
        memplan_testbed::Scenario::from_toml("ok.toml", &small("rtx4090", "", ""))
            .and_then(|s| s.resolve())
            .is_ok()
    );
    for dtype in ["auto", "fp4"] {
        let e = load_error(&small(
            "rtx4090",
            "dtype = \"bf16\"",
            &format!("dtype = \"{dtype}\""),
        ));
        assert!(e.starts_with("scenario bad: kv.dtype: "), "{e}");
        assert!(e.contains("bf16, fp16") && e.contains("fp8_ds_mla"), "{e}");
        // The list offers only what the parser takes: not the value just refused.
        let list = e.split("dtype: ").last().unwrap();
        assert!(!list.contains("auto,") && !list.contains(" auto "), "{e}");
    }
    let e = load_error(&small("rtx4090", "dtype = \"bf16\"", "dtype = \"auto\""));
    assert!(e.contains("model's dtype"), "{e}");
}

#[test]
fn a_byte_quantity_of_the_wrong_kind_says_what_a_byte_quantity_is() {
    for (from, to, key, why) in [
        (
            "gpu_memory_utilization = 0.9",
            "memory_budget = -5",
            "request.memory_budget: ",
            "-5 is negative",
        ),
        (
            "weights = \"3GiB\"",
            "weights = 2147483648.0",
            "model.weights: ",
            "2147483648.0 is a float",
        ),
        (
            "weights = \"3GiB\"",
            "weights = true",
            "model.weights: ",
            "boolean",
        ),
    ] {
        let e = load_error(&small("rtx4090", from, to));
        assert!(!e.contains("untagged") && !e.contains("ByteValue"), "{e}");
        assert!(e.contains(key) && e.contains(why), "{e}");
        assert!(
            e.contains("a whole number of bytes") && e.contains("\"24GiB\""),
            "{e}"
        );
    }
}

#[test]
fn a_neighbour_holding_the_whole_device_is_the_files_error() {
    let neighbours = |a: &str, b: &str| {
        format!(
            "[[neighbour]]\nbefore = \"profile_run\"\nbytes = \"{a}\"\n\n\
             [[neighbour]]\nbefore = \"graph_phase\"\nbytes = \"{b}\"\n"
        )
    };
    let text = |a: &str, b: &str| {
        scenario(
            "bad",
            "h100-80gb",
            "gpu_memory_utilization = 0.5",
            SMALL_MODEL,
            GRAPHS,
            &neighbours(a, b),
        )
    };
    // An H100 holds 79.19 GiB: a neighbour holding that or more leaves no process room, as
    // other_processes does; the error names which neighbour.
    for (a, b, key) in [
        ("100GiB", "1GiB", "neighbour[0].bytes: "),
        ("1GiB", "79.19GiB", "neighbour[1].bytes: "),
    ] {
        let e = load_error(&text(a, b));
        assert!(
            e.starts_with(&format!("scenario bad: {key}")) && e.contains("h100-80gb"),
            "{a} {b}: {e}"
        );
    }
    // A step the format does not name (`serve` is one: after the plan, before the burst).
    let e = load_error(&text("1GiB", "2GiB").replace("graph_phase", "serving"));
    assert!(e.starts_with("scenario bad: neighbour[1].before: "), "{e}");
    // Two changes at one step: one would go unused.
    let e = load_error(&text("1GiB", "2GiB").replace("graph_phase", "profile_run"));
    assert!(
        e.starts_with("scenario bad: neighbour[1].before: ") && e.contains("neighbour[0]'s step"),
        "{e}"
    );
    // File order is not step order: changes apply in step order, so either order loads.
    let swapped = text("1GiB", "2GiB")
        .replace("profile_run", "STEP")
        .replace("graph_phase", "profile_run")
        .replace("STEP", "graph_phase");
    assert!(memplan_testbed::Scenario::from_toml("ok.toml", &swapped)
        .and_then(|s| s.resolve())
        .is_ok());
    assert!(
        memplan_testbed::Scenario::from_toml("ok.toml", &text("1GiB", "40GiB"))
            .and_then(|s| s.resolve())
            .is_ok()
    );
}

#[test]
fn an_error_the_toml_reader_finds_names_the_scenario_too() {
    for (from, to, key) in [
        (
            "[graphs]",
            "[engine]\nkv_allocation = \"paged\"\n\n[graphs]",
            "engine.kv_allocation: ",
        ),
        (
            "[graphs]",
            "[engine]\nstart_rule = \"sglang\"\n\n[graphs]",
            "engine.start_rule: ",
        ),
        ("layers = 28", "layers = -28", "kv.layers: "),
    ] {
        let e = load_error(&small("rtx4090", from, to));
        assert!(
            e.starts_with("bad.toml: scenario bad: TOML parse error at line ") && e.contains(key),
            "{to}: {e}"
        );
    }
    // A file that is not TOML has no name to give: the file and the place.
    let e = load_error("name = \"bad\"\nthis is = = not toml\n");
    assert!(e.starts_with("bad.toml: TOML parse error at line 2"), "{e}");
}

#[test]
fn kv_errors_name_the_field_the_same_way_and_the_group_at_fault() {
    // A block size of 0 is `kv.block_size`'s error, as one of 4097 is.
    for (size, says) in [("0", "0 is outside 1..=4096"), ("4097", "4097 is outside")] {
        let e = load_error(&small(
            "rtx4090",
            "layers = 28",
            &format!("layers = 28\nblock_size = {size}"),
        ));
        assert!(
            e.starts_with("scenario bad: kv.block_size: ") && e.contains(says),
            "{e}"
        );
    }
    // A hybrid model whose pages vLLM cannot unify: the group whose page does not divide the
    // largest, and that one, by index.
    let hybrid = small(
        "rtx4090",
        "layers = 28\nkv_heads = 4\nhead_dim = 128\n",
        "",
    )
    .replace(
        "[graphs]",
        "[[kv.groups]]\nattention = \"sliding\"\nwindow = 1024\nlayers = 4\nkv_heads = 2\nhead_dim = 128\n\n\
         [[kv.groups]]\nattention = \"full\"\nlayers = 4\nkv_heads = 3\nhead_dim = 128\n\n[graphs]",
    );
    let e = load_error(&hybrid);
    assert!(
        e.starts_with("scenario bad: kv.groups[0]: its page of 16384 bytes")
            && e.contains("kv.groups[1]'s of 24576 bytes"),
        "{e}"
    );
    assert!(memplan_testbed::Scenario::from_toml(
        "ok.toml",
        &hybrid.replace("kv_heads = 3", "kv_heads = 4")
    )
    .and_then(|s| s.resolve())
    .is_ok());
}

#[test]
fn a_blank_name_is_refused() {
    for name in ["", "  "] {
        let e = load_error(&small(
            "rtx4090",
            "name = \"bad\"",
            &format!("name = \"{name}\""),
        ));
        assert!(e.starts_with("name: ") && e.contains("blank"), "{e}");
    }
}

#[test]
fn graphics_allocations_holding_the_whole_device_are_the_files_error() {
    let e = load_error(&small("rtx4090,graphics=30GiB", "", ""));
    assert!(
        e.starts_with("scenario bad: device: graphics allocations holding 30.00 GiB")
            && e.contains("rtx4090"),
        "{e}"
    );
    // A desktop's display memory on a CUDA card is a world the plan judges.
    assert!(memplan_testbed::Scenario::from_toml(
        "ok.toml",
        &small("rtx4090,graphics=1GiB", "", "")
    )
    .and_then(|s| s.resolve())
    .is_ok());
}
