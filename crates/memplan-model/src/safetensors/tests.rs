//! Tests of the safetensors reader: headers, files and directories.

use super::*;

/// A whole file: the header and as many data bytes as it describes.
fn file(json: &str) -> Vec<u8> {
    let mut v = header_only(json);
    let data = parse_header("x", json.as_bytes()).unwrap().total();
    v.resize(v.len() + data as usize, 0);
    v
}

fn header_only(json: &str) -> Vec<u8> {
    let mut v = (json.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(json.as_bytes());
    v
}

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("memplan-st-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn sums_by_dtype() {
    let h = r#"{"__metadata__":{"format":"pt"},
        "a.weight":{"dtype":"BF16","shape":[4,8],"data_offsets":[0,64]},
        "model.norm.weight":{"dtype":"BF16","shape":[8],"data_offsets":[64,80]},
        "b.weight":{"dtype":"F8_E4M3","shape":[16],"data_offsets":[80,96]}}"#;
    let s = parse_header("x", h.as_bytes()).unwrap();
    assert_eq!(s.total(), 96);
    assert_eq!(s.bytes_by_dtype["BF16"], 80);
    assert_eq!(s.replicated_bytes, 16);
    assert_eq!(s.per_rank(2), 16 + 40);
}

#[test]
fn floats_are_counted_at_the_loaded_dtype() {
    let h = r#"{"w":{"dtype":"F32","shape":[4,8],"data_offsets":[0,128]},
        "q":{"dtype":"I8","shape":[16],"data_offsets":[128,144]}}"#;
    let s = parse_header("x", h.as_bytes()).unwrap();
    assert_eq!(s.per_rank_as(1, 4, false), 144);
    // float32 served in bfloat16: half of the F32 bytes; int8 unchanged.
    assert_eq!(s.per_rank_as(1, 2, false), 64 + 16);
    // In a quantized checkpoint float32 tensors are scales, kept as they are.
    assert_eq!(s.per_rank_as(1, 2, true), 144);
    let h = r#"{"w":{"dtype":"BF16","shape":[8],"data_offsets":[0,16]}}"#;
    let s = parse_header("x", h.as_bytes()).unwrap();
    assert_eq!(s.per_rank_as(2, 4, false), 16);
    assert_eq!(Summary::default().per_rank_as(1, 2, false), 0);
}

#[test]
fn rejects_lies() {
    for h in [
        r#"{"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,7]}}"#,
        r#"{"a":{"dtype":"Q9","shape":[4],"data_offsets":[0,8]}}"#,
        r#"{"a":{"dtype":"BF16","shape":[4],"data_offsets":[8,0]}}"#,
        r#"{"a":{"dtype":"BF16","shape":[18446744073709551615,4],"data_offsets":[0,8]}}"#,
        r#"[1,2]"#,
        r#"{"a":{"dtype":"BF16"}}"#,
    ] {
        assert!(
            parse_header("w.safetensors", h.as_bytes())
                .unwrap_err()
                .to_string()
                .contains("w.safetensors"),
            "{h}"
        );
    }
}

#[test]
fn sizes_that_would_overflow_are_an_error_not_a_panic() {
    // Nine U8 tensors of 2^61 - 1 bytes each: every entry is consistent on its own, but
    // their sum overflows 64 bits. They overlap, so the header is invalid.
    let n = (1u64 << 61) - 1;
    let body: Vec<String> = (0..9)
        .map(|i| format!(r#""t{i}":{{"dtype":"U8","shape":[{n}],"data_offsets":[0,{n}]}}"#))
        .collect();
    let h = format!("{{{}}}", body.join(","));
    let e = parse_header("w.safetensors", h.as_bytes())
        .unwrap_err()
        .to_string();
    assert!(e.contains("gaps or overlaps"), "{e}");
    // Several files whose sums overflow together.
    let mut s = Summary::default();
    let big = |b: u64| Summary {
        bytes_by_dtype: [("U8".to_string(), b)].into(),
        replicated_bytes: 0,
        tensors: 1,
    };
    assert!(s.merge(big(u64::MAX - 1)).is_some());
    assert!(s.merge(big(2)).is_none());
    assert_eq!(s.total(), u64::MAX - 1);
}

#[test]
fn duplicate_names_gaps_and_overlaps_are_refused() {
    for (h, why) in [
        (
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}"#,
            "appears twice",
        ),
        (
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}"#,
            "gaps or overlaps",
        ),
        (
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
            "gaps or overlaps",
        ),
    ] {
        let e = parse_header("w.safetensors", h.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.contains(why), "{h}: {e}");
    }
    // Zero-sized tensors and any order of entries are fine.
    let ok = r#"{"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},"z":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let s = parse_header("w.safetensors", ok.as_bytes()).unwrap();
    assert_eq!((s.total(), s.tensors), (16, 3));
}

#[test]
fn sub_byte_dtypes_have_their_real_size() {
    // F6 is 6 bits: 4 elements are 3 bytes; F4 packs 2 per byte.
    let f6 = r#"{"a":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,3]}}"#;
    assert_eq!(parse_header("x", f6.as_bytes()).unwrap().total(), 3);
    let f4 = r#"{"a":{"dtype":"F4","shape":[2,4],"data_offsets":[0,4]}}"#;
    assert_eq!(parse_header("x", f4.as_bytes()).unwrap().total(), 4);
    for lie in [
        r#"{"a":{"dtype":"F4","shape":[8],"data_offsets":[0,100]}}"#,
        r#"{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}"#,
    ] {
        assert!(parse_header("x", lie.as_bytes()).is_err(), "{lie}");
    }
    let c64 = r#"{"a":{"dtype":"C64","shape":[2],"data_offsets":[0,16]}}"#;
    assert_eq!(parse_header("x", c64.as_bytes()).unwrap().total(), 16);
}

#[test]
fn an_index_limits_the_files_read() {
    // Mistral's repositories: HF shards listed in the index, plus consolidated.safetensors
    // holding the same weights again.
    let dir = std::env::temp_dir().join(format!("memplan-st-idx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let shard = file(r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#);
    std::fs::write(dir.join("model-00001-of-00001.safetensors"), &shard).unwrap();
    std::fs::write(dir.join("consolidated.safetensors"), &shard).unwrap();
    // Without the index both files are read, and the tensor they share is refused.
    let e = read_dir(&dir).unwrap_err().to_string();
    assert!(
        e.contains("consolidated.safetensors") && e.contains("model-00001"),
        "{e}"
    );
    std::fs::write(
        dir.join(INDEX),
        r#"{"metadata":{"total_size":8},"weight_map":{"w":"model-00001-of-00001.safetensors"}}"#,
    )
    .unwrap();
    assert_eq!(read_dir(&dir).unwrap().unwrap().total(), 8);
    std::fs::write(
        dir.join(INDEX),
        r#"{"weight_map":{"w":"model-00001-of-00001.safetensors","v":"model-00002-of-00002.safetensors"}}"#,
    )
    .unwrap();
    let e = read_dir(&dir).unwrap_err().to_string();
    assert!(e.contains("model-00002-of-00002.safetensors"), "{e}");
    std::fs::write(dir.join(INDEX), r#"{"weight_map":[1]}"#).unwrap();
    let e = read_dir(&dir).unwrap_err().to_string();
    assert!(e.contains("weight_map"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn reads_only_the_header() {
    let dir = std::env::temp_dir().join(format!("memplan-st-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bytes = file(r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#);
    std::fs::write(dir.join("m.safetensors"), &bytes).unwrap();
    assert_eq!(read_dir(&dir).unwrap().unwrap().total(), 8);
    std::fs::write(dir.join("m.safetensors"), 1u64.to_le_bytes().repeat(2)).unwrap();
    assert!(read_dir(&dir).is_err());
    std::fs::write(dir.join("m.safetensors"), u64::MAX.to_le_bytes()).unwrap();
    assert!(read_dir(&dir).unwrap_err().to_string().contains("limit"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn files_must_account_for_their_bytes() {
    let dir = tmp("bytes");
    let h = r#"{"w":{"dtype":"F32","shape":[256],"data_offsets":[0,1024]}}"#;
    let p = dir.join("model.safetensors");
    let whole = file(h);
    // A truncated download: the header promises 1 KiB of tensors, 100 bytes follow.
    std::fs::write(&p, &whole[..whole.len() - 924]).unwrap();
    let e = read_dir(&dir).unwrap_err().to_string();
    assert!(
        e.contains("model.safetensors") && e.contains("truncated"),
        "{e}"
    );
    // Trailing bytes the header does not describe.
    let mut more = whole.clone();
    more.extend_from_slice(&[0; 5]);
    std::fs::write(&p, &more).unwrap();
    let e = read_dir(&dir).unwrap_err().to_string();
    assert!(e.contains("5 bytes after its last tensor"), "{e}");
    // Files too short for the length, or for the header: named, not "failed to fill
    // whole buffer".
    for (bytes, why) in [
        (vec![], "is empty"),
        (vec![1, 2, 3], "is 3 bytes"),
        (
            header_only(h)[..20].to_vec(),
            "ends inside its safetensors header",
        ),
    ] {
        std::fs::write(&p, &bytes).unwrap();
        let e = read_dir(&dir).unwrap_err().to_string();
        assert!(
            e.contains("model.safetensors") && e.contains(why),
            "{why}: {e}"
        );
    }
    std::fs::write(&p, &whole).unwrap();
    assert_eq!(read_dir(&dir).unwrap().unwrap().total(), 1024);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_empty_checkpoint_is_an_error() {
    let dir = tmp("empty");
    std::fs::write(dir.join("model.safetensors"), file("{}")).unwrap();
    let e = read_dir(&dir).unwrap_err().to_string();
    assert!(e.contains("no weights"), "{e}");
    let z = r#"{"__metadata__":{},"z":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}"#;
    std::fs::write(dir.join("model.safetensors"), file(z)).unwrap();
    let e = read_dir(&dir).unwrap_err().to_string();
    assert!(e.contains("no weights"), "{e}");
    std::fs::write(dir.join(INDEX), r#"{"weight_map":{}}"#).unwrap();
    let e = read_dir(&dir).unwrap_err().to_string();
    assert!(e.contains("weight_map") && e.contains("empty"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_tensor_in_two_files_is_refused_naming_both() {
    let dir = tmp("dup");
    let a = file(r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#);
    let b = file(
        r#"{"v":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
    );
    std::fs::write(dir.join("model-00001-of-00002.safetensors"), &a).unwrap();
    std::fs::write(dir.join("model-00002-of-00002.safetensors"), &b).unwrap();
    let e = read_dir(&dir).unwrap_err().to_string();
    assert!(
        e.contains("\"w\"")
            && e.contains("model-00001-of-00002.safetensors")
            && e.contains("model-00002-of-00002.safetensors"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_index_stays_inside_the_model_directory() {
    let root = tmp("escape");
    let dir = root.join("model");
    std::fs::create_dir_all(&dir).unwrap();
    let shard = file(r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#);
    std::fs::write(root.join("outside.safetensors"), &shard).unwrap();
    for entry in [
        "../outside.safetensors",
        "/etc/passwd.safetensors",
        "sub/../../outside.safetensors",
        "",
        "config.json",
    ] {
        std::fs::write(
            dir.join(INDEX),
            format!(r#"{{"weight_map":{{"w":{entry:?}}}}}"#),
        )
        .unwrap();
        let e = read_dir(&dir).unwrap_err().to_string();
        assert!(
            e.contains("weight_map") && e.contains(INDEX),
            "{entry}: {e}"
        );
    }
    // A shard in a subdirectory of the model directory is read, not silently skipped.
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/w.safetensors"), &shard).unwrap();
    std::fs::write(
        dir.join(INDEX),
        r#"{"weight_map":{"w":"sub/w.safetensors"}}"#,
    )
    .unwrap();
    assert_eq!(read_dir(&dir).unwrap().unwrap().total(), 8);
    std::fs::remove_dir_all(&root).unwrap();
}

#[cfg(unix)]
#[test]
fn special_files_are_refused_without_reading_them() {
    let dir = tmp("special");
    std::os::unix::fs::symlink("/dev/zero", dir.join(INDEX)).unwrap();
    let e = read_dir(&dir).unwrap_err().to_string();
    assert!(e.contains("character device"), "{e}");
    std::fs::remove_file(dir.join(INDEX)).unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.join("model.safetensors")).unwrap();
    let e = read_dir(&dir).unwrap_err().to_string();
    assert!(e.contains("character device"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_streaming_readers_keep_their_messages() {
    // Not UTF-8, wrong-typed fields, entries that are not objects.
    for (h, why) in [
        (&b"{\"a\xff\":{}}"[..], "UTF-8"),
        (br#"{"a":5}"#, "no dtype"),
        (
            br#"{"a":{"dtype":7,"shape":[1],"data_offsets":[0,4]}}"#,
            "no dtype",
        ),
        (
            br#"{"a":{"dtype":"F32","shape":"1","data_offsets":[0,4]}}"#,
            "no shape",
        ),
        (
            br#"{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}"#,
            "integers",
        ),
        (
            br#"{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#,
            "integers",
        ),
        (
            br#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}}"#,
            "two integers",
        ),
        (
            br#"{"a":{"dtype":"F32","shape":[1],"data_offsets":{"0":4}}}"#,
            "no data_offsets",
        ),
        (
            br#"{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}}"#,
            "overflows",
        ),
        (br#"[1,2]"#, "not a JSON object"),
        (
            br#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} x"#,
            "not valid JSON",
        ),
        (
            br#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,NaN]}}"#,
            "a.data_offsets[1]: not valid JSON: NaN and infinity are not valid JSON numbers",
        ),
    ] {
        let e = parse_header("w.safetensors", h).unwrap_err().to_string();
        assert!(e.contains(why), "{}: {e}", String::from_utf8_lossy(h));
    }
    // Unknown keys and nested values are skipped; escaped names are kept.
    let ok = r#"{"__metadata__":{"format":"pt","nested":{"x":[1,{"y":null}]}},"a\"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":[true,{"k":"v"}]}}"#;
    assert_eq!(parse_header("w", ok.as_bytes()).unwrap().total(), 4);
}

#[test]
fn a_name_twice_in_one_shard_of_a_directory_names_the_shard() {
    let dir = tmp("dup-in-shard");
    let h = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}"#;
    let mut f = header_only(h);
    f.resize(f.len() + 16, 0);
    std::fs::write(dir.join("model.safetensors"), f).unwrap();
    let e = read_dir(&dir).unwrap_err().to_string();
    assert!(
        e.contains("model.safetensors") && e.contains("appears twice"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn index_problems_name_the_tensor() {
    let dir = tmp("index-names");
    let shard = file(r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#);
    std::fs::write(dir.join("a.safetensors"), &shard).unwrap();
    for (index, want) in [
        (
            r#"{"weight_map":{"w":"a.safetensors","x.y":7}}"#,
            r#"tensor "x.y": file names must be strings, found 7"#,
        ),
        (
            r#"{"weight_map":{"w":"a.safetensors","q\"r":{"f":1}}}"#,
            r#"tensor "q\"r": file names must be strings, found {"f":1}"#,
        ),
        (
            r#"{"weight_map":{"w":"a.safetensors","z":"../a.safetensors"}}"#,
            r#"tensor "z" is mapped to "../a.safetensors""#,
        ),
        (r#"[{"weight_map":{}}]"#, "missing or not an object"),
        (
            r#"{"weight_map":"a.safetensors"}"#,
            "missing or not an object",
        ),
        (r#"{"weight_map":{"w":"a.safetensors"}"#, "not valid JSON"),
        (
            r#"{"weight_map":{"w":"a.safetensors","x":-Infinity}}"#,
            "weight_map.x: not valid JSON: NaN and infinity are not valid JSON numbers",
        ),
    ] {
        std::fs::write(dir.join(INDEX), index).unwrap();
        let e = read_dir(&dir).unwrap_err().to_string();
        assert!(e.contains(want), "{index}: {e}");
    }
    // Many entries of one file, in any order of files: each file is read once.
    let mut map = serde_json::Map::new();
    map.insert("w".into(), "a.safetensors".into());
    std::fs::write(
        dir.join(INDEX),
        serde_json::json!({"metadata": {}, "weight_map": map}).to_string(),
    )
    .unwrap();
    assert_eq!(read_dir(&dir).unwrap().unwrap().tensors, 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn many_shards_read_in_parallel_report_the_first_error_in_file_order() {
    let dir = tmp("many");
    for i in 0..24 {
        let h = format!(r#"{{"t{i}":{{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}}}"#);
        std::fs::write(dir.join(format!("m-{i:02}.safetensors")), file(&h)).unwrap();
    }
    let s = read_dir(&dir).unwrap().unwrap();
    assert_eq!((s.tensors, s.total()), (24, 96));
    // Shard 7 truncated, shard 15 not a header at all: shard 7 is named.
    let h = r#"{"t7":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    std::fs::write(dir.join("m-07.safetensors"), header_only(h)).unwrap();
    std::fs::write(dir.join("m-15.safetensors"), b"xx").unwrap();
    let e = read_dir(&dir).unwrap_err().to_string();
    assert!(
        e.contains("m-07.safetensors") && e.contains("truncated"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_large_index_reads_the_named_shards_and_only_those() {
    // An index over 1 MiB has the directory's shards read while it is parsed: a shard it does
    // not name is dropped with its errors, one it names outside the listing is read after.
    let dir = tmp("large-index");
    std::fs::write(
        dir.join("a.safetensors"),
        file(r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#),
    )
    .unwrap();
    std::fs::write(dir.join("broken.safetensors"), b"not a header").unwrap();
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(
        dir.join("sub/b.safetensors"),
        file(r#"{"v":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}"#),
    )
    .unwrap();
    let pad = "x".repeat(1 << 20);
    let index = |map: &str| format!(r#"{{"metadata":{{"pad":"{pad}"}},"weight_map":{map}}}"#);
    std::fs::write(
        dir.join(INDEX),
        index(r#"{"w":"a.safetensors","v":"sub/b.safetensors"}"#),
    )
    .unwrap();
    let s = read_dir(&dir).unwrap().unwrap();
    assert_eq!((s.tensors, s.total()), (2, 12));
    // Named, the broken shard is an error again; a bad index is reported whatever was read.
    std::fs::write(
        dir.join(INDEX),
        index(r#"{"w":"a.safetensors","x":"broken.safetensors"}"#),
    )
    .unwrap();
    let e = read_dir(&dir).unwrap_err().to_string();
    assert!(e.contains("broken.safetensors"), "{e}");
    std::fs::write(dir.join(INDEX), index(r#"{"w":"../a.safetensors"}"#)).unwrap();
    let e = read_dir(&dir).unwrap_err().to_string();
    assert!(e.contains("weight_map") && e.contains("outside"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
