//! `--model ORG/NAME` from a fake Hugging Face cache tree (refs/main -> snapshots/<commit>),
//! with `HF_HUB_CACHE` and `HF_HOME` respected, and a clear error when it is not cached; then
//! every class of hostile cache entry: refs that name no commit, refs and files that are
//! FIFOs, devices or links leading out of the model's cache folder. Each is an error naming
//! the file (never a plan of a file outside the cache, never a hang).
//!
//! One test function: the cache location is an environment variable, process-wide.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use memplan_model::{Error, Model, Source};

const CONFIG: &str = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":64,"num_hidden_layers":2,
    "num_attention_heads":4,"num_key_value_heads":2,"vocab_size":100,"max_position_embeddings":256}"#;
/// Another model's config: planning it instead of the cached one would show as 8 KV heads.
const OUTSIDE_CONFIG: &str = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":64,"num_hidden_layers":2,
    "num_attention_heads":8,"num_key_value_heads":8,"vocab_size":100,"max_position_embeddings":256}"#;
const COMMIT: &str = "0123abcd0123abcd0123abcd0123abcd0123abcd";

fn safetensors() -> Vec<u8> {
    let h = r#"{"model.embed_tokens.weight":{"dtype":"BF16","shape":[100,64],"data_offsets":[0,12800]}}"#;
    let mut st = (h.len() as u64).to_le_bytes().to_vec();
    st.extend_from_slice(h.as_bytes());
    st.resize(st.len() + 12800, 0);
    st
}

fn link(target: impl AsRef<Path>, at: impl AsRef<Path>) {
    let at = at.as_ref();
    let _ = std::fs::remove_file(at);
    let _ = std::fs::remove_dir_all(at);
    std::os::unix::fs::symlink(target, at).unwrap();
}

fn mkfifo(at: &Path) -> bool {
    let _ = std::fs::remove_file(at);
    std::process::Command::new("mkfifo")
        .arg(at)
        .status()
        .is_ok_and(|s| s.success())
}

/// A well-formed cache entry `models--Org--<name>` laid out as the hub lays it out: files in
/// `blobs/`, the snapshot's names linked to them.
fn entry(hub: &Path, name: &str) -> PathBuf {
    let repo = hub.join(format!("models--Org--{name}"));
    let _ = std::fs::remove_dir_all(&repo);
    let snap = repo.join("snapshots").join(COMMIT);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::write(repo.join("refs/main"), COMMIT).unwrap();
    std::fs::write(repo.join("blobs/cfg"), CONFIG).unwrap();
    std::fs::write(repo.join("blobs/st"), safetensors()).unwrap();
    link("../../blobs/cfg", snap.join("config.json"));
    link("../../blobs/st", snap.join("model.safetensors"));
    repo
}

/// Load with a deadline: a FIFO opened for reading would block forever.
fn load(id: &str) -> Result<Model, Error> {
    let (tx, rx) = mpsc::channel();
    let id2 = id.to_string();
    std::thread::spawn(move || {
        let _ = tx.send(Model::load(&id2));
    });
    rx.recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("loading {id} did not end within 10 s"))
}

/// The entry must be refused as a file's fault (exit 1), naming `names` in the message.
fn refused(id: &str, case: &str, names: &str) {
    match load(id) {
        Ok(m) => panic!(
            "{case}: planned {:?} (kv heads {})",
            m.source, m.config.num_kv_heads
        ),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                matches!(e, Error::InvalidFile { .. } | Error::Io { .. }),
                "{case}: {e:?}"
            );
            assert!(msg.contains(names), "{case}: {msg:?} does not name {names}");
        }
    }
}

#[test]
fn hub_ids_resolve_from_the_local_cache_and_nothing_leaves_it() {
    let root = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("memplan-hub-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let hub = root.join("hub");
    entry(&hub, "Tiny");

    // HF_HOME/hub.
    std::env::remove_var("HF_HUB_CACHE");
    std::env::set_var("HF_HOME", &root);
    let m = Model::load("Org/Tiny").unwrap();
    assert_eq!(m.name, "Org/Tiny");
    assert!(
        matches!(&m.source, Source::HubCache { repo, snapshot } if repo == "Org/Tiny" && snapshot.ends_with(COMMIT))
    );
    assert_eq!(m.checkpoint.as_ref().map(|c| c.total()), Some(12800));
    // HF_HUB_CACHE wins over HF_HOME.
    std::env::set_var("HF_HOME", "/nonexistent");
    std::env::set_var("HF_HUB_CACHE", &hub);
    assert_eq!(Model::load("Org/Tiny").unwrap().config.num_kv_heads, 2);
    // A ref as git writes it (trailing newline) and an abbreviated commit are fine.
    std::fs::write(
        hub.join("models--Org--Tiny/refs/main"),
        format!("{COMMIT}\n"),
    )
    .unwrap();
    assert!(Model::load("Org/Tiny").is_ok());
    // Not cached and not a preset: say where memplan looked and how to download.
    let e = Model::load("Org/Missing").unwrap_err().to_string();
    assert!(
        e.contains("huggingface-cli download Org/Missing")
            && e.contains("not in the Hugging Face cache"),
        "{e}"
    );
    // A preset id still works without a cache entry.
    assert!(Model::load("meta-llama/Llama-3.1-8B-Instruct").is_ok());

    // Everything outside the cache a hostile entry could lead to: another model's folder, a
    // file, a device.
    let outside = root.join("outside");
    let osnap = outside.join("snapshot");
    std::fs::create_dir_all(&osnap).unwrap();
    std::fs::write(osnap.join("config.json"), OUTSIDE_CONFIG).unwrap();
    std::fs::write(osnap.join("model.safetensors"), safetensors()).unwrap();
    std::fs::write(outside.join("ref"), COMMIT).unwrap();
    std::fs::write(
        outside.join("q.json"),
        r#"{"quantization":{"kv_cache_quant_algo":"FP8"}}"#,
    )
    .unwrap();
    let o = |p: &str| outside.join(p).display().to_string();

    // refs/main that names no commit: path syntax, absolute paths, empty, too long, binary.
    let rel = format!(
        "../../../../{}",
        osnap.strip_prefix(&root).unwrap().display()
    );
    let bad_refs: Vec<Vec<u8>> = vec![
        rel.clone().into_bytes(),
        b"../snapshots/../../x".to_vec(),
        osnap.display().to_string().into_bytes(),
        b"".to_vec(),
        b"\n".to_vec(),
        b"main".to_vec(),
        format!("{COMMIT}/..").into_bytes(),
        format!("{}/{}", &COMMIT[..20], &COMMIT[20..]).into_bytes(),
        "a".repeat(65).into_bytes(),
        "0".repeat(5000).into_bytes(),
        vec![0xff, 0xfe, b'a'],
        b"0123abcd\x00".to_vec(),
        b"..".to_vec(),
        b".".to_vec(),
    ];
    for (i, content) in bad_refs.iter().enumerate() {
        let name = format!("Ref{i}");
        let repo = entry(&hub, &name);
        std::fs::write(repo.join("refs/main"), content).unwrap();
        refused(
            &format!("Org/{name}"),
            &format!("refs/main = {:?}", String::from_utf8_lossy(content)),
            "refs/main",
        );
    }
    // A valid commit whose snapshot is missing: an error naming refs/main, not a preset.
    let repo = entry(&hub, "Gone");
    std::fs::write(repo.join("refs/main"), "deadbeef").unwrap();
    refused("Org/Gone", "missing snapshot", "refs/main");

    // refs/main that is not a regular file inside the folder.
    let repo = entry(&hub, "RefZero");
    link("/dev/zero", repo.join("refs/main"));
    refused("Org/RefZero", "refs/main -> /dev/zero", "refs/main");
    let repo = entry(&hub, "RefOut");
    link(o("ref"), repo.join("refs/main"));
    refused("Org/RefOut", "refs/main -> outside", "refs/main");
    let repo = entry(&hub, "RefDir");
    std::fs::remove_file(repo.join("refs/main")).unwrap();
    std::fs::create_dir(repo.join("refs/main")).unwrap();
    refused("Org/RefDir", "refs/main is a folder", "refs/main");
    let repo = entry(&hub, "RefDangling");
    link(repo.join("refs/nowhere"), repo.join("refs/main"));
    refused("Org/RefDangling", "refs/main dangling", "refs/main");
    let repo = entry(&hub, "RefFifo");
    if mkfifo(&repo.join("refs/main")) {
        refused("Org/RefFifo", "refs/main is a FIFO", "refs/main");
    }

    // The snapshot, the model folder and every file read, each leading out of the folder.
    let repo = entry(&hub, "SnapOut");
    link(&osnap, repo.join("snapshots").join(COMMIT));
    refused("Org/SnapOut", "snapshot -> outside", COMMIT);
    let repo = entry(&hub, "SnapFile");
    let snap = repo.join("snapshots").join(COMMIT);
    std::fs::remove_dir_all(&snap).unwrap();
    std::fs::write(&snap, CONFIG).unwrap();
    refused("Org/SnapFile", "snapshot is a file", COMMIT);
    link(&outside, hub.join("models--Org--FolderOut"));
    std::fs::create_dir_all(outside.join("refs")).unwrap();
    std::fs::write(outside.join("refs/main"), COMMIT).unwrap();
    refused(
        "Org/FolderOut",
        "model folder -> outside",
        "models--Org--FolderOut",
    );
    for (file, target) in [
        ("config.json", o("snapshot/config.json")),
        ("config.json", "/dev/zero".to_string()),
        ("config.json", "/etc/passwd".to_string()),
        ("model.safetensors", o("snapshot/model.safetensors")),
        ("model.safetensors", "/dev/zero".to_string()),
        ("hf_quant_config.json", o("q.json")),
        ("model.safetensors.index.json", "/dev/zero".to_string()),
        ("extra.safetensors", o("snapshot/model.safetensors")),
    ] {
        let name = format!("Out{}", target.len() + file.len());
        let repo = entry(&hub, &name);
        link(&target, repo.join("snapshots").join(COMMIT).join(file));
        refused(&format!("Org/{name}"), &format!("{file} -> {target}"), file);
    }
    // An index whose entry is a link that leads out (the name itself is a plain relative one).
    let repo = entry(&hub, "IndexOut");
    let snap = repo.join("snapshots").join(COMMIT);
    std::fs::write(
        snap.join("model.safetensors.index.json"),
        r#"{"weight_map":{"model.embed_tokens.weight":"shard.safetensors"}}"#,
    )
    .unwrap();
    link(
        o("snapshot/model.safetensors"),
        snap.join("shard.safetensors"),
    );
    refused(
        "Org/IndexOut",
        "index entry -> outside",
        "shard.safetensors",
    );
    // FIFOs where files are read.
    for file in ["config.json", "model.safetensors", "hf_quant_config.json"] {
        let name = format!("Fifo{}", file.len());
        let repo = entry(&hub, &name);
        let at = repo.join("snapshots").join(COMMIT).join(file);
        if mkfifo(&at) {
            refused(&format!("Org/{name}"), &format!("{file} is a FIFO"), file);
        }
    }
    // A sidecar inside the folder with a value that names no algorithm: the key and the file.
    let repo = entry(&hub, "Sidecar");
    std::fs::write(
        repo.join("snapshots")
            .join(COMMIT)
            .join("hf_quant_config.json"),
        r#"{"quantization":{"kv_cache_quant_algo":["../x"]}}"#,
    )
    .unwrap();
    refused("Org/Sidecar", "sidecar value", "kv_cache_quant_algo");

    // What was refused changed nothing: the good entry still loads.
    assert_eq!(Model::load("Org/Tiny").unwrap().config.num_kv_heads, 2);
    std::fs::remove_dir_all(&root).unwrap();
}
