//! `--model ORG/NAME` from a fake Hugging Face cache tree (refs/main -> snapshots/<commit>),
//! with `HF_HUB_CACHE` and `HF_HOME` respected, and a clear error when it is not cached.
//! One test (environment variables are process-wide).

use memplan_model::{Model, Source};

#[test]
fn hub_ids_resolve_from_the_local_cache() {
    let root = std::env::temp_dir().join(format!("memplan-hub-{}", std::process::id()));
    let snap = root.join("hub/models--Org--Tiny/snapshots/0123abcd");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(root.join("hub/models--Org--Tiny/refs")).unwrap();
    std::fs::write(root.join("hub/models--Org--Tiny/refs/main"), "0123abcd").unwrap();
    std::fs::write(
        snap.join("config.json"),
        r#"{"architectures":["LlamaForCausalLM"],"hidden_size":64,"num_hidden_layers":2,
        "num_attention_heads":4,"num_key_value_heads":2,"vocab_size":100,"max_position_embeddings":256}"#,
    )
    .unwrap();
    let h = r#"{"model.embed_tokens.weight":{"dtype":"BF16","shape":[100,64],"data_offsets":[0,12800]}}"#;
    let mut st = (h.len() as u64).to_le_bytes().to_vec();
    st.extend_from_slice(h.as_bytes());
    st.resize(st.len() + 12800, 0);
    std::fs::write(snap.join("model.safetensors"), &st).unwrap();

    // HF_HOME/hub.
    std::env::remove_var("HF_HUB_CACHE");
    std::env::set_var("HF_HOME", &root);
    let m = Model::load("Org/Tiny").unwrap();
    assert_eq!(m.name, "Org/Tiny");
    assert!(
        matches!(&m.source, Source::HubCache { repo, snapshot } if repo == "Org/Tiny" && snapshot.ends_with("0123abcd"))
    );
    assert_eq!(m.checkpoint.as_ref().map(|c| c.total()), Some(12800));
    // HF_HUB_CACHE wins over HF_HOME.
    std::env::set_var("HF_HOME", "/nonexistent");
    std::env::set_var("HF_HUB_CACHE", root.join("hub"));
    assert_eq!(Model::load("Org/Tiny").unwrap().config.num_kv_heads, 2);
    // Not cached and not a preset: say where memplan looked and how to download.
    let e = Model::load("Org/Missing").unwrap_err().to_string();
    assert!(
        e.contains("huggingface-cli download Org/Missing")
            && e.contains("not in the Hugging Face cache"),
        "{e}"
    );
    // A preset id still works without a cache entry.
    assert!(Model::load("meta-llama/Llama-3.1-8B-Instruct").is_ok());
    std::fs::remove_dir_all(&root).unwrap();
}
