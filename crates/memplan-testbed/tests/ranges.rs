//! The simulator's ranges are not the planner's bounds: a range that stops exactly where the
//! planner's bound stops proves nothing about the bound. This test reads every integer constant
//! defined on the planner's side of the crate graph (`const NAME: u64 = EXPR;`, arrays
//! included, evaluated here, so a constant added later is checked too): the planner's, memplan-
//! core's and the real backends' (whose capabilities the planner trusts), with every literal
//! those expressions use; the figures the backends declare inline in their capabilities (a
//! reading's `tolerance_bytes`, `process_local(..)`, the per-capture memory); and every
//! tolerance and per-capture figure the simulated profiles declare through the real backends'
//! code. It fails when an endpoint of a simulated range (world or adversarial, the physics' and
//! the generated scenarios') equals one of them. It also checks that each adversarial range
//! reaches past the planner bound it tests.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use memplan_backend_sim::physics::{self, Quantity, QUANTITIES};
use memplan_testbed::sweep::generate::GENERATED;

/// World endpoints that are the same public figure as a planner constant, read from the same
/// source by both: (quantity, planner constant, the source). The adversarial range of the
/// quantity still has to reach past the constant.
const SAME_PUBLIC_FIGURE: [(&str, &str, &str); 5] = [
    (
        physics::ROUND_LARGE.name,
        "ALLOCATOR_ROUNDING_BOUND",
        "PyTorch's kRoundLarge (c10/cuda/CUDACachingAllocator.cpp)",
    ),
    (
        physics::ROUND_LARGE.name,
        "GRANULE",
        "the template backend's fake driver maps 2 MiB granules, CUDA's minimum VMM \
         granularity (cuMemGetAllocationGranularity): the same 2 MiB as PyTorch's kRoundLarge",
    ),
    (
        physics::ROUND_LARGE.name,
        "SMALL_SEGMENT",
        "PyTorch's kSmallBuffer (c10/cuda/CUDACachingAllocator.cpp), the segment small requests \
         share: another constant of the same file with the same 2 MiB as kRoundLarge",
    ),
    (
        physics::ROUND_LARGE.name,
        "PAGE",
        "the template backend's fake driver's 2 MiB page, the same public figure",
    ),
    (
        physics::ROUND_LARGE.name,
        "RAW_PAGE",
        "the 2 MiB page a driver commits a raw allocation in (the planner's probe keeps within \
         the request in whole pages), CUDA's minimum VMM granularity: the same public figure",
    ),
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn planner_src() -> PathBuf {
    repo().join("crates/memplan-planner/src")
}

/// Every source folder on the planner's side of the crate graph: the planner, memplan-core
/// and every real backend (the simulator is the other side).
fn planner_side() -> Vec<PathBuf> {
    let mut dirs = vec![planner_src(), repo().join("crates/memplan-core/src")];
    let mut backends: Vec<PathBuf> = std::fs::read_dir(repo().join("backends"))
        .expect("backends/")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.file_name().is_some_and(|n| n != "sim") && p.join("src").is_dir())
        .map(|p| p.join("src"))
        .collect();
    backends.sort();
    assert!(backends.len() >= 3, "the real backends were not found");
    dirs.extend(backends);
    dirs
}

/// Units, not figures: a range in KiB steps ends on a multiple of them by design.
const UNITS: [&str; 3] = ["KIB", "MIB", "GIB"];

/// The planner's own tests and test helpers hold figures of test cases, not of the planner.
fn is_test_file(p: &Path) -> bool {
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    name == "tests.rs" || name.ends_with("_tests.rs") || name == "testutil.rs"
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("planner sources") {
        let p = e.expect("dir entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") && !is_test_file(&p) {
            out.push(p);
        }
    }
}

/// A tiny evaluator for constant expressions: integers (with `_`), `KIB`/`MIB`/`GIB`, other
/// constants, `* / + - <<` and parentheses.
struct Eval<'a> {
    toks: Vec<String>,
    i: usize,
    known: &'a BTreeMap<String, u64>,
}

impl Eval<'_> {
    fn tokens(s: &str) -> Vec<String> {
        let mut v = Vec::new();
        let cs: Vec<char> = s.chars().collect();
        let mut i = 0;
        while i < cs.len() {
            let c = cs[i];
            if c.is_whitespace() {
                i += 1;
            } else if c.is_alphanumeric() || c == '_' {
                let st = i;
                while i < cs.len() && (cs[i].is_alphanumeric() || cs[i] == '_') {
                    i += 1;
                }
                v.push(cs[st..i].iter().collect());
            } else if c == '<' && cs.get(i + 1) == Some(&'<') {
                v.push("<<".into());
                i += 2;
            } else {
                v.push(c.to_string());
                i += 1;
            }
        }
        v
    }
    fn peek(&self) -> Option<&str> {
        self.toks.get(self.i).map(String::as_str)
    }
    fn atom(&mut self) -> Option<u64> {
        let t = self.toks.get(self.i)?.clone();
        self.i += 1;
        if t == "(" {
            let v = self.sum()?;
            (self.peek() == Some(")")).then(|| self.i += 1)?;
            return Some(v);
        }
        let digits: String = t.chars().filter(|c| *c != '_').collect();
        let digits = digits.trim_end_matches("u64").trim_end_matches("u32");
        if let Ok(v) = digits.parse() {
            return Some(v);
        }
        match t.as_str() {
            "KIB" => Some(1 << 10),
            "MIB" => Some(1 << 20),
            "GIB" => Some(1 << 30),
            name => self.known.get(name).copied(),
        }
    }
    /// An atom and any `as TYPE` casts after it (integer casts keep the value here).
    fn cast(&mut self) -> Option<u64> {
        let v = self.atom()?;
        while self.peek() == Some("as") {
            self.i += 2;
        }
        Some(v)
    }
    fn product(&mut self) -> Option<u64> {
        let mut v = self.cast()?;
        while let Some(op) = self.peek() {
            match op {
                "*" => {
                    self.i += 1;
                    v = v.checked_mul(self.cast()?)?;
                }
                "/" => {
                    self.i += 1;
                    v = v.checked_div(self.cast()?)?;
                }
                "<<" => {
                    self.i += 1;
                    v = v.checked_shl(u32::try_from(self.cast()?).ok()?)?;
                }
                _ => break,
            }
        }
        Some(v)
    }
    fn sum(&mut self) -> Option<u64> {
        let mut v = self.product()?;
        while let Some(op) = self.peek() {
            match op {
                "+" => {
                    self.i += 1;
                    v = v.checked_add(self.product()?)?;
                }
                "-" => {
                    self.i += 1;
                    v = v.checked_sub(self.product()?)?;
                }
                _ => break,
            }
        }
        Some(v)
    }
    fn all(s: &str, known: &BTreeMap<String, u64>) -> Option<u64> {
        // `u64::MAX` and paths (`memplan_core::bytes::MIB`): the value, the last segment.
        let mut s = s
            .replace("u64::MAX", &u64::MAX.to_string())
            .replace("u32::MAX", &u32::MAX.to_string());
        while let Some(at) = s.find("::") {
            let start = s[..at]
                .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
                .map_or(0, |i| i + 1);
            s.replace_range(start..at + 2, "");
        }
        let mut e = Eval {
            toks: Self::tokens(&s),
            i: 0,
            known,
        };
        let v = e.sum()?;
        (e.i == e.toks.len()).then_some(v)
    }
}

/// `text` with every line's `//` comment cut off.
fn without_comments(text: &str) -> String {
    text.lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The text after each `const ` up to its `;` (outside brackets), comments skipped.
fn const_items(text: &str) -> Vec<String> {
    let code = without_comments(text);
    let mut out = Vec::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("const ") {
        let tail = &rest[at + 6..];
        let mut depth = 0i32;
        let mut end = tail.len();
        for (i, c) in tail.char_indices() {
            match c {
                '[' | '(' | '{' => depth += 1,
                // The end of a `const fn`'s body ends the item.
                '}' if depth == 1 => {
                    end = i;
                    break;
                }
                ']' | ')' | '}' => depth -= 1,
                ';' if depth <= 0 => {
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// Every integer constant of the planner (name -> values; arrays give each element) and every
/// integer literal their expressions use.
fn planner_figures() -> (BTreeMap<String, Vec<u64>>, Vec<u64>) {
    figures(&[planner_src()])
}

/// As [`planner_figures`], over the sources in `dirs` (a constant's name is prefixed by its
/// file where two files define the same name).
fn figures(dirs: &[PathBuf]) -> (BTreeMap<String, Vec<u64>>, Vec<u64>) {
    let mut files = Vec::new();
    for d in dirs {
        rust_files(d, &mut files);
    }
    files.sort();
    // (name, expression)
    let mut items = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("readable source");
        for stmt in const_items(&text) {
            let Some((name, rest)) = stmt.split_once(':') else {
                continue;
            };
            let Some((ty, expr)) = rest.split_once('=') else {
                continue;
            };
            let ty = ty.trim();
            let int = ["u64", "u32", "usize", "i64"];
            let array = ty.starts_with('[') && int.iter().any(|t| ty.contains(t));
            // Macro-generated items (`$name`) and FFI layout offsets (`offset_of!`,
            // `size_of::<T>()`) are no figure.
            let layout = expr.contains('!') || expr.contains("size_of");
            if !(int.contains(&ty) || array)
                || name.trim().contains(' ')
                || expr.contains('$')
                || layout
            {
                continue;
            }
            if UNITS.contains(&name.trim()) {
                continue;
            }
            let file = f.strip_prefix(repo()).unwrap_or(f).display().to_string();
            items.push((
                name.trim().to_string(),
                expr.trim().to_string(),
                array,
                file,
            ));
        }
    }
    // Two files may define the same name: those are told apart by their file.
    let items: Vec<(String, String, String, bool)> = items
        .iter()
        .map(|(name, expr, array, file)| {
            let twice = items.iter().filter(|i| &i.0 == name).count() > 1;
            let key = if twice {
                format!("{name} ({file})")
            } else {
                name.clone()
            };
            (key, name.clone(), expr.clone(), *array)
        })
        .collect();
    assert!(
        items.len() >= 5,
        "the planner's constants were not found: {items:?}"
    );
    let mut known: BTreeMap<String, u64> = BTreeMap::new();
    let mut values: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut literals = Vec::new();
    // Constants may refer to each other: evaluate until nothing new resolves.
    for _ in 0..items.len() {
        for (key, name, expr, array) in &items {
            if values.contains_key(key) {
                continue;
            }
            let parts: Vec<&str> = if *array {
                expr.trim_start_matches('[')
                    .trim_end_matches(']')
                    .split(',')
                    .map(str::trim)
                    .filter(|p| !p.is_empty())
                    .collect()
            } else {
                vec![expr.as_str()]
            };
            let vs: Option<Vec<u64>> = parts.iter().map(|p| Eval::all(p, &known)).collect();
            if let Some(vs) = vs {
                if !array {
                    known.entry(name.clone()).or_insert(vs[0]);
                }
                values.insert(key.clone(), vs);
            }
        }
    }
    for (key, _, expr, _) in &items {
        assert!(
            values.contains_key(key),
            "the constant {key} = {expr} cannot be evaluated: teach this test its syntax"
        );
        for t in Eval::tokens(expr) {
            if let Ok(v) = t.replace('_', "").parse::<u64>() {
                literals.push(v);
            }
        }
    }
    (values, literals)
}

/// The expressions after each of `openers` in `text` (up to the closing `,`, `)` or `}` at
/// the opener's depth), comments skipped.
fn arguments(text: &str, openers: &[&str]) -> Vec<String> {
    let code = without_comments(text);
    let mut out = Vec::new();
    for o in openers {
        let mut rest = code.as_str();
        while let Some(at) = rest.find(o) {
            let tail = &rest[at + o.len()..];
            let mut depth = 0i32;
            let mut end = tail.len();
            for (i, c) in tail.char_indices() {
                match c {
                    '(' | '[' | '{' => depth += 1,
                    ')' | ']' | '}' if depth == 0 => {
                        end = i;
                        break;
                    }
                    ')' | ']' | '}' => depth -= 1,
                    ',' | ';' if depth == 0 => {
                        end = i;
                        break;
                    }
                    _ => {}
                }
            }
            out.push(tail[..end].trim().to_string());
            rest = &tail[end..];
        }
    }
    out
}

/// Figures the real backends declare inline in their capabilities (a reading's tolerance,
/// a process-local tolerance, the per-capture memory) that evaluate to a constant, with
/// where they are; figures computed at run time (from the device's total) are covered by
/// [`profile_declarations`].
fn declared_inline(known: &BTreeMap<String, Vec<u64>>) -> Vec<(String, u64)> {
    let scalars: BTreeMap<String, u64> = known
        .iter()
        .filter(|(_, v)| v.len() == 1)
        .map(|(k, v)| (k.clone(), v[0]))
        .collect();
    let mut files = Vec::new();
    for d in planner_side().iter().skip(2) {
        rust_files(d, &mut files);
    }
    files.sort();
    let mut out = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("readable source");
        let openers = [
            "tolerance_bytes:",
            "process_local(",
            "HiddenPerCapture(",
            "hidden_bytes_per_capture = Some(",
        ];
        for expr in arguments(&text, &openers) {
            if let Some(v) = Eval::all(&expr, &scalars) {
                let file = f.strip_prefix(repo()).unwrap_or(f).display().to_string();
                out.push((format!("{expr} declared in {file}"), v));
            }
        }
    }
    out
}

/// Every tolerance and per-capture figure the simulated profiles declare (through the real
/// backends' own declaration code).
fn profile_declarations() -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for p in memplan_backend_sim::profiles() {
        let cap = p.capability();
        for r in memplan_core::Reading::ALL {
            let t = cap.reading(r).tolerance_bytes();
            if t > 0 {
                out.push((format!("{}'s declared {} tolerance", p.name, r.name()), t));
            }
        }
        if let Some(h) = cap.facts.hidden_bytes_per_capture {
            out.push((format!("{}'s declared per-capture memory", p.name), h));
        }
    }
    out
}

fn every_range() -> Vec<(Quantity, &'static str, (u64, u64))> {
    QUANTITIES
        .iter()
        .chain(GENERATED.iter())
        .flat_map(|q| [(*q, "world", q.world), (*q, "adversarial", q.adversarial)])
        .collect()
}

#[test]
fn no_range_endpoint_is_a_planner_constant() {
    let (planner, _) = planner_figures();
    let (mut constants, literals) = figures(&planner_side());
    let declared: Vec<(String, u64)> = declared_inline(&constants)
        .into_iter()
        .chain(profile_declarations())
        .collect();
    assert!(
        declared
            .iter()
            .any(|(_, v)| *v == 4 * memplan_core::bytes::MIB),
        "the declared 4 MiB per capture was not found: {declared:?}"
    );
    for (name, v) in declared {
        constants.entry(name).or_default().push(v);
    }
    let mut clashes = Vec::new();
    for (q, regime, (lo, hi)) in every_range() {
        for end in [lo, hi] {
            for (name, vs) in &constants {
                let shared = SAME_PUBLIC_FIGURE
                    .iter()
                    .any(|(qn, cn, _)| *qn == q.name && cn == name && regime == "world");
                // 0 and 1 (no tolerance, a flag) are no figure outside the planner.
                let figure = end > 1 || planner.contains_key(name);
                if vs.contains(&end) && !shared && figure {
                    clashes.push(format!("{} ({regime}) ends at {end} = {name}", q.name));
                }
            }
            // A literal of a constant's expression (a node count, a count of graphs) is a
            // planner figure too; 0 and 1 are no figure.
            if end > 1 && literals.contains(&end) {
                clashes.push(format!(
                    "{} ({regime}) ends at {end}, a figure in the planner's constants",
                    q.name
                ));
            }
        }
    }
    assert!(clashes.is_empty(), "{clashes:#?}");
}

#[test]
fn adversarial_ranges_reach_past_the_planner_bounds_they_test() {
    let (constants, _) = planner_figures();
    let c = |name: &str| constants.get(name).unwrap_or_else(|| panic!("{name}"))[0];
    let per_node = c("EXEC_BYTES_PER_KERNEL_NODE_BOUND");
    let default_nodes = c("DEFAULT_EXEC_BYTES_PER_GRAPH") / per_node;
    for (q, bound) in [
        (physics::EXEC_PER_KERNEL_NODE, per_node),
        (physics::ROUND_LARGE, c("ALLOCATOR_ROUNDING_BOUND")),
        // A destroyed graph's memory may come back after more synchronizes than the planner's
        // protocol waits for.
        (physics::RELEASE_AFTER_SYNCS, c("SETTLE_SYNCHRONIZES")),
        (
            memplan_testbed::sweep::generate::GEN_KERNEL_NODES,
            default_nodes,
        ),
        (
            memplan_testbed::sweep::generate::GEN_WORKSPACE,
            c("UNMEASURED_NON_ALLOCATOR_BYTES"),
        ),
    ] {
        assert!(
            q.adversarial.1 > bound && q.adversarial.0 < bound,
            "{}: {:?} does not straddle the planner's {bound}",
            q.name,
            q.adversarial
        );
    }
    // Every world range is inside its adversarial range, and both are ordered.
    for q in QUANTITIES.iter().chain(GENERATED.iter()) {
        assert!(
            q.world.0 <= q.world.1 && q.adversarial.0 <= q.adversarial.1,
            "{q:?}"
        );
        assert!(
            q.adversarial.0 <= q.world.0 && q.world.1 <= q.adversarial.1,
            "{}: the adversarial range is wider than the world's",
            q.name
        );
        assert!(!q.evidence.is_empty(), "{}: cite the evidence", q.name);
    }
}

#[test]
fn the_evaluator_reads_the_planner_constants_it_knows() {
    let (constants, literals) = planner_figures();
    assert_eq!(
        constants["EXEC_BYTES_PER_KERNEL_NODE_BOUND"],
        vec![memplan_planner::strategy::EXEC_BYTES_PER_KERNEL_NODE_BOUND]
    );
    assert_eq!(
        constants["DEFAULT_EXEC_BYTES_PER_GRAPH"],
        vec![memplan_planner::strategy::DEFAULT_EXEC_BYTES_PER_GRAPH]
    );
    assert_eq!(
        constants["SIZES"],
        memplan_planner::calibrate::SIZES.to_vec(),
        "arrays give every element"
    );
    assert!(
        literals.contains(&256),
        "the default node count is a figure"
    );
    // Beyond the planner: memplan-core's and the real backends' constants, and the figures
    // the backends declare inline in their capabilities.
    let (all, _) = figures(&planner_side());
    assert_eq!(
        all["TWO_SOURCE_TOLERANCE"],
        vec![16 * memplan_core::bytes::MIB]
    );
    assert_eq!(all["VALUE_NOT_AVAILABLE"], vec![u64::MAX]);
    let inline = declared_inline(&all);
    assert!(
        inline
            .iter()
            .any(|(w, v)| w.contains("rocm") && *v == 4 * memplan_core::bytes::MIB),
        "{inline:?}"
    );
}

/// The `owner/repo#N` references in `text` (trailing punctuation dropped).
fn references(text: &str) -> Vec<String> {
    text.split(|c: char| c.is_whitespace() || "(),;".contains(c))
        .filter(|w| w.contains('#') && w.split('#').next().is_some_and(|r| r.contains('/')))
        .map(|w| {
            w.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
                .to_string()
        })
        .collect()
}

/// Every public issue a range cites as its evidence is cited in the table of
/// `docs/simulator-physics.md` too: the document and the ranges the sweep draws from do not
/// drift apart silently.
#[test]
fn the_physics_document_cites_every_range_s_sources() {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/simulator-physics.md");
    let doc = std::fs::read_to_string(&doc).expect("docs/simulator-physics.md");
    let mut cited = 0;
    let mut missing = Vec::new();
    for q in QUANTITIES.iter().chain(GENERATED.iter()) {
        for r in references(q.evidence) {
            cited += 1;
            if !doc.contains(&r) {
                missing.push(format!("{}: {r}", q.name));
            }
        }
    }
    assert!(
        cited >= 10,
        "only {cited} references found: the parser broke"
    );
    assert!(missing.is_empty(), "not in the document: {missing:?}");
}
