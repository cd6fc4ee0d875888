//! A [`WeightSource`] that knows its checkpoint's `quantization_config`: it hands out the
//! packed parts of quantized linears through [`WeightSource::linear`] and every other tensor
//! unchanged.
//!
//! Part names per scheme (`<m>` = the module path):
//! - compressed-tensors int4: `<m>.weight_packed`, `<m>.weight_scale`, `<m>.weight_zero_point`
//!   (asymmetric), `<m>.weight_g_idx` (when present), `<m>.weight_shape` (`[N, K]`, I64 or
//!   I32; else `K` = 8 × the packed columns);
//! - NVFP4: `<m>.weight_packed`, `<m>.weight_scale`, `<m>.weight_global_scale`
//!   (`<m>.input_global_scale` of W4A4 is not used);
//! - AutoAWQ: `<m>.qweight`, `<m>.qzeros`, `<m>.scales`;
//! - GPTQ: `<m>.qweight`, `<m>.qzeros`, `<m>.scales`, `<m>.g_idx` (when present).
//!
//! A `<m>.bias` on a packed module is refused (kiln's llama has no linear biases), and so is a
//! module the config quantizes but the file stores dense, both naming the module.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::ModelError;
use crate::model::quant_config::{Decision, QuantConfig, SchemeTemplate};
use crate::tensor::{
    LinearView, PackedLinear, PackedScheme, TensorInfo, TensorView, WeightDType, WeightSource,
};

/// `inner` read through `config`.
pub struct QuantizedWeights {
    inner: Box<dyn WeightSource>,
    config: QuantConfig,
    /// The W4A4-runs-as-A16 warning was logged.
    warned_w4a4: AtomicBool,
}

impl QuantizedWeights {
    /// Wrap `inner` (whose `config.json` carried `config`).
    pub fn new(inner: Box<dyn WeightSource>, config: QuantConfig) -> QuantizedWeights {
        QuantizedWeights {
            inner,
            config,
            warned_w4a4: AtomicBool::new(false),
        }
    }

    /// `inner` wrapped when `config_json` (the parsed `config.json`) has a
    /// `quantization_config`, else `inner` itself.
    pub fn wrap(
        inner: Box<dyn WeightSource>,
        config_json: &serde_json::Value,
    ) -> Result<Box<dyn WeightSource>, ModelError> {
        Ok(match QuantConfig::from_config_json(config_json)? {
            Some(config) => {
                tracing::info!(
                    quant_method = config.quant_method(),
                    "Checkpoint is quantized; packed linears stay packed."
                );
                Box::new(QuantizedWeights::new(inner, config))
            }
            None => inner,
        })
    }

    /// The parsed config.
    pub fn config(&self) -> &QuantConfig {
        &self.config
    }

    fn part(&self, module: &str, leaf: &str) -> Result<TensorView<'_>, ModelError> {
        self.inner.tensor(&format!("{module}.{leaf}"))
    }

    fn optional(&self, module: &str, leaf: &str) -> Result<Option<TensorView<'_>>, ModelError> {
        let name = format!("{module}.{leaf}");
        if self.inner.contains(&name) {
            self.inner.tensor(&name).map(Some)
        } else {
            Ok(None)
        }
    }

    /// `[N, K]` from `<m>.weight_shape` (any integer dtype).
    fn weight_shape(&self, module: &str) -> Result<Option<[usize; 2]>, ModelError> {
        let Some(v) = self.optional(module, "weight_shape")? else {
            return Ok(None);
        };
        let vals: Vec<i64> = match v.dtype {
            WeightDType::I64 => v
                .data
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("chunk of 8")))
                .collect(),
            WeightDType::I32 => v
                .data
                .chunks_exact(4)
                .map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect(),
            _ => vec![],
        };
        match vals[..] {
            [n, k] if n > 0 && k > 0 => Ok(Some([n as usize, k as usize])),
            _ => Err(ModelError::Unsupported(format!(
                "`{module}.weight_shape` is {:?} {:?}, expected two positive integers",
                v.dtype, v.shape
            ))),
        }
    }

    fn packed(&self, module: &str, t: &SchemeTemplate) -> Result<PackedLinear<'_>, ModelError> {
        let dims = |v: &TensorView<'_>| -> Result<(usize, usize), ModelError> {
            match *v.shape {
                [a, b] => Ok((a, b)),
                _ => Err(ModelError::Unsupported(format!(
                    "`{module}`: packed weight of shape {:?} is not 2-D",
                    v.shape
                ))),
            }
        };
        let p = match *t {
            SchemeTemplate::CtInt4 {
                group_size,
                symmetric,
            } => {
                let qweight = self.part(module, "weight_packed")?;
                let (rows, cols) = dims(&qweight)?;
                let [n, k] = self.weight_shape(module)?.unwrap_or([rows, cols * 8]);
                PackedLinear {
                    scheme: PackedScheme::CtInt4 {
                        group_size: group_size.unwrap_or(k),
                        symmetric,
                    },
                    out_features: n,
                    in_features: k,
                    qweight,
                    scales: self.part(module, "weight_scale")?,
                    zeros: if symmetric {
                        None
                    } else {
                        Some(self.part(module, "weight_zero_point")?)
                    },
                    g_idx: self.optional(module, "weight_g_idx")?,
                    global_scale: None,
                }
            }
            SchemeTemplate::CtNvfp4 { w4a4 } => {
                if w4a4 && !self.warned_w4a4.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        module,
                        "NVFP4 W4A4 checkpoint: kiln runs it weight-only (16-bit activations); \
                         results differ from the W4A4 reference by the activation rounding."
                    );
                }
                let qweight = self.part(module, "weight_packed")?;
                let (n, half_k) = dims(&qweight)?;
                PackedLinear {
                    scheme: PackedScheme::CtNvfp4,
                    out_features: n,
                    in_features: 2 * half_k,
                    qweight,
                    scales: self.part(module, "weight_scale")?,
                    zeros: None,
                    g_idx: None,
                    global_scale: Some(self.part(module, "weight_global_scale")?),
                }
            }
            SchemeTemplate::AwqGemm { group_size } => {
                let qweight = self.part(module, "qweight")?;
                let (k, cols) = dims(&qweight)?;
                PackedLinear {
                    scheme: PackedScheme::AwqGemm { group_size },
                    out_features: cols * 8,
                    in_features: k,
                    qweight,
                    scales: self.part(module, "scales")?,
                    zeros: Some(self.part(module, "qzeros")?),
                    g_idx: None,
                    global_scale: None,
                }
            }
            SchemeTemplate::Gptq {
                group_size,
                zero_minus_one,
            } => {
                let qweight = self.part(module, "qweight")?;
                let (rows, n) = dims(&qweight)?;
                let k = rows * 8;
                PackedLinear {
                    scheme: PackedScheme::Gptq {
                        group_size: group_size.unwrap_or(k),
                        zero_minus_one,
                    },
                    out_features: n,
                    in_features: k,
                    qweight,
                    scales: self.part(module, "scales")?,
                    zeros: Some(self.part(module, "qzeros")?),
                    g_idx: self.optional(module, "g_idx")?,
                    global_scale: None,
                }
            }
        };
        if self.inner.contains(&format!("{module}.bias")) {
            return Err(ModelError::Unsupported(format!(
                "`{module}.bias`: biases on quantized linears"
            )));
        }
        p.validate()
            .map_err(|e| ModelError::Unsupported(format!("`{module}`: {e}")))?;
        Ok(p)
    }
}

impl WeightSource for QuantizedWeights {
    fn tensor(&self, name: &str) -> Result<TensorView<'_>, ModelError> {
        self.inner.tensor(name)
    }

    fn contains(&self, name: &str) -> bool {
        self.inner.contains(name)
    }

    fn names(&self) -> Vec<String> {
        self.inner.names()
    }

    fn tensor_info(&self, name: &str) -> Result<TensorInfo, ModelError> {
        self.inner.tensor_info(name)
    }

    fn linear(&self, module: &str) -> Result<LinearView<'_>, ModelError> {
        match self.config.decide(module)? {
            Decision::Dense => self.inner.linear(module),
            Decision::Packed(t) => match self.packed(module, &t) {
                Err(ModelError::MissingTensor(missing))
                    if self.inner.contains(&format!("{module}.weight")) =>
                {
                    Err(ModelError::Unsupported(format!(
                        "`{module}`: quantization_config quantizes it ({t:?}) but the checkpoint \
                         stores a dense `{module}.weight` (no `{missing}`)"
                    )))
                }
                other => other.map(LinearView::Packed),
            },
        }
    }
}
