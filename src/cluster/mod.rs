//! The cluster: membership kept on disk, joining with a code (SPAKE2), a full mesh of authenticated
//! control connections, failure detection without a leader, and the shared view of members, telemetry
//! and links. [`agent::start`] runs it all.

pub mod agent;
mod connection;
pub mod health;
pub mod join;
pub mod links;
pub mod membership;
pub mod messages;
pub mod pairing;
pub mod service;
pub mod state;

pub use agent::{Agent, AgentConfig, JoinTarget, DEFAULT_API_PORT};
pub use health::{NodeStatus, PeerStatus};
pub use membership::{ClusterSecret, MemberRecord, Membership};
pub use service::ClusterService;
pub use state::{ClusterEvent, ClusterSnapshot, LinkView, NodeView, PoolView};
