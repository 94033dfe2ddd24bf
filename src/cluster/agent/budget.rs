//! Budgets for connections to the control port that have not proven they hold the cluster secret yet.
//! Anyone who can reach the port can open connections; each costs a task and a file descriptor until
//! its handshake completes or times out. So each source address gets a few at a time, strangers share a
//! pool, and the addresses of known members draw on a pool of their own: a flood from elsewhere can
//! neither exhaust the node nor keep members from reconnecting (nor a new member from joining, unless
//! the flood comes from its own address).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Handshakes at once from one address that is not a known member's, and from one that is (several
/// nodes may share an address behind NAT or on one machine).
const PER_STRANGER_ADDRESS: usize = 4;
const PER_MEMBER_ADDRESS: usize = 16;
/// Handshakes at once from all strangers, and from all known members.
const STRANGERS: usize = 48;
const MEMBERS: usize = 64;
/// How long an accepted connection has to send its preamble and complete its handshake.
pub(crate) const PRE_AUTH_DEADLINE: Duration = Duration::from_secs(2);

#[derive(Default)]
struct Counts {
    by_address: HashMap<IpAddr, usize>,
    strangers: usize,
    members: usize,
}

/// The handshake slots of one control port.
#[derive(Default)]
pub(crate) struct HandshakeBudget {
    counts: Mutex<Counts>,
}

/// A slot, given back when dropped.
pub(crate) struct Slot {
    budget: Arc<HandshakeBudget>,
    ip: IpAddr,
    member: bool,
}

impl HandshakeBudget {
    /// A slot for a connection from `ip` (`member`: a known member's address), or None when its budget
    /// is spent.
    pub(crate) fn take(self: &Arc<Self>, ip: IpAddr, member: bool) -> Option<Slot> {
        let mut counts = self.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (per_address, pool) =
            if member { (PER_MEMBER_ADDRESS, MEMBERS) } else { (PER_STRANGER_ADDRESS, STRANGERS) };
        let used = if member { counts.members } else { counts.strangers };
        if used >= pool || counts.by_address.get(&ip).copied().unwrap_or(0) >= per_address {
            return None;
        }
        *counts.by_address.entry(ip).or_default() += 1;
        if member {
            counts.members += 1;
        } else {
            counts.strangers += 1;
        }
        Some(Slot { budget: self.clone(), ip, member })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.budget.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = counts.by_address.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                counts.by_address.remove(&self.ip);
            }
        }
        if self.member {
            counts.members -= 1;
        } else {
            counts.strangers -= 1;
        }
    }
}

/// The addresses known members were last seen at or say they listen on.
pub(crate) fn member_addresses<'a>(
    records: impl Iterator<Item = &'a super::MemberRecord>,
    seen: impl Iterator<Item = IpAddr>,
) -> HashSet<IpAddr> {
    records.flat_map(|r| r.control.iter().map(|a| a.ip())).chain(seen).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_from_one_address_leaves_room_for_others_and_members() {
        let budget = Arc::new(HandshakeBudget::default());
        let flood: IpAddr = "10.0.0.66".parse().unwrap();
        let held: Vec<Slot> = (0..100).filter_map(|_| budget.take(flood, false)).collect();
        assert_eq!(held.len(), PER_STRANGER_ADDRESS);
        assert!(budget.take("10.0.0.2".parse().unwrap(), false).is_some());
        let many: Vec<Slot> = (0..=255u8).flat_map(|i| budget.take(IpAddr::from([10, 9, 0, i]), false)).collect();
        assert_eq!(many.len(), STRANGERS - PER_STRANGER_ADDRESS, "strangers share one pool");
        assert!(budget.take("10.0.0.3".parse().unwrap(), true).is_some(), "members have their own");
        drop(held);
        assert!(budget.take(flood, false).is_some(), "slots come back");
    }
}
