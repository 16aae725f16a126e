//! Hugging Face cache resolution: the input is a program that builds a cache entry
//! (`models--Org--M`: refs, snapshots, blobs, files, links that lead anywhere, including out of
//! the cache to another model, a FIFO and `/dev/zero`), then the entry is loaded. Properties:
//! no panic, no hang (a FIFO is never opened), and never a plan of the model outside the
//! cache (its config and checkpoint carry markers no file inside has).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use memplan_model::Model;

/// The inside model: 2 KV heads, a 12,800-byte checkpoint.
const CONFIG: &str = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":100,"max_position_embeddings":256}"#;
/// The outside model: 7 KV heads (the marker), a 98-byte checkpoint.
const OUTSIDE_CONFIG: &str = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":56,"num_hidden_layers":2,"num_attention_heads":7,"num_key_value_heads":7,"vocab_size":100,"max_position_embeddings":256}"#;
const OUTSIDE_HEADS: u64 = 7;
const C1: &str = "0123abcd0123abcd0123abcd0123abcd0123abcd";
const C2: &str = "feedbeef";

fn safetensors(elements: u64) -> Vec<u8> {
    let h = format!(
        r#"{{"model.embed_tokens.weight":{{"dtype":"BF16","shape":[{elements}],"data_offsets":[0,{}]}}}}"#,
        2 * elements
    );
    let mut st = (h.len() as u64).to_le_bytes().to_vec();
    st.extend_from_slice(h.as_bytes());
    st.resize(st.len() + 2 * elements as usize, 0);
    st
}

/// Where runs build their caches: a memory file system when there is one (`/dev/shm`: a
/// cache entry is a dozen files, and a loaded disk takes 100 ms for them), else the temp dir.
fn scratch() -> &'static Path {
    static S: OnceLock<PathBuf> = OnceLock::new();
    S.get_or_init(|| {
        let name = format!("memplan-fuzz-{}", std::process::id());
        let shm = Path::new("/dev/shm").join(&name);
        if std::fs::create_dir_all(&shm).is_ok() {
            return shm;
        }
        let tmp = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&tmp).unwrap();
        tmp
    })
}

/// Remove everything the runs of this process left (the drivers call it at the end).
pub fn cleanup() {
    let _ = std::fs::remove_dir_all(scratch());
}

/// Outside the cache, shared by every run: another model's folder, a FIFO.
struct Outside {
    dir: PathBuf,
    fifo: Option<PathBuf>,
}

fn outside() -> &'static Outside {
    static O: OnceLock<Outside> = OnceLock::new();
    O.get_or_init(|| {
        let dir = scratch().join("outside");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("snap")).unwrap();
        std::fs::write(dir.join("snap/config.json"), OUTSIDE_CONFIG).unwrap();
        std::fs::write(dir.join("snap/model.safetensors"), safetensors(49)).unwrap();
        std::fs::write(dir.join("ref"), C1).unwrap();
        let fifo = dir.join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .is_ok_and(|s| s.success());
        Outside {
            dir,
            fifo: made.then_some(fifo),
        }
    })
}

/// Paths inside the model folder a program writes, links or removes.
const PATHS: &[&str] = &[
    "refs/main",
    "snapshots/C1",
    "snapshots/C1/config.json",
    "snapshots/C1/model.safetensors",
    "snapshots/C1/model.safetensors.index.json",
    "snapshots/C1/hf_quant_config.json",
    "snapshots/C1/shard.safetensors",
    "snapshots/C2",
    "snapshots/C2/config.json",
    "blobs/a",
    "blobs/b",
    "refs",
    "snapshots",
];

fn path(repo: &Path, i: u8) -> PathBuf {
    let p = PATHS[i as usize % PATHS.len()]
        .replace("C1", C1)
        .replace("C2", C2);
    repo.join(p)
}

fn link_target(repo: &Path, i: u8) -> PathBuf {
    let o = outside();
    let choices: Vec<PathBuf> = vec![
        "../../blobs/a".into(),
        "../../blobs/b".into(),
        "../blobs/a".into(),
        o.dir.join("snap/config.json"),
        o.dir.join("snap/model.safetensors"),
        o.dir.join("snap"),
        o.dir.join("ref"),
        o.fifo.clone().unwrap_or_else(|| "/dev/null".into()),
        "/dev/zero".into(),
        "nowhere".into(),
        "..".into(),
        "../..".into(),
        C2.into(),
        repo.join("blobs/a"),
        format!("../../../{}", o.dir.display()).into(),
        "../../../../../../../../../../..".into(),
    ];
    choices[i as usize % choices.len()].clone()
}

fn content(i: u8, data: &[u8]) -> Vec<u8> {
    let o = outside();
    match i % 12 {
        0 => C1.into(),
        1 => format!("{C2}\n").into(),
        2 => format!("../../../../{}", o.dir.display()).into(),
        3 => o.dir.join("snap").display().to_string().into(),
        4 => CONFIG.into(),
        5 => safetensors(6400),
        6 => br#"{"weight_map":{"model.embed_tokens.weight":"shard.safetensors"}}"#.to_vec(),
        7 => br#"{"weight_map":{"model.embed_tokens.weight":"../../../x.safetensors"}}"#.to_vec(),
        8 => br#"{"quantization":{"kv_cache_quant_algo":"FP8"}}"#.to_vec(),
        9 => br#"{"quantization":{"kv_cache_quant_algo":{"a":1}}}"#.to_vec(),
        10 => Vec::new(),
        _ => data.iter().take(64).copied().collect(),
    }
}

fn make_parent(p: &Path) {
    if let Some(d) = p.parent() {
        let _ = std::fs::create_dir_all(d);
    }
}

fn remove(p: &Path) {
    if std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()) {
        let _ = std::fs::remove_dir_all(p);
    } else {
        let _ = std::fs::remove_file(p);
    }
}

/// Build the entry `data` describes under `root/hub`.
fn build(root: &Path, data: &[u8]) -> PathBuf {
    let hub = root.join("hub");
    let repo = hub.join("models--Org--M");
    // A well-formed entry to start from, so most programs change one thing in a real layout.
    for d in ["refs", "blobs", &format!("snapshots/{C1}")] {
        std::fs::create_dir_all(repo.join(d)).unwrap();
    }
    std::fs::write(repo.join("refs/main"), C1).unwrap();
    std::fs::write(repo.join("blobs/a"), CONFIG).unwrap();
    std::fs::write(repo.join("blobs/b"), safetensors(6400)).unwrap();
    let snap = repo.join("snapshots").join(C1);
    let _ = std::os::unix::fs::symlink("../../blobs/a", snap.join("config.json"));
    let _ = std::os::unix::fs::symlink("../../blobs/b", snap.join("model.safetensors"));
    let mut ops = data.chunks(3);
    for _ in 0..24 {
        let Some(op) = ops.next() else { break };
        let (a, b, c) = (op[0], *op.get(1).unwrap_or(&0), *op.get(2).unwrap_or(&0));
        let p = path(&repo, b);
        match a % 5 {
            0 => {
                remove(&p);
                make_parent(&p);
                let _ = std::fs::write(&p, content(c, data));
            }
            1 => {
                remove(&p);
                make_parent(&p);
                let _ = std::os::unix::fs::symlink(link_target(&repo, c), &p);
            }
            2 => remove(&p),
            3 => {
                let _ = std::fs::create_dir_all(&p);
            }
            _ => {
                // The whole model folder or the cache root as a link.
                if c % 4 == 0 {
                    let _ = std::fs::remove_dir_all(&repo);
                    let _ = std::os::unix::fs::symlink(link_target(&repo, b), &repo);
                }
            }
        }
    }
    hub
}

static PLANNED: AtomicU64 = AtomicU64::new(0);

/// How many runs loaded a model (the rest were refused or found nothing): a driver checks the
/// generator reaches both.
pub fn planned() -> u64 {
    PLANNED.load(Ordering::Relaxed)
}

pub fn run(data: &[u8]) {
    static N: AtomicU64 = AtomicU64::new(0);
    let root = scratch().join(format!("run-{}", N.fetch_add(1, Ordering::Relaxed)));
    let _ = std::fs::remove_dir_all(&root);
    let hub = build(&root, data);
    let loaded = Model::load_from_cache(&hub, "Org/M");
    let _ = std::fs::remove_dir_all(&root);
    if let Ok(Some(m)) = loaded {
        PLANNED.fetch_add(1, Ordering::Relaxed);
        assert_ne!(
            m.config.num_kv_heads, OUTSIDE_HEADS,
            "planned the config of the model outside the cache"
        );
        if let Some(c) = &m.checkpoint {
            assert_ne!(c.total(), 98, "read the checkpoint outside the cache");
        }
    }
}
