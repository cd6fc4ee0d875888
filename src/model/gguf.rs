//! GGUF (v2/v3) container reader: header, metadata, tensor directory, memory-mapped data.
//!
//! Layout (little-endian): magic `GGUF`, `u32` version, `u64` tensor count, `u64` metadata
//! count, the metadata pairs (`gguf_string` key, `u32` value type, value), then per tensor
//! `gguf_string` name, `u32` n_dims, `u64 × n_dims` ne (ggml order: `ne[0]` is the contiguous
//! axis), `u32` ggml type, `u64` offset. The data section starts at the next multiple of
//! `general.alignment` (default 32) after the directory; each tensor offset is relative to it
//! and a multiple of the alignment.
//!
//! The whole file is memory-mapped; [`GgufFile::tensor_data`] hands out slices of the map.
//! [`GgufFile::open`] checks the directory (names unique, offsets aligned, every tensor of a known
//! type inside the file), so a truncated download is a `ModelError::Format` naming the first
//! tensor that does not fit. Mapping GGUF names to Hugging Face names is [`weights`]' job.

pub mod metadata;
pub mod weights;
pub mod writer;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

pub use metadata::{GgufArray, GgufMetadata, GgufValue, GgufValueType};
pub use weights::GgufWeights;
pub use writer::GgufWriter;

use crate::error::ModelError;
use crate::tensor::WeightDType;

/// `GGUF` read as a little-endian u32.
const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section when `general.alignment` is absent.
pub const GGUF_DEFAULT_ALIGNMENT: usize = 32;
/// Nesting limit for arrays of arrays (real files use none).
const MAX_ARRAY_DEPTH: usize = 4;
/// Largest tensor rank ggml supports (`GGML_MAX_DIMS`).
const GGML_MAX_DIMS: u32 = 4;

/// A ggml tensor type code (`enum ggml_type`). Kept as the raw code so unsupported types can be
/// named in errors; [`GgmlType::weight_dtype`] maps the ones kiln reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GgmlType(pub u32);

impl GgmlType {
    /// `GGML_TYPE_F32`.
    pub const F32: GgmlType = GgmlType(0);
    /// `GGML_TYPE_F16`.
    pub const F16: GgmlType = GgmlType(1);
    /// `GGML_TYPE_Q4_0`.
    pub const Q4_0: GgmlType = GgmlType(2);
    /// `GGML_TYPE_Q4_1`.
    pub const Q4_1: GgmlType = GgmlType(3);
    /// `GGML_TYPE_Q8_0`.
    pub const Q8_0: GgmlType = GgmlType(8);
    /// `GGML_TYPE_Q4_K`.
    pub const Q4_K: GgmlType = GgmlType(12);
    /// `GGML_TYPE_Q6_K`.
    pub const Q6_K: GgmlType = GgmlType(14);
    /// `GGML_TYPE_BF16`.
    pub const BF16: GgmlType = GgmlType(30);

    /// The ggml name (`Q4_1`, `IQ2_XXS`, …), or `None` for a code ggml never defined.
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "F32",
            1 => "F16",
            2 => "Q4_0",
            3 => "Q4_1",
            6 => "Q5_0",
            7 => "Q5_1",
            8 => "Q8_0",
            9 => "Q8_1",
            10 => "Q2_K",
            11 => "Q3_K",
            12 => "Q4_K",
            13 => "Q5_K",
            14 => "Q6_K",
            15 => "Q8_K",
            16 => "IQ2_XXS",
            17 => "IQ2_XS",
            18 => "IQ3_XXS",
            19 => "IQ1_S",
            20 => "IQ4_NL",
            21 => "IQ3_S",
            22 => "IQ2_S",
            23 => "IQ4_XS",
            24 => "I8",
            25 => "I16",
            26 => "I32",
            27 => "I64",
            28 => "F64",
            29 => "IQ1_M",
            30 => "BF16",
            34 => "TQ1_0",
            35 => "TQ2_0",
            39 => "MXFP4",
            _ => return None,
        })
    }

    /// The kiln encoding of this type, if kiln reads it.
    pub fn weight_dtype(self) -> Option<WeightDType> {
        Some(match self {
            GgmlType::F32 => WeightDType::F32,
            GgmlType::F16 => WeightDType::F16,
            GgmlType::BF16 => WeightDType::BF16,
            GgmlType::Q8_0 => WeightDType::Q8_0,
            GgmlType::Q4_0 => WeightDType::Q4_0,
            GgmlType::Q4_1 => WeightDType::Q4_1,
            GgmlType::Q4_K => WeightDType::Q4K,
            GgmlType::Q6_K => WeightDType::Q6K,
            _ => return None,
        })
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "ggml type {}", self.0),
        }
    }
}

/// One entry of the tensor directory, as stored (ggml names, ggml dimension order).
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorInfo {
    /// ggml tensor name (`blk.0.attn_q.weight`).
    pub name: String,
    /// `ne[0..n_dims]`: `ne[0]` is the contiguous axis (the reverse of Hugging Face order).
    pub dims: Vec<usize>,
    /// Stored type.
    pub ggml_type: GgmlType,
    /// Byte offset relative to the start of the data section.
    pub offset: usize,
}

impl GgufTensorInfo {
    /// Stored size in bytes, when the type is one kiln reads and `ne[0]` is whole blocks.
    pub fn byte_len(&self) -> Option<usize> {
        let dtype = self.ggml_type.weight_dtype()?;
        let ne0 = *self.dims.first().unwrap_or(&1);
        let row = dtype.row_bytes(ne0)?;
        self.dims
            .iter()
            .skip(1)
            .try_fold(row, |acc, &d| acc.checked_mul(d))
    }

    /// Shape in Hugging Face order (`dims` reversed).
    pub fn hf_shape(&self) -> Vec<usize> {
        self.dims.iter().rev().copied().collect()
    }
}

/// An open, memory-mapped GGUF file.
#[derive(Debug)]
pub struct GgufFile {
    /// Where it was opened from.
    path: PathBuf,
    /// The whole file.
    mmap: Mmap,
    /// Format version (2 or 3).
    version: u32,
    /// Metadata pairs.
    metadata: GgufMetadata,
    /// Tensor directory in file order.
    tensors: Vec<GgufTensorInfo>,
    /// Tensor name → index into `tensors`.
    by_name: HashMap<String, usize>,
    /// Absolute offset of the data section.
    data_offset: usize,
    /// Data alignment in bytes (power of two).
    alignment: usize,
}

impl GgufFile {
    /// Memory-maps and parses `path`, checking the tensor directory against the file size.
    pub fn open(path: &Path) -> Result<GgufFile, ModelError> {
        let io_err = |source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io_err)?;
        // SAFETY: the map is read-only and kiln never writes model files; like every mmap-based
        // loader we rely on the file not being truncated or rewritten while it is mapped
        // (model files are immutable by convention: fetch-default writes tmp → rename).
        let mmap = unsafe { Mmap::map(&file) }.map_err(io_err)?;
        Self::parse(path, mmap)
    }

    /// Parses an already-mapped file.
    fn parse(path: &Path, mmap: Mmap) -> Result<GgufFile, ModelError> {
        let mut r = Reader {
            path,
            buf: &mmap,
            pos: 0,
        };
        let magic = r.bytes(4, "magic")?;
        if magic != GGUF_MAGIC {
            return Err(r.error(format!(
                "not a GGUF file (magic {magic:02x?}, expected \"GGUF\")"
            )));
        }
        let version = r.u32("version")?;
        match version {
            2 | 3 => {}
            v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
                return Err(ModelError::Unsupported(format!(
                    "{}: big-endian GGUF files",
                    path.display()
                )))
            }
            v => {
                return Err(ModelError::Unsupported(format!(
                    "{}: GGUF version {v} (kiln reads versions 2 and 3)",
                    path.display()
                )))
            }
        }
        let n_tensors = r.count("tensor count", 8 + 4 + 4 + 8)?;
        let n_kv = r.count("metadata count", 8 + 4)?;

        let mut metadata = GgufMetadata::new(path);
        for _ in 0..n_kv {
            let key = r.string("metadata key")?;
            if metadata.contains(&key) {
                return Err(r.error(format!("duplicate metadata key `{key}`")));
            }
            let ty = r.u32("metadata value type")?;
            let value = r.value(ty, &key, 0)?;
            metadata.insert(key, value);
        }

        let alignment = match metadata.get_u32("general.alignment")? {
            None => GGUF_DEFAULT_ALIGNMENT,
            Some(a) if a > 0 && a.is_power_of_two() => a as usize,
            Some(a) => {
                return Err(r.error(format!("general.alignment = {a} is not a power of two")))
            }
        };

        let mut tensors = Vec::with_capacity(n_tensors);
        let mut by_name = HashMap::with_capacity(n_tensors);
        for _ in 0..n_tensors {
            let name = r.string("tensor name")?;
            let n_dims = r.u32("tensor rank")?;
            if n_dims == 0 || n_dims > GGML_MAX_DIMS {
                return Err(r.error(format!("tensor `{name}`: rank {n_dims} out of 1..=4")));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                let d = r.u64("tensor dimension")?;
                let d = usize::try_from(d)
                    .map_err(|_| r.error(format!("tensor `{name}`: dimension {d} too large")))?;
                dims.push(d);
            }
            let ggml_type = GgmlType(r.u32("tensor type")?);
            let offset = r.u64("tensor offset")?;
            let offset = usize::try_from(offset)
                .map_err(|_| r.error(format!("tensor `{name}`: offset {offset} too large")))?;
            if offset % alignment != 0 {
                return Err(r.error(format!(
                    "tensor `{name}`: offset {offset} is not a multiple of the alignment {alignment}"
                )));
            }
            if by_name.insert(name.clone(), tensors.len()).is_some() {
                return Err(r.error(format!("duplicate tensor name `{name}`")));
            }
            tensors.push(GgufTensorInfo {
                name,
                dims,
                ggml_type,
                offset,
            });
        }

        let data_offset = r.pos.next_multiple_of(alignment);
        let file = GgufFile {
            path: path.to_path_buf(),
            version,
            metadata,
            tensors,
            by_name,
            data_offset,
            alignment,
            mmap,
        };
        for t in &file.tensors {
            file.data_range(t)?;
        }
        Ok(file)
    }

    /// The file path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Metadata pairs.
    pub fn metadata(&self) -> &GgufMetadata {
        &self.metadata
    }

    /// Data alignment in bytes.
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// The tensor directory, in file order.
    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// The directory entry for ggml name `name`.
    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// Absolute byte range of `t` in the file, checked against the file size. Tensors of types
    /// kiln cannot size (unsupported types) have no range and yield `Unsupported`.
    fn data_range(&self, t: &GgufTensorInfo) -> Result<std::ops::Range<usize>, ModelError> {
        let Some(dtype) = t.ggml_type.weight_dtype() else {
            // Unsupported types are checked (and refused) when the tensor is used.
            return Ok(0..0);
        };
        let len = t.byte_len().ok_or_else(|| ModelError::Format {
            path: self.path.clone(),
            format: "gguf",
            message: format!(
                "tensor `{}`: ne {:?} is not a whole number of {} blocks of {} elements",
                t.name,
                t.dims,
                t.ggml_type,
                dtype.block_elems()
            ),
        })?;
        let start = self.data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(len));
        match (start, end) {
            (Some(start), Some(end)) if end <= self.mmap.len() => Ok(start..end),
            _ => Err(ModelError::Format {
                path: self.path.clone(),
                format: "gguf",
                message: format!(
                    "tensor `{}` ({} bytes at data offset {}) extends past the end of the file \
                     ({} bytes); the file is truncated",
                    t.name,
                    len,
                    t.offset,
                    self.mmap.len()
                ),
            }),
        }
    }

    /// The stored bytes of `t` (a slice of the map; aligned to [`GgufFile::alignment`] relative
    /// to the file start). `Unsupported` for tensor types kiln does not read.
    pub fn tensor_data(&self, t: &GgufTensorInfo) -> Result<&[u8], ModelError> {
        if t.ggml_type.weight_dtype().is_none() {
            return Err(ModelError::Unsupported(format!(
                "GGUF tensor `{}` has type {}, which kiln does not read (F32, F16, BF16, Q8_0, \
                 Q4_0, Q4_1, Q4_K, Q6_K)",
                t.name, t.ggml_type
            )));
        }
        let range = self.data_range(t)?;
        Ok(&self.mmap[range])
    }
}

/// Bounds-checked little-endian cursor over the mapped header.
struct Reader<'a> {
    /// For error messages.
    path: &'a Path,
    /// The whole file.
    buf: &'a [u8],
    /// Current offset.
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A `Format` error at the current position.
    fn error(&self, message: String) -> ModelError {
        ModelError::Format {
            path: self.path.to_path_buf(),
            format: "gguf",
            message,
        }
    }

    /// The next `n` bytes.
    fn bytes(&mut self, n: usize, what: &str) -> Result<&'a [u8], ModelError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let Some(end) = end else {
            return Err(self.error(format!(
                "file ends inside the header while reading {what} at byte {} ({} bytes needed); \
                 the file is truncated",
                self.pos, n
            )));
        };
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    /// The next N bytes as an array.
    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], ModelError> {
        let b = self.bytes(N, what)?;
        Ok(b.try_into().expect("bytes() returned N bytes"))
    }

    fn u32(&mut self, what: &str) -> Result<u32, ModelError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, ModelError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A u64 element count, rejected when `count × min_elem_bytes` exceeds the bytes left
    /// (so a corrupt count never drives a huge allocation).
    fn count(&mut self, what: &str, min_elem_bytes: usize) -> Result<usize, ModelError> {
        let n = self.u64(what)?;
        let left = (self.buf.len() - self.pos) as u128;
        if u128::from(n) * min_elem_bytes as u128 > left {
            return Err(self.error(format!(
                "{what} {n} cannot fit in the {left} bytes left; the file is corrupt or truncated"
            )));
        }
        Ok(n as usize)
    }

    /// A `gguf_string`: u64 length + UTF-8 bytes.
    fn string(&mut self, what: &str) -> Result<String, ModelError> {
        let len = self.count(what, 1)?;
        let at = self.pos;
        let bytes = self.bytes(len, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|e| self.error(format!("{what} at byte {at} is not valid UTF-8: {e}")))
    }

    /// A value of type code `ty` for metadata key `key`.
    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<GgufValue, ModelError> {
        let Some(ty) = GgufValueType::from_code(ty) else {
            return Err(self.error(format!("metadata key `{key}`: unknown value type {ty}")));
        };
        Ok(match ty {
            GgufValueType::U8 => GgufValue::U8(self.array::<1>(key)?[0]),
            GgufValueType::I8 => GgufValue::I8(self.array::<1>(key)?[0] as i8),
            GgufValueType::U16 => GgufValue::U16(u16::from_le_bytes(self.array(key)?)),
            GgufValueType::I16 => GgufValue::I16(i16::from_le_bytes(self.array(key)?)),
            GgufValueType::U32 => GgufValue::U32(self.u32(key)?),
            GgufValueType::I32 => GgufValue::I32(i32::from_le_bytes(self.array(key)?)),
            GgufValueType::F32 => GgufValue::F32(f32::from_le_bytes(self.array(key)?)),
            GgufValueType::Bool => GgufValue::Bool(self.bool(key)?),
            GgufValueType::String => GgufValue::String(self.string(key)?),
            GgufValueType::U64 => GgufValue::U64(self.u64(key)?),
            GgufValueType::I64 => GgufValue::I64(i64::from_le_bytes(self.array(key)?)),
            GgufValueType::F64 => GgufValue::F64(f64::from_le_bytes(self.array(key)?)),
            GgufValueType::Array => GgufValue::Array(self.gguf_array(key, depth)?),
        })
    }

    /// A bool byte (0 or 1).
    fn bool(&mut self, key: &str) -> Result<bool, ModelError> {
        match self.array::<1>(key)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(self.error(format!("metadata key `{key}`: bool byte {b} is not 0 or 1"))),
        }
    }

    /// An array: u32 element type, u64 count, elements.
    fn gguf_array(&mut self, key: &str, depth: usize) -> Result<GgufArray, ModelError> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(self.error(format!("metadata key `{key}`: arrays nested too deeply")));
        }
        let code = self.u32(key)?;
        let Some(ty) = GgufValueType::from_code(code) else {
            return Err(self.error(format!(
                "metadata key `{key}`: unknown array element type {code}"
            )));
        };
        let min_bytes = match ty {
            GgufValueType::U8 | GgufValueType::I8 | GgufValueType::Bool => 1,
            GgufValueType::U16 | GgufValueType::I16 => 2,
            GgufValueType::U32 | GgufValueType::I32 | GgufValueType::F32 => 4,
            GgufValueType::U64 | GgufValueType::I64 | GgufValueType::F64 => 8,
            GgufValueType::String => 8,
            GgufValueType::Array => 12,
        };
        let n = self.count(key, min_bytes)?;
        /// Reads `n` fixed-size little-endian elements.
        fn fixed<const N: usize, T>(
            r: &mut Reader<'_>,
            n: usize,
            key: &str,
            conv: fn([u8; N]) -> T,
        ) -> Result<Vec<T>, ModelError> {
            let bytes = r.bytes(n * N, key)?;
            Ok(bytes
                .chunks_exact(N)
                .map(|c| conv(c.try_into().expect("chunks_exact")))
                .collect())
        }
        Ok(match ty {
            GgufValueType::U8 => GgufArray::U8(fixed::<1, _>(self, n, key, |b| b[0])?),
            GgufValueType::I8 => GgufArray::I8(fixed::<1, _>(self, n, key, |b| b[0] as i8)?),
            GgufValueType::U16 => GgufArray::U16(fixed(self, n, key, u16::from_le_bytes)?),
            GgufValueType::I16 => GgufArray::I16(fixed(self, n, key, i16::from_le_bytes)?),
            GgufValueType::U32 => GgufArray::U32(fixed(self, n, key, u32::from_le_bytes)?),
            GgufValueType::I32 => GgufArray::I32(fixed(self, n, key, i32::from_le_bytes)?),
            GgufValueType::F32 => GgufArray::F32(fixed(self, n, key, f32::from_le_bytes)?),
            GgufValueType::U64 => GgufArray::U64(fixed(self, n, key, u64::from_le_bytes)?),
            GgufValueType::I64 => GgufArray::I64(fixed(self, n, key, i64::from_le_bytes)?),
            GgufValueType::F64 => GgufArray::F64(fixed(self, n, key, f64::from_le_bytes)?),
            GgufValueType::Bool => {
                GgufArray::Bool((0..n).map(|_| self.bool(key)).collect::<Result<_, _>>()?)
            }
            GgufValueType::String => {
                GgufArray::String((0..n).map(|_| self.string(key)).collect::<Result<_, _>>()?)
            }
            GgufValueType::Array => GgufArray::Array(
                (0..n)
                    .map(|_| self.gguf_array(key, depth + 1))
                    .collect::<Result<_, _>>()?,
            ),
        })
    }
}

#[cfg(test)]
mod tests;
