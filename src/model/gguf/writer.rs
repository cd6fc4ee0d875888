//! A minimal GGUF v3 writer, for tests and small fixtures (tiny models, malformed files).
//!
//! Writes the metadata in insertion order, then the tensor directory, then each tensor's bytes
//! at the next multiple of the alignment, exactly as the reader in [`super`] expects.

use super::metadata::{GgufArray, GgufValue};
use super::{GgmlType, GGUF_DEFAULT_ALIGNMENT};

/// A GGUF file being assembled in memory.
#[derive(Debug, Clone, Default)]
pub struct GgufWriter {
    /// Metadata in file order.
    metadata: Vec<(String, GgufValue)>,
    /// `(ggml name, ne in ggml order, type, stored bytes)`.
    tensors: Vec<(String, Vec<usize>, GgmlType, Vec<u8>)>,
}

impl GgufWriter {
    /// An empty file.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets a metadata pair (appended, or replaced in place when `key` is already set).
    pub fn metadata(&mut self, key: &str, value: GgufValue) -> &mut Self {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.metadata.push((key.to_string(), value)),
        }
        self
    }

    /// Appends a tensor: `ne` in ggml order (`ne[0]` contiguous), `data` its stored bytes.
    pub fn tensor(&mut self, name: &str, ne: &[usize], ty: GgmlType, data: Vec<u8>) -> &mut Self {
        self.tensors.push((name.to_string(), ne.to_vec(), ty, data));
        self
    }

    /// The file's bytes, with `general.alignment` (if set as u32) or 32 as the data alignment.
    pub fn to_bytes(&self) -> Vec<u8> {
        let alignment = self
            .metadata
            .iter()
            .find_map(|(k, v)| match (k.as_str(), v) {
                ("general.alignment", GgufValue::U32(a)) => Some(*a as usize),
                _ => None,
            })
            .unwrap_or(GGUF_DEFAULT_ALIGNMENT);
        let mut out = Vec::new();
        out.extend(b"GGUF");
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_string(&mut out, k);
            out.extend((v.value_type() as u32).to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0usize;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for (name, ne, ty, data) in &self.tensors {
            put_string(&mut out, name);
            out.extend((ne.len() as u32).to_le_bytes());
            for d in ne {
                out.extend((*d as u64).to_le_bytes());
            }
            out.extend(ty.0.to_le_bytes());
            out.extend((offset as u64).to_le_bytes());
            offsets.push(offset);
            offset = (offset + data.len()).next_multiple_of(alignment);
        }
        let data_start = out.len().next_multiple_of(alignment);
        out.resize(data_start, 0);
        for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
            out.resize(data_start + off, 0);
            out.extend(data);
        }
        out
    }
}

/// A `gguf_string`.
fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// A value body (the type code is written by the caller).
fn put_value(out: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.push(*x as u8),
        GgufValue::U16(x) => out.extend(x.to_le_bytes()),
        GgufValue::I16(x) => out.extend(x.to_le_bytes()),
        GgufValue::U32(x) => out.extend(x.to_le_bytes()),
        GgufValue::I32(x) => out.extend(x.to_le_bytes()),
        GgufValue::F32(x) => out.extend(x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(u8::from(*x)),
        GgufValue::String(s) => put_string(out, s),
        GgufValue::U64(x) => out.extend(x.to_le_bytes()),
        GgufValue::I64(x) => out.extend(x.to_le_bytes()),
        GgufValue::F64(x) => out.extend(x.to_le_bytes()),
        GgufValue::Array(a) => put_array(out, a),
    }
}

/// An array body: element type, count, elements.
fn put_array(out: &mut Vec<u8>, a: &GgufArray) {
    out.extend((a.element_type() as u32).to_le_bytes());
    out.extend((a.len() as u64).to_le_bytes());
    match a {
        GgufArray::U8(v) => out.extend(v),
        GgufArray::I8(v) => out.extend(v.iter().map(|&x| x as u8)),
        GgufArray::U16(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        GgufArray::I16(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        GgufArray::U32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        GgufArray::I32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        GgufArray::F32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        GgufArray::Bool(v) => out.extend(v.iter().map(|&x| u8::from(x))),
        GgufArray::String(v) => v.iter().for_each(|s| put_string(out, s)),
        GgufArray::U64(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        GgufArray::I64(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        GgufArray::F64(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        GgufArray::Array(v) => v.iter().for_each(|inner| put_array(out, inner)),
    }
}

/// Test helpers: a tiny but complete model in GGUF form.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// Tiny geometry: hidden 32, 4 heads of 8, 2 KV heads, MLP 64, 1 layer, vocab 10.
    pub(crate) const HIDDEN: usize = 32;
    pub(crate) const HEADS: usize = 4;
    pub(crate) const KV_HEADS: usize = 2;
    pub(crate) const HEAD_DIM: usize = 8;
    pub(crate) const FFN: usize = 64;
    pub(crate) const VOCAB: usize = 10;

    /// f32 values `base + i` as little-endian bytes.
    pub(crate) fn f32_bytes(n: usize, base: f32) -> Vec<u8> {
        (0..n)
            .flat_map(|i| (base + i as f32).to_le_bytes())
            .collect()
    }

    /// A tiny model of architecture `arch` (`llama` or `qwen3`); every matrix is F32 with
    /// distinct values except the Q8_0 embedding; no `output.weight` (tied).
    pub(crate) fn tiny_model(arch: &str) -> GgufWriter {
        let mut w = GgufWriter::new();
        let k = |s: &str| format!("{arch}.{s}");
        w.metadata("general.architecture", GgufValue::String(arch.into()))
            .metadata(&k("block_count"), GgufValue::U32(1))
            .metadata(&k("context_length"), GgufValue::U32(128))
            .metadata(&k("embedding_length"), GgufValue::U32(HIDDEN as u32))
            .metadata(&k("feed_forward_length"), GgufValue::U32(FFN as u32))
            .metadata(&k("attention.head_count"), GgufValue::U32(HEADS as u32))
            .metadata(
                &k("attention.head_count_kv"),
                GgufValue::U32(KV_HEADS as u32),
            )
            .metadata(&k("attention.layer_norm_rms_epsilon"), GgufValue::F32(1e-6))
            .metadata(&k("rope.freq_base"), GgufValue::F32(10000.0))
            .metadata(&k("rope.dimension_count"), GgufValue::U32(HEAD_DIM as u32));
        // Embedding: Q8_0 rows of 32 elements, d = 1, qs = row index.
        let mut embd = Vec::new();
        for row in 0..VOCAB {
            embd.extend(half::f16::from_f32(1.0).to_le_bytes());
            embd.extend(std::iter::repeat_n(row as u8, 32));
        }
        w.tensor("token_embd.weight", &[HIDDEN, VOCAB], GgmlType::Q8_0, embd);
        w.tensor(
            "output_norm.weight",
            &[HIDDEN],
            GgmlType::F32,
            f32_bytes(HIDDEN, 0.5),
        );
        let q = HEADS * HEAD_DIM;
        let kv = KV_HEADS * HEAD_DIM;
        let mats: [(&str, usize, usize); 7] = [
            ("attn_q", HIDDEN, q),
            ("attn_k", HIDDEN, kv),
            ("attn_v", HIDDEN, kv),
            ("attn_output", q, HIDDEN),
            ("ffn_gate", HIDDEN, FFN),
            ("ffn_up", HIDDEN, FFN),
            ("ffn_down", FFN, HIDDEN),
        ];
        for (i, (name, ne0, ne1)) in mats.into_iter().enumerate() {
            w.tensor(
                &format!("blk.0.{name}.weight"),
                &[ne0, ne1],
                GgmlType::F32,
                f32_bytes(ne0 * ne1, 1000.0 * i as f32),
            );
        }
        w.tensor(
            "blk.0.attn_norm.weight",
            &[HIDDEN],
            GgmlType::F32,
            f32_bytes(HIDDEN, 1.0),
        );
        w.tensor(
            "blk.0.ffn_norm.weight",
            &[HIDDEN],
            GgmlType::F32,
            f32_bytes(HIDDEN, 2.0),
        );
        if arch == "qwen3" {
            w.metadata(&k("attention.key_length"), GgufValue::U32(HEAD_DIM as u32));
            w.tensor(
                "blk.0.attn_q_norm.weight",
                &[HEAD_DIM],
                GgmlType::F32,
                f32_bytes(HEAD_DIM, 3.0),
            );
            w.tensor(
                "blk.0.attn_k_norm.weight",
                &[HEAD_DIM],
                GgmlType::F32,
                f32_bytes(HEAD_DIM, 4.0),
            );
        }
        w
    }

    /// Writes `w` to a fresh temporary file.
    pub(crate) fn write_temp(w: &GgufWriter) -> tempfile::NamedTempFile {
        let mut f = tempfile::Builder::new()
            .suffix(".gguf")
            .tempfile()
            .expect("temp file");
        std::io::Write::write_all(&mut f, &w.to_bytes()).expect("write temp gguf");
        f
    }
}
