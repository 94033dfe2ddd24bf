//! Cluster endpoints: `GET /api/cluster`, `GET /api/events`, `POST /api/cluster/{code,join,leave}`,
//! `POST /api/links/measure`.

use super::{ApiError, ApiState};
use crate::cluster::{ClusterSnapshot, JoinTarget};
use axum::extract::rejection::JsonRejection;
use axum::extract::{ConnectInfo, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::Json;
use futures_util::stream::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use std::convert::Infallible;
use std::net::SocketAddr;
use tokio_stream::wrappers::BroadcastStream;

pub async fn health(State(state): State<ApiState>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "ok": true,
        "node_id": state.agent.id(),
        "version": env!("CARGO_PKG_VERSION"),
        "mdns": state.agent.config.mdns,
        // Whether clients must send the API token (the dashboard's Connect view says so).
        "token_required": state.token.is_some(),
    }))
}

pub async fn snapshot(State(state): State<ApiState>) -> Json<ClusterSnapshot> {
    Json(state.agent.snapshot())
}

/// Every change as a server-sent event named by its type; the data is the event as JSON. A client that
/// falls behind gets a `lagged` event and should fetch `/api/cluster` again.
/// A stream without the API token takes a place in the budget of such streams (see
/// [`super::streams`]) for as long as it is open; 429 when there is none.
pub async fn events(
    State(state): State<ApiState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let permit = match state.carries_token(&headers) {
        true => None,
        false => Some(state.streams.admit(peer.ip()).map_err(ApiError::too_many)?),
    };
    let stream = BroadcastStream::new(state.agent.subscribe()).map(move |item| {
        let _held_while_the_stream_lives = &permit;
        Ok(match item {
            Ok(event) => Event::default().event(event.name()).json_data(&event).unwrap_or_default(),
            Err(_) => Event::default().event("lagged").data("{}"),
        })
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

#[derive(Serialize, ts_rs::TS)]
#[ts(rename = "JoinCode")]
pub struct CodeResponse {
    pub code: String,
    pub expires_at_ms: u64,
    pub expires_in_seconds: u64,
    /// Whether this node advertises itself with mDNS (a new machine nearby then finds it by the code
    /// alone; otherwise it needs `CODE@HOST:PORT`).
    pub mdns: bool,
    /// This node's control addresses, for `--join CODE@HOST:PORT` where multicast does not reach.
    pub join_addresses: Vec<std::net::SocketAddr>,
}

pub async fn create_code(State(state): State<ApiState>) -> Json<CodeResponse> {
    let code = state.agent.create_code();
    let snapshot = state.agent.snapshot();
    let join_addresses = snapshot.nodes.iter().find(|n| n.is_self).map(|n| n.control.clone()).unwrap_or_default();
    Json(CodeResponse {
        code: code.display(),
        expires_at_ms: code.expires_at_ms,
        expires_in_seconds: crate::cluster::pairing::CODE_LIFETIME.as_secs(),
        mdns: state.agent.config.mdns,
        join_addresses,
    })
}

#[derive(Deserialize, ts_rs::TS)]
pub struct JoinRequest {
    /// `ABCD-EFGH`, or `ABCD-EFGH@HOST:PORT` to join through a given member.
    pub code: String,
}

/// A join body as `join` checks it: where to join and with which code.
pub(super) fn check_join(body: Result<Json<JoinRequest>, JsonRejection>) -> Result<JoinTarget, ApiError> {
    let Json(body) = body.map_err(|e| ApiError::bad_request(format!("expected {{\"code\": \"ABCD-EFGH\"}}: {e}")))?;
    body.code.parse().map_err(ApiError::bad_request)
}

pub async fn join(
    State(state): State<ApiState>,
    body: Result<Json<JoinRequest>, JsonRejection>,
) -> Result<Json<ClusterSnapshot>, ApiError> {
    let target = check_join(body)?;
    state.agent.join(target).await.map_err(|e| ApiError::failed(crate::errors::chain(&e)))?;
    Ok(Json(state.agent.snapshot()))
}

pub async fn leave(State(state): State<ApiState>) -> Json<ClusterSnapshot> {
    state.agent.leave().await;
    Json(state.agent.snapshot())
}

pub async fn measure_links(State(state): State<ApiState>) -> Json<serde_json::Value> {
    state.agent.measure_links();
    Json(serde_json::json!({ "started_at_ms": crate::util::now_ms() }))
}
