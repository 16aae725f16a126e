//! Compare every struct layout and integer constant memplan passes to HIP with the installed
//! HIP header: a small C program is compiled with `cc` against it and prints sizes, field
//! offsets and enum values, which must equal what this crate uses.
//!
//! Needs the HIP headers (Debian: `libamdhip64-dev`; CI installs it). Without them the test
//! prints why it checked nothing and passes; structs the installed header predates (HIP 5.2
//! has no virtual-memory structs) are reported as not checked.

use std::ffi::c_int;
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;

use hip_runtime_sys::{hipMemAccessDesc, hipMemAllocationProp, hipMemLocation};
use memplan_backend_rocm::conv;

/// One fact: the C expression, what memplan uses, a header word that must exist for the fact
/// to be checkable, and the oldest HIP memplan passes it to.
struct Fact {
    c_expr: String,
    ours: i64,
    needs: &'static str,
    since: (u32, u32),
}

fn fact(c_expr: impl Into<String>, ours: usize, needs: &'static str) -> Fact {
    Fact {
        c_expr: c_expr.into(),
        ours: ours as i64,
        needs,
        since: (0, 0),
    }
}

fn int(c_expr: impl Into<String>, ours: c_int, needs: &'static str) -> Fact {
    Fact {
        c_expr: c_expr.into(),
        ours: i64::from(ours),
        needs,
        since: (0, 0),
    }
}

/// Virtual memory is only used from HIP 5.4 (capability rule): older headers lay
/// hipMemAllocationProp out differently, which this test found on HIP 5.2.
fn vmm(f: Fact) -> Fact {
    Fact { since: (5, 4), ..f }
}

/// `(HIP_VERSION_MAJOR, HIP_VERSION_MINOR)` of the installed header.
fn header_version(include: &Path) -> Option<(u32, u32)> {
    let text = std::fs::read_to_string(include.join("hip/hip_version.h")).ok()?;
    let get = |name: &str| -> Option<u32> {
        text.lines().find_map(|l| {
            l.strip_prefix("#define ")?
                .strip_prefix(name)?
                .trim()
                .parse()
                .ok()
        })
    };
    Some((get("HIP_VERSION_MAJOR")?, get("HIP_VERSION_MINOR")?))
}

fn facts(r0000: &'static str) -> Vec<Fact> {
    let mut v = vec![
        fact(format!("sizeof({r0000})"), conv::PROPS_R0000_SIZE, r0000),
        fact(
            format!("offsetof({r0000}, gcnArchName)"),
            conv::PROPS_R0000_GCN_ARCH_NAME,
            r0000,
        ),
        fact(
            "sizeof(hipDeviceProp_tR0600)",
            conv::PROPS_R0600_SIZE,
            "hipDeviceProp_tR0600",
        ),
        fact(
            "offsetof(hipDeviceProp_tR0600, gcnArchName)",
            conv::PROPS_R0600_GCN_ARCH_NAME,
            "hipDeviceProp_tR0600",
        ),
        vmm(fact(
            "sizeof(hipMemLocation)",
            size_of::<hipMemLocation>(),
            "hipMemLocation",
        )),
        vmm(fact(
            "offsetof(hipMemLocation, type)",
            offset_of!(hipMemLocation, type_),
            "hipMemLocation",
        )),
        vmm(fact(
            "offsetof(hipMemLocation, id)",
            offset_of!(hipMemLocation, id),
            "hipMemLocation",
        )),
        vmm(fact(
            "sizeof(hipMemAccessDesc)",
            size_of::<hipMemAccessDesc>(),
            "hipMemAccessDesc",
        )),
        vmm(fact(
            "offsetof(hipMemAccessDesc, location)",
            offset_of!(hipMemAccessDesc, location),
            "hipMemAccessDesc",
        )),
        vmm(fact(
            "offsetof(hipMemAccessDesc, flags)",
            offset_of!(hipMemAccessDesc, flags),
            "hipMemAccessDesc",
        )),
        vmm(fact(
            "sizeof(hipMemAllocationProp)",
            size_of::<hipMemAllocationProp>(),
            "hipMemAllocationProp",
        )),
        vmm(fact(
            "offsetof(hipMemAllocationProp, type)",
            offset_of!(hipMemAllocationProp, type_),
            "hipMemAllocationProp",
        )),
        vmm(fact(
            "offsetof(hipMemAllocationProp, requestedHandleType)",
            offset_of!(hipMemAllocationProp, requestedHandleType),
            "hipMemAllocationProp",
        )),
        vmm(fact(
            "offsetof(hipMemAllocationProp, location)",
            offset_of!(hipMemAllocationProp, location),
            "hipMemAllocationProp",
        )),
        vmm(fact(
            "offsetof(hipMemAllocationProp, win32HandleMetaData)",
            offset_of!(hipMemAllocationProp, win32HandleMetaData),
            "hipMemAllocationProp",
        )),
        vmm(fact(
            "offsetof(hipMemAllocationProp, allocFlags)",
            offset_of!(hipMemAllocationProp, allocFlags),
            "hipMemAllocationProp",
        )),
        int(
            "hipDeviceAttributeIntegrated",
            conv::ATTR_INTEGRATED,
            "hipDeviceAttributeIntegrated",
        ),
        int(
            "hipDeviceAttributeVirtualMemoryManagementSupported",
            conv::ATTR_VMM_SUPPORTED,
            "hipDeviceAttributeVirtualMemoryManagementSupported",
        ),
        int(
            "hipGraphMemAttrUsedMemCurrent",
            conv::GRAPH_MEM_ATTRS[0],
            "hipGraphMemAttrUsedMemCurrent",
        ),
        int(
            "hipGraphMemAttrUsedMemHigh",
            conv::GRAPH_MEM_ATTRS[1],
            "hipGraphMemAttrUsedMemHigh",
        ),
        int(
            "hipGraphMemAttrReservedMemCurrent",
            conv::GRAPH_MEM_ATTRS[2],
            "hipGraphMemAttrReservedMemCurrent",
        ),
        int(
            "hipGraphMemAttrReservedMemHigh",
            conv::GRAPH_MEM_ATTRS[3],
            "hipGraphMemAttrReservedMemHigh",
        ),
        int(
            "hipStreamNonBlocking",
            conv::STREAM_NON_BLOCKING as c_int,
            "hipStreamNonBlocking",
        ),
        int(
            "hipStreamCaptureModeThreadLocal",
            conv::CAPTURE_MODE_THREAD_LOCAL,
            "hipStreamCaptureModeThreadLocal",
        ),
        vmm(int(
            "hipMemAllocationGranularityMinimum",
            conv::GRANULARITY_MINIMUM,
            "hipMemAllocationGranularityMinimum",
        )),
        vmm(int(
            "hipMemAllocationTypePinned",
            1,
            "hipMemAllocationTypePinned",
        )),
        vmm(int(
            "hipMemLocationTypeDevice",
            1,
            "hipMemLocationTypeDevice",
        )),
        vmm(int(
            "hipMemAccessFlagsProtReadWrite",
            3,
            "hipMemAccessFlagsProtReadWrite",
        )),
        vmm(int("hipMemHandleTypeNone", 0, "hipMemHandleTypeNone")),
    ];
    // Every error name memplan prints must have the value the header gives it.
    v.extend(
        conv::ERROR_NAMES
            .iter()
            .map(|(code, name)| int(*name, *code, name)),
    );
    v
}

/// The include directory holding `hip/hip_runtime_api.h`.
fn include_dir() -> Option<PathBuf> {
    let from_env = ["HIP_PATH", "ROCM_PATH"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .map(|p| Path::new(&p).join("include"));
    from_env
        .chain(
            ["/usr/include", "/opt/rocm/include"]
                .iter()
                .map(PathBuf::from),
        )
        .find(|d| d.join("hip/hip_runtime_api.h").is_file())
}

/// Every header text under `hip/` (to tell which names the installed version has).
fn header_text(include: &Path) -> String {
    let mut text = String::new();
    let mut dirs = vec![include.join("hip")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "h") {
                text.push_str(&std::fs::read_to_string(&p).unwrap_or_default());
            }
        }
    }
    text
}

fn has_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(i, _)| {
        let after = text[i + word.len()..].chars().next();
        let before = text[..i].chars().next_back();
        let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        !ident(after) && !ident(before)
    })
}

#[test]
fn layouts_and_constants_match_the_installed_header() {
    let Some(include) = include_dir() else {
        eprintln!("SKIPPED: no hip/hip_runtime_api.h (install libamdhip64-dev, or set HIP_PATH); nothing checked");
        return;
    };
    let text = header_text(&include);
    // HIP >= 6 renames the 5.x properties struct; before, it is hipDeviceProp_t itself.
    let r0000 = if has_word(&text, "hipDeviceProp_tR0000") {
        "hipDeviceProp_tR0000"
    } else {
        "hipDeviceProp_t"
    };
    let version = header_version(&include).unwrap_or((0, 0));
    let (check, skipped): (Vec<Fact>, Vec<Fact>) = facts(r0000)
        .into_iter()
        .partition(|f| has_word(&text, f.needs) && version >= f.since);
    for f in &skipped {
        if version < f.since {
            eprintln!(
                "not checked (memplan passes it only to HIP >= {:?}; header is {version:?}): {}",
                f.since, f.c_expr
            );
        } else {
            eprintln!(
                "not checked (the installed header has no `{}`): {}",
                f.needs, f.c_expr
            );
        }
    }
    assert!(
        check.len() > 20,
        "too little to check: the header at {} looks wrong",
        include.display()
    );
    let out_dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("memplan-rocm-layout-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).expect("temp dir");
    let src = out_dir.join("layout.c");
    let mut c = String::from("#include <hip/hip_runtime_api.h>\n#include <stddef.h>\n#include <stdio.h>\nint main(void) {\n");
    for f in &check {
        c.push_str(&format!(
            "  printf(\"%lld\\n\", (long long)({}));\n",
            f.c_expr
        ));
    }
    c.push_str("  return 0;\n}\n");
    std::fs::write(&src, c).expect("write layout.c");
    let exe = out_dir.join("layout");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(&cc)
        .args(["-D__HIP_PLATFORM_AMD__", "-I"])
        .arg(&include)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output();
    let built = match built {
        Ok(o) => o,
        Err(e) => {
            eprintln!("SKIPPED: cannot run the C compiler `{cc}`: {e}");
            return;
        }
    };
    assert!(
        built.status.success(),
        "compiling against {} failed:\n{}",
        include.display(),
        String::from_utf8_lossy(&built.stderr)
    );
    let run = Command::new(&exe).output().expect("run the layout program");
    let _ = std::fs::remove_dir_all(&out_dir);
    let values: Vec<i64> = String::from_utf8_lossy(&run.stdout)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    assert_eq!(
        values.len(),
        check.len(),
        "the layout program printed {} values",
        values.len()
    );
    let wrong: Vec<String> = check
        .iter()
        .zip(&values)
        .filter(|(f, v)| f.ours != **v)
        .map(|(f, v)| format!("{}: header {v}, memplan {}", f.c_expr, f.ours))
        .collect();
    assert!(
        wrong.is_empty(),
        "layout mismatches with {}:\n{}",
        include.display(),
        wrong.join("\n")
    );
    eprintln!(
        "checked {} layouts and constants against {}",
        check.len(),
        include.display()
    );
}
