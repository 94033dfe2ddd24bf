//! The budget of event streams (`GET /api/events`) opened without the API token. A stream holds one of
//! the API's connections for as long as its client reads, and a browser's `EventSource` (the
//! dashboard's) cannot send the token, so such streams stay open to anyone who can reach the API — but
//! within a budget of their own, per address and in all, so that subscribers cannot take every
//! connection from token holders, the CLI and the other dashboards. A stream that carries the token
//! (`Authorization: Bearer`) is not counted.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Event streams without the token open at once from one address (the app's window, a few browser
/// tabs and CLI watchers of one machine).
pub const STREAMS_PER_ADDRESS: usize = 16;
/// Event streams without the token open at once in all: a quarter of the API's connections.
pub const STREAMS_WITHOUT_TOKEN: usize = crate::api::server::MAX_CONNECTIONS / 4;

#[derive(Debug, Default)]
pub struct StreamBudget {
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One stream's place in the budget, given back when the stream ends.
#[derive(Debug)]
pub struct StreamPermit {
    budget: Arc<StreamBudget>,
    address: IpAddr,
}

impl StreamBudget {
    /// A place for a stream from `address`; the reason when there is none.
    pub fn admit(self: &Arc<Self>, address: IpAddr) -> Result<StreamPermit, String> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let total: usize = open.values().sum();
        let mine = open.get(&address).copied().unwrap_or(0);
        if mine >= STREAMS_PER_ADDRESS {
            return Err(format!(
                "{address} has {mine} event streams open already (at most {STREAMS_PER_ADDRESS} without the API token); close one"
            ));
        }
        if total >= STREAMS_WITHOUT_TOKEN {
            return Err(format!(
                "{total} event streams without the API token are open already (at most {STREAMS_WITHOUT_TOKEN}); \
                 try again later, or send the token"
            ));
        }
        *open.entry(address).or_default() += 1;
        Ok(StreamPermit { budget: self.clone(), address })
    }
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut open = self.budget.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.address) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.address);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_counted_per_address_and_in_all_and_given_back() {
        let budget = Arc::new(StreamBudget::default());
        let one: IpAddr = "127.0.0.1".parse().unwrap();
        let mine: Vec<_> = (0..STREAMS_PER_ADDRESS).map(|_| budget.admit(one).unwrap()).collect();
        assert!(budget.admit(one).unwrap_err().contains("close one"));
        let others: Vec<_> = (0..STREAMS_WITHOUT_TOKEN - STREAMS_PER_ADDRESS)
            .map(|i| budget.admit(IpAddr::from([127, 1, (i / 8) as u8, (i % 8) as u8])).unwrap())
            .collect();
        assert!(budget.admit("127.9.9.9".parse().unwrap()).unwrap_err().contains("try again later"));
        drop(mine);
        assert!(budget.admit(one).is_ok(), "the address's streams were given back");
        drop(others);
        assert!(budget.open.lock().unwrap().len() <= 1);
    }
}
