//! The layout and documentation rules the project keeps, checked so they cannot rot.

use std::collections::BTreeSet;
use std::path::Path;

use memplan_workspace_tests::repo_root;

/// Every relative link in the README and docs/ points at a file that exists.
#[test]
fn doc_links_resolve() {
    let root = repo_root();
    let mut pages = vec![root.join("README.md")];
    for e in std::fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .flatten()
    {
        if e.path().extension().is_some_and(|x| x == "md") {
            pages.push(e.path());
        }
    }
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).expect("readable page");
        let base = page.parent().unwrap_or(Path::new("."));
        for target in links(&text) {
            if target.starts_with("http")
                || target.starts_with('#')
                || target.starts_with("mailto:")
            {
                continue;
            }
            let file = target.split('#').next().unwrap_or("");
            if !file.is_empty() && !base.join(file).exists() {
                broken.push(format!("{}: {target}", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            out.push(rest[..end].to_string());
            rest = &rest[end..];
        }
    }
    out
}

/// Every docs page is reachable from the README or the architecture page.
#[test]
fn every_doc_is_linked() {
    let root = repo_root();
    let index = std::fs::read_to_string(root.join("README.md")).expect("README")
        + &std::fs::read_to_string(root.join("docs/architecture.md")).expect("architecture page");
    let mut orphans = Vec::new();
    for e in std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") && name != "architecture.md" && !index.contains(&name) {
            orphans.push(name);
        }
    }
    assert!(
        orphans.is_empty(),
        "docs not linked from README.md or docs/architecture.md: {orphans:?}"
    );
}

/// Every scenario file in crates/memplan-testbed/scenarios/ is shipped in the binary (loadable by name).
#[test]
fn every_scenario_file_is_shipped() {
    let shipped: BTreeSet<&str> = memplan_testbed::SHIPPED.iter().map(|(n, _)| *n).collect();
    for e in std::fs::read_dir(repo_root().join("crates/memplan-testbed/scenarios"))
        .expect("scenarios/")
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(".toml") {
            assert!(
                shipped.contains(stem),
                "crates/memplan-testbed/scenarios/{name} is not embedded in memplan_testbed::SHIPPED"
            );
        }
    }
}
