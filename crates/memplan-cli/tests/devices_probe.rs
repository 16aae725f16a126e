//! `memplan devices` and `memplan probe`, run as the built binary.

use std::process::{Command, Output};

use serde_json::Value;

const MIB: u64 = 1 << 20;

fn memplan(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memplan"))
        .args(args)
        .env_remove("MEMPLAN_LOG")
        .output()
        .expect("the binary runs")
}

fn json(args: &[&str]) -> Value {
    let out = memplan(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON value")
}

fn error_line(args: &[&str]) -> String {
    let out = memplan(args);
    assert!(!out.status.success(), "{args:?} should fail");
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(err.lines().count(), 1, "one-line error: {err}");
    err
}

#[test]
fn devices_json_lists_sim_devices() {
    let v = json(&["devices", "--json"]);
    let backends = v["backends"].as_array().expect("backends array");
    let sim = backends
        .iter()
        .find(|b| b["backend"] == "sim")
        .expect("sim compiled in");
    assert_eq!(sim["status"], "available");
    let devices = sim["devices"].as_array().unwrap();
    let rtx = devices
        .iter()
        .find(|d| d["id"] == "sim:rtx4090")
        .expect("sim:rtx4090 listed");
    assert_eq!(rtx["total_bytes"], 24_564 * MIB);
    assert_eq!(rtx["name"], "NVIDIA GeForce RTX 4090");
    for id in [
        "sim:rx7900xtx-rocm5.4",
        "sim:arc-b580-nosysman",
        "sim:strix-halo",
        "sim:broken-stale",
    ] {
        assert!(devices.iter().any(|d| d["id"] == id), "{id}");
    }
    // A compiled-in backend that cannot run here is reported, not an error.
    for b in backends.iter().filter(|b| b["status"] == "unavailable") {
        assert!(b["reason"].as_str().is_some_and(|r| !r.is_empty()), "{b}");
    }
}

#[test]
fn devices_table_exits_zero() {
    let out = memplan(&["devices"]);
    assert!(out.status.success());
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        s.contains("sim: available") && s.contains("sim:h100-80gb") && s.contains("79.19 GiB"),
        "{s}"
    );
}

#[test]
fn probe_rtx4090_json_has_every_layer_and_capabilities() {
    let v = json(&["probe", "sim:rtx4090", "--json"]);
    assert_eq!(v["device"], "sim:rtx4090");
    assert_eq!(v["descriptor"]["id"], "sim:rtx4090");
    let m = &v["memory"];
    assert_eq!(m["driver"]["total"], 24_564 * MIB);
    assert_eq!(
        m["driver"]["free"],
        (24_564 - 400) * MIB,
        "total less the 400 MiB context"
    );
    assert_eq!(m["allocator"]["reserved"], 0);
    assert_eq!(m["allocator"]["allocated"], 0);
    assert_eq!(m["graph_pool"]["used"], 0);
    assert_eq!(v["derived"]["non_allocator"], 400 * MIB);
    let c = &v["capability"];
    for r in ["driver_total", "driver_free", "graph_pool"] {
        assert_eq!(c["readings"][r]["kind"], "exact", "{r}");
    }
    assert_eq!(c["facts"]["graph_capture"]["kind"], "supported");
    assert_eq!(c["facts"]["virtual_memory"]["kind"], "supported");
}

#[test]
fn rocm54_free_is_process_local() {
    let v = json(&["probe", "sim:rx7900xtx-rocm5.4,other=4GiB", "--json"]);
    assert_eq!(
        v["capability"]["readings"]["driver_free"]["kind"],
        "process_local"
    );
    assert_eq!(
        v["capability"]["readings"]["graph_pool"]["kind"],
        "unavailable"
    );
    assert_eq!(
        v["memory"]["driver"]["free"],
        (24_560 - 300) * MIB,
        "the 4 GiB of others are invisible"
    );
    assert!(
        v["memory"]["graph_pool"]["used"].is_null(),
        "the stub's 0 is not reported"
    );
}

#[test]
fn xpu_without_sysman_has_no_free_reading() {
    let v = json(&["probe", "sim:arc-b580-nosysman", "--json"]);
    let free = &v["capability"]["readings"]["driver_free"];
    assert_eq!(free["kind"], "unavailable");
    assert!(free["reason"].as_str().unwrap().contains("Sysman"));
    assert!(v["memory"]["driver"]["free"].is_null(), "absent, never 0");
    assert!(v["derived"]["driver_used"].is_null());
    assert_eq!(v["memory"]["driver"]["total"], 12u64 << 30);
}

#[test]
fn probe_table_shows_absent_values() {
    let out = memplan(&["probe", "sim:arc-b580-nosysman"]);
    assert!(out.status.success());
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        s.lines()
            .any(|l| l.contains("driver free") && l.contains("absent")),
        "{s}"
    );
    assert!(s.contains("unavailable (Level Zero Sysman"), "{s}");
}

#[test]
fn unknown_devices_and_backends_are_one_line_errors() {
    let e = error_line(&["probe", "sim:rtx9090"]);
    assert!(
        e.contains("sim:rtx9090") && e.contains("rtx4090") && e.contains("mi300x"),
        "{e}"
    );
    let e = error_line(&["probe", "metal:0"]);
    assert!(
        e.contains("metal") && e.contains(&memplan::BackendKind::names()),
        "{e}"
    );
    let e = error_line(&["probe", "sim:rtx4090,warp-drive"]);
    assert!(e.contains("warp-drive"), "{e}");
}

#[test]
fn backend_not_compiled_in_says_so() {
    // Only the backends this binary lacks: a compiled-in one may really find a GPU here. Not
    // this crate's features: in a `--workspace` build, feature unification can link a real
    // backend's registration in (the simulator depends on the backends' declarations, and the
    // backend crates themselves build with their default `runtime`), so ask the binary.
    let registered: Vec<String> = json(&["devices", "--json"])["backends"]
        .as_array()
        .expect("a backends list")
        .iter()
        .filter_map(|b| b["backend"].as_str().map(String::from))
        .collect();
    for name in memplan::BackendKind::ALL
        .iter()
        .map(|k| k.name())
        .filter(|n| !registered.iter().any(|r| r == n))
    {
        let e = error_line(&["probe", &format!("{name}:0")]);
        assert!(
            e.contains("not compiled in") && e.contains(&format!("--features {name}")),
            "{e}"
        );
    }
}

#[test]
fn help_explains_the_flags() {
    let out = memplan(&["probe", "--help"]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && s.contains("--json") && s.contains("DEVICE"),
        "{s}"
    );
    // The help names an id of every backend in the list.
    for k in memplan::BackendKind::ALL {
        assert!(s.contains(&k.info().example_id()), "{k}: {s}");
    }
    let out = memplan(&["devices", "--help"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("--json"));
}
