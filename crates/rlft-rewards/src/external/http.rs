//! `type = "http"`: POST `{"samples": [...]}` to an endpoint, read `{"scores": [...]}`.
//!
//! The transport is [`crate::http_client`]: one connection per batch, one deadline
//! (`timeout_s`) covering name resolution, connecting, sending and reading; plain `http://`
//! only (put a local plain-HTTP proxy in front of a remote HTTPS endpoint, or use a `command`
//! reward).

use std::time::Duration;

use super::{parse_scores_body, samples_body};
use crate::http_client::{parse_url, HttpError, Url};
use crate::spec::{timeout, HttpSpec};
use crate::{Reward, RewardError, RewardOutput, Sample};

/// The `http` reward.
pub struct HttpReward {
    name: String,
    url: String,
    endpoint: Url,
    timeout: Duration,
    timeout_s: f64,
}

impl HttpReward {
    /// Validates the URL and timeout; nothing is contacted until the first batch.
    pub fn new(name: String, spec: &HttpSpec) -> Result<Self, RewardError> {
        let endpoint = parse_url(spec.url.trim()).map_err(|m| RewardError::config(&name, m))?;
        Ok(HttpReward {
            timeout: timeout(&name, spec.timeout_s)?,
            timeout_s: spec.timeout_s,
            name,
            url: spec.url.trim().to_string(),
            endpoint,
        })
    }

    fn error(&self, message: String) -> RewardError {
        RewardError::Http {
            reward: self.name.clone(),
            message: format!("POST {}: {message}", self.url),
        }
    }

    /// Sends `body`, returns the response body of a 2xx answer.
    fn post(&self, body: &[u8]) -> Result<Vec<u8>, RewardError> {
        let response = self
            .endpoint
            .request("POST", Some(body), self.timeout)
            .map_err(|e| match e {
                HttpError::Timeout { stage } => RewardError::Timeout {
                    reward: self.name.clone(),
                    seconds: self.timeout_s,
                    detail: format!("POST {} while {stage}", self.url),
                },
                HttpError::Failed(m) => {
                    self.error(m.replace("is the server running?", "is the reward server running?"))
                }
            })?;
        response.ok().map_err(|m| self.error(m))
    }
}

impl Reward for HttpReward {
    fn name(&self) -> &str {
        &self.name
    }

    fn score(&mut self, batch: &[Sample<'_>]) -> Result<RewardOutput, RewardError> {
        if batch.is_empty() {
            return Ok(RewardOutput::default());
        }
        let body = self.post(&samples_body(batch))?;
        let text = String::from_utf8_lossy(&body);
        parse_scores_body(&text, batch.len()).map_err(|m| RewardError::Protocol {
            reward: self.name.clone(),
            message: format!("POST {}: {m}", self.url),
        })
    }
}
