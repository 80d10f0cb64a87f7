//! What to change when a run does not fit: each lever tried on its own, from the least to the
//! most intrusive, then in pairs, each with its predicted total. The trainer names its levers
//! (its config keys); the search plans each candidate through a callback.

use serde::Serialize;

/// One setting of a lever: the change in words and as `--set key=value` overrides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    /// In words, e.g. "per_device_train_batch_size 8 -> 4 with gradient_accumulation_steps
    /// 2 -> 4 (same batch of 16)".
    pub change: String,
    /// The overrides.
    pub sets: Vec<String>,
    /// Whether it alters what is trained (method, objective, lengths), not only how.
    pub changes_training: bool,
}

/// A change and what it predicts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Suggestion {
    /// In words.
    pub change: String,
    /// The overrides.
    pub sets: Vec<String>,
    /// Predicted peak with the change.
    pub total_bytes: u64,
    /// Whether it alters what is trained.
    pub changes_training: bool,
}

/// Changes that bring a run's predicted peak (`current`) to at most `budget_bytes`.
///
/// `levers(sets)` lists the levers of the run with the overrides `sets` applied, each as its
/// settings from the mildest to the strongest; `total(sets)` predicts the peak with them. The
/// result: the mildest setting of each lever that fits on its own and lowers the peak; when
/// none does, pairs (the strongest setting of one lever, then the mildest of a later one that
/// fits), at most four, those that keep the training first. Empty when nothing tried fits.
pub fn suggest<E>(
    current: u64,
    budget_bytes: u64,
    levers: impl Fn(&[String]) -> Vec<Vec<Change>>,
    total: impl Fn(&[String]) -> Result<u64, E>,
) -> Result<Vec<Suggestion>, E> {
    let fit = |c: &Change, t: u64| Suggestion {
        change: c.change.clone(),
        sets: c.sets.clone(),
        total_bytes: t,
        changes_training: c.changes_training,
    };
    let mut out = Vec::new();
    let all = levers(&[]);
    for lever in &all {
        for c in lever {
            let t = total(&c.sets)?;
            if t <= budget_bytes && t < current {
                out.push(fit(c, t));
                break;
            }
        }
    }
    if !out.is_empty() {
        return Ok(out);
    }
    for (a, lever) in all.iter().enumerate() {
        let Some(first) = lever.last() else {
            continue;
        };
        // The levers of the changed run, after this one (a change can add or remove levers).
        for later in levers(&first.sets).iter().skip(a + 1) {
            for c in later {
                let sets: Vec<String> = first.sets.iter().chain(&c.sets).cloned().collect();
                let t = total(&sets)?;
                if t <= budget_bytes {
                    out.push(Suggestion {
                        change: format!("{}, and {}", first.change, c.change),
                        sets,
                        total_bytes: t,
                        changes_training: first.changes_training || c.changes_training,
                    });
                    break;
                }
            }
        }
    }
    out.sort_by_key(|s| (s.changes_training, s.total_bytes));
    out.truncate(4);
    Ok(out)
}
