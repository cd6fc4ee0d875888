//! Hugging Face `*.safetensors` weights, memory-mapped, single file or sharded.
//!
//! A folder holds either `model.safetensors.index.json` (`{"weight_map": {name: shard file}}`)
//! naming the shards to map, or a single `model.safetensors`. Every shard is memory-mapped and
//! validated by the `safetensors` crate (contiguous offsets, sizes matching dtype × shape); a
//! shard cut short is a `ModelError::Format` naming the first tensor that does not fit.
//!
//! Names and shapes are already Hugging Face's. Element types F32, F16, BF16 and the parts of
//! packed 4-bit linears (I32, I64, U8, I8, F8_E4M3) are served; a tensor of any other dtype is
//! listed but `tensor()` refuses it with `Unsupported` naming it. Tensor bytes are slices of the map,
//! except a tensor whose offset is not a multiple of its element size (possible in files from
//! third-party writers): it is copied once into an 8-byte-aligned buffer so readers may cast.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::{Dtype, SafeTensorError};
use safetensors::SafeTensors;
use serde::Deserialize;

use crate::error::ModelError;
use crate::tensor::{TensorView, WeightDType, WeightSource};

/// The single-file checkpoint name.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The sharded checkpoint index name.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// `model.safetensors.index.json`.
#[derive(Debug, Deserialize)]
struct Index {
    /// Tensor name → shard file name (relative to the folder).
    weight_map: HashMap<String, String>,
}

/// Where a tensor's bytes live.
#[derive(Debug)]
enum Storage {
    /// `shards[shard]` map, this byte range.
    Mapped { shard: usize, range: Range<usize> },
    /// A copy made for alignment: `u64` words, `len` bytes used.
    Owned { words: Vec<u64>, len: usize },
}

/// One tensor.
#[derive(Debug)]
struct Entry {
    /// Encoding, or the safetensors dtype kiln does not read.
    dtype: Result<WeightDType, Dtype>,
    /// HF shape.
    shape: Vec<usize>,
    /// Bytes.
    storage: Storage,
    /// The shard file (for messages).
    shard_path: PathBuf,
}

/// Memory-mapped safetensors shards of one checkpoint.
#[derive(Debug)]
pub struct SafetensorsWeights {
    /// The maps, kept alive for `Storage::Mapped`.
    shards: Vec<Mmap>,
    /// Name → tensor.
    entries: HashMap<String, Entry>,
}

impl SafetensorsWeights {
    /// Maps the checkpoint in folder `dir` (index + shards, or `model.safetensors`).
    pub fn open_dir(dir: &Path) -> Result<SafetensorsWeights, ModelError> {
        let index_path = dir.join(INDEX_FILE);
        if index_path.is_file() {
            let text = std::fs::read_to_string(&index_path).map_err(|source| ModelError::Io {
                path: index_path.clone(),
                source,
            })?;
            let index: Index = serde_json::from_str(&text).map_err(|e| ModelError::Format {
                path: index_path.clone(),
                format: "safetensors index",
                message: e.to_string(),
            })?;
            let files: BTreeSet<&String> = index.weight_map.values().collect();
            for f in &files {
                if Path::new(f).components().count() != 1 || f.starts_with('.') {
                    return Err(ModelError::Format {
                        path: index_path.clone(),
                        format: "safetensors index",
                        message: format!("shard name `{f}` is not a plain file name"),
                    });
                }
            }
            let paths: Vec<PathBuf> = files.iter().map(|f| dir.join(f)).collect();
            let weights = Self::open_files(&paths)?;
            for (name, file) in &index.weight_map {
                let found = weights.entries.get(name).map(|e| &e.shard_path);
                if found != Some(&dir.join(file)) {
                    return Err(ModelError::Format {
                        path: index_path.clone(),
                        format: "safetensors index",
                        message: format!("tensor `{name}` is listed in `{file}` but is not there"),
                    });
                }
            }
            Ok(weights)
        } else {
            let single = dir.join(SINGLE_FILE);
            if !single.is_file() {
                return Err(ModelError::Format {
                    path: dir.to_path_buf(),
                    format: "safetensors",
                    message: format!("neither {INDEX_FILE} nor {SINGLE_FILE} in the folder"),
                });
            }
            Self::open_files(&[single])
        }
    }

    /// Maps the given shard files; a tensor name in two shards is a `Format` error.
    pub fn open_files(paths: &[PathBuf]) -> Result<SafetensorsWeights, ModelError> {
        let mut shards = Vec::with_capacity(paths.len());
        let mut entries: HashMap<String, Entry> = HashMap::new();
        for path in paths {
            let io_err = |source| ModelError::Io {
                path: path.clone(),
                source,
            };
            let file = File::open(path).map_err(io_err)?;
            // SAFETY: read-only map of a checkpoint file; like every mmap loader we rely on model
            // files not being truncated or rewritten while kiln runs.
            let mmap = unsafe { Mmap::map(&file) }.map_err(io_err)?;
            let shard = shards.len();
            for (name, entry) in read_shard(path, &mmap, shard)? {
                if entries.contains_key(&name) {
                    return Err(ModelError::Format {
                        path: path.clone(),
                        format: "safetensors",
                        message: format!("tensor `{name}` appears in two shards"),
                    });
                }
                entries.insert(name, entry);
            }
            shards.push(mmap);
        }
        Ok(SafetensorsWeights { shards, entries })
    }
}

/// The `safetensors` dtype as kiln's encoding, if kiln reads it.
fn weight_dtype(d: Dtype) -> Result<WeightDType, Dtype> {
    match d {
        Dtype::F32 => Ok(WeightDType::F32),
        Dtype::F16 => Ok(WeightDType::F16),
        Dtype::BF16 => Ok(WeightDType::BF16),
        Dtype::I32 => Ok(WeightDType::I32),
        Dtype::I64 => Ok(WeightDType::I64),
        Dtype::U8 => Ok(WeightDType::U8),
        Dtype::I8 => Ok(WeightDType::I8),
        Dtype::F8_E4M3 => Ok(WeightDType::F8E4M3),
        other => Err(other),
    }
}

/// Validates one mapped shard and lists its tensors.
fn read_shard(path: &Path, buf: &[u8], shard: usize) -> Result<Vec<(String, Entry)>, ModelError> {
    let format_err = |message: String| ModelError::Format {
        path: path.to_path_buf(),
        format: "safetensors",
        message,
    };
    let (n, metadata) = match SafeTensors::read_metadata(buf) {
        Ok(ok) => ok,
        Err(SafeTensorError::MetadataIncompleteBuffer) => {
            return Err(format_err(truncation_message(buf)));
        }
        Err(e) => return Err(format_err(e.to_string())),
    };
    let data_start = 8 + n;
    let mut out = Vec::new();
    for (name, info) in metadata.tensors() {
        let (s, e) = info.data_offsets;
        let range = data_start + s..data_start + e;
        let dtype = weight_dtype(info.dtype);
        let elem = (info.dtype.bitsize() / 8).max(1);
        let bytes = &buf[range.clone()];
        let storage = if (bytes.as_ptr() as usize).is_multiple_of(elem) {
            Storage::Mapped { shard, range }
        } else {
            tracing::debug!(tensor = %name, path = %path.display(), "Copying a misaligned safetensors tensor.");
            let mut words = vec![0u64; bytes.len().div_ceil(8)];
            bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
            Storage::Owned {
                words,
                len: bytes.len(),
            }
        };
        out.push((
            name,
            Entry {
                dtype,
                shape: info.shape.clone(),
                storage,
                shard_path: path.to_path_buf(),
            },
        ));
    }
    Ok(out)
}

/// Names the first tensor (by offset) that extends past the end of a truncated shard.
fn truncation_message(buf: &[u8]) -> String {
    #[derive(Deserialize)]
    struct Info {
        data_offsets: (usize, usize),
    }
    let n =
        u64::from_le_bytes(buf[..8].try_into().expect("read_metadata checked 8 bytes")) as usize;
    let available = buf.len().saturating_sub(8 + n);
    let header: HashMap<String, serde_json::Value> =
        serde_json::from_slice(&buf[8..8 + n]).unwrap_or_default();
    let mut tensors: Vec<(String, (usize, usize))> = header
        .into_iter()
        .filter(|(k, _)| k != "__metadata__")
        .filter_map(|(k, v)| {
            serde_json::from_value::<Info>(v)
                .ok()
                .map(|i| (k, i.data_offsets))
        })
        .collect();
    tensors.sort_by_key(|(_, o)| *o);
    match tensors.iter().find(|(_, (_, end))| *end > available) {
        Some((name, (start, end))) => format!(
            "tensor `{name}` (bytes {start}..{end} of the data) extends past the end of the file \
             ({available} data bytes); the file is truncated"
        ),
        None => format!(
            "the header's tensors do not account for the {available} data bytes in the file"
        ),
    }
}

impl WeightSource for SafetensorsWeights {
    fn tensor(&self, name: &str) -> Result<TensorView<'_>, ModelError> {
        let e = self
            .entries
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        let dtype = e.dtype.map_err(|d| {
            ModelError::Unsupported(format!(
                "tensor `{name}` in {} has dtype {d:?} (kiln reads F32, F16, BF16, I32, I64, U8, I8, F8_E4M3)",
                e.shard_path.display()
            ))
        })?;
        let data = match &e.storage {
            Storage::Mapped { shard, range } => &self.shards[*shard][range.clone()],
            Storage::Owned { words, len } => &bytemuck::cast_slice::<u64, u8>(words)[..*len],
        };
        Ok(TensorView {
            dtype,
            shape: &e.shape,
            data,
        })
    }

    fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.entries.keys().cloned().collect();
        names.sort();
        names
    }
}

#[cfg(test)]
mod tests;
