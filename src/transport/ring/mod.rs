//! One link of a model instance's ring, from a stage to the next: always an authenticated TCP
//! connection, and over it — when the node agent chose RDMA for the link — a queue pair that carries the
//! frames while TCP carries only acknowledgements.
//!
//! The connecting stage opens with a hello ([`Hello`]): "TCP only", or an RDMA offer with its queue
//! pair's endpoint and the device the next stage should open. The next stage answers ([`Answer`]) with
//! its own endpoint, or with the reason it cannot; a refusal means TCP. Over RDMA every frame has a
//! number; the receiver acknowledges each over TCP, and the sender keeps a copy of each frame until its
//! acknowledgement arrives. When RDMA fails at either end — an error, a damaged or lost slot, a missing
//! acknowledgement — the sender switches the link to TCP and sends again every frame not acknowledged;
//! the receiver drops the ones it already had. No frame is lost and the instance keeps running; the
//! fallback is reported with its reason. The link stays on TCP until the instance is launched again.

mod receiver;
mod sender;
#[doc(hidden)]
pub mod wire;

pub use receiver::FailoverSource;
pub use sender::FailoverSink;

use super::rdma::open::{PendingLink, RdmaOpener};
use super::rdma::{Endpoint, RdmaError, FRAME_BYTES, MAX_SLOTS};
use super::{FrameSink, FrameSource, TcpSink, TcpSource, MAX_RING_FRAME};
use crate::net::NetError;
use crate::rdma::parse::MacOsVersion;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// How long a link waits before it judges RDMA broken and falls back to TCP. Workers use the default;
/// tests set their own, so that a busy machine cannot pass for a broken link nor a test wait seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingTimeouts {
    /// Longest wait for an RDMA completion (a credit to send, the rest of a message).
    pub completion: Duration,
    /// Longest a frame sent over RDMA may go unacknowledged.
    pub ack: Duration,
}

impl Default for RingTimeouts {
    fn default() -> RingTimeouts {
        RingTimeouts { completion: Duration::from_secs(2), ack: Duration::from_secs(2) }
    }
}

/// The RDMA devices the agent chose for a link: this end's, the next stage's, and the slot size both
/// use (4 KiB frames on macOS 26.2; multi-frame slots need 26.3 at both ends).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaRoute {
    pub device: String,
    pub peer_device: String,
    pub slot_bytes: u32,
}

impl RdmaRoute {
    /// The slot size for two nodes' macOS versions: 64 KiB when both run 26.3 or later, else one frame.
    pub fn slot_bytes_for(versions: [Option<&MacOsVersion>; 2]) -> u32 {
        if versions.iter().all(|v| v.is_some_and(|v| v.numbers() >= (26, 3, 0))) {
            super::rdma::MAX_SLOT_BYTES
        } else {
            FRAME_BYTES as u32
        }
    }
}

/// What a link's sending end reports about the transport it uses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum RingTransport {
    Rdma {
        device: String,
    },
    /// TCP, and why (only when RDMA was asked for).
    Tcp {
        reason: String,
    },
}

/// Called with each change of a link's transport.
pub type TransportReport = Arc<dyn Fn(RingTransport) + Send + Sync>;

/// The connecting stage's first frame.
#[derive(Debug, Serialize, Deserialize)]
struct Hello {
    rdma: Option<Offer>,
}

/// An RDMA offer: the offering end's queue pair, and the device the other end should open (a ring
/// link's next stage, or a group's higher rank).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Offer {
    pub endpoint: Endpoint,
    pub device: String,
}

/// The answer to an offer: the other end's queue pair (its receives posted), or why it cannot.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Answer {
    pub endpoint: Option<Endpoint>,
    pub refused: Option<String>,
}

fn send_json(sink: &mut TcpSink, value: &impl Serialize) -> Result<(), NetError> {
    sink.send(&serde_json::to_vec(value).expect("plain data serializes"))
}

fn recv_json<T: for<'de> Deserialize<'de>>(source: &mut TcpSource, what: &str) -> Result<T, NetError> {
    let mut bytes = Vec::new();
    source.recv_into(&mut bytes)?;
    serde_json::from_slice(&bytes).map_err(|e| NetError::BadPreamble(format!("a malformed ring {what}: {e}")))
}

/// Decodes `bytes` as the link's opening messages, the previous stage's hello and the next stage's
/// answer, as `open_inbound` and `open_outbound` do (for the fuzz targets).
#[doc(hidden)]
pub fn decode_opening(bytes: &[u8]) -> (bool, bool) {
    let hello = serde_json::from_slice::<Hello>(bytes).is_ok();
    let answer = serde_json::from_slice::<Answer>(bytes).is_ok();
    (hello, answer)
}

/// Opens the link to the next stage over its TCP connection (`tcp`), with RDMA on `route` if given.
/// Blocking. Errors only when TCP fails; an RDMA problem means TCP, reported through `report`.
pub fn open_outbound(
    tcp: (TcpSource, TcpSink),
    route: Option<&RdmaRoute>,
    opener: &dyn RdmaOpener,
    report: TransportReport,
    timeouts: RingTimeouts,
) -> Result<Box<dyn FrameSink>, NetError> {
    let (mut source, mut sink) = tcp;
    let Some(route) = route else {
        send_json(&mut sink, &Hello { rdma: None })?;
        recv_json::<Answer>(&mut source, "answer")?;
        return Ok(Box::new(sink));
    };
    let opened = opener.open(&route.device, MAX_SLOTS, route.slot_bytes).and_then(|link| Ok((link.endpoint()?, link)));
    let (endpoint, pending) = match opened {
        Ok(opened) => opened,
        Err(e) => {
            send_json(&mut sink, &Hello { rdma: None })?;
            recv_json::<Answer>(&mut source, "answer")?;
            report(RingTransport::Tcp { reason: format!("RDMA could not start here: {e}") });
            return Ok(Box::new(sink));
        }
    };
    send_json(&mut sink, &Hello { rdma: Some(Offer { endpoint, device: route.peer_device.clone() }) })?;
    let answer: Answer = recv_json(&mut source, "answer")?;
    let connected = match (answer.endpoint, answer.refused) {
        (Some(remote), _) => pending.connect(&remote, MAX_RING_FRAME, timeouts.completion),
        (None, refused) => Err(RdmaError::Connect(format!(
            "the next stage could not start RDMA: {}",
            refused.unwrap_or_else(|| "no reason given".into())
        ))),
    };
    match connected {
        Ok(rdma) => {
            report(RingTransport::Rdma { device: route.device.clone() });
            Ok(Box::new(FailoverSink::start(rdma, source, sink, report, timeouts.ack)))
        }
        Err(e) => {
            // The next stage reads TCP after a refusal, and waits for frames on both otherwise: tell it.
            let mut sink = FailoverSink::tcp_only(sink);
            sink.switch_now()?;
            report(RingTransport::Tcp { reason: e.to_string() });
            Ok(Box::new(sink))
        }
    }
}

/// Opens the link from the previous stage over its TCP connection, with RDMA if the previous stage
/// offers it and this node can. Blocking.
pub fn open_inbound(
    tcp: (TcpSource, TcpSink),
    opener: &dyn RdmaOpener,
    timeouts: RingTimeouts,
) -> Result<Box<dyn FrameSource>, NetError> {
    let (mut source, mut sink) = tcp;
    let hello: Hello = recv_json(&mut source, "hello")?;
    let Some(offer) = hello.rdma else {
        send_json(&mut sink, &Answer { endpoint: None, refused: None })?;
        return Ok(Box::new(source));
    };
    let accepted = offer
        .endpoint
        .check_slots()
        .and_then(|()| opener.open(&offer.device, offer.endpoint.slots, offer.endpoint.slot_bytes))
        .and_then(|link: Box<dyn PendingLink>| {
            let endpoint = link.endpoint()?;
            Ok((endpoint, link.connect(&offer.endpoint, MAX_RING_FRAME, timeouts.completion)?))
        });
    match accepted {
        Ok((endpoint, rdma)) => {
            send_json(&mut sink, &Answer { endpoint: Some(endpoint), refused: None })?;
            Ok(Box::new(FailoverSource::start(Some(rdma), source, sink)))
        }
        Err(e) => {
            send_json(&mut sink, &Answer { endpoint: None, refused: Some(e.to_string()) })?;
            Ok(Box::new(FailoverSource::start(None, source, sink)))
        }
    }
}

#[cfg(test)]
mod tests;
