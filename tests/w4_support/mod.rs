//! Seeded random 4-bit linears of every int4 format and NVFP4 (owned parts, borrowed as a
//! [`PackedLinear`]), shared by `tests/cuda_w4a16_layout.rs` (CPU) and `tests/cuda_w4a16.rs` (GPU).
#![allow(dead_code)]

use half::bf16;
use kiln::tensor::{PackedLinear, PackedScheme, TensorView, WeightDType};

/// splitmix64: a small seeded generator (no dependency).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Which int4 format to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fmt {
    /// compressed-tensors pack-quantized; `act_order` adds a permuting `weight_g_idx`.
    Ct {
        group: usize,
        symmetric: bool,
        act_order: bool,
    },
    /// AutoAWQ GEMM.
    Awq { group: usize },
    /// GPTQ v1 (zeros minus one); `desc_act` adds a permuting `g_idx`.
    Gptq { group: usize, desc_act: bool },
    /// compressed-tensors `nvfp4-pack-quantized`: e2m1 pairs, fp8 E4M3 scales per 16, a global
    /// scale.
    Nvfp4,
}

/// The owned parts of one packed linear.
pub struct Owned {
    pub scheme: PackedScheme,
    pub n: usize,
    pub k: usize,
    pub q: (Vec<usize>, Vec<u8>),
    pub s: (Vec<usize>, Vec<u8>),
    pub z: Option<(Vec<usize>, Vec<u8>)>,
    pub g: Option<(Vec<usize>, Vec<u8>)>,
    /// NVFP4's global scale (one f32).
    pub gs: Option<(Vec<usize>, Vec<u8>)>,
}

fn words(rng: &mut Rng, count: usize) -> Vec<u8> {
    (0..count)
        .flat_map(|_| (rng.next_u64() as u32).to_le_bytes())
        .collect()
}

/// Scales in [0.5, 1.5) / 64 (bf16), so outputs of K ~ 5000 stay O(1) for unit inputs.
fn scales(rng: &mut Rng, count: usize) -> Vec<u8> {
    (0..count)
        .flat_map(|_| bf16::from_f32((1.0 + 0.5 * rng.unit()) / 64.0).to_le_bytes())
        .collect()
}

/// A `g_idx` that assigns a random permutation of the columns to groups of `group`.
fn act_order(rng: &mut Rng, k: usize, group: usize) -> Vec<u8> {
    let mut cols: Vec<usize> = (0..k).collect();
    for i in (1..k).rev() {
        cols.swap(i, rng.below(i + 1));
    }
    let mut gi = vec![0i32; k];
    for (pos, &c) in cols.iter().enumerate() {
        gi[c] = (pos / group) as i32;
    }
    gi.iter().flat_map(|v| v.to_le_bytes()).collect()
}

impl Owned {
    /// A random `[n, k]` linear of format `fmt` from `seed`.
    pub fn random(fmt: Fmt, n: usize, k: usize, seed: u64) -> Owned {
        let mut rng = Rng(seed);
        match fmt {
            Fmt::Ct {
                group,
                symmetric,
                act_order: ao,
            } => {
                let gr = k.div_ceil(group);
                Owned {
                    scheme: PackedScheme::CtInt4 {
                        group_size: group,
                        symmetric,
                    },
                    n,
                    k,
                    q: (vec![n, k / 8], words(&mut rng, n * k / 8)),
                    s: (vec![n, gr], scales(&mut rng, n * gr)),
                    z: (!symmetric)
                        .then(|| (vec![n.div_ceil(8), gr], words(&mut rng, n.div_ceil(8) * gr))),
                    g: ao.then(|| (vec![k], act_order(&mut rng, k, group))),
                    gs: None,
                }
            }
            Fmt::Awq { group } => {
                let gr = k / group;
                Owned {
                    scheme: PackedScheme::AwqGemm { group_size: group },
                    n,
                    k,
                    q: (vec![k, n / 8], words(&mut rng, k * n / 8)),
                    s: (vec![gr, n], scales(&mut rng, gr * n)),
                    z: Some((vec![gr, n / 8], words(&mut rng, gr * n / 8))),
                    g: None,
                    gs: None,
                }
            }
            Fmt::Gptq { group, desc_act } => {
                let gr = k.div_ceil(group);
                Owned {
                    scheme: PackedScheme::Gptq {
                        group_size: group,
                        zero_minus_one: true,
                    },
                    n,
                    k,
                    q: (vec![k / 8, n], words(&mut rng, k / 8 * n)),
                    s: (vec![gr, n], scales(&mut rng, gr * n)),
                    z: Some((vec![gr, n / 8], words(&mut rng, gr * n / 8))),
                    g: desc_act.then(|| (vec![k], act_order(&mut rng, k, group))),
                    gs: None,
                }
            }
            Fmt::Nvfp4 => {
                // Every e2m1 code (±0 included); fp8 scales 0x30..0x3F (0.5 .. 1.875) over a
                // global scale of 64, so weights are up to 6 × 1.875 / 64 like the int4 ones.
                let q: Vec<u8> = (0..n * k / 2).map(|_| rng.next_u64() as u8).collect();
                let sc: Vec<u8> = (0..n * k / 16)
                    .map(|_| 0x30 + (rng.next_u64() % 16) as u8)
                    .collect();
                Owned {
                    scheme: PackedScheme::CtNvfp4,
                    n,
                    k,
                    q: (vec![n, k / 2], q),
                    s: (vec![n, k / 16], sc),
                    z: None,
                    g: None,
                    gs: Some((vec![1], 64f32.to_le_bytes().to_vec())),
                }
            }
        }
    }

    /// The borrowed linear.
    pub fn linear(&self) -> PackedLinear<'_> {
        fn v(d: WeightDType, p: &(Vec<usize>, Vec<u8>)) -> TensorView<'_> {
            TensorView {
                dtype: d,
                shape: &p.0,
                data: &p.1,
            }
        }
        let fp4 = self.scheme == PackedScheme::CtNvfp4;
        PackedLinear {
            scheme: self.scheme,
            out_features: self.n,
            in_features: self.k,
            qweight: v(
                if fp4 {
                    WeightDType::U8
                } else {
                    WeightDType::I32
                },
                &self.q,
            ),
            scales: v(
                if fp4 {
                    WeightDType::F8E4M3
                } else {
                    WeightDType::BF16
                },
                &self.s,
            ),
            zeros: self.z.as_ref().map(|z| v(WeightDType::I32, z)),
            g_idx: self.g.as_ref().map(|g| v(WeightDType::I32, g)),
            global_scale: self.gs.as_ref().map(|g| v(WeightDType::F32, g)),
        }
    }
}

/// compressed-tensors pack-quantized without act-order, `group` columns per scale.
pub fn ct(group: usize, symmetric: bool) -> Fmt {
    Fmt::Ct {
        group,
        symmetric,
        act_order: false,
    }
}

/// The formats the cluster GEMVs' bit tests cover, as (label, format): the fast layouts' kinds,
/// the 27B checkpoints' CT sym / asym g128 first (those two on every shape, the others on the
/// small ones: [`fast_format_shape`]).
pub fn fast_formats() -> [(&'static str, Fmt); 6] {
    [
        ("ct-sym-g128", ct(128, true)),
        ("ct-asym-g128", ct(128, false)),
        ("ct-sym-g32", ct(32, true)),
        ("awq-g64", Fmt::Awq { group: 64 }),
        (
            "gptq-g64",
            Fmt::Gptq {
                group: 64,
                desc_act: false,
            },
        ),
        ("nvfp4", Fmt::Nvfp4),
    ]
}

/// Whether format `i` of [`fast_formats`] runs on shape (n, k): the first two everywhere, the
/// others on the small shapes (n < 1000) and 5120×6144.
pub fn fast_format_shape(i: usize, (n, k): (usize, usize)) -> bool {
    i < 2 || n < 1000 || (n, k) == (5120, 6144)
}

/// Every 4-bit format the tiles hold (the int4 ones and NVFP4), as (label, format).
pub fn all_formats() -> Vec<(&'static str, Fmt)> {
    let ct = |group, symmetric, act_order| Fmt::Ct {
        group,
        symmetric,
        act_order,
    };
    vec![
        ("ct-sym-g32", ct(32, true, false)),
        ("ct-sym-g64", ct(64, true, false)),
        ("ct-sym-g128", ct(128, true, false)),
        ("ct-asym-g32", ct(32, false, false)),
        ("ct-asym-g128", ct(128, false, false)),
        ("ct-asym-g128-actorder", ct(128, false, true)),
        ("ct-sym-g64-actorder", ct(64, true, true)),
        ("awq-g64", Fmt::Awq { group: 64 }),
        ("awq-g128", Fmt::Awq { group: 128 }),
        (
            "gptq-g64",
            Fmt::Gptq {
                group: 64,
                desc_act: false,
            },
        ),
        (
            "gptq-g128-desc-act",
            Fmt::Gptq {
                group: 128,
                desc_act: true,
            },
        ),
        ("nvfp4", Fmt::Nvfp4),
    ]
}

/// The bulk-copy GEMV's settings swept by `cuda_w4a16_bulk_bench w4a16_gemv_bulk` when
/// `KILN_BULK_BENCH` is unset, as `SKxSTAGES[h][c][pN]` (k blocks per stage × stages, `h` the L2
/// hint, `c` the cluster form, `pN` the block form on a persistent grid of N blocks per SM);
/// `cuda_w4a16 bulk_gemv_equals_w4_gemv_bit_for_bit` checks every one of them bit for bit, so
/// the bench never times a setting the bit test did not cover.
pub const BULK_VARIANTS: &str = "1x4,1x8,2x2,2x3,2x4,2x6,4x2,4x3,2x2h,1x4c,2x2c,2x4c,4x2c,\
     1x4p4,1x8p4,2x2p4,2x3p4,2x4p4,4x2p4,2x4p2,2x6p2,4x4p1,\
     1x2h,1x3h,1x4h,2x3h,4x2h,2x1h,2x2hp4,1x4hp4,2x3hp4,4x2hp4";

/// One bulk setting: (label, stages, k blocks per stage, L2 hint, cluster form, persistent
/// blocks per SM).
pub type BulkVariant = (String, usize, usize, bool, bool, usize);

/// The settings of a comma-separated `SKxSTAGES[h][c][pN]` list (unparsable items dropped).
pub fn bulk_variants(spec: &str) -> Vec<BulkVariant> {
    spec.split(',')
        .filter_map(|v| {
            let v = v.trim();
            let (body, persist) = match v.split_once('p') {
                Some((b, p)) => (b, p.parse().ok()?),
                None => (v, 0),
            };
            let (body, cluster) = body.strip_suffix('c').map_or((body, false), |b| (b, true));
            let (body, hint) = body.strip_suffix('h').map_or((body, false), |b| (b, true));
            let (sk, st) = body.split_once('x')?;
            Some((
                format!("bulk{v}"),
                st.parse().ok()?,
                sk.parse().ok()?,
                hint,
                cluster,
                persist,
            ))
        })
        .collect()
}
