//! Checkpoint-key building: `Prefix::new("model").pp("layers").pp(3).key("self_attn.q_proj.weight")`
//! gives `model.layers.3.self_attn.q_proj.weight`, so weight lookups read like the Hugging Face
//! module tree they mirror (and a model nested under `model.language_model.` only changes the
//! root).

use std::fmt::Display;

/// A dotted path into the checkpoint's key space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prefix(String);

impl Prefix {
    /// A root prefix (`""` for top-level keys such as `lm_head.weight`).
    pub fn new(root: &str) -> Prefix {
        Prefix(root.to_owned())
    }

    /// The sub-module `part` (a name or a layer index).
    pub fn pp(&self, part: impl Display) -> Prefix {
        Prefix(self.join(part))
    }

    /// The full key of `leaf` under this prefix.
    pub fn key(&self, leaf: impl Display) -> String {
        self.join(leaf)
    }

    fn join(&self, part: impl Display) -> String {
        if self.0.is_empty() {
            part.to_string()
        } else {
            format!("{}.{part}", self.0)
        }
    }
}

impl Display for Prefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_hf_keys() {
        let layer = Prefix::new("model").pp("layers").pp(3);
        assert_eq!(
            layer.key("self_attn.q_proj.weight"),
            "model.layers.3.self_attn.q_proj.weight"
        );
        assert_eq!(Prefix::new("").key("lm_head.weight"), "lm_head.weight");
        assert_eq!(layer.to_string(), "model.layers.3");
    }
}
