//! One logical linear layer whose weight is stored as several packed tensors.
//!
//! A 4-bit checkpoint does not store `<module>.weight`: it stores the 4-bit values packed into
//! integer words, per-group scales, optional zero points, an optional `g_idx` (act-order) and,
//! for NVFP4, a global scale. [`PackedLinear`] borrows all of them with the [`PackedScheme`]
//! that says how to read them; [`LinearView`] is what a weight source hands the loader for a
//! linear, dense or packed. The exact dequantization lives in `quant::packed` (a layer above); this
//! file only describes and checks the layouts (every shape below is `[rows, cols]`, row-major,
//! `N` = out_features, `K` = in_features, `G` = group size):
//!
//! | scheme | `qweight` | `scales` | `zeros` | extra |
//! |---|---|---|---|---|
//! | compressed-tensors int4 (`pack-quantized`) | I32 `[N, K/8]` | float `[N, K/G]` | asymmetric: I32 `[⌈N/8⌉, K/G]` (packed along N) | `g_idx` I32 `[K]` (legacy act-order) |
//! | compressed-tensors NVFP4 (`nvfp4-pack-quantized`) | U8 `[N, K/2]` | F8E4M3 `[N, K/16]` | — | `global_scale` F32 `[1]` |
//! | AutoAWQ GEMM | I32 `[K, N/8]` (AWQ nibble order) | float `[K/G, N]` | I32 `[K/G, N/8]` | — |
//! | GPTQ | I32 `[K/8, N]` | float `[K/G, N]` | I32 `[K/G, N/8]` | `g_idx` I32 `[K]` (desc_act) |
//!
//! "float" is F16, BF16 or F32. With a `g_idx`, input column `k` belongs to group `g_idx[k]`
//! (every entry in `0..⌈K/G⌉`); without one, to group `k / G`.

use std::fmt;

use crate::tensor::{TensorView, WeightDType};

/// How the parts of a [`PackedLinear`] encode the weight (a closed set: one variant per
/// layout kiln reads; see the module docs for the shapes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PackedScheme {
    /// compressed-tensors `pack-quantized` 4-bit integers, `q + 8` unsigned, 8 per i32 along K
    /// (low nibble first); `W = (q − zp) · scale`, zero points only when not `symmetric`.
    CtInt4 {
        /// Input columns per scale (K itself for per-channel).
        group_size: usize,
        /// No zero points (`zp = 0`).
        symmetric: bool,
    },
    /// compressed-tensors `nvfp4-pack-quantized`: E2M1 pairs per byte (low nibble first), one
    /// fp8 E4M3 scale per 16 inputs, `W = fp4 · scale / global_scale`.
    CtNvfp4,
    /// AutoAWQ GEMM (`version: gemm`): transposed, 8 outputs per i32 in AWQ order
    /// `[0, 2, 4, 6, 1, 3, 5, 7]`; `W = (q − z) · s`, unsigned zeros, no offset.
    AwqGemm {
        /// Input rows per scale.
        group_size: usize,
    },
    /// GPTQ (AutoGPTQ / GPTQModel / optimum): 8 inputs per i32 along K, zeros 8 per i32 along
    /// N, both in plain nibble order; `W = (q − z) · s`.
    Gptq {
        /// Input columns per scale.
        group_size: usize,
        /// Zeros are stored minus one (`checkpoint_format` `gptq`, the v1 convention); false for
        /// `gptq_v2`.
        zero_minus_one: bool,
    },
}

impl PackedScheme {
    /// Elements per group of one scale.
    pub fn group_size(&self) -> usize {
        match *self {
            PackedScheme::CtInt4 { group_size, .. }
            | PackedScheme::AwqGemm { group_size }
            | PackedScheme::Gptq { group_size, .. } => group_size,
            PackedScheme::CtNvfp4 => 16,
        }
    }
}

impl fmt::Display for PackedScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            PackedScheme::CtInt4 {
                group_size,
                symmetric,
            } => write!(
                f,
                "compressed-tensors pack-quantized int4 ({}, group {group_size})",
                if symmetric { "symmetric" } else { "asymmetric" }
            ),
            PackedScheme::CtNvfp4 => f.write_str("compressed-tensors nvfp4-pack-quantized"),
            PackedScheme::AwqGemm { group_size } => {
                write!(f, "AutoAWQ GEMM int4 (group {group_size})")
            }
            PackedScheme::Gptq {
                group_size,
                zero_minus_one,
            } => write!(
                f,
                "GPTQ int4 (group {group_size}, {})",
                if zero_minus_one { "gptq" } else { "gptq_v2" }
            ),
        }
    }
}

/// The packed tensors of one linear `[out_features, in_features]`, borrowed from a source.
#[derive(Debug, Clone, Copy)]
pub struct PackedLinear<'a> {
    /// How to read the parts.
    pub scheme: PackedScheme,
    /// N: output features (rows of the logical weight).
    pub out_features: usize,
    /// K: input features (columns of the logical weight).
    pub in_features: usize,
    /// The 4-bit values.
    pub qweight: TensorView<'a>,
    /// Per-group scales.
    pub scales: TensorView<'a>,
    /// Zero points (asymmetric compressed-tensors, AWQ, GPTQ).
    pub zeros: Option<TensorView<'a>>,
    /// Group of each input column (act-order).
    pub g_idx: Option<TensorView<'a>>,
    /// NVFP4 global scale (the divisor).
    pub global_scale: Option<TensorView<'a>>,
}

/// Why a [`PackedLinear`]'s parts do not fit its scheme (a malformed or unsupported file).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{scheme} weight [{n}, {k}]: {message}")]
pub struct PackedLayoutError {
    /// The scheme the parts were checked against.
    pub scheme: PackedScheme,
    /// out_features.
    pub n: usize,
    /// in_features.
    pub k: usize,
    /// What does not fit.
    pub message: String,
}

impl<'a> PackedLinear<'a> {
    /// Every part that is present, with its role (`qweight`, `scales`, `zeros`, `g_idx`,
    /// `global_scale`).
    pub fn parts(&self) -> Vec<(&'static str, TensorView<'a>)> {
        let mut out = vec![("qweight", self.qweight), ("scales", self.scales)];
        for (role, part) in [
            ("zeros", self.zeros),
            ("g_idx", self.g_idx),
            ("global_scale", self.global_scale),
        ] {
            if let Some(p) = part {
                out.push((role, p));
            }
        }
        out
    }

    /// Bytes of all parts as stored (what a backend that keeps them packed holds).
    pub fn stored_bytes(&self) -> usize {
        self.parts().iter().map(|(_, p)| p.data.len()).sum()
    }

    /// Number of scale groups along K.
    pub fn num_groups(&self) -> usize {
        self.in_features.div_ceil(self.scheme.group_size().max(1))
    }

    /// Checks every part's dtype, shape and byte length against the scheme, and the `g_idx`
    /// values; `Ok` means the dequantizer may index the parts without further checks.
    pub fn validate(&self) -> Result<(), PackedLayoutError> {
        let (n, k) = (self.out_features, self.in_features);
        let err = |message: String| PackedLayoutError {
            scheme: self.scheme,
            n,
            k,
            message,
        };
        let g = self.scheme.group_size();
        if n == 0 || k == 0 || g == 0 {
            return Err(err("empty shape or group".into()));
        }
        let groups = self.num_groups();
        let expect =
            |role: &str, v: &TensorView<'_>, ok: &dyn Fn(WeightDType) -> bool, shape: &[usize]| {
                if !ok(v.dtype) {
                    return Err(err(format!("{role} has dtype {:?}", v.dtype)));
                }
                if v.shape != shape {
                    return Err(err(format!(
                        "{role} has shape {:?}, expected {shape:?}",
                        v.shape
                    )));
                }
                let want = v.dtype.row_bytes(v.numel()).unwrap_or(usize::MAX);
                if v.data.len() != want {
                    return Err(err(format!(
                        "{role} has {} bytes, expected {want}",
                        v.data.len()
                    )));
                }
                Ok(())
            };
        let i32_ = |d: WeightDType| d == WeightDType::I32;
        let float = |d: WeightDType| d.is_float();
        let absent = |role: &str, p: &Option<TensorView<'_>>| match p {
            Some(_) => Err(err(format!("has a {role} tensor this scheme does not use"))),
            None => Ok(()),
        };
        match self.scheme {
            PackedScheme::CtInt4 { symmetric, .. } => {
                if !k.is_multiple_of(8) {
                    return Err(err("in_features is not a multiple of 8".into()));
                }
                if self.g_idx.is_none() && !k.is_multiple_of(g) {
                    return Err(err(format!("in_features is not a multiple of group {g}")));
                }
                expect("weight_packed", &self.qweight, &i32_, &[n, k / 8])?;
                expect("weight_scale", &self.scales, &float, &[n, groups])?;
                match (&self.zeros, symmetric) {
                    (Some(z), false) => {
                        expect("weight_zero_point", z, &i32_, &[n.div_ceil(8), groups])?
                    }
                    (None, false) => return Err(err("asymmetric but no weight_zero_point".into())),
                    (z, true) => absent("zero-point", z)?,
                }
                absent("global-scale", &self.global_scale)?;
            }
            PackedScheme::CtNvfp4 => {
                if !k.is_multiple_of(16) {
                    return Err(err("in_features is not a multiple of 16".into()));
                }
                expect(
                    "weight_packed",
                    &self.qweight,
                    &|d| d == WeightDType::U8,
                    &[n, k / 2],
                )?;
                expect(
                    "weight_scale",
                    &self.scales,
                    &|d| d == WeightDType::F8E4M3,
                    &[n, k / 16],
                )?;
                let gs = self
                    .global_scale
                    .as_ref()
                    .ok_or_else(|| err("no weight_global_scale".into()))?;
                if gs.dtype != WeightDType::F32 || gs.numel() != 1 || gs.data.len() != 4 {
                    return Err(err(format!(
                        "weight_global_scale is {:?} {:?}, expected one F32",
                        gs.dtype, gs.shape
                    )));
                }
                absent("zero-point", &self.zeros)?;
                absent("g_idx", &self.g_idx)?;
            }
            PackedScheme::AwqGemm { .. } => {
                if !n.is_multiple_of(8) || !k.is_multiple_of(g) {
                    return Err(err(format!(
                        "AWQ needs out_features % 8 = 0 and in_features % {g} = 0"
                    )));
                }
                expect("qweight", &self.qweight, &i32_, &[k, n / 8])?;
                expect("scales", &self.scales, &float, &[groups, n])?;
                let z = self.zeros.as_ref().ok_or_else(|| err("no qzeros".into()))?;
                expect("qzeros", z, &i32_, &[groups, n / 8])?;
                absent("g_idx", &self.g_idx)?;
                absent("global-scale", &self.global_scale)?;
            }
            PackedScheme::Gptq { .. } => {
                if !n.is_multiple_of(8) || !k.is_multiple_of(8) {
                    return Err(err(
                        "GPTQ needs out_features and in_features multiples of 8".into(),
                    ));
                }
                if self.g_idx.is_none() && !k.is_multiple_of(g) {
                    return Err(err(format!("in_features is not a multiple of group {g}")));
                }
                expect("qweight", &self.qweight, &i32_, &[k / 8, n])?;
                expect("scales", &self.scales, &float, &[groups, n])?;
                let z = self.zeros.as_ref().ok_or_else(|| err("no qzeros".into()))?;
                expect("qzeros", z, &i32_, &[groups, n / 8])?;
                absent("global-scale", &self.global_scale)?;
            }
        }
        if let Some(gi) = &self.g_idx {
            expect("g_idx", gi, &i32_, &[k])?;
            if let Some((col, bad)) = gi
                .data
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .enumerate()
                .find(|&(_, v)| v < 0 || v as usize >= groups)
            {
                return Err(err(format!(
                    "g_idx[{col}] = {bad} is not a group in 0..{groups}"
                )));
            }
        }
        Ok(())
    }
}

/// A linear layer's weight as the source stores it.
#[derive(Debug, Clone, Copy)]
pub enum LinearView<'a> {
    /// `<module>.weight`: one float or ggml-block tensor `[N, K]`.
    Dense(TensorView<'a>),
    /// Packed 4-bit parts.
    Packed(PackedLinear<'a>),
}

impl LinearView<'_> {
    /// The logical `[out_features, in_features]`, when the dense tensor is 2-D.
    pub fn shape(&self) -> Vec<usize> {
        match self {
            LinearView::Dense(v) => v.shape.to_vec(),
            LinearView::Packed(p) => vec![p.out_features, p.in_features],
        }
    }

    /// Stored bytes of all its tensors.
    pub fn stored_bytes(&self) -> usize {
        match self {
            LinearView::Dense(v) => v.data.len(),
            LinearView::Packed(p) => p.stored_bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view<'a>(dtype: WeightDType, shape: &'a [usize], data: &'a [u8]) -> TensorView<'a> {
        TensorView { dtype, shape, data }
    }

    #[test]
    fn ct_int4_layout_is_checked_part_by_part() {
        let (qs, ss, zs) = ([16usize, 8], [16usize, 2], [2usize, 2]);
        let (q, s, z) = (
            vec![0u8; 16 * 8 * 4],
            vec![0u8; 16 * 2 * 2],
            vec![0u8; 2 * 2 * 4],
        );
        let mut p = PackedLinear {
            scheme: PackedScheme::CtInt4 {
                group_size: 32,
                symmetric: false,
            },
            out_features: 16,
            in_features: 64,
            qweight: view(WeightDType::I32, &qs, &q),
            scales: view(WeightDType::BF16, &ss, &s),
            zeros: Some(view(WeightDType::I32, &zs, &z)),
            g_idx: None,
            global_scale: None,
        };
        p.validate().unwrap();
        assert_eq!(p.stored_bytes(), q.len() + s.len() + z.len());
        let sym = PackedLinear {
            scheme: PackedScheme::CtInt4 {
                group_size: 32,
                symmetric: true,
            },
            ..p
        };
        let e = sym.validate().unwrap_err();
        assert!(e.message.contains("zero-point"), "{e}");
        p.zeros = None;
        assert!(p.validate().unwrap_err().message.contains("asymmetric"));
        p.scheme = PackedScheme::CtInt4 {
            group_size: 64,
            symmetric: true,
        };
        let e = p.validate().unwrap_err();
        assert!(
            e.to_string().contains("weight_scale has shape [16, 2]"),
            "{e}"
        );
    }

    #[test]
    fn g_idx_values_must_name_groups() {
        let (qs, ss, gs) = ([8usize, 2], [8usize, 2], [16usize]);
        let (q, s) = (vec![0u8; 8 * 2 * 4], vec![0u8; 8 * 2 * 2]);
        let mut g: Vec<u8> = (0..16i32).flat_map(|i| (i % 2).to_le_bytes()).collect();
        let p = |g: &[u8]| {
            PackedLinear {
                scheme: PackedScheme::CtInt4 {
                    group_size: 8,
                    symmetric: true,
                },
                out_features: 8,
                in_features: 16,
                qweight: view(WeightDType::I32, &qs, &q),
                scales: view(WeightDType::F16, &ss, &s),
                zeros: None,
                g_idx: Some(view(WeightDType::I32, &gs, g)),
                global_scale: None,
            }
            .validate()
        };
        p(&g).unwrap();
        g[4 * 5..4 * 6].copy_from_slice(&2i32.to_le_bytes());
        assert!(p(&g).unwrap_err().message.contains("g_idx[5] = 2"));
    }
}
