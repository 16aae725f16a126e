//! Dependency rules, checked with `cargo tree`, and linkage rules, checked with `readelf`.

use crate::backends;
use crate::run::{capture, step};

/// The test-bed: the simulated backend and the harness around it. What an engine ships (the
/// planner, the model specs) never depends on them, in any feature: the simulator is the
/// evidence against the planner, and must not share code or constants with it.
const TESTBED_CRATES: &[&str] = &["memplan-testbed"];

/// One rule: `cargo tree -p package flags` contains none of `forbidden`.
struct Rule {
    package: String,
    flags: Vec<String>,
    forbidden: Vec<String>,
    why: String,
}

fn rule(package: &str, flags: &[&str], forbidden: &[String], why: String) -> Rule {
    Rule {
        package: package.into(),
        flags: flags.iter().map(|f| f.to_string()).collect(),
        forbidden: forbidden.to_vec(),
        why,
    }
}

/// The crate names `cargo tree -e normal` lists for a package and flags.
fn tree(package: &str, flags: &[&str]) -> Result<Vec<String>, String> {
    let mut argv = vec![
        "cargo", "tree", "-q", "-e", "normal", "--prefix", "none", "-p", package,
    ];
    argv.extend_from_slice(flags);
    Ok(capture(&argv)?
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect())
}

/// The rules, derived from the one list of backends: each backend's vendor crates are what its
/// `runtime` feature adds to its pure declaration (`cargo tree`), so a new backend's crates are
/// found without being named here.
fn rules() -> Result<Vec<Rule>, String> {
    let list = backends::list()?;
    // Per backend: the crates its `runtime` feature adds directly (its vendor crates: bindings,
    // loaders) and everything it adds, transitively (what it may pull without breaking
    // another backend's rule).
    let mut vendor: Vec<(backends::Entry, Vec<String>, Vec<String>)> = Vec::new();
    for b in list.iter().filter(|b| b.layout == "hal") {
        let pkg = b.package();
        let added = |depth: &[&str]| -> Result<Vec<String>, String> {
            let mut pure = vec!["--no-default-features"];
            pure.extend_from_slice(depth);
            let pure = tree(&pkg, &pure)?;
            let mut runtime = vec!["--no-default-features", "--features", "runtime"];
            runtime.extend_from_slice(depth);
            Ok(tree(&pkg, &runtime)?
                .into_iter()
                .filter(|c| !pure.contains(c) && *c != pkg)
                .collect())
        };
        vendor.push((b.clone(), added(&["--depth", "1"])?, added(&[])?));
    }
    let mut vendor_libs: Vec<String> = vendor.iter().flat_map(|(_, v, _)| v.clone()).collect();
    vendor_libs.sort();
    vendor_libs.dedup();
    let all_backends: Vec<String> = list.iter().map(|b| b.package()).collect();
    let hal_backends: Vec<String> = vendor.iter().map(|(b, ..)| b.package()).collect();
    let mut vendor_crates = vendor_libs.clone();
    vendor_crates.extend(hal_backends.iter().cloned());
    let sims: Vec<&backends::Entry> = list.iter().filter(|b| b.layout == "simulator").collect();
    let mut testbed: Vec<String> = TESTBED_CRATES.iter().map(|c| c.to_string()).collect();
    testbed.extend(sims.iter().map(|b| b.package()));

    let mut rules = vec![
        rule(
            "memplan-core",
            &[],
            &vendor_crates,
            "the core depends on no vendor crate, ever".into(),
        ),
        rule(
            "memplan-planner",
            &[],
            &vendor_crates,
            "the planner decides from capabilities, not vendor code".into(),
        ),
        rule(
            "memplan-model",
            &[],
            &vendor_crates,
            "model specs are vendor-neutral".into(),
        ),
        rule(
            "memplan-planner",
            &["--all-features"],
            &testbed,
            "the planner is judged by the simulator, so it does not depend on it".into(),
        ),
        rule(
            "memplan-model",
            &["--all-features"],
            &testbed,
            "model specs ship to engines without the test-bed".into(),
        ),
        rule(
            "memplan",
            &["--no-default-features"],
            &all_backends,
            "the facade without features pulls no backend".into(),
        ),
        rule(
            "memplan",
            &["--no-default-features", "--features", "declarations"],
            &vendor_libs,
            "every backend's pure declaration pulls no vendor library crate".into(),
        ),
    ];
    for s in &sims {
        rules.push(rule(
            "memplan",
            &["--no-default-features", "--features", &s.feature],
            &vendor_libs,
            format!(
                "`{}` alone pulls no vendor library crate (only the backends' pure declarations)",
                s.feature
            ),
        ));
        rules.push(rule(
            &s.package(),
            &[],
            &vendor_libs,
            "the simulator declares through the backends without their `runtime` feature".into(),
        ));
    }
    for (b, direct, own) in &vendor {
        let mut others: Vec<String> = vendor
            .iter()
            .filter(|(o, ..)| o.name != b.name)
            .flat_map(|(o, v, _)| v.iter().cloned().chain(std::iter::once(o.package())))
            .filter(|c| !own.contains(c))
            .collect();
        others.extend(sims.iter().map(|s| s.package()));
        others.sort();
        others.dedup();
        rules.push(rule(
            "memplan",
            &["--no-default-features", "--features", &b.feature],
            &others,
            format!(
                "`{}` pulls only its own vendor crates ({})",
                b.feature,
                direct.join(", ")
            ),
        ));
    }
    Ok(rules)
}

/// Check every dependency rule.
pub fn check() -> Result<(), String> {
    println!("\n==> [deps] dependency rules (cargo tree)");
    let mut failures = Vec::new();
    for r in rules()? {
        let flags: Vec<&str> = r.flags.iter().map(String::as_str).collect();
        let names = tree(&r.package, &flags)?;
        let hits: Vec<&String> = r.forbidden.iter().filter(|f| names.contains(f)).collect();
        let label = format!("{} {}", r.package, r.flags.join(" "));
        if hits.is_empty() {
            println!("  ok   {label:<50} {}", r.why);
        } else {
            println!("  FAIL {label:<50} {}: found {hits:?}", r.why);
            failures.push(label);
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!("dependency rules broken: {}", failures.join("; ")))
    }
}

/// `cargo package --workspace --no-verify`: every crate packages on its own (no `include_str!`
/// reaching outside its crate, every path dependency with a version). Offline: the packages
/// are only assembled, nothing is fetched.
pub fn package() -> Result<(), String> {
    step(
        "package",
        &[
            "cargo",
            "package",
            "-q",
            "--workspace",
            "--no-verify",
            "--allow-dirty",
            "--offline",
        ],
    )?;
    licenses_packaged()
}

/// Every package carries both license texts its `license = "MIT OR Apache-2.0"` names (each
/// crate folder links to the root's `LICENSE-MIT` and `LICENSE-APACHE`; cargo packages the
/// link's target). Counted in `cargo package --list`: one `Cargo.toml.orig` per package.
fn licenses_packaged() -> Result<(), String> {
    let list = capture(&[
        "cargo",
        "package",
        "--list",
        "--workspace",
        "--allow-dirty",
        "--offline",
    ])?;
    let count = |name: &str| list.lines().filter(|l| l.trim() == name).count();
    let packages = count("Cargo.toml.orig");
    for license in ["LICENSE-MIT", "LICENSE-APACHE"] {
        let n = count(license);
        if n != packages {
            return Err(format!(
                "[package] {n} of {packages} packages include {license}: link it into every \
                 crate folder (ln -s ../../{license} crates/NAME/{license})"
            ));
        }
    }
    println!("    both license files in each of the {packages} packages");
    Ok(())
}

/// Build the CLI with every backend of the list and check that no vendor library it loads at
/// run time (the list's `libraries`) is NEEDED: a binary with every runtime-loaded backend
/// must start on a machine without them.
pub fn linkage() -> Result<(), String> {
    let list = backends::list()?;
    let features: Vec<String> = list
        .iter()
        .map(|b| format!("memplan/{}", b.feature))
        .collect();
    let features = features.join(",");
    step(
        "linkage build",
        &[
            "cargo",
            "build",
            "-q",
            "-p",
            "memplan-cli",
            "--all-features",
            "--features",
            &features,
        ],
    )?;
    let bin = backends::target_dir().join("debug/memplan");
    let bin = bin.to_string_lossy().into_owned();
    let dynamic = capture(&["readelf", "-d", &bin])?;
    let needed: Vec<&str> = dynamic.lines().filter(|l| l.contains("(NEEDED)")).collect();
    let vendor: Vec<&String> = list.iter().flat_map(|b| b.libraries.iter()).collect();
    let bad: Vec<&&str> = needed
        .iter()
        .filter(|l| vendor.iter().any(|v| l.contains(v.as_str())))
        .collect();
    println!("\n==> [linkage] {bin} NEEDED:");
    for l in &needed {
        println!("  {}", l.trim());
    }
    if bad.is_empty() {
        println!("  ok: no vendor library is a hard dependency");
        Ok(())
    } else {
        Err(format!("vendor libraries linked at build time: {bad:?}"))
    }
}
