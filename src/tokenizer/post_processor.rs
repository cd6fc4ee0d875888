//! The post-processor that adds BOS / EOS around encoded text (`add_special_tokens = true`).
//!
//! Both loaders end up with the template transformers builds in `update_post_processor`:
//! single `[bos] $A:0 [eos]`, pair `[bos] $A:0 [bos]:1 $B:1 [eos]:1`, where each bracketed token
//! is present only when its flag is on. With neither, nothing is added.

use tokenizers::processors::template::TemplateProcessing;
use tokenizers::PostProcessorWrapper;

use crate::error::ModelError;

/// `TemplateProcessing` adding `bos` before and `eos` after each sequence; `(text, id)` pairs.
pub fn bos_eos_template(
    bos: Option<(&str, u32)>,
    eos: Option<(&str, u32)>,
) -> Result<PostProcessorWrapper, ModelError> {
    let err = |e: String| ModelError::Tokenizer(format!("BOS/EOS post-processor: {e}"));
    let piece = |token: Option<(&str, u32)>, type_id: u32| {
        token.map(|(text, _)| format!("{text}:{type_id}"))
    };
    let single: Vec<String> = [piece(bos, 0), Some("$A:0".into()), piece(eos, 0)]
        .into_iter()
        .flatten()
        .collect();
    let mut pair = single.clone();
    pair.extend(
        [piece(bos, 1), Some("$B:1".into()), piece(eos, 1)]
            .into_iter()
            .flatten(),
    );
    let mut specials: Vec<(String, u32)> = Vec::new();
    for (text, id) in [bos, eos].into_iter().flatten() {
        if !specials.iter().any(|(t, _)| t == text) {
            specials.push((text.to_owned(), id));
        }
    }
    let processor = TemplateProcessing::builder()
        .try_single(single)
        .map_err(err)?
        .try_pair(pair)
        .map_err(err)?
        .special_tokens(specials)
        .build()
        .map_err(|e| err(e.to_string()))?;
    Ok(processor.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_name_only_the_enabled_tokens() {
        let PostProcessorWrapper::Template(t) = bos_eos_template(Some(("<s>", 1)), None).unwrap()
        else {
            panic!("expected a template");
        };
        assert_eq!(t.get_added_single(), 1);
        assert_eq!(t.get_added_pair(), 2);
        let PostProcessorWrapper::Template(t) =
            bos_eos_template(Some(("<s>", 1)), Some(("</s>", 2))).unwrap()
        else {
            panic!("expected a template");
        };
        assert_eq!((t.get_added_single(), t.get_added_pair()), (2, 4));
        let PostProcessorWrapper::Template(t) = bos_eos_template(None, None).unwrap() else {
            panic!("expected a template");
        };
        assert_eq!(t.get_added_single(), 0);
    }
}
