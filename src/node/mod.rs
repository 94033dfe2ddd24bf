//! The node itself: its persistent identity and data directory (locked while a node uses it), and the
//! telemetry it reports.

pub mod identity;
mod launch_at_start;
mod lock;
mod options;
mod platform;
pub mod telemetry;

pub use identity::{DataDir, NodeId, NodeIdentity};
pub use lock::DataDirLock;
pub use options::{NodeOptions, StartedNode};
pub use telemetry::{measure_memory_bandwidth, NodeTelemetry, TelemetrySampler};
