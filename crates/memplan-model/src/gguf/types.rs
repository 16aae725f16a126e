//! ggml tensor types: bytes per block and elements per block (`ggml_type_size`,
//! `ggml_blck_size`; `ggml/src/ggml.c`'s `type_traits`). Types llama.cpp removed (4, 5,
//! 31-33, 36-38) have no entry and are refused, as llama.cpp refuses them (block size 0).

/// One ggml type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlType {
    /// Its name (`Q4_K`).
    pub name: &'static str,
    /// Bytes per block.
    pub block_bytes: u64,
    /// Elements per block.
    pub block: u64,
}

/// The ggml type numbered `t`, if memplan knows it.
pub fn ggml_type(t: u32) -> Option<GgmlType> {
    let (block_bytes, block, name) = match t {
        0 => (4, 1, "F32"),
        1 => (2, 1, "F16"),
        2 => (18, 32, "Q4_0"),
        3 => (20, 32, "Q4_1"),
        6 => (22, 32, "Q5_0"),
        7 => (24, 32, "Q5_1"),
        8 => (34, 32, "Q8_0"),
        9 => (36, 32, "Q8_1"),
        10 => (84, 256, "Q2_K"),
        11 => (110, 256, "Q3_K"),
        12 => (144, 256, "Q4_K"),
        13 => (176, 256, "Q5_K"),
        14 => (210, 256, "Q6_K"),
        15 => (292, 256, "Q8_K"),
        16 => (66, 256, "IQ2_XXS"),
        17 => (74, 256, "IQ2_XS"),
        18 => (98, 256, "IQ3_XXS"),
        19 => (50, 256, "IQ1_S"),
        20 => (18, 32, "IQ4_NL"),
        21 => (110, 256, "IQ3_S"),
        22 => (82, 256, "IQ2_S"),
        23 => (136, 256, "IQ4_XS"),
        24 => (1, 1, "I8"),
        25 => (2, 1, "I16"),
        26 => (4, 1, "I32"),
        27 => (8, 1, "I64"),
        28 => (8, 1, "F64"),
        29 => (56, 256, "IQ1_M"),
        30 => (2, 1, "BF16"),
        34 => (54, 256, "TQ1_0"),
        35 => (66, 256, "TQ2_0"),
        39 => (17, 32, "MXFP4"),
        _ => return None,
    };
    Some(GgmlType {
        name,
        block_bytes,
        block,
    })
}
