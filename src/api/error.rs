//! API errors in OpenAI's shape: `{"error": {"message", "type", "code"}}` with a fitting HTTP status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::BAD_REQUEST, kind: "invalid_request_error", message: message.into() }
    }

    pub fn unauthorized() -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            kind: "authentication_error",
            message: "this node requires its API token: send Authorization: Bearer TOKEN".into(),
        }
    }

    pub fn failed(message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::BAD_GATEWAY, kind: "cluster_error", message: message.into() }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": { "message": self.message, "type": self.kind, "code": null } });
        (self.status, Json(body)).into_response()
    }
}
