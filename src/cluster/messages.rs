//! What members say to each other on their control connections, and how it is framed: a version byte,
//! then JSON. Anything that does not parse is an error that closes the connection.

use super::membership::{ClusterSecret, MemberRecord};
use crate::links::LinkReport;
use crate::node::{NodeId, NodeTelemetry};
use crate::records::{InstanceInfo, StageReport};
use crate::worker::supervisor::StageSpec;
use crate::worker::{FrontEvent, FrontRequest};
use serde::{Deserialize, Serialize};

/// Version of the message vocabulary inside frames.
pub const MESSAGE_VERSION: u8 = 1;
/// Largest control frame accepted.
pub const MAX_CONTROL_FRAME: usize = 1 << 20;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ControlMessage {
    /// The first message in each direction: who the sender is.
    Hello {
        node: MemberRecord,
    },
    /// Heartbeat and round-trip probe; answered with `Pong`.
    Ping {
        seq: u64,
    },
    /// `busy`: the sender is in a bulk transfer, so this round trip says little about the link.
    Pong {
        seq: u64,
        #[serde(default)]
        busy: bool,
    },
    Telemetry {
        telemetry: NodeTelemetry,
    },
    /// The sender's measurements of its own links.
    Links {
        links: Vec<LinkReport>,
    },
    /// The members the sender knows, so every member learns every other.
    Members {
        members: Vec<MemberRecord>,
    },
    /// Asks the receiver to measure its outgoing throughput to `peer` now and answer `LinkMeasured`.
    MeasureLink {
        peer: NodeId,
        request: u64,
    },
    LinkMeasured {
        request: u64,
        bps: Option<u64>,
    },
    /// The sender is leaving the cluster for good.
    Leaving,
    /// Owner → node: start a worker for one stage of an instance.
    StartStage {
        spec: StageSpec,
    },
    /// Node → owner: a stage's state changed.
    StageUpdate {
        instance: String,
        stage: usize,
        report: StageReport,
    },
    /// Owner → node: tell the stage where the next stage listens.
    ConnectStage {
        instance: String,
        stage: usize,
        next_node: NodeId,
        next_port: u16,
    },
    /// Owner → node: tell a rank of a tensor-parallel group where every rank listens (rank order).
    ConnectGroup {
        instance: String,
        stage: usize,
        peers: Vec<(NodeId, u16)>,
    },
    /// Stop every worker of an instance (to the owner: stop the instance).
    StopInstance {
        instance: String,
    },
    /// Owner → all: the instance as it stands.
    Instance {
        info: Box<InstanceInfo>,
    },
    /// Run a request on the instance's stage 0, which this node hosts; answer with `GenerateEvent`s.
    Generate {
        call: u64,
        instance: String,
        request: FrontRequest,
    },
    GenerateEvent {
        call: u64,
        event: FrontEvent,
    },
    CancelGenerate {
        call: u64,
    },
}

/// Messages on a join connection, after the code's key exchange.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum JoinMessage {
    Request { node: MemberRecord },
    Accepted { secret: ClusterSecret, members: Vec<MemberRecord> },
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MessageError {
    #[error("empty message")]
    Empty,
    #[error("message version {0}; this node speaks version {MESSAGE_VERSION} (run the same shoal version everywhere)")]
    Version(u8),
    #[error("malformed message: {0}")]
    Malformed(String),
}

pub fn encode<T: Serialize>(message: &T) -> Vec<u8> {
    let mut out = vec![MESSAGE_VERSION];
    serde_json::to_writer(&mut out, message).expect("messages serialise");
    out
}

pub fn decode<T: for<'de> Deserialize<'de>>(frame: &[u8]) -> Result<T, MessageError> {
    let (&version, body) = frame.split_first().ok_or(MessageError::Empty)?;
    if version != MESSAGE_VERSION {
        return Err(MessageError::Version(version));
    }
    serde_json::from_slice(body).map_err(|e| MessageError::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn messages_round_trip() {
        let m = ControlMessage::Ping { seq: 42 };
        assert_eq!(decode::<ControlMessage>(&encode(&m)).unwrap(), m);
        assert_eq!(decode::<ControlMessage>(&[]), Err(MessageError::Empty));
        assert_eq!(decode::<ControlMessage>(&[2, b'{', b'}']), Err(MessageError::Version(2)));
        assert!(matches!(decode::<ControlMessage>(b"\x01{\"type\":\"nope\"}"), Err(MessageError::Malformed(_))));
    }

    proptest! {
        #[test]
        fn arbitrary_frames_never_panic(frame in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode::<ControlMessage>(&frame);
            let _ = decode::<JoinMessage>(&frame);
        }

        #[test]
        fn json_shaped_garbage_never_panics(body in "\\{\"type\":\"(ping|pong|hello|members|links)\"(,\"[a-z]{1,6}\":[0-9a-z\\[\\]{}\",]{0,40})?\\}") {
            let mut frame = vec![MESSAGE_VERSION];
            frame.extend_from_slice(body.as_bytes());
            let _ = decode::<ControlMessage>(&frame);
        }
    }
}
