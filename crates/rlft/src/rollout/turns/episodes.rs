//! The start of an environment's episodes: one `reset` per completion (every completion of a
//! group is its own episode, with its own state), whose first observation becomes a user
//! message after the row's prompt. Group statistics stay per episode: the G episodes of a
//! prompt are one group, whatever their observations.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use rlft_text::{Message, TextBundle};

use super::Turns;
use crate::data::prompts::PromptItem;
use crate::error::Result;
use crate::run::optim::mix;

/// One episode of a rollout.
pub struct Episode {
    /// Its id in the environment's requests (unique within the run).
    pub id: String,
    /// Its first prompt, where the first observation extended the row's prompt.
    pub prompt: Option<Arc<PromptItem>>,
}

/// The first turn's request: each context, and completions per context.
pub struct FirstTurn {
    /// Prompt ids, one per distinct context.
    pub contexts: Vec<Vec<u32>>,
    /// Completions sampled per context.
    pub n: usize,
}

impl Turns {
    /// Resets one episode per completion of `prompts` (indices into `items`; `n` completions
    /// each, in order): episode `e` is completion `e % n` of prompt `prompts[e / n]`, seeded
    /// `mix(seed, e)`. Empty without an environment.
    pub fn start_episodes(
        &self,
        text: &TextBundle,
        items: &[PromptItem],
        prompts: &[usize],
        n: usize,
        seed: u64,
    ) -> Result<Vec<Episode>> {
        let Some(env) = &self.environment else {
            return Ok(Vec::new());
        };
        let first = self
            .started
            .fetch_add((prompts.len() * n) as u64, Ordering::Relaxed);
        let mut out: Vec<Episode> = Vec::with_capacity(prompts.len() * n);
        for e in 0..prompts.len() * n {
            let item = &items[prompts[e / n]];
            let id = format!("e{}", first + e as u64);
            let observation = env.reset(&id, mix(seed, e as u64), &item.row)?;
            let prompt = match observation {
                None => None,
                // Episodes of one row that start alike share their prompt.
                Some(o) => match out.last().filter(|_| e % n > 0) {
                    Some(prev) if prev.observation() == Some(o.as_str()) => prev.prompt.clone(),
                    _ => Some(Arc::new(self.first_prompt(item, o, text)?)),
                },
            };
            out.push(Episode { id, prompt });
        }
        Ok(out)
    }

    /// `item`'s conversation with the first observation `o` as a user message after it.
    fn first_prompt(&self, item: &PromptItem, o: String, text: &TextBundle) -> Result<PromptItem> {
        let mut messages = item.messages.clone();
        messages.push(Message::user(o));
        let rendered = self.template.render(&messages, &self.render)?;
        Ok(PromptItem {
            row_index: item.row_index,
            ids: text.encode(&rendered, false)?,
            text: rendered,
            messages,
            row: item.row.clone(),
        })
    }

    /// Tells the environment that `episodes` are over.
    pub fn close(&self, episodes: &[Episode]) -> Result<()> {
        if let Some(env) = &self.environment {
            let ids: Vec<String> = episodes.iter().map(|e| e.id.clone()).collect();
            env.close(&ids)?;
        }
        Ok(())
    }
}

impl Episode {
    /// The first observation, read back from the prompt's last message.
    fn observation(&self) -> Option<&str> {
        let m = self.prompt.as_ref()?.messages.last()?;
        m.content.as_ref()?.as_text()
    }
}

/// The first turn of `prompts` (`n` completions each) for `episodes` (empty: no environment):
/// one context per prompt with `n` completions when every group's episodes start alike (so
/// the prompt is prefilled once per group), else one context per episode.
pub fn first_turn(
    items: &[PromptItem],
    prompts: &[usize],
    n: usize,
    episodes: &[Episode],
) -> FirstTurn {
    let ids = |e: usize| match episodes.get(e).and_then(|x| x.prompt.as_deref()) {
        Some(p) => p.ids.clone(),
        None => items[prompts[e / n]].ids.clone(),
    };
    let alike = episodes.chunks(n.max(1)).all(|g| {
        g.iter().all(|e| match (&e.prompt, &g[0].prompt) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        })
    });
    if alike {
        FirstTurn {
            contexts: (0..prompts.len()).map(|p| ids(p * n)).collect(),
            n,
        }
    } else {
        FirstTurn {
            contexts: (0..prompts.len() * n).map(ids).collect(),
            n: 1,
        }
    }
}
