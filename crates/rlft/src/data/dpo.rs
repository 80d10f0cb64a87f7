//! Preference rows -> tokenized DPO pairs (`prompt_ids`, `chosen_ids`, `rejected_ids`), as TRL
//! 1.16's `DPOTrainer._prepare_dataset` and `DataCollatorForPreference` make them
//! (`trl/trainer/dpo_trainer.py`, lines 1036-1142 and 146-170):
//!
//! - the row is parsed and rendered as every preference trainer does
//!   ([`super::preferences`]: implicit prompts, EOS on standard rows, chat templates);
//! - `prompt`, `prompt + chosen` and `prompt + rejected` are tokenized; the completions start
//!   where the tokenized prompt and the tokenized sequences first differ (TRL's
//!   `common_prefix_length`), so a token merged across the boundary goes to the completions;
//! - `max_prompt_length` (rlft's, TRL < 1.0's): a longer prompt keeps its last tokens;
//! - `max_length` with [`TruncationMode::KeepStart`] keeps each sequence's first tokens (the
//!   completion loses its end); a prompt that alone fills `max_length` is an error naming the
//!   row (TRL drops such rows silently). With [`TruncationMode::KeepEnd`] each sequence keeps
//!   its last tokens, so the chosen and rejected contexts may lose different prompt tokens.

use rlft_data::Dataset;
use rlft_text::TextBundle;

use super::preferences::{parse_row, render};
use crate::config::dpo::TruncationMode;
use crate::error::{Result, TrainerError};

/// One tokenized preference pair.
#[derive(Debug, Clone, PartialEq)]
pub struct DpoPair {
    /// Index of the row in its dataset.
    pub row_index: usize,
    /// The context of the chosen completion (and of the rejected one unless
    /// `rejected_prompt_ids` is set); never empty.
    pub prompt_ids: Vec<u32>,
    /// The chosen completion's tokens (never empty).
    pub chosen_ids: Vec<u32>,
    /// The rejected completion's tokens (never empty).
    pub rejected_ids: Vec<u32>,
    /// `keep_end` only: the rejected side's context when it kept other prompt tokens than the
    /// chosen side's.
    pub rejected_prompt_ids: Option<Vec<u32>>,
    /// Reference log-probs `(chosen, rejected)`, when precomputed.
    pub ref_logps: Option<(f64, f64)>,
}

impl DpoPair {
    /// The rejected completion's context.
    pub fn rejected_prompt(&self) -> &[u32] {
        self.rejected_prompt_ids
            .as_deref()
            .unwrap_or(&self.prompt_ids)
    }

    /// Tokens of both sequences (prompt counted once when shared).
    pub fn tokens(&self) -> usize {
        let shared = self.rejected_prompt_ids.is_none();
        self.prompt_ids.len()
            + self.chosen_ids.len()
            + self.rejected_ids.len()
            + if shared {
                0
            } else {
                self.rejected_prompt().len()
            }
    }
}

/// The length limits of [`dpo_pairs`] (0 = none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DpoLimits {
    /// Longest prompt + completion.
    pub max_length: usize,
    /// Longest prompt (keeps its last tokens).
    pub max_prompt_length: usize,
    /// Which end `max_length` keeps.
    pub truncation_mode: TruncationMode,
}

/// What the length limits did to a dataset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DpoReport {
    /// Pairs made.
    pub pairs: usize,
    /// Prompts cut to `max_prompt_length`.
    pub prompts_truncated: usize,
    /// Sequences (chosen or rejected) cut to `max_length`.
    pub sequences_truncated: usize,
    /// Longest prompt + completion before the limits.
    pub longest: usize,
}

impl std::fmt::Display for DpoReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} pairs (longest sequence {} tokens; {} prompts cut to max_prompt_length, {} \
             sequences cut to max_length)",
            self.pairs, self.longest, self.prompts_truncated, self.sequences_truncated
        )
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// `prompt + completion` cut to its last `max` tokens, split back into a context (at least
/// one token: the first kept token only conditions, as in TRL's shifted labels) and a
/// completion.
fn keep_end(prompt: &[u32], completion: &[u32], max: usize) -> (Vec<u32>, Vec<u32>) {
    let all = [prompt, completion].concat();
    let kept = &all[all.len().saturating_sub(max)..];
    let p = prompt.len().saturating_sub(all.len() - kept.len()).max(1);
    (kept[..p].to_vec(), kept[p..].to_vec())
}

/// Tokenizes and cuts one rendered pair (module docs).
fn pair(row: usize, ids: [Vec<u32>; 3], lim: &DpoLimits, rep: &mut DpoReport) -> Result<DpoPair> {
    let [prompt, pc, pr] = ids;
    let plen = common_prefix(&prompt, &pc).min(common_prefix(&prompt, &pr));
    let mut prompt = prompt[..plen].to_vec();
    let (mut chosen, mut rejected) = (pc[plen..].to_vec(), pr[plen..].to_vec());
    if chosen.is_empty() || rejected.is_empty() {
        return Err(TrainerError::Data(format!(
            "preference row {row}: the {} completion has no tokens after the prompt; give it \
             some text",
            if chosen.is_empty() {
                "chosen"
            } else {
                "rejected"
            }
        )));
    }
    rep.longest = rep.longest.max(pc.len().max(pr.len()));
    if lim.max_prompt_length > 0 && prompt.len() > lim.max_prompt_length {
        prompt.drain(..prompt.len() - lim.max_prompt_length);
        rep.prompts_truncated += 1;
    }
    if prompt.is_empty() {
        return Err(TrainerError::Data(format!(
            "preference row {row}: the prompt is empty; DPO scores completions after a prompt, \
             give the row a `prompt` (or a shared start of `chosen` and `rejected`)"
        )));
    }
    let m = lim.max_length;
    let mut rejected_prompt = None;
    if m > 0 {
        let over = |c: &[u32]| prompt.len() + c.len() > m;
        rep.sequences_truncated += usize::from(over(&chosen)) + usize::from(over(&rejected));
        match lim.truncation_mode {
            TruncationMode::KeepStart => {
                if prompt.len() >= m {
                    return Err(TrainerError::Data(format!(
                        "preference row {row}: the prompt alone has {} tokens, which fills \
                         max_length = {m} and leaves no completion token; raise max_length, set \
                         max_prompt_length below it (keeps the prompt's end), or drop the row",
                        prompt.len()
                    )));
                }
                chosen.truncate(m - prompt.len());
                rejected.truncate(m - prompt.len());
            }
            TruncationMode::KeepEnd => {
                let (pc, c) = keep_end(&prompt, &chosen, m);
                let (pr, r) = keep_end(&prompt, &rejected, m);
                (chosen, rejected) = (c, r);
                if pr != pc {
                    rejected_prompt = Some(pr);
                }
                prompt = pc;
            }
        }
    }
    Ok(DpoPair {
        row_index: row,
        prompt_ids: prompt,
        chosen_ids: chosen,
        rejected_ids: rejected,
        rejected_prompt_ids: rejected_prompt,
        ref_logps: None,
    })
}

/// Tokenizes every row of `ds` into [`DpoPair`]s (module docs); each bad row is an error that
/// names it and the fix.
pub fn dpo_pairs(
    ds: &Dataset,
    text: &TextBundle,
    system_prompt: Option<&str>,
    lim: &DpoLimits,
) -> Result<(Vec<DpoPair>, DpoReport)> {
    let template = text.compile_chat_template().ok();
    let mut rep = DpoReport::default();
    let mut out = Vec::with_capacity(ds.len());
    for (i, row) in ds.iter().enumerate() {
        let p = parse_row(row, i)?;
        let r = render(&p, text, template.as_ref(), system_prompt)?;
        let enc = |s: &str| text.encode(s, !r.conversational);
        let ids = [
            enc(&r.prompt)?,
            enc(&r.prompt_chosen)?,
            enc(&r.prompt_rejected)?,
        ];
        out.push(pair(i, ids, lim, &mut rep)?);
    }
    rep.pairs = out.len();
    Ok((out, rep))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lim(max_length: usize, max_prompt_length: usize, mode: TruncationMode) -> DpoLimits {
        DpoLimits {
            max_length,
            max_prompt_length,
            truncation_mode: mode,
        }
    }

    fn cut(ids: [Vec<u32>; 3], l: DpoLimits) -> Result<DpoPair> {
        pair(5, ids, &l, &mut DpoReport::default())
    }

    #[test]
    fn completions_start_where_the_tokens_differ() {
        // The prompt's last token merged into the completions' first ones: TRL moves the
        // boundary back to the common prefix.
        let p = cut(
            [vec![1, 2, 3], vec![1, 2, 9, 4], vec![1, 2, 8]],
            lim(0, 0, TruncationMode::KeepStart),
        )
        .unwrap();
        assert_eq!(
            (p.prompt_ids, p.chosen_ids, p.rejected_ids),
            (vec![1, 2], vec![9, 4], vec![8])
        );
    }

    #[test]
    fn keep_start_cuts_completions_and_names_a_full_prompt() {
        let ids = || [vec![1, 2, 3], vec![1, 2, 3, 4, 5, 6], vec![1, 2, 3, 7]];
        let p = cut(ids(), lim(5, 0, TruncationMode::KeepStart)).unwrap();
        assert_eq!((p.chosen_ids, p.rejected_ids), (vec![4, 5], vec![7]));
        let e = cut(ids(), lim(3, 0, TruncationMode::KeepStart))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("row 5") && e.contains("max_prompt_length"),
            "{e}"
        );
        // max_prompt_length keeps the prompt's end.
        let p = cut(ids(), lim(4, 2, TruncationMode::KeepStart)).unwrap();
        assert_eq!((p.prompt_ids, p.chosen_ids), (vec![2, 3], vec![4, 5]));
    }

    #[test]
    fn keep_end_keeps_the_last_tokens_of_each_side() {
        let p = cut(
            [vec![1, 2, 3], vec![1, 2, 3, 4, 5, 6], vec![1, 2, 3, 7]],
            lim(4, 0, TruncationMode::KeepEnd),
        )
        .unwrap();
        assert_eq!(
            (&p.prompt_ids[..], &p.chosen_ids[..]),
            (&[3][..], &[4, 5, 6][..])
        );
        assert_eq!(
            (p.rejected_prompt(), &p.rejected_ids[..]),
            (&[1, 2, 3][..], &[7][..])
        );
    }
}
