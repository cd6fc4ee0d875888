//! Stacking the stored rows of several 2-D weights into one ([`concat_rows`]), for
//! [`Backend::upload_weight_rows`] (the fused q|k|v and gate|up weights).
//!
//! [`Backend::upload_weight_rows`]: super::Backend::upload_weight_rows

use super::BackendError;
use crate::tensor::TensorView;

/// The stored rows of `parts` (2-D, one encoding, one width) one after another: the bytes, shape
/// `[Σ nᵢ, k]` and encoding of their stack, for [`Backend::upload_weight_rows`](super::Backend::upload_weight_rows). Only for the
/// encodings whose rows are stored independently and in order (dense floats, ggml blocks).
pub fn concat_rows(
    name: &str,
    parts: &[TensorView<'_>],
) -> Result<(Vec<u8>, [usize; 2], crate::tensor::WeightDType), BackendError> {
    use crate::tensor::WeightDType as D;
    let bad = |m: String| BackendError::InvalidArgument(format!("`{name}`: {m}"));
    let first = parts
        .first()
        .ok_or_else(|| bad("no weights to stack".into()))?;
    let &[_, k] = first.shape else {
        return Err(bad(format!(
            "expected 2-D weights, found {:?}",
            first.shape
        )));
    };
    match first.dtype {
        D::F32 | D::F16 | D::BF16 | D::Q8_0 | D::Q4_0 | D::Q4_1 | D::Q4K | D::Q6K => {}
        #[allow(unreachable_patterns)]
        other => {
            return Err(BackendError::Unsupported(format!(
                "`{name}`: stacking {other:?} weights"
            )))
        }
    }
    let row_bytes = first.dtype.row_bytes(k).ok_or_else(|| {
        bad(format!(
            "{k} columns are not whole {:?} blocks",
            first.dtype
        ))
    })?;
    let mut rows = 0;
    let mut bytes = Vec::new();
    for p in parts {
        let &[n, pk] = p.shape else {
            return Err(bad(format!("expected 2-D weights, found {:?}", p.shape)));
        };
        if p.dtype != first.dtype {
            // Mixed encodings (a Q4_K_M file's Q6_K attn_v under Q4_K q / k): not one weight;
            // the caller keeps the parts apart.
            return Err(BackendError::Unsupported(format!(
                "`{name}`: stacking {:?} under {:?}",
                p.dtype, first.dtype
            )));
        }
        if pk != k || p.data.len() != n * row_bytes {
            return Err(bad(format!(
                "cannot stack {:?} {:?} ({} bytes) under {:?} {:?}",
                p.dtype,
                p.shape,
                p.data.len(),
                first.dtype,
                first.shape
            )));
        }
        bytes.extend_from_slice(p.data);
        rows += n;
    }
    Ok((bytes, [rows, k], first.dtype))
}
