//! Errors as OpenAI returns them: an HTTP status and
//! `{"error": {"message", "type", "param", "code"}}`.

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::engine::SubmitError;

/// An error answer.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What is wrong and how to fix it.
    pub message: String,
    /// OpenAI's error `type`.
    pub kind: &'static str,
    /// The request field at fault.
    pub param: Option<&'static str>,
    /// OpenAI's error `code`.
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400: the request is wrong (`invalid_request_error`).
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// 400 naming the field at fault.
    pub fn bad_param(param: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param),
            ..Self::bad_request(message)
        }
    }

    /// 403: the server's configuration does not allow this (`code` says which rule).
    pub fn forbidden(
        param: Option<&'static str>,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            status: StatusCode::FORBIDDEN,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code: Some(code),
        }
    }

    /// 404 for a model name the server does not serve (OpenAI's `model_not_found`).
    pub fn unknown_model(name: &str, served: &[String]) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "The model `{name}` does not exist. This server serves: {} (GET /v1/models \
                 lists them; POST /v1/load_lora_adapter adds an adapter)",
                served.join(", ")
            ),
            kind: "invalid_request_error",
            param: Some("model"),
            code: Some("model_not_found"),
        }
    }

    /// 404 for a route or an adapter that does not exist.
    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// 413: the body is over the server's limit.
    pub fn too_large(limit: usize) -> Self {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!(
                "the request body is larger than this server's limit of {limit} bytes \
                 (--max-body-mb); send a shorter prompt"
            ),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_too_large"),
        }
    }

    /// 500: something failed inside the server.
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// The `{"error": ...}` body.
    pub fn body(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        let message = e.to_string();
        match e {
            SubmitError::QueueFull(_) => ApiError {
                status: StatusCode::TOO_MANY_REQUESTS,
                message,
                kind: "server_overloaded",
                param: None,
                code: Some("queue_full"),
            },
            SubmitError::Draining => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message,
                kind: "server_unavailable",
                param: None,
                code: Some("draining"),
            },
            SubmitError::TooManyRows { .. } => ApiError::bad_param("n", message),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = json_response(self.status, &self.body());
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        r
    }
}

/// A JSON response.
pub fn json_response(status: StatusCode, v: &Value) -> Response {
    let mut r = Response::new(Body::from(v.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}
