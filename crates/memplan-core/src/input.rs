//! Reading files a user names: every one goes through [`read_bounded`] (or [`open_regular`]
//! for a file read in parts), so no reader can hang on a FIFO or `/dev/zero`, or read a
//! multi-gigabyte file whole because someone passed the wrong path.
//!
//! The rules, in this order, before a byte is read:
//! 1. the path (symbolic links followed) must name a **regular file**: not a directory, FIFO,
//!    socket or device. It is checked with `stat` before opening (opening a FIFO for reading
//!    blocks until a writer comes) and again on the opened handle;
//! 2. its size must be at most the [`Limit`] of what it is (a config, an index, a scenario);
//! 3. it is read through a reader that stops one byte past the cap, so a file that grows while
//!    it is read is refused too, never read without end.
//!
//! The caps (documented in `docs/input-limits.md`) are far above any real file of the kind
//! and far below what would hurt: a file above its cap is almost always the wrong file.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::bytes::{fmt_bytes, MIB};
use crate::error::{Error, Result};

/// What a file is and how large it may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limit {
    /// What the file is, for messages (`model config`, `safetensors index`).
    pub what: &'static str,
    /// The largest accepted size in bytes.
    pub max_bytes: u64,
}

impl Limit {
    /// Files that are `what` (for messages) and at most `max_bytes` long.
    pub const fn new(what: &'static str, max_bytes: u64) -> Self {
        Self { what, max_bytes }
    }
}

/// A model's `config.json`: real ones are a few KiB (the largest shipped configs, multimodal
/// wrappers with vision and audio towers, stay under 100 KiB).
pub const CONFIG_JSON: Limit = Limit {
    what: "model config",
    max_bytes: 16 * MIB,
};

/// `model.safetensors.index.json`: one line per tensor; DeepSeek-V3's (91,000 tensors) is
/// about 9 MiB.
pub const SAFETENSORS_INDEX: Limit = Limit {
    what: "safetensors index",
    max_bytes: 64 * MIB,
};

/// A `memplan simulate` scenario (TOML); shipped ones are about 1 KiB.
pub const SCENARIO: Limit = Limit {
    what: "scenario",
    max_bytes: MIB,
};

/// A JSON Lines file of model configs (the presets' layout, e.g. configs of held-back logs).
pub const CONFIG_LINES: Limit = Limit {
    what: "JSON Lines file of model configs",
    max_bytes: 64 * MIB,
};

/// An engine start-up log.
pub const ENGINE_LOG: Limit = Limit {
    what: "engine log",
    max_bytes: 256 * MIB,
};

/// A Hugging Face cache ref (`refs/main`): one commit hash, 40 bytes in practice.
pub const HF_REF: Limit = Limit {
    what: "Hugging Face cache ref",
    max_bytes: 1024,
};

/// The real path of `path` (every link followed, `..` resolved) when it lies inside `root`
/// (a real path itself, from [`std::fs::canonicalize`]); otherwise an error naming the path,
/// where it leads and the folder it had to stay in (`inside` describes that folder). Nothing
/// is opened: a FIFO or device is resolved without blocking.
pub fn confined(path: &Path, root: &Path, inside: &str) -> Result<std::path::PathBuf> {
    let real = std::fs::canonicalize(path).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })?;
    if real.starts_with(root) {
        return Ok(real);
    }
    Err(Error::file(
        path.display().to_string(),
        format!(
            "leads to {}, outside {inside} {}; memplan reads only files inside it",
            real.display(),
            root.display()
        ),
    ))
}

/// Open `path` for reading after checking that it names a regular file; returns the file and
/// its size. Used directly by readers that read a file in parts (safetensors headers), which
/// then bound what they read themselves.
pub fn open_regular(path: &Path, what: &str) -> Result<(File, u64)> {
    let name = || path.display().to_string();
    let io = |source| Error::Io {
        path: name(),
        source,
    };
    // `metadata` follows links and does not open: a FIFO is refused before it can block.
    let meta = std::fs::metadata(path).map_err(io)?;
    check_kind(path, what, &meta)?;
    let f = File::open(path).map_err(io)?;
    // The path may have been replaced between the two calls: check what was opened.
    let meta = f.metadata().map_err(io)?;
    check_kind(path, what, &meta)?;
    Ok((f, meta.len()))
}

fn check_kind(path: &Path, what: &str, meta: &std::fs::Metadata) -> Result<()> {
    if meta.is_file() {
        return Ok(());
    }
    let kind = file_kind(meta);
    Err(Error::file(
        path.display().to_string(),
        format!(
            "is {kind}, not a regular file ({} {what} must be a regular file)",
            article(what)
        ),
    ))
}

/// The indefinite article before `what` in messages: "an engine log", "a model config". By
/// its first letter, which is right for every kind of file named here (none starts with a
/// vowel letter read as a consonant, "a user", nor with a silent "h").
fn article(what: &str) -> &'static str {
    match what.chars().next().map(|c| c.to_ascii_lowercase()) {
        Some('a' | 'e' | 'i' | 'o' | 'u') => "an",
        _ => "a",
    }
}

fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    if meta.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        if t.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    "a special file"
}

/// Check a path memplan will write (`--svg FILE`) before writing it: it may be absent (it is
/// created) or a regular file (replaced), never a directory, FIFO, socket or device (writing
/// to a FIFO blocks until someone reads it; a device is not where a picture goes).
pub fn check_output(path: &Path, what: &str) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(meta) => check_kind(path, what, &meta),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(Error::Io {
            path: path.display().to_string(),
            source,
        }),
    }
}

/// Read a whole file of the given kind: a regular file, non-empty, at most
/// `limit.max_bytes`.
pub fn read_bounded(path: &Path, limit: Limit) -> Result<Vec<u8>> {
    let name = path.display().to_string();
    let (f, len) = open_regular(path, limit.what)?;
    let too_big = |what: String| {
        Error::file(
            &name,
            format!(
                "{what} more than {} {} may be ({}); is it the right file?",
                article(limit.what),
                limit.what,
                fmt_bytes(limit.max_bytes)
            ),
        )
    };
    if len > limit.max_bytes {
        // In bytes where the rounded sizes read alike (16 MiB and 600 bytes over a 16 MiB
        // cap: "is 16.00 MiB, more than ... (16.00 MiB)").
        let size = if fmt_bytes(len) == fmt_bytes(limit.max_bytes) {
            format!("{len} bytes")
        } else {
            fmt_bytes(len)
        };
        return Err(too_big(format!("is {size},")));
    }
    let mut buf = Vec::with_capacity(len as usize);
    f.take(limit.max_bytes + 1)
        .read_to_end(&mut buf)
        .map_err(|source| Error::Io {
            path: name.clone(),
            source,
        })?;
    if buf.len() as u64 > limit.max_bytes {
        return Err(too_big("grew while it was read, to".into()));
    }
    if buf.is_empty() {
        return Err(Error::file(
            &name,
            format!("is empty (expected {} {})", article(limit.what), limit.what),
        ));
    }
    Ok(buf)
}

/// [`read_bounded`] for text: the bytes must be UTF-8.
pub fn read_text(path: &Path, limit: Limit) -> Result<String> {
    let bytes = read_bounded(path, limit)?;
    String::from_utf8(bytes).map_err(|e| {
        Error::file(
            path.display().to_string(),
            format!(
                "is not UTF-8 text (invalid byte at offset {}); {} {} is text",
                e.utf8_error().valid_up_to(),
                article(limit.what),
                limit.what
            ),
        )
    })
}

/// The candidate closest to a misspelled `word` (case-insensitive edit distance at most a
/// third of its length, at least 1), for "did you mean" hints.
pub fn closest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    let w: Vec<char> = word.to_ascii_lowercase().chars().collect();
    let limit = (w.len() / 3).max(1);
    candidates
        .iter()
        .map(|c| {
            (
                distance(&w, &c.to_ascii_lowercase().chars().collect::<Vec<_>>()),
                *c,
            )
        })
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Levenshtein distance (with adjacent transpositions counted once).
fn distance(a: &[char], b: &[char]) -> usize {
    let mut prev2: Vec<usize> = vec![0; b.len() + 1];
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for i in 1..=a.len() {
        let mut cur = vec![i; b.len() + 1];
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            cur[j] = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                cur[j] = cur[j].min(prev2[j - 2] + 1);
            }
        }
        prev2 = std::mem::replace(&mut prev, cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closest_names_the_likely_typo() {
        let known = ["other", "graphics", "declare-exact", "stale-free"];
        assert_eq!(closest("ohter", &known), Some("other"));
        assert_eq!(closest("GRAPHIC", &known), Some("graphics"));
        assert_eq!(closest("warp-drive", &known), None);
    }

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("memplan-input-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    const TINY: Limit = Limit {
        what: "test file",
        max_bytes: 16,
    };

    #[test]
    fn regular_files_within_the_cap_are_read() {
        let d = tmp("ok");
        std::fs::write(d.join("a"), "hello").unwrap();
        assert_eq!(read_text(&d.join("a"), TINY).unwrap(), "hello");
        std::fs::write(d.join("b"), [b'x'; 16]).unwrap();
        assert_eq!(read_bounded(&d.join("b"), TINY).unwrap().len(), 16);
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Every message that names what a file is reads as English: "an engine log", "a model
    /// config" (never "a engine log").
    #[test]
    fn messages_put_the_right_article_before_what_a_file_is() {
        assert_eq!(article("engine log"), "an");
        assert_eq!(article("model config"), "a");
        assert_eq!(article("GGUF file"), "a");
        assert_eq!(article("--svg picture"), "a");
        let d = tmp("article");
        std::fs::write(d.join("empty"), "").unwrap();
        std::fs::write(d.join("big"), vec![b'x'; 17]).unwrap();
        std::fs::write(d.join("bin"), [0xff]).unwrap();
        let log = |max_bytes| Limit::new(ENGINE_LOG.what, max_bytes);
        for e in [
            read_bounded(&d.join("empty"), ENGINE_LOG),
            read_bounded(&d.join("big"), log(16)),
            read_text(&d.join("bin"), ENGINE_LOG).map(String::into_bytes),
            read_bounded(&d, ENGINE_LOG),
        ] {
            let e = e.unwrap_err().to_string();
            assert!(
                e.contains("an engine log") && !e.contains("a engine"),
                "{e}"
            );
        }
        for limit in [
            CONFIG_JSON,
            SAFETENSORS_INDEX,
            SCENARIO,
            CONFIG_LINES,
            HF_REF,
        ] {
            let e = read_bounded(&d.join("empty"), limit)
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("expected a {})", limit.what)), "{e}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn oversized_empty_and_non_utf8_files_are_refused_naming_the_file() {
        let d = tmp("bad");
        std::fs::write(d.join("big"), [b'x'; 17]).unwrap();
        let e = read_bounded(&d.join("big"), TINY).unwrap_err().to_string();
        assert!(
            e.contains("big") && e.contains("more than a test file"),
            "{e}"
        );
        // Just over a cap that rounds alike: the size in bytes, not the cap's own figure.
        let mib = Limit {
            what: "test file",
            max_bytes: 1 << 20,
        };
        std::fs::write(d.join("just-over"), vec![b'x'; (1 << 20) + 600]).unwrap();
        let e = read_bounded(&d.join("just-over"), mib)
            .unwrap_err()
            .to_string();
        assert!(e.contains("is 1049176 bytes, more than"), "{e}");
        std::fs::write(d.join("empty"), "").unwrap();
        let e = read_bounded(&d.join("empty"), TINY)
            .unwrap_err()
            .to_string();
        assert!(e.contains("empty") && e.contains("is empty"), "{e}");
        std::fs::write(d.join("bin"), [b'a', 0xff, 0xfe]).unwrap();
        let e = read_text(&d.join("bin"), TINY).unwrap_err().to_string();
        assert!(e.contains("not UTF-8") && e.contains("offset 1"), "{e}");
        let e = read_bounded(&d, TINY).unwrap_err().to_string();
        assert!(e.contains("a directory"), "{e}");
        let e = read_bounded(&d.join("missing"), TINY).unwrap_err();
        assert!(matches!(e, Error::Io { .. }), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn devices_fifos_and_links_to_them_are_refused_without_blocking() {
        let d = tmp("special");
        let e = read_bounded(Path::new("/dev/zero"), TINY)
            .unwrap_err()
            .to_string();
        assert!(e.contains("character device"), "{e}");
        std::os::unix::fs::symlink("/dev/zero", d.join("link")).unwrap();
        let e = read_bounded(&d.join("link"), TINY).unwrap_err().to_string();
        assert!(e.contains("character device"), "{e}");
        let fifo = d.join("fifo");
        let ok = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            // Opening a FIFO would block this test forever; it must be refused before.
            let e = read_bounded(&fifo, TINY).unwrap_err().to_string();
            assert!(e.contains("FIFO"), "{e}");
            let e = check_output(&fifo, "picture").unwrap_err().to_string();
            assert!(e.contains("FIFO") && e.contains("picture"), "{e}");
        }
        assert!(check_output(&d.join("new.svg"), "picture").is_ok());
        std::fs::write(d.join("old.svg"), "x").unwrap();
        assert!(check_output(&d.join("old.svg"), "picture").is_ok());
        assert!(check_output(&d, "picture").is_err());
        assert!(check_output(Path::new("/dev/null"), "picture").is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
