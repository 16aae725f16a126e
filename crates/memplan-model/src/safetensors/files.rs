//! A checkpoint on disk: the files to read (the index's, else every `*.safetensors` of the
//! directory), each one's header read without its tensors, and the checks that the files
//! account for their bytes and for each tensor once.

use std::borrow::Cow;
use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use memplan_core::input::{self, SAFETENSORS_INDEX};
use memplan_core::{Error, Result};
use serde::de::{
    self, Deserialize, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor,
};
use serde_json::Value;
use std::fmt;

use super::header::{header_len, parse, short_file};
use super::Summary;

/// An index at least this large (about ten thousand tensors) has the directory's shards read
/// while it is parsed.
const SPECULATE_INDEX_BYTES: u64 = 1 << 20;

/// The index of a sharded checkpoint.
pub const INDEX: &str = "model.safetensors.index.json";

/// Most files one checkpoint may have (the largest public ones have a few hundred shards).
pub const MAX_SHARDS: usize = 4096;

/// Most tensors one checkpoint may have, all files together (DeepSeek-V3 with its fp8 scales
/// has about 150,000).
pub const MAX_TENSORS: u64 = 1 << 20;

/// Read the header of one file, without reading its tensors, and check that the file is
/// exactly as long as the header says (`8 + header + the end of the last tensor`).
pub fn read_file(path: &Path) -> Result<Summary> {
    let raw = read_raw(path)?;
    let h = parse(&raw.name, &raw.header, true)?;
    raw.check_len(&h.summary)?;
    Ok(h.summary)
}

/// One file's header bytes, and the length of the data section after them.
struct Raw {
    name: String,
    header: Vec<u8>,
    data: u64,
}

fn read_raw(path: &Path) -> Result<Raw> {
    let name = path.display().to_string();
    let (mut f, file_len) = input::open_regular(path, "safetensors file")?;
    let io = |source| Error::Io {
        path: name.clone(),
        source,
    };
    let mut len = [0u8; 8];
    if file_len < 8 {
        return Err(short_file(&name, file_len));
    }
    f.read_exact(&mut len).map_err(io)?;
    let n = header_len(&name, len, file_len - 8)?;
    let mut header = Vec::with_capacity(n as usize);
    f.take(n).read_to_end(&mut header).map_err(io)?;
    if header.len() as u64 != n {
        // The file shrank since its size was read.
        return Err(Error::file(
            &name,
            format!(
                "the file ends inside its safetensors header ({} of {n} bytes)",
                header.len()
            ),
        ));
    }
    Ok(Raw {
        data: file_len - 8 - n,
        name,
        header,
    })
}

impl Raw {
    /// The tensors tile the data section from 0 (checked by the parser), so their total is
    /// the end of the data section: the file must end exactly there, as the reference reader
    /// requires.
    fn check_len(&self, s: &Summary) -> Result<()> {
        let (data, want) = (self.data, s.total());
        if data < want {
            return Err(Error::file(
                &self.name,
                format!(
                    "is truncated: its header describes {want} bytes of tensors but only {data} follow the header (an incomplete download?)"
                ),
            ));
        }
        if data > want {
            return Err(Error::file(
                &self.name,
                format!(
                    "has {} bytes after its last tensor (header describes {want} bytes of tensors, {data} follow it); safetensors files end with their last tensor",
                    data - want
                ),
            ));
        }
        Ok(())
    }
}

/// `f(0..n)`, spread over the machine's cores when there is enough work (headers of a large
/// checkpoint are independent); results in order.
fn each<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let threads = cores.min(8).min(n / 4);
    if threads <= 1 {
        return (0..n).map(f).collect();
    }
    std::thread::scope(|s| {
        let f = &f;
        // A chunk that gets no thread (the system refuses one) runs here instead.
        let parts: Vec<_> = (0..threads)
            .map(|t| {
                let range = t * n / threads..(t + 1) * n / threads;
                std::thread::Builder::new()
                    .spawn_scoped(s, {
                        let range = range.clone();
                        move || range.map(f).collect::<Vec<T>>()
                    })
                    .map_err(|_| range)
            })
            .collect();
        parts
            .into_iter()
            .flat_map(|p| match p {
                Ok(h) => h
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                Err(range) => range.map(f).collect(),
            })
            .collect()
    })
}

/// Read every `*.safetensors` header of a checkpoint directory; `None` when it has none.
///
/// When the directory has an [`INDEX`], exactly the files its `weight_map` names are read, as
/// engines load them: repositories such as Mistral's ship the same weights twice
/// (`consolidated.safetensors` beside the Hugging Face shards). Every name the index gives
/// must stay inside the directory; it is checked before any file is opened.
///
/// Errors: a file that does not account for its bytes, a tensor in two files (both named), a
/// checkpoint without tensors, more than [`MAX_SHARDS`] files or [`MAX_TENSORS`] tensors. The
/// first error in file order is the one reported.
///
/// Cost: linear in the tensors (one pass over each header's JSON, a hash set of names) but
/// for one sort of each header's byte ranges (skipped when they are in order, as writers lay
/// them out); headers are read and parsed on several threads when there are many files, and
/// while a large index is parsed.
pub fn read_dir(dir: &Path) -> Result<Option<Summary>> {
    read_dir_within(dir, None)
}

/// [`read_dir`]; with `within` (a real path, from [`std::fs::canonicalize`]), the index and
/// every file are first resolved (links followed) and must lie inside it: a cached Hugging
/// Face model links its files into the cache's `blobs/`, and a link that leads anywhere else
/// is an error naming the file, read never.
pub fn read_dir_within(dir: &Path, within: Option<&Path>) -> Result<Option<Summary>> {
    let confine = |f: &Path| match within {
        Some(root) => input::confined(f, root, "the model's Hugging Face cache folder").map(drop),
        None => Ok(()),
    };
    // With a large index (a checkpoint of thousands of tensors), the directory's own shards
    // (the files an index names, in every checkpoint seen so far) are read and parsed on
    // other threads while the index is parsed; the files the index names are then taken from
    // them, a shard it does not name is dropped (its errors with it), and one it names that
    // was not read is read after.
    let has_index = std::fs::metadata(dir.join(INDEX))
        .is_ok_and(|m| m.is_file() && m.len() >= SPECULATE_INDEX_BYTES);
    let (files, mut early) = std::thread::scope(|s| -> Result<_> {
        let speculate = || {
            let listed: Vec<PathBuf> = listed_files(dir)
                .ok()?
                .into_iter()
                .filter(|f| confine(f).is_ok())
                .collect();
            let shards = each(listed.len(), |i| read_shard(&listed[i]));
            Some(listed.into_iter().zip(shards).collect::<HashMap<_, _>>())
        };
        let early = has_index
            .then(|| std::thread::Builder::new().spawn_scoped(s, speculate).ok())
            .flatten();
        let files = match indexed_files(dir, &confine)? {
            Some(named) => named,
            None => listed_files(dir)?,
        };
        let early = early
            .and_then(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .unwrap_or_default();
        Ok((files, early))
    })?;
    if files.is_empty() {
        return Ok(None);
    }
    for f in &files {
        confine(f)?;
    }
    let late: Vec<&PathBuf> = files.iter().filter(|f| !early.contains_key(*f)).collect();
    let mut late: HashMap<&PathBuf, Result<Shard>> = late
        .iter()
        .copied()
        .zip(each(late.len(), |i| read_shard(late[i])))
        .collect();
    let shards: Vec<Result<Shard>> = files
        .iter()
        .map(|f| match early.remove(f) {
            Some(r) => r,
            None => late.remove(f).unwrap_or_else(|| read_shard(f)),
        })
        .collect();
    // Checked in file order, so the first error in file order is the one reported: the shards
    // before the first that failed, then its error.
    let failed = shards
        .iter()
        .position(Result::is_err)
        .unwrap_or(shards.len());
    let s = check_shards(dir, &files, shards[..failed].iter().flatten())?;
    if let Some(Err(e)) = shards.into_iter().nth(failed) {
        return Err(e);
    }
    if s.tensors == 0 || s.total() == 0 {
        return Err(Error::file(
            dir.display().to_string(),
            format!(
                "the checkpoint holds no weights ({} tensors, {} bytes in {} safetensors file(s))",
                s.tensors,
                s.total(),
                files.len()
            ),
        ));
    }
    Ok(Some(s))
}

/// The checkpoint's totals from its shards (in file order), checking that no tensor appears
/// twice and that the totals stay within bounds.
fn check_shards<'a>(
    dir: &Path,
    files: &[PathBuf],
    shards: impl Iterator<Item = &'a Shard> + Clone,
) -> Result<Summary> {
    let mut s = Summary::default();
    // Sized once for every name: growing it file by file would hash every name again.
    let names: usize = shards.clone().map(|h| h.ends.len()).sum();
    let mut owner: HashMap<&str, usize> = HashMap::with_capacity(names);
    for (i, shard) in shards.enumerate() {
        for t in shard.names() {
            match owner.entry(t) {
                Entry::Vacant(v) => {
                    v.insert(i);
                }
                Entry::Occupied(o) if *o.get() == i => {
                    return Err(Error::file(
                        &shard.file,
                        format!("tensor {t:?} appears twice in the header"),
                    ));
                }
                Entry::Occupied(o) => {
                    return Err(Error::file(
                        dir.display().to_string(),
                        format!(
                            "tensor {t:?} is in both {} and {}; a checkpoint holds each tensor once",
                            files[*o.get()].display(),
                            files[i].display()
                        ),
                    ));
                }
            }
        }
        s.merge(shard.summary.clone()).ok_or_else(|| {
            Error::file(
                dir.display().to_string(),
                "safetensors sizes overflow 64 bits",
            )
        })?;
        if s.tensors > MAX_TENSORS {
            return Err(Error::file(
                dir.display().to_string(),
                format!("more than {MAX_TENSORS} tensors in one checkpoint"),
            ));
        }
    }
    Ok(s)
}

/// One file's header, checked on its own (parsed, the file's length accounted for), with the
/// tensor names kept in one buffer so it can be read on any thread.
struct Shard {
    file: String,
    summary: Summary,
    /// Every name, one after the other.
    text: String,
    /// Where each name ends in `text`.
    ends: Vec<usize>,
}

impl Shard {
    fn names(&self) -> impl Iterator<Item = &str> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(&self.ends).map(|(a, &b)| &self.text[a..b])
    }
}

fn read_shard(path: &Path) -> Result<Shard> {
    let raw = read_raw(path)?;
    let h = parse(&raw.name, &raw.header, false)?;
    raw.check_len(&h.summary)?;
    let mut text = String::with_capacity(h.names.iter().map(|n| n.len()).sum());
    let mut ends = Vec::with_capacity(h.names.len());
    for n in &h.names {
        text.push_str(n);
        ends.push(text.len());
    }
    Ok(Shard {
        file: raw.name.clone(),
        summary: h.summary,
        text,
        ends,
    })
}

/// Every `*.safetensors` entry of the directory, sorted.
fn listed_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let io = |source| Error::Io {
        path: dir.display().to_string(),
        source,
    };
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io)? {
        let p = e.map_err(io)?.path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            files.push(p);
            if files.len() > MAX_SHARDS {
                return Err(too_many_shards(dir));
            }
        }
    }
    files.sort();
    Ok(files)
}

fn too_many_shards(dir: &Path) -> Error {
    Error::file(
        dir.display().to_string(),
        format!("more than {MAX_SHARDS} safetensors files in one checkpoint"),
    )
}

/// The files a directory's [`INDEX`] maps tensors to, each checked to be a plain relative
/// path inside the directory; `None` without an index.
fn indexed_files(
    dir: &Path,
    confine: &dyn Fn(&Path) -> Result<()>,
) -> Result<Option<Vec<PathBuf>>> {
    let path = dir.join(INDEX);
    let name = path.display().to_string();
    match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(Error::Io {
                path: name,
                source: e,
            })
        }
        Ok(_) => {}
    }
    confine(&path)?;
    let text = input::read_text(&path, SAFETENSORS_INDEX)?;
    let index: Index = memplan_core::json::from_str(&text).map_err(|e| e.in_file(&name))?;
    let map = index
        .weight_map
        .ok_or_else(|| Error::file_key(&name, "weight_map", "missing or not an object"))?;
    match map.problem {
        Some(Problem::TooManyFiles) => return Err(too_many_shards(dir)),
        Some(Problem::Entry { at, what }) => {
            // The tensor's name, for the message: a second pass, only when something is wrong.
            let mut de = serde_json::Deserializer::from_str(&text);
            let tensor = NthKey(at)
                .deserialize(&mut de)
                .ok()
                .flatten()
                .unwrap_or_default();
            let message = match what {
                EntryProblem::NotAString(v) => {
                    format!("tensor {tensor:?}: file names must be strings, found {v}")
                }
                EntryProblem::Outside(f, why) => {
                    format!("tensor {tensor:?} is mapped to {f:?}, {why}")
                }
            };
            return Err(Error::file_key(&name, "weight_map", message));
        }
        None if map.entries == 0 => {
            return Err(Error::file_key(
                &name,
                "weight_map",
                "is empty: the index names no tensor",
            ))
        }
        None => {}
    }
    let names = map.files;
    let files: Vec<PathBuf> = names.iter().map(|n| dir.join(&**n)).collect();
    // A shard the index names but the directory lacks would silently shrink the weights.
    if let Some((missing, _)) = names.iter().zip(&files).find(|(_, p)| !p.exists()) {
        return Err(Error::file_key(
            &name,
            "weight_map",
            format!("names {missing:?}, which is not in the directory"),
        ));
    }
    Ok(Some(files))
}

/// An index file, as far as it is read: its `weight_map` (`None`: absent or not an object).
struct Index<'a> {
    weight_map: Option<WeightMap<'a>>,
}

/// A `weight_map` read entry by entry without building it: the distinct files it names
/// (each checked once with [`inside`]), how many entries, and the first problem.
#[derive(Default)]
struct WeightMap<'a> {
    files: BTreeSet<Cow<'a, str>>,
    entries: u64,
    problem: Option<Problem>,
}

/// What is wrong with a `weight_map`.
enum Problem {
    /// Entry `at` (counting from 0 in file order) names no file inside the directory.
    Entry { at: u64, what: EntryProblem },
    /// More than [`MAX_SHARDS`] distinct files.
    TooManyFiles,
}

/// Why an entry names no file.
enum EntryProblem {
    /// Its value is not a string.
    NotAString(Value),
    /// Its file is outside the directory or not a safetensors file, and why.
    Outside(String, &'static str),
}

/// The `n`-th key of the index's `weight_map` (for an error message).
struct NthKey(u64);

impl<'de> DeserializeSeed<'de> for NthKey {
    type Value = Option<String>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
        struct Top(u64);
        impl<'de> Visitor<'de> for Top {
            type Value = Option<String>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an index")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                let mut found = None;
                while let Some(k) = m.next_key::<String>()? {
                    if k == "weight_map" {
                        found = m.next_value_seed(Keys(self.0))?;
                    } else {
                        m.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(found)
            }
        }
        struct Keys(u64);
        impl<'de> DeserializeSeed<'de> for Keys {
            type Value = Option<String>;
            fn deserialize<D: Deserializer<'de>>(
                self,
                d: D,
            ) -> std::result::Result<Self::Value, D::Error> {
                d.deserialize_map(self)
            }
        }
        impl<'de> Visitor<'de> for Keys {
            type Value = Option<String>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a weight map")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                let mut i = 0;
                let mut found = None;
                while let Some(k) = m.next_key::<String>()? {
                    m.next_value::<IgnoredAny>()?;
                    if i == self.0 {
                        found = Some(k);
                    }
                    i += 1;
                }
                Ok(found)
            }
        }
        d.deserialize_map(Top(self.0))
    }
}

impl<'de> Deserialize<'de> for Index<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Index<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<Index<'de>, A::Error> {
                let mut weight_map = None;
                while let Some(k) = m.next_key::<Cow<'de, str>>()? {
                    if k == "weight_map" {
                        weight_map = m.next_value::<MaybeWeightMap<'de>>()?.0;
                    } else {
                        m.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(Index { weight_map })
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> std::result::Result<Index<'de>, A::Error> {
                while a.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Index { weight_map: None })
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> std::result::Result<Index<'de>, E> {
                Ok(Index { weight_map: None })
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> std::result::Result<Index<'de>, E> {
                Ok(Index { weight_map: None })
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> std::result::Result<Index<'de>, E> {
                Ok(Index { weight_map: None })
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> std::result::Result<Index<'de>, E> {
                Ok(Index { weight_map: None })
            }
            fn visit_str<E: de::Error>(self, _: &str) -> std::result::Result<Index<'de>, E> {
                Ok(Index { weight_map: None })
            }
            fn visit_unit<E: de::Error>(self) -> std::result::Result<Index<'de>, E> {
                Ok(Index { weight_map: None })
            }
        }
        d.deserialize_any(V)
    }
}

/// A `weight_map` that is an object (`None`: any other value, consumed).
struct MaybeWeightMap<'a>(Option<WeightMap<'a>>);

impl<'de> Deserialize<'de> for MaybeWeightMap<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = MaybeWeightMap<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of tensor names to file names")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                let mut w = WeightMap::default();
                let mut last: Option<Cow<'de, str>> = None;
                // Tensor names are skipped (only scanned): one is looked up again for a message.
                while m.next_key::<IgnoredAny>()?.is_some() {
                    let at = w.entries;
                    w.entries += 1;
                    let file = m.next_value::<FileName<'de>>()?;
                    if w.problem.is_some() {
                        continue;
                    }
                    let f = match file {
                        FileName::Name(f) => f,
                        FileName::Other(v) => {
                            w.problem = Some(Problem::Entry {
                                at,
                                what: EntryProblem::NotAString(v),
                            });
                            continue;
                        }
                    };
                    // Shards list their tensors together: most entries repeat the last file.
                    if last.as_ref() == Some(&f) || w.files.contains(&f) {
                        last = Some(f);
                        continue;
                    }
                    if let Err(why) = inside(&f) {
                        w.problem = Some(Problem::Entry {
                            at,
                            what: EntryProblem::Outside(f.into_owned(), why),
                        });
                        continue;
                    }
                    w.files.insert(f.clone());
                    last = Some(f);
                    if w.files.len() > MAX_SHARDS {
                        w.problem = Some(Problem::TooManyFiles);
                    }
                }
                Ok(MaybeWeightMap(Some(w)))
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                while a.next_element::<IgnoredAny>()?.is_some() {}
                Ok(MaybeWeightMap(None))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> std::result::Result<Self::Value, E> {
                Ok(MaybeWeightMap(None))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> std::result::Result<Self::Value, E> {
                Ok(MaybeWeightMap(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> std::result::Result<Self::Value, E> {
                Ok(MaybeWeightMap(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> std::result::Result<Self::Value, E> {
                Ok(MaybeWeightMap(None))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> std::result::Result<Self::Value, E> {
                Ok(MaybeWeightMap(None))
            }
            fn visit_unit<E: de::Error>(self) -> std::result::Result<Self::Value, E> {
                Ok(MaybeWeightMap(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// A `weight_map` value: a file name, or the JSON of a value that is not a string.
enum FileName<'a> {
    Name(Cow<'a, str>),
    Other(Value),
}

impl<'de> Deserialize<'de> for FileName<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = FileName<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a file name")
            }
            fn visit_borrowed_str<E: de::Error>(
                self,
                v: &'de str,
            ) -> std::result::Result<Self::Value, E> {
                Ok(FileName::Name(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Self::Value, E> {
                Ok(FileName::Name(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> std::result::Result<Self::Value, E> {
                Ok(FileName::Name(Cow::Owned(v)))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<Self::Value, E> {
                Ok(FileName::Other(v.into()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<Self::Value, E> {
                Ok(FileName::Other(v.into()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Self::Value, E> {
                Ok(FileName::Other(v.into()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<Self::Value, E> {
                Ok(FileName::Other(v.into()))
            }
            fn visit_unit<E: de::Error>(self) -> std::result::Result<Self::Value, E> {
                Ok(FileName::Other(Value::Null))
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                a: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                Value::deserialize(de::value::SeqAccessDeserializer::new(a)).map(FileName::Other)
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                m: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                Value::deserialize(de::value::MapAccessDeserializer::new(m)).map(FileName::Other)
            }
        }
        d.deserialize_any(V)
    }
}

/// Whether an index entry names a `.safetensors` file inside the model directory: relative,
/// without `..`, a root or a drive prefix. Checked on the text alone (links inside the
/// directory, as in the Hugging Face cache, stay allowed).
fn inside(f: &str) -> std::result::Result<(), &'static str> {
    let p = Path::new(f);
    if f.is_empty() || p.file_name().is_none() {
        return Err("which names no file");
    }
    if !p
        .components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(
            "outside the model directory (index entries must be relative paths without `..`)",
        );
    }
    if p.extension().is_none_or(|x| x != "safetensors") {
        return Err("which is not a .safetensors file");
    }
    Ok(())
}
