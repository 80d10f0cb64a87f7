//! # rlft-suggest: the one "did you mean" rule
//!
//! Every place in rlft that rejects a name (a config key, an enum value such as `loss_type`, a
//! reward `type`, a dataset column or split) suggests the closest valid one with this rule, so a
//! typo gets the same help everywhere: case-insensitive Levenshtein distance, accepted when it
//! is at most `max(2, len / 3)` edits for a word of `len` characters ("promt" -> "prompt",
//! "lerning_rate" -> "learning_rate", but not "question" -> "prompt"). Ties go to the first
//! candidate. Each caller words the hint in its own message.

/// Levenshtein distance over chars (insertions, deletions and substitutions each cost 1).
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        cur[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// The most edits a word of `len` characters may be from a candidate to count as a typo of it.
pub fn max_edits(len: usize) -> usize {
    (len / 3).max(2)
}

/// The candidate closest to `word`, if it is close enough to be a likely typo of it.
pub fn closest<'a, S: AsRef<str>>(word: &str, candidates: &'a [S]) -> Option<&'a str> {
    let lower = word.trim().to_lowercase();
    let limit = max_edits(lower.chars().count());
    let mut best: Option<(usize, &'a str)> = None;
    for c in candidates {
        let c = c.as_ref();
        let d = edit_distance(&lower, &c.to_lowercase());
        if d <= limit && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, c));
        }
    }
    best.map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
    }

    #[test]
    fn typos_find_their_word_and_others_do_not() {
        let keys = ["learning_rate", "num_train_epochs", "seed"];
        assert_eq!(closest("lerning_rate", &keys), Some("learning_rate"));
        assert_eq!(closest("num_train_epoch", &keys), Some("num_train_epochs"));
        assert_eq!(closest("LEARNING_RATE", &keys), Some("learning_rate"));
        assert_eq!(closest("batch", &keys), None);
        let cols = vec!["prompt".to_string(), "answer".to_string()];
        assert_eq!(closest("promt", &cols), Some("prompt"));
        assert_eq!(closest("question", &cols), None);
        // Ties keep the first candidate.
        assert_eq!(closest("ab", &["aa", "bb"]), Some("aa"));
    }
}
