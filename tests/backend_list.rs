//! The one list of backends (`crates/memplan-core/src/backends.rs`, which `BackendKind` is
//! generated from) against every other place that names backends: a test fails when any of
//! them is left behind. A new backend touches its folder, the facade's manifest (its feature
//! and dependency) and the list (the workspace takes every `backends/*` folder; Cargo.lock and
//! the generated docs/capability-matrix.md follow); everything else is generated from the list
//! or checked here.

use std::collections::BTreeSet;
use std::path::Path;

use memplan::{BackendKind, Layout};
use memplan_workspace_tests::repo_root;

fn read(rel: &str) -> String {
    let p = repo_root().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn manifest(rel: &str) -> toml::Table {
    read(rel)
        .parse()
        .unwrap_or_else(|e| panic!("{rel} is not TOML: {e}"))
}

/// A manifest's `[features]`, each as its list of strings.
fn features(m: &toml::Table) -> Vec<(String, Vec<String>)> {
    m.get("features")
        .and_then(|f| f.as_table())
        .map(|t| {
            t.iter()
                .map(|(k, v)| {
                    let items = v
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|x| x.as_str().map(str::to_string))
                                .collect()
                        })
                        .unwrap_or_default();
                    (k.clone(), items)
                })
                .collect()
        })
        .unwrap_or_default()
}

fn feature<'a>(fs: &'a [(String, Vec<String>)], name: &str) -> Option<&'a Vec<String>> {
    fs.iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

/// The `##` doc comment right above `name = [` in a manifest's text, joined into one line.
fn feature_doc(text: &str, name: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let Some(at) = lines
        .iter()
        .position(|l| l.trim_start().starts_with(&format!("{name} = [")))
    else {
        return String::new();
    };
    let mut doc: Vec<&str> = lines[..at]
        .iter()
        .rev()
        .take_while(|l| l.trim_start().starts_with("##"))
        .map(|l| l.trim_start().trim_start_matches('#').trim())
        .collect();
    doc.reverse();
    doc.join(" ")
}

/// Is `folder` a workspace member, by name or by a `dir/*` glob?
fn is_member(members: &[&str], folder: &str) -> bool {
    members.iter().any(|m| {
        *m == folder
            || m.strip_suffix("/*").is_some_and(|dir| {
                folder
                    .strip_prefix(dir)
                    .is_some_and(|rest| rest.starts_with('/') && !rest[1..].contains('/'))
            })
    })
}

#[test]
fn every_backend_is_in_the_workspace_and_the_facade() {
    let ws = manifest("Cargo.toml");
    let ws = ws["workspace"].as_table().expect("[workspace]");
    let members: Vec<&str> = ws["members"]
        .as_array()
        .expect("members")
        .iter()
        .filter_map(|m| m.as_str())
        .collect();
    let ws_deps = ws["dependencies"]
        .as_table()
        .expect("[workspace.dependencies]");
    let facade_text = read("crates/memplan/Cargo.toml");
    let facade = manifest("crates/memplan/Cargo.toml");
    let facade_features = features(&facade);
    let facade_deps = facade["dependencies"]
        .as_table()
        .expect("facade dependencies");
    let declarations = feature(&facade_features, "declarations").expect("`declarations`");
    let mut problems = Vec::new();
    for k in BackendKind::ALL {
        let b = k.info();
        let (pkg, folder) = (b.package(), b.folder());
        if !is_member(&members, &folder) {
            problems.push(format!("{folder} is not a workspace member"));
        }
        // The facade's dependency: its own path, or the workspace's entry.
        let dep = facade_deps.get(&pkg).and_then(|d| d.as_table());
        let from_workspace = dep
            .and_then(|d| d.get("workspace"))
            .and_then(|w| w.as_bool())
            == Some(true);
        let source = if from_workspace {
            ws_deps.get(&pkg).and_then(|d| d.as_table())
        } else {
            dep
        };
        let want_path = if from_workspace {
            folder.clone()
        } else {
            format!("../../{folder}")
        };
        match (dep, source) {
            (None, _) => problems.push(format!(
                "crates/memplan/Cargo.toml: no dependency on {pkg}"
            )),
            (Some(_), None) => problems.push(format!(
                "[workspace.dependencies] lacks {pkg}, which crates/memplan/Cargo.toml takes from the workspace"
            )),
            (Some(d), Some(src)) => {
                if d.get("optional").and_then(|o| o.as_bool()) != Some(true) {
                    problems.push(format!(
                        "crates/memplan/Cargo.toml: `{pkg}` should be an optional dependency"
                    ));
                }
                if src.get("path").and_then(|p| p.as_str()) != Some(want_path.as_str()) {
                    problems.push(format!("{pkg}: path is not {want_path}"));
                }
                if src.get("version").is_none() {
                    problems.push(format!("{pkg}: no version (cargo package needs one)"));
                }
                if b.layout == Layout::Hal
                    && src.get("default-features").and_then(|v| v.as_bool()) != Some(false)
                {
                    problems.push(format!(
                        "{pkg}: default-features = false (only the pure declaration, by default)"
                    ));
                }
            }
        }
        let want = [format!("dep:{pkg}"), format!("{pkg}/register")];
        match feature(&facade_features, b.feature) {
            Some(f) if want.iter().all(|w| f.contains(w)) => {}
            other => problems.push(format!(
                "crates/memplan/Cargo.toml: feature `{}` should be {want:?}, is {other:?}",
                b.feature
            )),
        }
        if feature_doc(&facade_text, b.feature) != b.description {
            problems.push(format!(
                "crates/memplan/Cargo.toml: feature `{}` has doc `## {}`, the list says `{}`",
                b.feature,
                feature_doc(&facade_text, b.feature),
                b.description
            ));
        }
        if !declarations.contains(&format!("dep:{pkg}")) {
            problems.push(format!(
                "crates/memplan/Cargo.toml: `declarations` lacks \"dep:{pkg}\""
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A backend feature of a crate that is not the facade is an alias of the facade's (the CLI's
/// `rocm` is `memplan/rocm`): optional, but never something else. Any backend is reached with
/// `--features memplan/<feature>` without one.
#[test]
fn backend_features_elsewhere_forward_to_the_facade() {
    let names: BTreeSet<&str> = BackendKind::ALL.iter().map(|k| k.feature()).collect();
    let cli = features(&manifest("crates/memplan-cli/Cargo.toml"));
    let mut problems = Vec::new();
    for rel in [
        "crates/memplan-cli/Cargo.toml",
        "crates/memplan-conformance/Cargo.toml",
        "python/Cargo.toml",
    ] {
        let fs = features(&manifest(rel));
        for (name, items) in &fs {
            if !names.contains(name.as_str()) {
                continue;
            }
            if !items.contains(&format!("memplan/{name}")) {
                problems.push(format!(
                    "{rel}: feature `{name}` does not turn on memplan/{name}"
                ));
            }
            let cli_alias = feature(&cli, name).is_some();
            if rel == "python/Cargo.toml"
                && cli_alias
                && !items.contains(&format!("memplan-cli/{name}"))
            {
                problems.push(format!(
                    "{rel}: feature `{name}` does not turn on memplan-cli/{name}"
                ));
            }
        }
        for (name, items) in &fs {
            for item in items {
                let Some(f) = item.strip_prefix("memplan/") else {
                    continue;
                };
                if !names.contains(f) && !["model", "declarations"].contains(&f) {
                    problems.push(format!(
                        "{rel}: feature `{name}` names memplan/{f}, which is no backend"
                    ));
                }
            }
        }
    }
    // The wheel's default features are features of the Python crate.
    let py = features(&manifest("python/Cargo.toml"));
    let pyproject = manifest("python/pyproject.toml");
    let wheel = pyproject["tool"]["maturin"]["features"]
        .as_array()
        .expect("tool.maturin.features");
    for f in wheel.iter().filter_map(|f| f.as_str()) {
        if feature(&py, f).is_none() && !f.starts_with("memplan/") {
            problems.push(format!(
                "python/pyproject.toml: feature `{f}` is no feature of python/Cargo.toml"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Every folder under backends/ is a listed backend (or a `-sys` binding crate one of them
/// uses); every listed backend's folder has the crate, the features and the registration the
/// guide describes.
#[test]
fn every_backend_folder_is_listed_and_wired() {
    let root = repo_root();
    let listed: BTreeSet<&str> = BackendKind::ALL.iter().map(|k| k.name()).collect();
    let mut problems = Vec::new();
    for e in std::fs::read_dir(root.join("backends"))
        .expect("backends/")
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if e.path().is_dir() && !listed.contains(name.as_str()) && !name.ends_with("-sys") {
            problems.push(format!(
                "backends/{name} is not in the list of backends (crates/memplan-core/src/backends.rs)"
            ));
        }
    }
    for k in BackendKind::ALL {
        let b = k.info();
        let rel = format!("{}/Cargo.toml", b.folder());
        if !root.join(&rel).exists() {
            problems.push(format!("{rel} does not exist"));
            continue;
        }
        let m = manifest(&rel);
        if m["package"]["name"].as_str() != Some(b.package().as_str()) {
            problems.push(format!("{rel}: package name is not {}", b.package()));
        }
        let fs = features(&m);
        if feature(&fs, "register").is_none() {
            problems.push(format!("{rel}: no `register` feature"));
        }
        if b.layout == Layout::Hal {
            let runtime_default =
                feature(&fs, "default").is_some_and(|d| d.contains(&"runtime".into()));
            let register_runtime =
                feature(&fs, "register").is_some_and(|r| r.contains(&"runtime".into()));
            if feature(&fs, "runtime").is_none() || !runtime_default || !register_runtime {
                problems.push(format!(
                    "{rel}: needs `runtime` (default) and `register = [\"runtime\"]`"
                ));
            }
        }
        let src = root.join(b.folder()).join("src");
        let text: String = std::fs::read_dir(&src)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().extension().is_some_and(|x| x == "rs"))
                    .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                    .collect()
            })
            .unwrap_or_default();
        let variant = format!("BackendKind::{k:?}");
        if !text.contains(&variant) || !text.contains("#[cfg(feature = \"register\")]") {
            problems.push(format!(
                "{}: registers no `{variant}` behind `#[cfg(feature = \"register\")]`",
                src.display()
            ));
        }
        let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap_or_default();
        if !lib.contains("pub fn link()") || !lib.contains("pub mod capability") {
            problems.push(format!(
                "{}/src/lib.rs: needs `pub fn link()` and `pub mod capability` (its `platforms()`)",
                b.folder()
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A standard backend's facts type (what `capability::declare` takes) is defined in `facts.rs`,
/// where the guide says, and `capability.rs` offers `platforms()` for the capability matrix.
#[test]
fn declarations_take_their_facts_from_facts_rs() {
    let mut problems = Vec::new();
    for k in BackendKind::ALL
        .iter()
        .filter(|k| k.info().layout == Layout::Hal)
    {
        let dir = repo_root().join(k.info().folder()).join("src");
        let cap = std::fs::read_to_string(dir.join("capability.rs")).unwrap_or_default();
        let facts = std::fs::read_to_string(dir.join("facts.rs")).unwrap_or_default();
        let declared = cap
            .lines()
            .find_map(|l| l.trim().strip_prefix("pub fn declare("))
            .and_then(|rest| rest.split_once('&').map(|(_, t)| t))
            .and_then(|t| t.split(|c: char| !c.is_alphanumeric() && c != '_').next())
            .unwrap_or("");
        if declared.is_empty() {
            problems.push(format!(
                "{}: no `pub fn declare(facts: &Facts)`",
                dir.join("capability.rs").display()
            ));
        } else if !facts.contains(&format!("pub struct {declared}")) {
            problems.push(format!(
                "{}: `{declared}` (what `declare` takes) is not defined in facts.rs",
                k.info().folder()
            ));
        }
        if !cap.contains("pub fn platforms()") {
            problems.push(format!(
                "{}/src/capability.rs: no `pub fn platforms()`",
                k.info().folder()
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// xtask reads the list (`xtask/src/backends.rs`): its conformance command, dependency rules
/// and linkage check name no backend of their own.
#[test]
fn xtask_names_no_backend() {
    let dir = repo_root().join("xtask/src");
    let mut problems = Vec::new();
    for e in std::fs::read_dir(&dir).expect("xtask/src").flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        // The NVIDIA hardware bundle and the CI feature matrix's entry names are about one
        // configuration each, not a list of backends.
        if !file.ends_with(".rs") || file == "gpu_check.rs" || file == "matrix.rs" {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        for k in BackendKind::ALL {
            for n in std::iter::once(k.name()).chain(k.info().aliases.iter().copied()) {
                if text.contains(&format!("\"{n}\"")) {
                    problems.push(format!(
                        "xtask/src/{file} names backend \"{n}\": read it from the list"
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The README keeps no list of backends of its own: it points to the generated table in
/// docs/capability-matrix.md, so a new backend leaves it alone.
#[test]
fn the_readme_lists_no_backend_by_hand() {
    let text = read("README.md");
    assert!(
        text.contains("docs/capability-matrix.md#backends"),
        "README.md should point to the generated backend table"
    );
    for k in BackendKind::ALL {
        let crate_name = k.info().package();
        assert!(
            !text.contains(&crate_name),
            "README.md names {crate_name}: the backend table is generated into docs/capability-matrix.md"
        );
    }
}

/// The folder layout a reader relies on (wgpu-hal style): every standard backend folder has
/// the same file names.
#[test]
fn standard_backends_share_file_names() {
    let required = [
        "lib.rs",
        "loader.rs",
        "backend.rs",
        "device.rs",
        "capability.rs",
        "facts.rs",
        "graph.rs",
        "vmm.rs",
        "conv.rs",
    ];
    for k in BackendKind::ALL
        .iter()
        .filter(|k| k.info().layout == Layout::Hal)
    {
        let dir = repo_root().join(k.info().folder()).join("src");
        let have: BTreeSet<String> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect();
        let missing: Vec<_> = required.iter().filter(|f| !have.contains(**f)).collect();
        assert!(
            missing.is_empty(),
            "{}/src lacks {missing:?}",
            k.info().folder()
        );
    }
    assert!(Path::new(&repo_root()).join("backends").is_dir());
}
