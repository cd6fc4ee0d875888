//! Stop strings: finding the first occurrence in text that grows at the end.
//!
//! A stop string can be split across tokens, so each check looks at the new text plus the
//! `longest stop − 1` bytes before it. Until generation ends the engine keeps the whole text to
//! itself, which holds back any stop string still forming; [`StopStrings::releasable_len`] says
//! how much of a growing text could be shown early (for streaming) without ever showing part of
//! a stop string. The stop string itself is never part of the returned text.

/// The stop strings of one request (empty strings are ignored).
#[derive(Debug, Clone, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    /// Longest stop string, in bytes.
    max_len: usize,
}

impl StopStrings {
    /// Stop strings from the request.
    pub fn new(stops: &[String]) -> Self {
        let stops: Vec<String> = stops.iter().filter(|s| !s.is_empty()).cloned().collect();
        let max_len = stops.iter().map(String::len).max().unwrap_or(0);
        StopStrings { stops, max_len }
    }

    /// Whether there is no stop string.
    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// Byte offset of the earliest stop string in `text` that ends after byte `new_from` (the
    /// length of the text before its latest growth). Occurrences entirely before `new_from`
    /// were already reported by an earlier call.
    pub fn find(&self, text: &str, new_from: usize) -> Option<usize> {
        if self.stops.is_empty() || text.len() <= new_from {
            return None;
        }
        let mut start = new_from.saturating_sub(self.max_len - 1);
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        let window = &text[start..];
        self.stops
            .iter()
            .filter_map(|s| window.find(s.as_str()))
            .min()
            .map(|p| start + p)
    }

    /// Length of the prefix of `text` that can be released: `text` minus its longest suffix that
    /// is a proper prefix of some stop string (that suffix may still become a stop string).
    pub fn releasable_len(&self, text: &str) -> usize {
        let mut held = 0;
        for s in &self.stops {
            for k in (held + 1..s.len().min(text.len() + 1)).rev() {
                if s.is_char_boundary(k) && text.ends_with(&s[..k]) {
                    held = k;
                    break;
                }
            }
        }
        text.len() - held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(s: &[&str]) -> StopStrings {
        StopStrings::new(&s.iter().map(|x| x.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn finds_a_stop_string_split_across_growth_steps() {
        let s = stops(&["END"]);
        assert_eq!(s.find("abcE", 0), None);
        assert_eq!(s.find("abcEN", 4), None);
        assert_eq!(s.find("abcENDxyz", 5), Some(3));
    }

    #[test]
    fn earliest_of_several_wins_and_old_text_is_not_rescanned() {
        let s = stops(&["zz", "b"]);
        assert_eq!(s.find("azzb", 0), Some(1));
        // Growth from 10 bytes: only the last 1 (max_len - 1) old byte is rescanned.
        assert_eq!(s.find("b.........zz", 10), Some(10));
    }

    #[test]
    fn window_start_respects_char_boundaries() {
        let s = stops(&["éé"]);
        // "aé" is 3 bytes; the window would start inside "é" without the boundary fix.
        assert_eq!(s.find("aéé", 3), Some(1));
    }

    #[test]
    fn releasable_len_holds_back_a_forming_stop_string() {
        let s = stops(&["</s>", "STOP"]);
        assert_eq!(s.releasable_len("hello </"), 6);
        assert_eq!(s.releasable_len("hello ST"), 6);
        assert_eq!(s.releasable_len("hello"), 5);
        assert_eq!(stops(&[]).releasable_len("x<"), 2);
    }

    #[test]
    fn empty_stop_strings_are_ignored() {
        let s = stops(&[""]);
        assert!(s.is_empty());
        assert_eq!(s.find("anything", 0), None);
    }
}
