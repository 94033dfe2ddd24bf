//! API errors with a fitting HTTP status, in the shape of the API the route belongs to: OpenAI's
//! `{"error": {"message", "type", "param", "code"}}` (shoal's own routes too), Anthropic's
//! `{"type": "error", "error": {"type", "message"}}` on `/v1/messages`, Ollama's `{"error": "..."}` on
//! Ollama's routes.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    pub code: Option<&'static str>,
    pub param: Option<&'static str>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message: message.into(),
            code: None,
            param: None,
        }
    }

    pub fn unauthorized() -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            kind: "authentication_error",
            message: "this node requires its API token: send Authorization: Bearer TOKEN".into(),
            code: None,
            param: None,
        }
    }

    /// A request this node does not take from where it came (another web site, another host name).
    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::FORBIDDEN,
            kind: "permission_error",
            message: message.into(),
            code: Some("forbidden"),
            param: None,
        }
    }

    pub fn failed(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_GATEWAY,
            kind: "cluster_error",
            message: message.into(),
            code: None,
            param: None,
        }
    }

    /// A bad value of request parameter `param`.
    pub fn bad_param(param: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { param: Some(param), ..ApiError::bad_request(message) }
    }

    pub fn not_found(message: impl Into<String>, code: &'static str) -> ApiError {
        ApiError { status: StatusCode::NOT_FOUND, code: Some(code), ..ApiError::bad_request(message) }
    }

    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::SERVICE_UNAVAILABLE, kind: "server_error", ..ApiError::bad_request(message) }
    }

    /// Every slot of the model is taken and its queue is full: try again shortly (429, with
    /// `Retry-After`).
    pub fn busy(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            kind: "rate_limit_error",
            code: Some("model_busy"),
            ..ApiError::bad_request(message)
        }
    }

    /// A client holds more of something than its budget allows (event streams): 429.
    pub fn too_many(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            kind: "rate_limit_error",
            code: Some("too_many_streams"),
            ..ApiError::bad_request(message)
        }
    }

    /// A prompt longer than the instance's context, in the words agents look for: OpenAI's code
    /// `context_length_exceeded` (Codex ends the turn saying it ran out of room) and Anthropic's
    /// "prompt is too long" (Claude Code compacts the conversation on it).
    pub fn context_exceeded(prompt_tokens: usize, context: usize) -> ApiError {
        ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::bad_request(format!(
                "prompt is too long: {prompt_tokens} tokens > {} maximum (this instance's context holds \
                 {context} tokens, one of them for the reply); shorten the conversation, or launch the model \
                 with a longer --context",
                context - 1
            ))
        }
    }

    pub fn unprocessable(message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::UNPROCESSABLE_ENTITY, ..ApiError::bad_request(message) }
    }

    /// The JSON body of this error (also sent inside event streams).
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({ "error": { "message": self.message, "type": self.kind, "param": self.param, "code": self.code } })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.body();
        self.respond(body)
    }
}

/// The API a route belongs to, which decides the shape of its errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    OpenAi,
    Anthropic,
    Ollama,
}

impl Dialect {
    /// The dialect of the route at `path` (errors raised before the handler, such as the guard's).
    pub fn of_path(path: &str) -> Dialect {
        if path == "/v1/messages" || path.starts_with("/v1/messages/") {
            Dialect::Anthropic
        } else if path.starts_with("/ollama/") || super::ollama::PATHS.contains(&path) {
            Dialect::Ollama
        } else {
            Dialect::OpenAi
        }
    }
}

impl ApiError {
    /// Anthropic's name for this kind of error (by its status, as Anthropic's API assigns them).
    fn anthropic_kind(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            s if s >= 500 => "api_error",
            _ => "invalid_request_error",
        }
    }

    /// This error as a response of the API `dialect`.
    pub fn into_response_as(self, dialect: Dialect) -> Response {
        let body = match dialect {
            Dialect::OpenAi => return self.into_response(),
            Dialect::Anthropic => self.anthropic_body(),
            Dialect::Ollama => serde_json::json!({ "error": self.message }),
        };
        self.respond(body)
    }

    fn respond(self, body: serde_json::Value) -> Response {
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            // A busy model frees a slot as soon as any request ends.
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
        }
        response
    }

    /// The body of this error in Anthropic's shape (also sent as an `error` event in streams).
    pub fn anthropic_body(&self) -> serde_json::Value {
        serde_json::json!({ "type": "error", "error": { "type": self.anthropic_kind(), "message": self.message } })
    }
}
