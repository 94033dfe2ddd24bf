//! The node's HTTP API: the cluster view, a server-sent-event stream of every change, the actions
//! (join code, join, leave, link measurement), the model library with its fit check, downloads and copies
//! between nodes, model instances, the OpenAI-compatible endpoints (chat, completions, Responses),
//! Anthropic's Messages API, Ollama's API
//! and the dashboard at `/`. It listens on 127.0.0.1 unless
//! told otherwise; on any other address it requires a token for every action (reads stay open for the
//! dashboard). Before any of that, [`guard`] refuses requests a web page could forge (DNS rebinding,
//! cross-site posts), and [`server`] bounds connections and how long they may sit idle.

mod admission;
mod anthropic;
#[cfg(test)]
mod bindings;
pub mod body;
mod cluster;
mod copy;
mod error;
mod fit;
mod generation;
pub mod guard;
mod instances;
mod models;
mod ollama;
mod openai;
mod quit;
mod rdma;
mod reply;
mod responses;
pub mod server;
mod streams;
mod tools;
pub mod ui;

pub use error::{ApiError, Dialect};

use crate::cluster::Agent;
use crate::instances::Instances;
use axum::extract::{Request, State};
use axum::http::{header, Method};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use std::net::SocketAddr;
use std::sync::Arc;

#[derive(Clone, Debug)]
pub struct ApiConfig {
    pub listen: SocketAddr,
    pub token: Option<String>,
    /// Where to serve Ollama's API alone as well (`--ollama-port`).
    pub ollama_listen: Option<SocketAddr>,
    /// How `POST /api/quit` asks the process hosting the node to quit (the app sets it).
    pub quit: crate::desktop::quit::QuitSwitch,
}

#[derive(Clone)]
pub struct ApiState {
    pub agent: Agent,
    pub instances: Arc<Instances>,
    pub token: Option<Arc<str>>,
    /// The address the API listens on (a `Host` naming it is this node).
    pub listen: SocketAddr,
    pub quit: crate::desktop::quit::QuitSwitch,
    /// Event streams open without the token (see [`streams`]).
    pub streams: Arc<streams::StreamBudget>,
    /// The Responses API's remembered responses (see [`responses::log`]).
    pub responses: Arc<responses::log::ResponseLog>,
}

impl ApiState {
    /// Whether `headers` carry this node's API token (as `Authorization: Bearer` or `x-api-key`).
    pub fn carries_token(&self, headers: &axum::http::HeaderMap) -> bool {
        let Some(token) = &self.token else { return false };
        let bearer =
            headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        let api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
        [bearer, api_key].into_iter().flatten().any(|g| constant_time_eq(g.as_bytes(), token.as_bytes()))
    }
}

pub fn router(state: ApiState) -> Router {
    let router = Router::new()
        .route("/api/health", get(cluster::health))
        .route("/api/cluster", get(cluster::snapshot))
        .route("/api/events", get(cluster::events))
        .route("/api/cluster/code", post(cluster::create_code))
        .route("/api/cluster/join", post(cluster::join))
        .route("/api/cluster/leave", post(cluster::leave))
        .route("/api/links/measure", post(cluster::measure_links))
        .route("/api/rdma", get(rdma::rdma))
        .route("/api/rdma/wizard", get(rdma::wizard).post(rdma::wizard_action))
        .route("/api/placements/preview", post(instances::preview))
        .route("/api/instances", post(instances::launch).get(instances::list))
        .route("/api/instances/{id}", get(instances::get).delete(instances::stop))
        .route("/api/instances/{id}/relaunch", post(instances::relaunch))
        .route("/api/quit", get(quit::what_it_stops).post(quit::quit))
        .route("/api/models", get(models::list))
        .route("/api/models/fit", get(fit::list))
        .route("/api/models/pull", post(models::pull))
        .route("/api/models/cluster", get(copy::cluster_files))
        .route("/api/models/copy", post(copy::copy))
        .route("/v1/models", get(openai::models))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{id}", get(responses::retrieve).delete(responses::delete))
        .route("/v1/responses/{id}/input_items", get(responses::input_items));
    guarded(ollama::routes(router).fallback(get(ui::serve)), state)
}

/// `router` behind the token and the guard (see [`guard`]).
fn guarded(router: Router<ApiState>, state: ApiState) -> Router {
    // The last layer is the outermost: framing is refused on every answer, refusals included, and a
    // body is read only for a request that passed the guard and the token.
    router
        .layer(middleware::from_fn(body::read_in_time))
        .layer(body::extractor_limit())
        .layer(middleware::from_fn_with_state(state.clone(), require_token))
        .layer(middleware::from_fn_with_state(state.clone(), refuse_forged))
        .layer(middleware::from_fn(body::refuse_framing))
        .with_state(state)
}

/// Binds the API and serves it in the background. Refuses to expose it beyond this machine without a
/// token.
pub async fn serve(instances: Arc<Instances>, config: ApiConfig) -> anyhow::Result<SocketAddr> {
    if !config.listen.ip().is_loopback() && config.token.is_none() {
        anyhow::bail!(
            "--listen {} would let anyone on the network control this node; pass --api-token TOKEN as well",
            config.listen.ip()
        );
    }
    let bind = |addr: SocketAddr, flag: &'static str| async move {
        tokio::net::TcpListener::bind(addr).await.map_err(|e| {
            anyhow::anyhow!("cannot listen on {addr} for the API: {e} (is another node running? pick another {flag})")
        })
    };
    let listener = bind(config.listen, "--port").await?;
    let ollama = match config.ollama_listen {
        Some(at) => Some(bind(at, "--ollama-port").await?),
        None => None,
    };
    let addr = listener.local_addr()?;
    let token: Option<Arc<str>> = config.token.map(Into::into);
    let agent = instances.agent.clone();
    let streams = Arc::default();
    let responses = Arc::default();
    let state = ApiState { agent, instances, token, listen: addr, quit: config.quit, streams, responses };
    let privileged: server::Privileged = {
        let (state, beyond_loopback) = (state.clone(), !addr.ip().is_loopback());
        Arc::new(move |headers, from| state.carries_token(headers) || (beyond_loopback && from.ip().is_loopback()))
    };
    tokio::spawn(server::run(listener, router(state.clone()), privileged.clone()));
    if let Some(listener) = ollama {
        let state = ApiState { listen: listener.local_addr()?, ..state };
        tokio::spawn(server::run(
            listener,
            guarded(ollama::routes(Router::new()).route("/", get(ollama::running)), state),
            privileged,
        ));
    }
    Ok(addr)
}

/// Refuses requests another web site could have made the browser send (see [`guard`]).
async fn refuse_forged(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    match guard::check(request.method(), request.headers(), state.listen) {
        Ok(()) => next.run(request).await,
        Err(refusal) => {
            let path = request.uri().path();
            tracing::warn!("refused {} {path}: {refusal}", request.method());
            ApiError::forbidden(refusal.to_string()).into_response_as(Dialect::of_path(path))
        }
    }
}

/// With a token configured, every request that changes something must carry it: as
/// `Authorization: Bearer TOKEN` (OpenAI's and Ollama's clients), or as `x-api-key: TOKEN` (Anthropic's).
async fn require_token(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    if state.token.is_none() || request.method() == Method::GET || request.method() == Method::HEAD {
        return next.run(request).await;
    }
    if state.carries_token(request.headers()) {
        next.run(request).await
    } else {
        ApiError::unauthorized().into_response_as(Dialect::of_path(request.uri().path()))
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The endpoints whose JSON bodies [`check_body`] knows, by the name it takes.
#[doc(hidden)]
pub const CHECKED_BODIES: [&str; 10] = [
    "chat_completions",
    "completions",
    "messages",
    "ollama_chat",
    "ollama_generate",
    "ollama_show",
    "launch",
    "copy",
    "pull",
    "join",
];

/// Runs the checks an endpoint makes of its JSON body before it touches the node, on raw bytes (the
/// fuzz targets and their corpus test use it): `Ok` when the body would be acted on.
#[doc(hidden)]
pub fn check_body(endpoint: &str, body: &[u8]) -> Result<(), ApiError> {
    let json = || axum::Json::<serde_json::Value>::from_bytes(body);
    match endpoint {
        "chat_completions" => openai::check_chat(json()).map(drop),
        "completions" => openai::check_completion(json()).map(drop),
        "messages" => anthropic::check(json()).map(drop),
        "ollama_chat" => ollama::check_chat(json()).map(drop),
        "ollama_generate" => ollama::check_generate(json()).map(drop),
        "ollama_show" => ollama::check_show(json()).map(drop),
        "launch" => instances::launch_request(json()).map(drop),
        "copy" => copy::check_copy(axum::Json::from_bytes(body)).map(drop),
        "pull" => models::check_pull(axum::Json::from_bytes(body)).map(drop),
        "join" => cluster::check_join(axum::Json::from_bytes(body)).map(drop),
        _ => Err(ApiError::bad_request(format!("no endpoint {endpoint}"))),
    }
}
