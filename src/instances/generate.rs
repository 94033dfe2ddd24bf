//! Routing a generation request to the instance's stage 0, from any node: locally through the
//! worker's front port, or through the control connection to the node that hosts stage 0, which
//! streams the events back. Dropping the receiver cancels the request.

use super::service::Instances;
use super::InstanceState;
use crate::cluster::messages::ControlMessage;
use crate::node::NodeId;
use crate::worker::{FrontEvent, FrontRequest};
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum GenerateError {
    #[error("the model `{0}` does not exist on this cluster; GET /v1/models lists the running ones")]
    UnknownModel(String),
    #[error("the model `{0}` is not ready ({1})")]
    NotReady(String, String),
    #[error("{0}")]
    Failed(String),
}

/// Starts `request` on the instance called `model` (its name or id); events arrive on the receiver.
pub fn generate(
    instances: &Arc<Instances>,
    model: &str,
    mut request: FrontRequest,
) -> Result<UnboundedReceiver<FrontEvent>, GenerateError> {
    let (instance, head) = {
        let registry = instances.registry();
        let mut matching: Vec<_> = registry.instances.values().filter(|i| i.model == model || i.id == model).collect();
        matching.sort_by_key(|i| (i.state != InstanceState::Ready, std::cmp::Reverse(i.created_at_ms)));
        let Some(info) = matching.first() else { return Err(GenerateError::UnknownModel(model.to_string())) };
        if info.state != InstanceState::Ready {
            let why = info.error.clone().unwrap_or_else(|| format!("{:?}", info.state).to_lowercase());
            return Err(GenerateError::NotReady(model.to_string(), why));
        }
        let Some(head) = info.head() else {
            return Err(GenerateError::NotReady(model.to_string(), "it has no stages".into()));
        };
        if let Some(cap) = info.request.as_ref().and_then(|r| r.max_reply_tokens) {
            request.max_tokens = request.max_tokens.min(cap);
        }
        (info.id.clone(), head)
    };
    let (tx, rx) = mpsc::unbounded_channel();
    if head == instances.agent.id() {
        call_local(instances, &instance, request, tx)?;
    } else {
        let call = rand::random::<u64>();
        instances.registry().calls.insert(call, (head, tx));
        if !instances.agent.send_to(head, ControlMessage::Generate { call, instance, request }) {
            instances.registry().calls.remove(&call);
            return Err(GenerateError::Failed("the node running the model's first stage is unreachable".into()));
        }
    }
    Ok(rx)
}

/// [`generate`], waiting up to `wait` while the model's instance is launching or recovering (placed
/// again after it lost a node) rather than refusing the request.
pub async fn generate_when_ready(
    instances: &Arc<Instances>,
    model: &str,
    request: FrontRequest,
    wait: std::time::Duration,
) -> Result<UnboundedReceiver<FrontEvent>, GenerateError> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match generate(instances, model, request.clone()) {
            Err(GenerateError::NotReady(..))
                if tokio::time::Instant::now() < deadline && starting(instances, model) =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            other => return other,
        }
    }
}

/// After a request for `model` failed before its first token: whether that was because its instance
/// was lost and is being placed again (no instance of it is ready, and one is recovering or
/// launching). Its owner may learn of the loss a moment after the request failed, so this watches for
/// up to `within`.
pub async fn lost_and_recovering(instances: &Arc<Instances>, model: &str, within: std::time::Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let ready = instances
            .registry()
            .instances
            .values()
            .any(|i| (i.model == model || i.id == model) && i.state == InstanceState::Ready);
        if !ready && starting(instances, model) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Whether an instance called `model` is launching or recovering: it will be ready, or fail, soon.
fn starting(instances: &Arc<Instances>, model: &str) -> bool {
    instances.registry().instances.values().any(|i| {
        (i.model == model || i.id == model) && matches!(i.state, InstanceState::Launching | InstanceState::Recovering)
    })
}

/// Sends `request` to this node's stage-0 worker of `instance`; its events go to `events`.
fn call_local(
    instances: &Arc<Instances>,
    instance: &str,
    request: FrontRequest,
    events: UnboundedSender<FrontEvent>,
) -> Result<tokio::task::AbortHandle, GenerateError> {
    let (port, token) = {
        let registry = instances.registry();
        let local = registry.local.get(&(instance.to_string(), 0));
        match local.and_then(|l| l.front_port.map(|p| (p, l.handle.front_token.clone()))) {
            Some(found) => found,
            None => return Err(GenerateError::Failed("this node does not run the instance's first stage".into())),
        }
    };
    let task = tokio::spawn(async move {
        let fail = |events: &UnboundedSender<FrontEvent>, message: String| {
            let _ = events.send(FrontEvent::Error { message, client_error: false });
        };
        let Ok(stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
            return fail(&events, "the model's first stage does not answer".into());
        };
        let _ = stream.set_nodelay(true);
        let (read, mut write) = stream.into_split();
        let mut opening = format!("{token}\n").into_bytes();
        if let Err(e) = serde_json::to_writer(&mut opening, &request) {
            return fail(&events, format!("cannot encode the request: {e}"));
        }
        opening.push(b'\n');
        if write.write_all(&opening).await.is_err() {
            return fail(&events, "the model's first stage closed the connection".into());
        }
        let mut lines = BufReader::new(read).lines();
        loop {
            tokio::select! {
                line = lines.next_line() => {
                    let event = match line {
                        Ok(Some(line)) => match serde_json::from_str::<FrontEvent>(&line) {
                            Ok(e) => e,
                            Err(e) => return fail(&events, format!("malformed answer from the first stage: {e}")),
                        },
                        _ => return fail(&events, "the model's first stage stopped in the middle of the request".into()),
                    };
                    let end = event.is_final();
                    if events.send(event).is_err() || end {
                        return;
                    }
                }
                // The client went away: dropping the connection cancels the request in the worker.
                _ = events.closed() => return,
            }
        }
    });
    Ok(task.abort_handle())
}

/// Generation messages on the control connections.
pub fn on_message(instances: &Arc<Instances>, from: NodeId, message: ControlMessage) {
    match message {
        ControlMessage::Generate { call, instance, request } => {
            let (tx, mut rx) = mpsc::unbounded_channel();
            match call_local(instances, &instance, request, tx) {
                Ok(abort) => {
                    instances.registry().serving.insert((from, call), abort);
                    let instances = instances.clone();
                    tokio::spawn(async move {
                        while let Some(event) = rx.recv().await {
                            let end = event.is_final();
                            if !instances.agent.send_to(from, ControlMessage::GenerateEvent { call, event }) || end {
                                break;
                            }
                        }
                        instances.registry().serving.remove(&(from, call));
                    });
                }
                Err(e) => {
                    let event = FrontEvent::Error { message: e.to_string(), client_error: false };
                    instances.agent.send_to(from, ControlMessage::GenerateEvent { call, event });
                }
            }
        }
        ControlMessage::GenerateEvent { call, event } => {
            let end = event.is_final();
            // Only the node serving a call sends its events.
            let sender =
                instances.registry().calls.get(&call).filter(|(node, _)| *node == from).map(|(_, tx)| tx.clone());
            let delivered = sender.is_some_and(|tx| tx.send(event).is_ok());
            if end || !delivered {
                let mut registry = instances.registry();
                if registry.calls.get(&call).is_some_and(|(node, _)| *node == from) {
                    registry.calls.remove(&call);
                }
            }
            if !delivered && !end {
                instances.agent.send_to(from, ControlMessage::CancelGenerate { call });
            }
        }
        ControlMessage::CancelGenerate { call } => {
            if let Some(abort) = instances.registry().serving.remove(&(from, call)) {
                abort.abort();
            }
        }
        other => tracing::debug!("ignoring {other:?} from {}", from.short()),
    }
}

/// Calls routed through `peer` end with an error; calls served for it are dropped.
pub fn fail_calls_through(instances: &Arc<Instances>, peer: NodeId) {
    let mut registry = instances.registry();
    let lost: Vec<u64> = registry.calls.iter().filter(|(_, (p, _))| *p == peer).map(|(c, _)| *c).collect();
    for call in lost {
        if let Some((_, tx)) = registry.calls.remove(&call) {
            let _ = tx.send(FrontEvent::Error {
                message: "the node running the model's first stage is gone".into(),
                client_error: false,
            });
        }
    }
    registry.serving.retain(|(p, _), abort| {
        if *p == peer {
            abort.abort();
        }
        *p != peer
    });
}
