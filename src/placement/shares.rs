//! How much of a model each rank of a tensor-parallel group holds when its nodes differ.
//!
//! The ranks wait for each other at every sum, twice a layer, so a group is as fast as its slowest
//! rank: each node's share of the heads, feed-forward columns, experts and vocabulary is in proportion
//! to how fast it reads weights (its measured weight rate). A node whose memory cannot hold that much
//! gets what it can hold, and the rest goes to the others in the same proportion; a group whose nodes
//! cannot hold the model between them gets no shares. A rank's bytes are the parts every rank holds
//! whole, its share of the divided parts and of the KV cache, and a compute buffer: the shares are
//! checked against each rank's exact bytes and lowered where rounding to whole heads or blocks
//! overshot.

use super::{ModelNeeds, NodeOffer};
use crate::model::slice::Divider;

/// Times the shares are checked against the exact bytes and lowered where a rank overshot.
const ROUNDS: usize = 8;

/// Shares for `members` (rank order) that fit each one's memory and follow their speeds as closely as
/// memory allows, or `None` when the nodes cannot hold the model between them.
pub(super) fn fitted(needs: &ModelNeeds, divider: &Divider, members: &[&NodeOffer]) -> Option<Vec<f64>> {
    let kv_all: u64 = needs.kv_per_layer.iter().sum();
    let fixed = divider.whole_bytes() + needs.compute;
    let per_share = (divider.divided_bytes() + kv_all + needs.compute_last_extra).max(1) as f64;
    let mut caps: Vec<f64> = members.iter().map(|m| m.bytes.saturating_sub(fixed) as f64 / per_share).collect();
    let rates = rates(members);
    for _ in 0..ROUNDS {
        let shares = spread(&rates, &caps)?;
        let slices = divider.plan(&shares).ok()?;
        let mut over = false;
        for ((slice, member), cap) in slices.iter().zip(members).zip(&mut caps) {
            let bytes = needs.rank(slice, divider.bytes(slice)).total();
            if bytes > member.bytes {
                // Lower the cap past the overshoot, and by one part in a thousand more so that the next
                // round does not land on the same rounding.
                *cap -= (bytes - member.bytes) as f64 / per_share + 1e-3;
                over = true;
            }
        }
        if !over {
            return Some(shares);
        }
    }
    None
}

/// Each member's weight rate, or equal rates when any is unknown (a guess for one would skew all).
fn rates(members: &[&NodeOffer]) -> Vec<f64> {
    let known: Option<Vec<f64>> =
        members.iter().map(|m| m.weight_rate.or(m.memory_bandwidth).map(|r| r.max(1) as f64)).collect();
    known.unwrap_or_else(|| vec![1.0; members.len()])
}

/// Shares summing to 1 in proportion to `rates`, none above its `cap`: a capped member keeps its cap
/// and the rest is spread over the others by their rates. `None` when the caps add up to less than 1.
fn spread(rates: &[f64], caps: &[f64]) -> Option<Vec<f64>> {
    if caps.iter().map(|c| c.max(0.0)).sum::<f64>() < 1.0 {
        return None;
    }
    let mut shares = vec![0.0; rates.len()];
    let mut capped = vec![false; rates.len()];
    loop {
        let free_members: Vec<usize> = (0..rates.len()).filter(|&i| !capped[i]).collect();
        let left = 1.0 - (0..rates.len()).filter(|&i| capped[i]).map(|i| shares[i]).sum::<f64>();
        let free: f64 = free_members.iter().map(|&i| rates[i]).sum();
        let mut changed = false;
        for i in free_members {
            shares[i] = left * rates[i] / free;
            if shares[i] > caps[i] {
                shares[i] = caps[i].max(0.0);
                capped[i] = true;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    // Every rank holds at least one unit of each part (the plan sees to it); a share must be positive.
    Some(shares.into_iter().map(|s| s.max(1e-4)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9)
    }

    #[test]
    fn shares_follow_the_rates_until_a_node_is_full() {
        // Room for everything: by rate.
        assert!(close(&spread(&[1.0, 1.0], &[5.0, 5.0]).unwrap(), &[0.5, 0.5]));
        assert!(close(&spread(&[3.0, 1.0], &[5.0, 5.0]).unwrap(), &[0.75, 0.25]));
        // The fast node can hold only 0.6: the slow one takes the rest.
        assert!(close(&spread(&[3.0, 1.0], &[0.6, 5.0]).unwrap(), &[0.6, 0.4]));
        // One of three is full; the other two share the rest by their rates.
        assert!(close(&spread(&[1.0, 1.0, 2.0], &[0.1, 5.0, 5.0]).unwrap(), &[0.1, 0.3, 0.6]));
        // A cap that binds only after another node's cap moved the rest onto it.
        assert!(close(&spread(&[2.0, 1.0, 1.0], &[0.2, 0.35, 5.0]).unwrap(), &[0.2, 0.35, 0.45]));
        // Not enough room between them, and a node with no room at all.
        assert_eq!(spread(&[1.0, 1.0], &[0.5, 0.49]), None);
        assert!(close(&spread(&[1.0, 1.0], &[-0.2, 1.0]).unwrap(), &[1e-4, 1.0]));
    }
}
