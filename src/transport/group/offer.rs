//! Starting RDMA between the ranks of a group, once their TCP links are up. For each pair the lower rank
//! speaks first: a hello with an offer (its queue pair's endpoint and the device the peer should open)
//! when the agent chose RDMA for the pair, or a hello without one. The higher rank answers with its own
//! endpoint (its receives posted) or the reason it cannot; the lower rank connects and says whether it
//! could, and only then does either send over RDMA, so no frame goes to a queue pair without receives.
//! Any failure leaves the pair on TCP, reported with its reason.
//!
//! Every rank sends its hellos first, then answers the lower ranks, then reads the higher ranks' answers,
//! then the lower ranks' word: no rank waits for one that waits for it.

use super::peer::{GroupReport, Peer, RdmaPatience};
use super::{RankLinks, MAX_GROUP_FRAME};
use crate::transport::rdma::open::{PendingLink, RdmaMessages, RdmaOpener};
use crate::transport::rdma::MAX_SLOTS;
use crate::transport::ring::{Answer, Offer, RdmaRoute, RingTransport};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How long a rank waits for each step of the offer.
const OFFER_TIMEOUT: Duration = Duration::from_secs(30);

/// Bound on an offer's messages.
const MAX_OFFER: usize = 4096;

#[derive(Debug, Serialize, Deserialize)]
struct Hello {
    offer: Option<Offer>,
}

/// The lower rank's last word, after an answer with an endpoint.
#[derive(Debug, Serialize, Deserialize)]
struct Connected {
    failed: Option<String>,
}

/// Decodes `bytes` as each of the offer's messages, as a rank does (for the fuzz targets).
#[doc(hidden)]
pub fn decode_offer(bytes: &[u8]) -> [bool; 3] {
    [
        serde_json::from_slice::<Hello>(bytes).is_ok(),
        serde_json::from_slice::<Answer>(bytes).is_ok(),
        serde_json::from_slice::<Connected>(bytes).is_ok(),
    ]
}

/// How a rank starts RDMA with the others: the routes the agent chose (per rank; only those to higher
/// ranks are used, the higher rank opening the device the lower one names), the opener, where changes
/// go and how patient the links are.
pub struct RdmaSetup<'a> {
    pub routes: &'a [Option<RdmaRoute>],
    pub opener: &'a dyn RdmaOpener,
    pub report: GroupReport,
    pub patience: RdmaPatience,
}

fn send_json(peer: &mut Peer, value: &impl Serialize) -> Result<(), String> {
    let bytes = serde_json::to_vec(value).expect("plain data serializes");
    let rank = peer.rank();
    let deadline = Some(std::time::Instant::now() + OFFER_TIMEOUT);
    peer.tcp_stream().send_waiting(&bytes, deadline).map_err(|e| format!("cannot reach rank {rank}: {e}"))
}

fn recv_json<T: for<'de> Deserialize<'de>>(peer: &mut Peer, what: &str) -> Result<T, String> {
    let rank = peer.rank();
    let mut bytes = Vec::new();
    let deadline = Some(std::time::Instant::now() + OFFER_TIMEOUT);
    peer.tcp_stream()
        .recv_waiting(&mut bytes, MAX_OFFER, deadline, std::time::Duration::ZERO)
        .map_err(|e| format!("rank {rank} did not send its RDMA {what}: {e}"))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("rank {rank} sent a malformed RDMA {what}: {e}"))
}

impl RankLinks {
    /// Starts RDMA on the pairs the agent chose it for (blocking; every rank of the group calls this
    /// once, right after [`super::connect`]). Errors only when TCP fails.
    pub fn start_rdma(&mut self, setup: RdmaSetup<'_>) -> Result<(), String> {
        let rank = self.rank;
        let report = setup.report.clone();
        for peer in self.peers.iter_mut().flatten() {
            peer.report_to(report.clone());
        }
        // Hellos to the higher ranks, with an offer where RDMA was chosen and a queue pair opens.
        let mut offered: Vec<Option<(Box<dyn PendingLink>, String)>> = (0..self.peers.len()).map(|_| None).collect();
        for peer in self.peers.iter_mut().flatten().filter(|p| p.rank() > rank) {
            let s = peer.rank();
            let mut offer = None;
            if let Some(route) = setup.routes.get(s).and_then(Option::as_ref) {
                let opened = setup.opener.open(&route.device, MAX_SLOTS, route.slot_bytes);
                match opened.and_then(|link| Ok((link.endpoint()?, link))) {
                    Ok((endpoint, link)) => {
                        offer = Some(Offer { endpoint, device: route.peer_device.clone() });
                        offered[s] = Some((link, route.device.clone()));
                    }
                    Err(e) => report(s, RingTransport::Tcp { reason: format!("RDMA could not start here: {e}") }),
                }
            }
            send_json(peer, &Hello { offer })?;
        }
        // Answers to the lower ranks.
        let mut accepted: Vec<Option<(Box<dyn RdmaMessages>, String)>> = (0..self.peers.len()).map(|_| None).collect();
        for peer in self.peers.iter_mut().flatten().filter(|p| p.rank() < rank) {
            let hello: Hello = recv_json(peer, "hello")?;
            let Some(offer) = hello.offer else {
                send_json(peer, &Answer { endpoint: None, refused: None })?;
                continue;
            };
            let opened = offer
                .endpoint
                .check_slots()
                .and_then(|()| setup.opener.open(&offer.device, offer.endpoint.slots, offer.endpoint.slot_bytes));
            let connected = opened.and_then(|link| {
                let endpoint = link.endpoint()?;
                Ok((endpoint, link.connect(&offer.endpoint, MAX_GROUP_FRAME, OFFER_TIMEOUT)?))
            });
            match connected {
                Ok((endpoint, link)) => {
                    send_json(peer, &Answer { endpoint: Some(endpoint), refused: None })?;
                    accepted[peer.rank()] = Some((link, offer.device));
                }
                Err(e) => {
                    report(peer.rank(), RingTransport::Tcp { reason: format!("RDMA could not start here: {e}") });
                    send_json(peer, &Answer { endpoint: None, refused: Some(e.to_string()) })?;
                }
            }
        }
        // The higher ranks' answers: connect, and say whether it worked.
        for peer in self.peers.iter_mut().flatten().filter(|p| p.rank() > rank) {
            let s = peer.rank();
            let answer: Answer = recv_json(peer, "answer")?;
            let Some((link, device)) = offered[s].take() else { continue };
            let Some(remote) = answer.endpoint else {
                let why = answer.refused.unwrap_or_else(|| "no reason given".into());
                report(s, RingTransport::Tcp { reason: format!("rank {s} could not start RDMA: {why}") });
                continue;
            };
            match link.connect(&remote, MAX_GROUP_FRAME, OFFER_TIMEOUT) {
                Ok(link) => {
                    send_json(peer, &Connected { failed: None })?;
                    peer.use_rdma(link, device.clone(), setup.patience);
                    report(s, RingTransport::Rdma { device });
                }
                Err(e) => {
                    send_json(peer, &Connected { failed: Some(e.to_string()) })?;
                    report(s, RingTransport::Tcp { reason: format!("RDMA could not connect: {e}") });
                }
            }
        }
        // The lower ranks' word on the pairs this rank accepted.
        for peer in self.peers.iter_mut().flatten().filter(|p| p.rank() < rank) {
            let Some((link, device)) = accepted[peer.rank()].take() else { continue };
            let connected: Connected = recv_json(peer, "connection")?;
            match connected.failed {
                None => {
                    peer.use_rdma(link, device.clone(), setup.patience);
                    report(peer.rank(), RingTransport::Rdma { device });
                }
                Some(why) => {
                    let reason = format!("rank {} could not connect over RDMA: {why}", peer.rank());
                    report(peer.rank(), RingTransport::Tcp { reason });
                }
            }
        }
        Ok(())
    }
}
