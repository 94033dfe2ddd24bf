//! Workers: one `shoal worker` process per stage of a model instance on a node, spawned and supervised
//! by the node agent. The process side is in [`process`] and [`compute`]; what a worker and its agent
//! say to each other is in [`protocol`]; the agent side is in [`supervisor`].

pub mod args;
pub mod compute;
pub mod executable;
pub mod process;
pub mod protocol;
pub mod supervisor;

pub use process::StageDevice;
pub use protocol::{
    FrontEvent, FrontRequest, GenerationReport, PromptInput, StageStats, WorkerCommand, WorkerEvent, WorkerState,
};
