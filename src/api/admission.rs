//! Who gets one of the API's connections when they run short, so that no client without the token can
//! lock out one that has it:
//! - a new connection that finds every slot taken closes the connection that has waited longest for a
//!   request (none in flight, no answer being sent) and takes its place: sockets that send nothing, or
//!   keep-alive connections left idle, cannot hold the API;
//! - requests of unprivileged clients in flight (their handlers running, their answers being sent)
//!   may take at most [`UNPRIVILEGED_SHARE`] of the slots; the next is answered 503 at once and its
//!   connection closed. Privileged are requests that carry the API token and, on a node listening
//!   beyond loopback, requests from this machine: they may use every slot.
//!
//! A node listening on loopback without a token cannot tell its user's requests from another local
//! process's: there the share only turns a lock-out into quick 503 answers.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::sync::Notify;
use tokio::time::Instant;

/// How many of the slots unprivileged requests in flight may hold (the rest are kept for the token).
pub const UNPRIVILEGED_SHARE: usize = super::server::MAX_CONNECTIONS * 7 / 8;

/// The open connections and the requests in flight on them.
#[derive(Default)]
pub struct Admission {
    connections: Mutex<HashMap<u64, Arc<Connection>>>,
    next_id: AtomicUsize,
    unprivileged: AtomicUsize,
}

/// One open connection, as [`Admission`] sees it.
pub struct Connection {
    id: u64,
    /// Requests whose handler runs or whose answer is still being sent.
    active: AtomicUsize,
    /// Since when it has had nothing in flight.
    idle_since: Mutex<Instant>,
    /// Woken to close the connection in favour of a newer one.
    evicted: Notify,
}

impl Connection {
    /// Resolves when the connection is to be closed for a newer one.
    pub async fn evicted(&self) {
        self.evicted.notified().await
    }
}

/// A request in flight: counted until dropped (with the answer's body, see [`Guarded`]).
pub struct InFlight {
    connection: Arc<Connection>,
    unprivileged: Option<Arc<Admission>>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(admission) = &self.unprivileged {
            admission.unprivileged.fetch_sub(1, Ordering::AcqRel);
        }
        if self.connection.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            *self.connection.idle_since.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        }
    }
}

impl Admission {
    /// Admits a new connection when fewer than `limit` are open, or in place of the one idle longest;
    /// `None` when every open connection has a request in flight.
    pub fn admit(self: &Arc<Self>, limit: usize) -> Option<Arc<Connection>> {
        let mut connections = self.connections.lock().unwrap_or_else(|e| e.into_inner());
        if connections.len() >= limit {
            let idlest = connections
                .values()
                .filter(|c| c.active.load(Ordering::Acquire) == 0)
                .min_by_key(|c| *c.idle_since.lock().unwrap_or_else(|e| e.into_inner()))?
                .id;
            if let Some(evicted) = connections.remove(&idlest) {
                // notify_one keeps the wake-up for a task not yet waiting.
                evicted.evicted.notify_one();
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) as u64;
        let connection = Arc::new(Connection {
            id,
            active: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            evicted: Notify::new(),
        });
        connections.insert(id, connection.clone());
        Some(connection)
    }

    /// The connection is closed: its slot is free.
    pub fn close(&self, connection: &Connection) {
        self.connections.lock().unwrap_or_else(|e| e.into_inner()).remove(&connection.id);
    }

    /// Starts a request on `connection`; `None` (refuse it) when it is unprivileged and unprivileged
    /// requests already hold their share.
    pub fn start(self: &Arc<Self>, connection: &Arc<Connection>, privileged: bool) -> Option<InFlight> {
        let unprivileged = if privileged {
            None
        } else {
            let taken = self.unprivileged.fetch_add(1, Ordering::AcqRel);
            if taken >= UNPRIVILEGED_SHARE {
                self.unprivileged.fetch_sub(1, Ordering::AcqRel);
                return None;
            }
            Some(self.clone())
        };
        connection.active.fetch_add(1, Ordering::AcqRel);
        Some(InFlight { connection: connection.clone(), unprivileged })
    }
}

/// An answer's body that keeps its request counted in flight until it is sent or dropped.
pub struct Guarded<B> {
    inner: B,
    _in_flight: InFlight,
}

impl<B> Guarded<B> {
    pub fn new(inner: B, in_flight: InFlight) -> Guarded<B> {
        Guarded { inner, _in_flight: in_flight }
    }
}

impl<B: hyper::body::Body + Unpin> hyper::body::Body for Guarded<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_connection_replaces_the_one_idle_longest_but_never_one_with_a_request_in_flight() {
        let admission = Arc::new(Admission::default());
        let first = admission.admit(2).unwrap();
        let second = admission.admit(2).unwrap();
        let busy = admission.start(&first, true).unwrap();
        // The second is idle: the third takes its place.
        let third = admission.admit(2).unwrap();
        assert!(!admission.connections.lock().unwrap().contains_key(&second.id));
        let _also_busy = admission.start(&third, true).unwrap();
        assert!(admission.admit(2).is_none(), "every connection has a request in flight");
        drop(busy);
        assert!(admission.admit(2).is_some(), "the first is idle again");
    }

    #[test]
    fn unprivileged_requests_hold_at_most_their_share() {
        let admission = Arc::new(Admission::default());
        let connection = admission.admit(super::super::server::MAX_CONNECTIONS).unwrap();
        let held: Vec<InFlight> =
            (0..UNPRIVILEGED_SHARE).map(|_| admission.start(&connection, false).unwrap()).collect();
        assert!(admission.start(&connection, false).is_none());
        let privileged = admission.start(&connection, true);
        assert!(privileged.is_some(), "the token's share is kept");
        drop(held);
        assert_eq!(admission.unprivileged.load(Ordering::Acquire), 0);
        assert!(admission.start(&connection, false).is_some());
    }
}
