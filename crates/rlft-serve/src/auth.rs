//! The API key: with one set (`rlft serve --api-key KEY` or `RLFT_API_KEY`), every endpoint but
//! `/health` answers 401 unless the request carries `Authorization: Bearer KEY`, as vLLM's
//! `--api-key` and OpenAI's API do (OpenAI's error body: `invalid_request_error`,
//! `invalid_api_key`). The key is kept as its SHA-256 digest and a given key is compared by
//! digest in constant time, so neither the comparison's time nor a memory dump shows it.

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use crate::error::ApiError;

/// Paths open without a key (load balancers and the trainer's liveness probes).
const OPEN_PATHS: &[&str] = &["/health"];

/// Why a key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ApiKeyError {
    /// Empty.
    #[error("the API key is empty; give a non-empty key (e.g. `openssl rand -hex 32`)")]
    Empty,
    /// A character an HTTP header cannot carry as is.
    #[error(
        "the API key has a character other than printable ASCII (spaces and line breaks \
         included), which an `Authorization` header cannot carry; use e.g. `openssl rand -hex 32`"
    )]
    NotPrintable,
}

/// A server's API key (only its digest is kept).
#[derive(Clone)]
pub struct ApiKey {
    digest: [u8; 32],
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(***)")
    }
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

impl ApiKey {
    /// A key: non-empty printable ASCII without spaces.
    pub fn new(key: &str) -> Result<ApiKey, ApiKeyError> {
        check_key(key)?;
        Ok(ApiKey {
            digest: sha256(key.as_bytes()),
        })
    }

    /// Whether `given` is the key, in time independent of where they differ (both sides are
    /// digests of the same length).
    pub fn matches(&self, given: &str) -> bool {
        let d = sha256(given.as_bytes());
        let diff = d
            .iter()
            .zip(&self.digest)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        std::hint::black_box(diff) == 0
    }

    /// Whether the `Authorization` header value is `Bearer <this key>` (the scheme in any case).
    pub fn authorizes(&self, header: Option<&HeaderValue>) -> bool {
        let Some(v) = header.and_then(|h| h.to_str().ok()) else {
            return false;
        };
        match v.trim().split_once(' ') {
            Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => {
                self.matches(token.trim())
            }
            _ => false,
        }
    }
}

/// The checks of [`ApiKey::new`], for a client's key too.
pub fn check_key(key: &str) -> Result<(), ApiKeyError> {
    if key.is_empty() {
        return Err(ApiKeyError::Empty);
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiKeyError::NotPrintable);
    }
    Ok(())
}

/// 401 in OpenAI's shape, with `WWW-Authenticate: Bearer`.
pub fn unauthorized(with_header: bool) -> Response {
    let message = if with_header {
        "Incorrect API key provided. Send the key this server was started with (rlft serve \
         --api-key or RLFT_API_KEY) as `Authorization: Bearer KEY`."
    } else {
        "You didn't provide an API key. This server needs one: send `Authorization: Bearer KEY` \
         with the key it was started with (rlft serve --api-key or RLFT_API_KEY)."
    };
    let e = ApiError {
        status: StatusCode::UNAUTHORIZED,
        message: message.into(),
        kind: "invalid_request_error",
        param: None,
        code: Some("invalid_api_key"),
    };
    let mut r = e.into_response();
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

/// The middleware: passes requests to open paths and requests with the key; answers 401 to the
/// rest. With no key every request passes.
pub async fn require_key(State(key): State<Option<ApiKey>>, req: Request, next: Next) -> Response {
    let Some(key) = key else {
        return next.run(req).await;
    };
    if OPEN_PATHS.contains(&req.uri().path()) {
        return next.run(req).await;
    }
    let given = req.headers().get(header::AUTHORIZATION);
    if key.authorizes(given) {
        return next.run(req).await;
    }
    unauthorized(given.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_only_themselves_and_need_the_bearer_scheme() {
        let k = ApiKey::new("s3cret-key").unwrap();
        assert!(k.matches("s3cret-key"));
        for wrong in ["", "s3cret-ke", "s3cret-key ", "S3CRET-KEY", "s3cret-keyx"] {
            assert!(!k.matches(wrong), "{wrong:?}");
        }
        let h = |s: &'static str| HeaderValue::from_static(s);
        assert!(k.authorizes(Some(&h("Bearer s3cret-key"))));
        assert!(k.authorizes(Some(&h("bearer  s3cret-key"))));
        assert!(!k.authorizes(Some(&h("Basic s3cret-key"))));
        assert!(!k.authorizes(Some(&h("s3cret-key"))));
        assert!(!k.authorizes(Some(&h("Bearer other"))));
        assert!(!k.authorizes(None));
        assert_eq!(format!("{k:?}"), "ApiKey(***)");
    }

    #[test]
    fn keys_must_be_printable_ascii() {
        assert!(matches!(ApiKey::new(""), Err(ApiKeyError::Empty)));
        for bad in ["has space", "line\nbreak", "caf\u{e9}"] {
            assert!(
                matches!(ApiKey::new(bad), Err(ApiKeyError::NotPrintable)),
                "{bad:?}"
            );
        }
    }
}
