//! `shoal worker`: one stage of a model instance. Started by the node agent, not by people; the
//! cluster secret and the front token arrive in its environment.

pub use shoal::worker::args::{run, WorkerArgs};
