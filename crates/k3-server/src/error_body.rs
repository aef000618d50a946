//! Error responses in OpenAI's shape (`{"error": {...}}`), the shape of every route except
//! Anthropic's `/v1/messages` (`http_anthropic.rs` has its own).

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use k3_api::ApiError;

/// An [`ApiError`] answered in OpenAI's shape; a full queue adds `Retry-After: 1`.
pub struct OpenAiError(pub ApiError);

impl From<ApiError> for OpenAiError {
    fn from(e: ApiError) -> Self {
        OpenAiError(e)
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        let e = self.0;
        let mut resp = (
            e.status,
            [(header::CONTENT_TYPE, "application/json")],
            e.body().to_string(),
        )
            .into_response();
        if e.retry_after() {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp
    }
}
