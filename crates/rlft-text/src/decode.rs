//! Decoding helpers for generation: incremental detokenization (new text per generated token,
//! never splitting a multi-byte UTF-8 character) and stop strings.
//!
//! A generation loop per sequence:
//!
//! ```
//! # use rlft_text::{IncrementalDecoder, StopMatcher, StopStrings};
//! # fn demo(tok: &tokenizers::Tokenizer, ids: &[u32]) -> rlft_text::Result<String> {
//! let stops = StopStrings::new(["</answer>"])?;
//! let mut decoder = IncrementalDecoder::new(true);
//! let mut matcher = StopMatcher::new(stops);
//! for &id in ids {
//!     if let Some(piece) = decoder.step(tok, id)? {
//!         if let Some(hit) = matcher.push(&piece) {
//!             // stop generating; the completion text is cut where the stop string starts
//!             return Ok(matcher.text()[..hit.start].to_string());
//!         }
//!     }
//! }
//! if let Some(rest) = decoder.flush(tok)? {
//!     matcher.push(&rest);
//! }
//! Ok(matcher.text().to_string())
//! # }
//! ```

use crate::error::{Result, TextError};
use tokenizers::Tokenizer;

/// Streaming detokenizer for one sequence, owning its state so it can live next to a KV cache.
///
/// Same algorithm as `tokenizers`' `DecodeStream` (decode a short window of ids, emit what grew
/// past the previously emitted prefix, hold back while the text ends in an incomplete UTF-8
/// sequence) plus [`flush`](Self::flush) for what is still held back when generation ends.
#[derive(Debug, Clone, Default)]
pub struct IncrementalDecoder {
    skip_special_tokens: bool,
    ids: Vec<u32>,
    prefix: String,
    prefix_index: usize,
}

impl IncrementalDecoder {
    /// A decoder; with `skip_special_tokens` control tokens such as `<|im_end|>` produce no text.
    pub fn new(skip_special_tokens: bool) -> Self {
        IncrementalDecoder {
            skip_special_tokens,
            ..Default::default()
        }
    }

    fn decode(&self, tok: &Tokenizer, ids: &[u32]) -> Result<String> {
        tok.decode(ids, self.skip_special_tokens)
            .map_err(|e| TextError::tokenizer("decoding a generated token", e))
    }

    /// Feeds one generated id; returns the new text it completes, or None while the text so far
    /// ends inside a multi-byte character (or the token decodes to nothing).
    pub fn step(&mut self, tok: &Tokenizer, id: u32) -> Result<Option<String>> {
        if self.prefix.is_empty() && !self.ids.is_empty() {
            let prefix = self.decode(tok, &self.ids)?;
            if !prefix.ends_with('\u{FFFD}') {
                self.prefix = prefix;
                self.prefix_index = self.ids.len();
            }
        }
        self.ids.push(id);
        let text = self.decode(tok, &self.ids)?;
        if text.len() <= self.prefix.len() || text.ends_with('\u{FFFD}') {
            return Ok(None);
        }
        let Some(new_text) = text.strip_prefix(self.prefix.as_str()) else {
            return Err(TextError::tokenizer(
                "decoding a generated token",
                format!(
                    "the text of the window no longer starts with the text already emitted \
                     ({:?} vs {:?}); this decoder cannot stream this tokenizer",
                    text, self.prefix
                ),
            ));
        };
        let new_text = new_text.to_string();
        let new_prefix_index = self.ids.len() - self.prefix_index;
        self.ids.drain(..self.prefix_index);
        self.prefix = self.decode(tok, &self.ids)?;
        self.prefix_index = new_prefix_index;
        Ok(Some(new_text))
    }

    /// Text still held back (an incomplete UTF-8 sequence at the very end, decoded with U+FFFD as
    /// a full decode would), and resets the decoder.
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<Option<String>> {
        let text = self.decode(tok, &self.ids)?;
        let rest = text
            .strip_prefix(self.prefix.as_str())
            .filter(|r| !r.is_empty())
            .map(str::to_string);
        *self = IncrementalDecoder::new(self.skip_special_tokens);
        Ok(rest)
    }
}

/// Where a stop string was found, in bytes of the text searched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopMatch {
    /// Index of the stop string in the list given to [`StopStrings::new`].
    pub stop_index: usize,
    /// Byte offset where the stop string starts: cut the completion text here.
    pub start: usize,
    /// Byte offset just past the stop string (cut here to keep it).
    pub end: usize,
}

/// A set of stop strings. Stateless: search any text.
#[derive(Debug, Clone)]
pub struct StopStrings {
    stops: Vec<String>,
    max_len: usize,
}

impl StopStrings {
    /// A set of stop strings; an empty string is rejected (it would stop at once).
    pub fn new<I, S>(stops: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let stops: Vec<String> = stops.into_iter().map(Into::into).collect();
        if stops.iter().any(String::is_empty) {
            return Err(TextError::InvalidArgument(
                "a stop string is empty; remove it from the stop list".into(),
            ));
        }
        let max_len = stops.iter().map(String::len).max().unwrap_or(0);
        Ok(StopStrings { stops, max_len })
    }

    /// The stop strings.
    pub fn as_slice(&self) -> &[String] {
        &self.stops
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// The earliest occurrence of any stop string in `text` that can involve bytes from
    /// `already_checked` on (text before it was searched by an earlier call). On equal starts the
    /// stop listed first wins.
    pub fn find(&self, text: &str, already_checked: usize) -> Option<StopMatch> {
        if self.stops.is_empty() {
            return None;
        }
        let mut from = already_checked
            .min(text.len())
            .saturating_sub(self.max_len - 1);
        while !text.is_char_boundary(from) {
            from -= 1;
        }
        let region = &text[from..];
        let mut best: Option<StopMatch> = None;
        for (stop_index, stop) in self.stops.iter().enumerate() {
            if let Some(pos) = region.find(stop.as_str()) {
                let start = from + pos;
                if best.is_none_or(|b| start < b.start) {
                    best = Some(StopMatch {
                        stop_index,
                        start,
                        end: start + stop.len(),
                    });
                }
            }
        }
        best
    }

    /// How many bytes at the end of `text` could be the beginning of a stop string that later text
    /// completes: a streaming consumer should hold them back.
    pub fn holdback(&self, text: &str) -> usize {
        let mut best = 0;
        for stop in &self.stops {
            for (i, _) in stop.char_indices().skip(1) {
                let head = &stop[..i];
                if i > best && text.ends_with(head) {
                    best = i;
                }
            }
        }
        best
    }
}

/// Accumulates the generated text of one sequence and reports the first stop string.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: StopStrings,
    text: String,
    hit: Option<StopMatch>,
}

impl StopMatcher {
    /// A matcher with empty text.
    pub fn new(stops: StopStrings) -> Self {
        StopMatcher {
            stops,
            text: String::new(),
            hit: None,
        }
    }

    /// Appends a piece of generated text; returns the stop match when this piece completes the
    /// first one (later pushes keep returning it).
    pub fn push(&mut self, piece: &str) -> Option<StopMatch> {
        if self.hit.is_none() {
            let checked = self.text.len();
            self.text.push_str(piece);
            self.hit = self.stops.find(&self.text, checked);
        }
        self.hit
    }

    /// All text pushed (until the stop was found; nothing is appended after it).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The stop found, if any.
    pub fn stopped(&self) -> Option<StopMatch> {
        self.hit
    }

    /// The text up to the stop string (the completion as TRL/vLLM return it), or all of it.
    pub fn completion(&self) -> &str {
        match self.hit {
            Some(hit) => &self.text[..hit.start],
            None => &self.text,
        }
    }

    /// Clears the text for a new sequence.
    pub fn reset(&mut self) {
        self.text.clear();
        self.hit = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpe::{build_bpe_tokenizer, bytes_to_unicode, BpeSpec};

    fn byte_tokenizer() -> Tokenizer {
        // Byte tokens only (plus <|im_end|>), so multi-byte characters take several ids.
        let mut tokens: Vec<String> = vec!["<|im_end|>".into()];
        tokens.extend(bytes_to_unicode().iter().map(|c| c.to_string()));
        let mut types = vec![3];
        types.resize(tokens.len(), 1);
        build_bpe_tokenizer(&BpeSpec {
            tokens,
            token_types: types,
            pre: Some("gpt2".into()),
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn incremental_decode_never_splits_characters() {
        let tok = byte_tokenizer();
        let text = "a日本🤗 b";
        let ids = tok.encode(text, false).unwrap().get_ids().to_vec();
        assert!(ids.len() > text.chars().count());
        let mut dec = IncrementalDecoder::new(true);
        let mut pieces = Vec::new();
        for &id in &ids {
            if let Some(p) = dec.step(&tok, id).unwrap() {
                pieces.push(p);
            }
        }
        assert_eq!(pieces, ["a", "日", "本", "🤗", " ", "b"]);
        assert_eq!(dec.flush(&tok).unwrap(), None);
        // A trailing incomplete character is held back, then flushed as U+FFFD.
        let cut = &ids[..2];
        let mut dec = IncrementalDecoder::new(true);
        assert_eq!(dec.step(&tok, cut[0]).unwrap().as_deref(), Some("a"));
        assert_eq!(dec.step(&tok, cut[1]).unwrap(), None);
        assert_eq!(dec.flush(&tok).unwrap().as_deref(), Some("\u{FFFD}"));
        // Special tokens are skipped when asked.
        let mut dec = IncrementalDecoder::new(true);
        assert_eq!(dec.step(&tok, 0).unwrap(), None);
        let mut dec = IncrementalDecoder::new(false);
        assert_eq!(dec.step(&tok, 0).unwrap().as_deref(), Some("<|im_end|>"));
    }

    #[test]
    fn stop_strings_across_pieces() {
        let stops = StopStrings::new(["</answer>", "\n\n"]).unwrap();
        let mut m = StopMatcher::new(stops.clone());
        assert_eq!(m.push("The answer: 4</an"), None);
        assert_eq!(stops.holdback(m.text()), 4);
        let hit = m.push("swer> trailing").unwrap();
        assert_eq!(hit.stop_index, 0);
        assert_eq!(m.completion(), "The answer: 4");
        assert_eq!(&m.text()[hit.start..hit.end], "</answer>");
        assert_eq!(m.push("more"), Some(hit));
        assert!(!m.text().ends_with("more"));
    }

    #[test]
    fn earliest_stop_wins_and_unicode_is_safe() {
        let stops = StopStrings::new(["é!", "b"]).unwrap();
        let hit = stops.find("aébé!", 0).unwrap();
        assert_eq!((hit.stop_index, hit.start), (1, 3));
        // `already_checked` inside a multi-byte character is handled.
        assert_eq!(stops.find("日本é!", 7).unwrap().start, 6);
        assert!(StopStrings::new(["ok", ""]).is_err());
        assert_eq!(
            StopStrings::new(Vec::<String>::new()).unwrap().find("x", 0),
            None
        );
    }
}
