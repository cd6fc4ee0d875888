//! Rotary position embedding tables, computed on the host once per model and shared by every
//! backend, so all backends rotate with the same cos/sin values.
//!
//! The values follow transformers' default `LlamaRotaryEmbedding` in float32:
//! `inv_freq[i] = 1 / theta^((2i) / rotary_dim)` (exponent and power in f32),
//! `angle = position · inv_freq[i]` (one f32 product), `cos(angle)`, `sin(angle)` in f32.
//! The rotation itself is NeoX "rotate_half": dims `i` and `i + rotary_dim/2` form a pair.

/// RoPE parameters of a model (no scaling: `rope_scaling` other than null is rejected at load).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeSpec {
    /// Dims of each head that rotate (`head_dim` unless a partial rotary factor applies); even.
    pub rotary_dim: usize,
    /// RoPE base (`rope_theta`).
    pub theta: f32,
    /// Positions the table covers (`max_position_embeddings`).
    pub max_positions: usize,
}

/// `(cos, sin)`, each `[max_positions, rotary_dim / 2]` row-major.
pub fn cos_sin_table(spec: &RopeSpec) -> (Vec<f32>, Vec<f32>) {
    let half = spec.rotary_dim / 2;
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| 1.0f32 / spec.theta.powf((2 * i) as f32 / spec.rotary_dim as f32))
        .collect();
    let mut cos = Vec::with_capacity(spec.max_positions * half);
    let mut sin = Vec::with_capacity(spec.max_positions * half);
    for pos in 0..spec.max_positions {
        for &f in &inv_freq {
            let angle = pos as f32 * f;
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
    }
    (cos, sin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_the_formula_at_hand_checked_points() {
        let spec = RopeSpec {
            rotary_dim: 4,
            theta: 10000.0,
            max_positions: 3,
        };
        let (cos, sin) = cos_sin_table(&spec);
        // inv_freq = [1, 1/100]; row p holds cos/sin of [p, p/100].
        assert_eq!(cos.len(), 6);
        assert_eq!(cos[0..2], [1.0, 1.0]);
        assert_eq!(sin[0..2], [0.0, 0.0]);
        assert!((cos[4] - 2.0f32.cos()).abs() < 1e-7);
        assert!((sin[5] - 0.02f32.sin()).abs() < 1e-7);
    }
}
