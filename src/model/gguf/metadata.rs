//! GGUF metadata: the typed key/value store at the head of a `.gguf` file.
//!
//! Values keep the exact GGUF value type ([`GgufValue`]); arrays are stored per element type
//! ([`GgufArray`]) so that a 49 152-entry `tokenizer.ggml.tokens` is one `Vec<String>`, not a
//! vector of enums. Getters coerce only where no information is lost (any integer type into
//! `u32` when the value fits, `f64` into `f32`), and report a value of the wrong type as
//! `ModelError::Format` naming the key, so a malformed file never reads as "key absent".
//!
//! Keys the loaders and the tokenizer use: `general.architecture`, `{arch}.block_count`,
//! `{arch}.embedding_length`, `tokenizer.ggml.model`, `tokenizer.ggml.pre`,
//! `tokenizer.ggml.tokens`, `tokenizer.ggml.merges`, `tokenizer.ggml.token_type`,
//! `tokenizer.ggml.bos_token_id`, `tokenizer.chat_template`, …

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::ModelError;

/// The thirteen GGUF value types, with their on-disk codes (`gguf_type` in ggml).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GgufValueType {
    /// `GGUF_TYPE_UINT8`.
    U8 = 0,
    /// `GGUF_TYPE_INT8`.
    I8 = 1,
    /// `GGUF_TYPE_UINT16`.
    U16 = 2,
    /// `GGUF_TYPE_INT16`.
    I16 = 3,
    /// `GGUF_TYPE_UINT32`.
    U32 = 4,
    /// `GGUF_TYPE_INT32`.
    I32 = 5,
    /// `GGUF_TYPE_FLOAT32`.
    F32 = 6,
    /// `GGUF_TYPE_BOOL` (one byte, 0 or 1).
    Bool = 7,
    /// `GGUF_TYPE_STRING` (u64 length + UTF-8 bytes, no terminator).
    String = 8,
    /// `GGUF_TYPE_ARRAY` (u32 element type + u64 count + elements).
    Array = 9,
    /// `GGUF_TYPE_UINT64`.
    U64 = 10,
    /// `GGUF_TYPE_INT64`.
    I64 = 11,
    /// `GGUF_TYPE_FLOAT64`.
    F64 = 12,
}

impl GgufValueType {
    /// The type with on-disk code `code`, if any.
    pub fn from_code(code: u32) -> Option<Self> {
        use GgufValueType::*;
        Some(match code {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Lower-case name as gguf-py prints it (`uint32`, `string`, …).
    pub fn name(self) -> &'static str {
        use GgufValueType::*;
        match self {
            U8 => "uint8",
            I8 => "int8",
            U16 => "uint16",
            I16 => "int16",
            U32 => "uint32",
            I32 => "int32",
            F32 => "float32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "uint64",
            I64 => "int64",
            F64 => "float64",
        }
    }
}

impl fmt::Display for GgufValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value, in its stored type.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// uint8.
    U8(u8),
    /// int8.
    I8(i8),
    /// uint16.
    U16(u16),
    /// int16.
    I16(i16),
    /// uint32.
    U32(u32),
    /// int32.
    I32(i32),
    /// float32.
    F32(f32),
    /// bool.
    Bool(bool),
    /// UTF-8 string.
    String(String),
    /// Homogeneous array.
    Array(GgufArray),
    /// uint64.
    U64(u64),
    /// int64.
    I64(i64),
    /// float64.
    F64(f64),
}

impl GgufValue {
    /// The stored GGUF type.
    pub fn value_type(&self) -> GgufValueType {
        match self {
            GgufValue::U8(_) => GgufValueType::U8,
            GgufValue::I8(_) => GgufValueType::I8,
            GgufValue::U16(_) => GgufValueType::U16,
            GgufValue::I16(_) => GgufValueType::I16,
            GgufValue::U32(_) => GgufValueType::U32,
            GgufValue::I32(_) => GgufValueType::I32,
            GgufValue::F32(_) => GgufValueType::F32,
            GgufValue::Bool(_) => GgufValueType::Bool,
            GgufValue::String(_) => GgufValueType::String,
            GgufValue::Array(_) => GgufValueType::Array,
            GgufValue::U64(_) => GgufValueType::U64,
            GgufValue::I64(_) => GgufValueType::I64,
            GgufValue::F64(_) => GgufValueType::F64,
        }
    }

    /// The value as a signed 128-bit integer, for any integer type (not bool, not floats).
    fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            GgufValue::U8(v) => v.into(),
            GgufValue::I8(v) => v.into(),
            GgufValue::U16(v) => v.into(),
            GgufValue::I16(v) => v.into(),
            GgufValue::U32(v) => v.into(),
            GgufValue::I32(v) => v.into(),
            GgufValue::U64(v) => v.into(),
            GgufValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// A short human description for error messages (`uint32 7`, `string "llama"`, `array of 3 int32`).
    pub fn describe(&self) -> String {
        match self {
            GgufValue::String(s) if s.len() > 40 => format!("string of {} bytes", s.len()),
            GgufValue::String(s) => format!("string {s:?}"),
            GgufValue::Array(a) => format!("array of {} {}", a.len(), a.element_type()),
            GgufValue::Bool(b) => format!("bool {b}"),
            GgufValue::F32(v) => format!("float32 {v}"),
            GgufValue::F64(v) => format!("float64 {v}"),
            other => format!(
                "{} {}",
                other.value_type(),
                other.as_integer().unwrap_or_default()
            ),
        }
    }
}

/// A homogeneous GGUF array, stored per element type.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufArray {
    /// uint8 elements.
    U8(Vec<u8>),
    /// int8 elements.
    I8(Vec<i8>),
    /// uint16 elements.
    U16(Vec<u16>),
    /// int16 elements.
    I16(Vec<i16>),
    /// uint32 elements.
    U32(Vec<u32>),
    /// int32 elements (e.g. `tokenizer.ggml.token_type`).
    I32(Vec<i32>),
    /// float32 elements (e.g. `tokenizer.ggml.scores`).
    F32(Vec<f32>),
    /// bool elements.
    Bool(Vec<bool>),
    /// string elements (e.g. `tokenizer.ggml.tokens`, `tokenizer.ggml.merges`).
    String(Vec<String>),
    /// Nested arrays.
    Array(Vec<GgufArray>),
    /// uint64 elements.
    U64(Vec<u64>),
    /// int64 elements.
    I64(Vec<i64>),
    /// float64 elements.
    F64(Vec<f64>),
}

impl GgufArray {
    /// Element type.
    pub fn element_type(&self) -> GgufValueType {
        match self {
            GgufArray::U8(_) => GgufValueType::U8,
            GgufArray::I8(_) => GgufValueType::I8,
            GgufArray::U16(_) => GgufValueType::U16,
            GgufArray::I16(_) => GgufValueType::I16,
            GgufArray::U32(_) => GgufValueType::U32,
            GgufArray::I32(_) => GgufValueType::I32,
            GgufArray::F32(_) => GgufValueType::F32,
            GgufArray::Bool(_) => GgufValueType::Bool,
            GgufArray::String(_) => GgufValueType::String,
            GgufArray::Array(_) => GgufValueType::Array,
            GgufArray::U64(_) => GgufValueType::U64,
            GgufArray::I64(_) => GgufValueType::I64,
            GgufArray::F64(_) => GgufValueType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            GgufArray::U8(v) => v.len(),
            GgufArray::I8(v) => v.len(),
            GgufArray::U16(v) => v.len(),
            GgufArray::I16(v) => v.len(),
            GgufArray::U32(v) => v.len(),
            GgufArray::I32(v) => v.len(),
            GgufArray::F32(v) => v.len(),
            GgufArray::Bool(v) => v.len(),
            GgufArray::String(v) => v.len(),
            GgufArray::Array(v) => v.len(),
            GgufArray::U64(v) => v.len(),
            GgufArray::I64(v) => v.len(),
            GgufArray::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every element as i128 when the element type is an integer type.
    fn integers(&self) -> Option<Vec<i128>> {
        fn conv<T: Copy + Into<i128>>(v: &[T]) -> Vec<i128> {
            v.iter().map(|&x| x.into()).collect()
        }
        Some(match self {
            GgufArray::U8(v) => conv(v),
            GgufArray::I8(v) => conv(v),
            GgufArray::U16(v) => conv(v),
            GgufArray::I16(v) => conv(v),
            GgufArray::U32(v) => conv(v),
            GgufArray::I32(v) => conv(v),
            GgufArray::U64(v) => conv(v),
            GgufArray::I64(v) => conv(v),
            _ => return None,
        })
    }
}

/// The metadata key/value pairs of one GGUF file, in file order, with lookup by key.
///
/// Getters return `Ok(None)` when the key is absent, `Ok(Some(v))` when present with a
/// compatible type, and `Err(ModelError::Format)` naming the key when present with a type
/// that cannot be read as asked. `require_*` variants turn absence into a `Format` error.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GgufMetadata {
    /// File the metadata came from (for error messages).
    path: PathBuf,
    /// Pairs in file order.
    entries: Vec<(String, GgufValue)>,
    /// Key → index into `entries`.
    index: HashMap<String, usize>,
}

impl GgufMetadata {
    /// Reads the metadata of the GGUF file at `path` (opens it with [`super::GgufFile::open`], so
    /// a malformed tensor directory is an error here too).
    pub fn read(path: &Path) -> Result<GgufMetadata, ModelError> {
        Ok(super::GgufFile::open(path)?.metadata().clone())
    }

    /// An empty store attributed to `path`; [`GgufMetadata::insert`] fills it.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        GgufMetadata {
            path: path.into(),
            entries: Vec::new(),
            index: HashMap::new(),
        }
    }

    /// Adds (or replaces) `key`. Used by the parser and by tests that build metadata by hand.
    pub fn insert(&mut self, key: impl Into<String>, value: GgufValue) {
        let key = key.into();
        match self.index.get(&key) {
            Some(&i) => self.entries[i].1 = value,
            None => {
                self.index.insert(key.clone(), self.entries.len());
                self.entries.push((key, value));
            }
        }
    }

    /// The file this metadata was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Keys in file order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(k, _)| k.as_str())
    }

    /// Pairs in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &GgufValue)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// The raw value under `key`.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// The `Format` error for `key` holding `found` where `wanted` was asked for.
    fn type_error(&self, key: &str, wanted: &str, found: &GgufValue) -> ModelError {
        ModelError::Format {
            path: self.path.clone(),
            format: "gguf",
            message: format!(
                "metadata key `{key}`: expected {wanted}, found {}",
                found.describe()
            ),
        }
    }

    /// The `Format` error for a missing required `key`.
    fn missing(&self, key: &str) -> ModelError {
        ModelError::Format {
            path: self.path.clone(),
            format: "gguf",
            message: format!("metadata key `{key}` is missing"),
        }
    }

    /// An integer of any GGUF integer type that fits in `T`.
    fn get_int<T: TryFrom<i128>>(&self, key: &str, wanted: &str) -> Result<Option<T>, ModelError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        v.as_integer()
            .and_then(|i| T::try_from(i).ok())
            .map(Some)
            .ok_or_else(|| self.type_error(key, wanted, v))
    }

    /// A string.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(GgufValue::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.type_error(key, "a string", v)),
        }
    }

    /// An integer that fits in u32 (stored as any integer type).
    pub fn get_u32(&self, key: &str) -> Result<Option<u32>, ModelError> {
        self.get_int(key, "an integer fitting uint32")
    }

    /// An integer that fits in i32 (stored as any integer type).
    pub fn get_i32(&self, key: &str) -> Result<Option<i32>, ModelError> {
        self.get_int(key, "an integer fitting int32")
    }

    /// An integer that fits in u64 (stored as any integer type).
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>, ModelError> {
        self.get_int(key, "an integer fitting uint64")
    }

    /// An integer that fits in i64 (stored as any integer type).
    pub fn get_i64(&self, key: &str) -> Result<Option<i64>, ModelError> {
        self.get_int(key, "an integer fitting int64")
    }

    /// A non-negative integer that fits in usize (stored as any integer type).
    pub fn get_usize(&self, key: &str) -> Result<Option<usize>, ModelError> {
        self.get_int(key, "a non-negative integer")
    }

    /// A float32 (a float64 is narrowed; integers are not accepted).
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(GgufValue::F32(v)) => Ok(Some(*v)),
            Some(GgufValue::F64(v)) => Ok(Some(*v as f32)),
            Some(v) => Err(self.type_error(key, "a float", v)),
        }
    }

    /// A float64 (a float32 is widened).
    pub fn get_f64(&self, key: &str) -> Result<Option<f64>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(GgufValue::F32(v)) => Ok(Some(f64::from(*v))),
            Some(GgufValue::F64(v)) => Ok(Some(*v)),
            Some(v) => Err(self.type_error(key, "a float", v)),
        }
    }

    /// A bool.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(GgufValue::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.type_error(key, "a bool", v)),
        }
    }

    /// An array of any element type.
    pub fn get_array(&self, key: &str) -> Result<Option<&GgufArray>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(GgufValue::Array(a)) => Ok(Some(a)),
            Some(v) => Err(self.type_error(key, "an array", v)),
        }
    }

    /// An array of strings, borrowed (e.g. `tokenizer.ggml.tokens`).
    pub fn get_str_array(&self, key: &str) -> Result<Option<&[String]>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(GgufValue::Array(GgufArray::String(v))) => Ok(Some(v)),
            Some(v) => Err(self.type_error(key, "an array of strings", v)),
        }
    }

    /// An array of integers that each fit in i32 (e.g. `tokenizer.ggml.token_type`), copied.
    pub fn get_i32_array(&self, key: &str) -> Result<Option<Vec<i32>>, ModelError> {
        self.get_int_array(key, "an array of integers fitting int32")
    }

    /// An array of integers that each fit in u32, copied.
    pub fn get_u32_array(&self, key: &str) -> Result<Option<Vec<u32>>, ModelError> {
        self.get_int_array(key, "an array of integers fitting uint32")
    }

    /// Integer array coercion shared by the typed array getters.
    fn get_int_array<T: TryFrom<i128>>(
        &self,
        key: &str,
        wanted: &str,
    ) -> Result<Option<Vec<T>>, ModelError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let converted = match v {
            GgufValue::Array(a) => a.integers().and_then(|ints| {
                ints.into_iter()
                    .map(|i| T::try_from(i).ok())
                    .collect::<Option<Vec<T>>>()
            }),
            _ => None,
        };
        converted
            .map(Some)
            .ok_or_else(|| self.type_error(key, wanted, v))
    }

    /// An array of floats as f32 (float64 elements are narrowed), copied (e.g. `tokenizer.ggml.scores`).
    pub fn get_f32_array(&self, key: &str) -> Result<Option<Vec<f32>>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(GgufValue::Array(GgufArray::F32(v))) => Ok(Some(v.clone())),
            Some(GgufValue::Array(GgufArray::F64(v))) => {
                Ok(Some(v.iter().map(|&x| x as f32).collect()))
            }
            Some(v) => Err(self.type_error(key, "an array of floats", v)),
        }
    }

    /// Like [`GgufMetadata::get_str`], but absence is a `Format` error.
    pub fn require_str(&self, key: &str) -> Result<&str, ModelError> {
        self.get_str(key)?.ok_or_else(|| self.missing(key))
    }

    /// Like [`GgufMetadata::get_u32`], but absence is a `Format` error.
    pub fn require_u32(&self, key: &str) -> Result<u32, ModelError> {
        self.get_u32(key)?.ok_or_else(|| self.missing(key))
    }

    /// Like [`GgufMetadata::get_usize`], but absence is a `Format` error.
    pub fn require_usize(&self, key: &str) -> Result<usize, ModelError> {
        self.get_usize(key)?.ok_or_else(|| self.missing(key))
    }

    /// Like [`GgufMetadata::get_f32`], but absence is a `Format` error.
    pub fn require_f32(&self, key: &str) -> Result<f32, ModelError> {
        self.get_f32(key)?.ok_or_else(|| self.missing(key))
    }

    /// Like [`GgufMetadata::get_str_array`], but absence is a `Format` error.
    pub fn require_str_array(&self, key: &str) -> Result<&[String], ModelError> {
        self.get_str_array(key)?.ok_or_else(|| self.missing(key))
    }
}

#[cfg(test)]
mod tests;
