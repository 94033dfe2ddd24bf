//! API errors in OpenAI's shape: `{"error": {"message", "type", "code"}}` with a fitting HTTP status.

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
        (self.status, Json(self.body())).into_response()
    }
}
