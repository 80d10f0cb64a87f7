//! The one error type of this crate. Every variant that belongs to a reward function carries its
//! name, so a message read in a training log says which function failed and why.

/// What went wrong while building or running reward functions.
#[derive(Debug, thiserror::Error)]
pub enum RewardError {
    /// A reward spec is invalid (bad regex, impossible lengths, unknown `type`, ...).
    #[error("reward `{reward}`: {message}")]
    Config {
        /// The reward's name (its `name`, or its `type` when unnamed).
        reward: String,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// The list of reward specs is invalid as a whole (duplicate names, wrong number of weights).
    #[error("{0}")]
    Set(String),
    /// A dataset row lacks a field the reward needs, or holds it with an unusable type.
    #[error("reward `{reward}`: sample {sample}: {message}")]
    Row {
        /// The reward's name.
        reward: String,
        /// Index of the sample in the batch.
        sample: usize,
        /// What is missing, what the row has, and how to fix it.
        message: String,
    },
    /// An external reward did not answer within its `timeout_s`.
    #[error(
        "reward `{reward}`: no answer within {seconds} s ({detail}); raise `timeout_s` if the \
         reward is just slow"
    )]
    Timeout {
        /// The reward's name.
        reward: String,
        /// The configured timeout.
        seconds: f64,
        /// What was pending (which sample, which process or URL).
        detail: String,
    },
    /// The external reward process could not start, or exited or crashed while scoring.
    #[error("reward `{reward}`: {message}")]
    Process {
        /// The reward's name.
        reward: String,
        /// The command, its exit status and the last lines of its stderr.
        message: String,
    },
    /// An external reward answered something that is not the protocol (a garbage line, a wrong
    /// number of scores).
    #[error("reward `{reward}`: {message}")]
    Protocol {
        /// The reward's name.
        reward: String,
        /// The offending text (truncated) and what was expected.
        message: String,
    },
    /// The HTTP endpoint could not be reached or answered with an error status.
    #[error("reward `{reward}`: {message}")]
    Http {
        /// The reward's name.
        reward: String,
        /// The URL and what failed.
        message: String,
    },
    /// A Python reward function (`type = "python"`) raised an exception, or importing its file
    /// did; the message holds the traceback and which batch was being scored.
    #[error("reward `{reward}`: {message}")]
    Python {
        /// The reward's name.
        reward: String,
        /// The function, the file, the batch and the traceback.
        message: String,
    },
    /// A reward function returned an unusable result (wrong length, NaN or infinite scores).
    #[error("reward `{reward}`: {message}")]
    Output {
        /// The reward's name.
        reward: String,
        /// What was wrong with the result.
        message: String,
    },
}

impl RewardError {
    /// The message without the reward's name, for a process that serves something else (a
    /// tool, an environment), whose caller names it.
    pub fn detail(&self) -> String {
        match self {
            RewardError::Timeout {
                seconds, detail, ..
            } => format!(
                "no answer within {seconds} s ({detail}); raise `timeout_s` if it is just slow"
            ),
            RewardError::Row {
                sample, message, ..
            } => format!("sample {sample}: {message}"),
            RewardError::Set(message)
            | RewardError::Config { message, .. }
            | RewardError::Process { message, .. }
            | RewardError::Protocol { message, .. }
            | RewardError::Http { message, .. }
            | RewardError::Python { message, .. }
            | RewardError::Output { message, .. } => message.clone(),
        }
    }

    /// The name of the reward function the error belongs to, if it belongs to one.
    pub fn reward(&self) -> Option<&str> {
        match self {
            RewardError::Set(_) => None,
            RewardError::Config { reward, .. }
            | RewardError::Row { reward, .. }
            | RewardError::Timeout { reward, .. }
            | RewardError::Process { reward, .. }
            | RewardError::Protocol { reward, .. }
            | RewardError::Http { reward, .. }
            | RewardError::Python { reward, .. }
            | RewardError::Output { reward, .. } => Some(reward),
        }
    }

    pub(crate) fn config(reward: &str, message: impl Into<String>) -> Self {
        RewardError::Config {
            reward: reward.to_string(),
            message: message.into(),
        }
    }
}

/// Shortens `text` to at most `max` characters for an error message, marking the cut.
pub(crate) fn excerpt(text: &str, max: usize) -> String {
    let mut chars = text.chars();
    let head: String = chars.by_ref().take(max).collect();
    if chars.next().is_some() {
        format!("{head}... ({} characters in all)", text.chars().count())
    } else {
        head
    }
}
