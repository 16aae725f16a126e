//! docs/adding-a-backend.md cannot drift from the template backend CI builds and runs: every
//! code block after `<!-- snippet: PATH#NAME -->` is the region between `// guide:begin NAME`
//! and `// guide:end NAME` of that file (indentation aside), every line of a block after
//! `<!-- lines-in: PATH -->` is a line of that file, every region of the template is shown,
//! and every `cargo xtask` task the guide names exists.

use memplan_workspace_tests::repo_root;

fn read(rel: &str) -> String {
    let p = repo_root().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Remove the common leading whitespace of the non-empty lines.
fn dedent(text: &str) -> String {
    let indent = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    text.lines()
        .map(|l| {
            if l.len() >= indent {
                &l[indent..]
            } else {
                l.trim_start()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn region(rel: &str, name: &str) -> Option<String> {
    let text = read(rel);
    let lines: Vec<&str> = text.lines().collect();
    let begin = lines
        .iter()
        .position(|l| l.trim() == format!("// guide:begin {name}"))?;
    let end = lines
        .iter()
        .position(|l| l.trim() == format!("// guide:end {name}"))?;
    Some(dedent(&lines[begin + 1..end].join("\n")))
}

/// (marker line, the code block after it).
fn blocks(guide: &str, marker: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = guide.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let Some(rest) = l.trim().strip_prefix(marker) else {
            continue;
        };
        let target = rest.trim_end_matches("-->").trim().to_string();
        let open = i + 1;
        assert!(
            lines
                .get(open)
                .is_some_and(|l| l.trim_start().starts_with("```")),
            "docs/adding-a-backend.md line {}: a code block must follow `{l}`",
            i + 1
        );
        let close = (open + 1..lines.len())
            .find(|j| lines[*j].trim_start().starts_with("```"))
            .expect("the code block ends");
        out.push((target, lines[open + 1..close].join("\n")));
    }
    out
}

#[test]
fn every_snippet_is_the_template_backends_code() {
    let guide = read("docs/adding-a-backend.md");
    let snippets = blocks(&guide, "<!-- snippet:");
    assert!(snippets.len() >= 8, "the guide shows the template's files");
    let mut drift = Vec::new();
    for (target, code) in &snippets {
        let (path, name) = target.split_once('#').expect("PATH#NAME");
        match region(path, name) {
            None => drift.push(format!("{path} has no region `{name}`")),
            Some(r) if r.trim_end() != dedent(code).trim_end() => drift.push(format!(
                "the guide's `{target}` differs from {path}; paste the region again:\n{r}"
            )),
            Some(_) => {}
        }
    }
    // Every region of the template is shown.
    for e in std::fs::read_dir(repo_root().join("backends/template/src"))
        .expect("the template's sources")
        .flatten()
    {
        let rel = format!("backends/template/src/{}", e.file_name().to_string_lossy());
        for l in read(&rel).lines() {
            if let Some(name) = l.trim().strip_prefix("// guide:begin ") {
                let target = format!("{rel}#{name}");
                if !snippets.iter().any(|(t, _)| *t == target) {
                    drift.push(format!("the guide does not show {target}"));
                }
            }
        }
    }
    assert!(drift.is_empty(), "{}", drift.join("\n\n"));
}

#[test]
fn every_listed_line_is_in_its_file() {
    let guide = read("docs/adding-a-backend.md");
    let mut missing = Vec::new();
    for (path, code) in blocks(&guide, "<!-- lines-in:") {
        let text = read(&path);
        let have: Vec<&str> = text.lines().map(str::trim).collect();
        for l in code.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if !have.contains(&l) {
                missing.push(format!("{path} has no line `{l}`"));
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn every_xtask_task_the_guide_names_exists() {
    let guide = read("docs/adding-a-backend.md");
    let help = read("xtask/src/main.rs");
    let mut unknown = Vec::new();
    for (i, _) in guide.match_indices("cargo xtask ") {
        let task: String = guide[i + "cargo xtask ".len()..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        if !help.contains(&format!("\"{task}\" =>")) {
            unknown.push(task);
        }
    }
    assert!(unknown.is_empty(), "tasks xtask does not have: {unknown:?}");
}
