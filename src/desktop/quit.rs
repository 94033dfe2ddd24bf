//! Quitting the app ends this node, and with it every model instance this node runs a stage of or
//! manages (owns): their requests fail until another node places them again, if the nodes that remain
//! can hold them. So Quit first says what it would stop ([`quitting_stops`], [`warning`]) and lets the
//! person cancel; the dashboard shows that question and answers it through the API, which asks the
//! process hosting the node to quit through a [`QuitSwitch`] (the app sets it; a headless node has
//! none).

use crate::instances::InstanceInfo;
use crate::node::NodeId;
use crate::util::LockExt;
use serde::Serialize;
use std::sync::{Arc, Mutex};

/// An instance that quitting this node would stop.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, ts_rs::TS)]
pub struct Stopped {
    pub id: String,
    pub model: String,
    /// The nodes that run its stages, by name, in ring order, each once; this node as "this node".
    pub nodes: Vec<String>,
    /// This node runs none of its stages, only manages it.
    pub only_owned: bool,
}

/// What quitting this node (`me`) would stop: the instances that are launching, serving or being placed
/// again, and that run a stage here or are owned here.
pub fn quitting_stops(me: NodeId, instances: &[InstanceInfo]) -> Vec<Stopped> {
    let mut stopped: Vec<Stopped> = instances
        .iter()
        .filter(|i| i.state.is_active() && i.uses(me))
        .map(|i| {
            let mut nodes: Vec<String> = Vec::new();
            for stage in &i.stages {
                let name = if stage.node == me { "this node".to_string() } else { stage.node_name.clone() };
                if !nodes.contains(&name) {
                    nodes.push(name);
                }
            }
            let only_owned = i.stages.iter().all(|s| s.node != me);
            Stopped { id: i.id.clone(), model: i.model.clone(), nodes, only_owned }
        })
        .collect();
    stopped.sort_by(|a, b| (&a.model, &a.id).cmp(&(&b.model, &b.id)));
    stopped
}

/// The question Quit asks before it stops `stopped`, e.g. "Quitting stops SmolLM2 on this node and
/// beta." (None: nothing would stop, Quit just quits.)
pub fn warning(stopped: &[Stopped]) -> Option<String> {
    if stopped.is_empty() {
        return None;
    }
    let each: Vec<String> = stopped
        .iter()
        .map(|s| match s.only_owned {
            false => format!("{} on {}", s.model, and_list(&s.nodes)),
            true => format!("{} (it runs on {}; this node manages it)", s.model, and_list(&s.nodes)),
        })
        .collect();
    Some(format!("Quitting stops {}.", and_list(&each)))
}

/// "a", "a and b", "a, b and c".
fn and_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

type QuitHandler = Box<dyn Fn() + Send + Sync>;

/// How the dashboard asks the process that hosts this node to quit: the app sets a handler that ends
/// it; without one (a headless `shoal node`) nothing can be asked.
#[derive(Clone, Default)]
pub struct QuitSwitch(Arc<Mutex<Option<QuitHandler>>>);

impl std::fmt::Debug for QuitSwitch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("QuitSwitch").field(&if self.is_set() { "set" } else { "unset" }).finish()
    }
}

impl QuitSwitch {
    /// Makes `quit` what a request to quit does.
    pub fn set(&self, quit: impl Fn() + Send + Sync + 'static) {
        *self.0.locked() = Some(Box::new(quit));
    }

    /// Whether a handler is set (the node runs inside the app).
    pub fn is_set(&self) -> bool {
        self.0.locked().is_some()
    }

    /// Asks the host to quit; false when nothing can be asked.
    pub fn request(&self) -> bool {
        let handler = self.0.locked();
        match handler.as_ref() {
            Some(quit) => {
                quit();
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
#[path = "quit/tests.rs"]
mod tests;
