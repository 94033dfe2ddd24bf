//! Stage 0's index of the saved prefixes (the prompt cache beyond its slots): which token sequences
//! every stage keeps a copy of, in memory and on disk, and which to keep. A request that ends leaves
//! what its slot ran saved; a later request whose prompt begins with more of a saved prefix than any
//! free slot holds gets it written back into its slot. Memory and disk each hold at most a budget of
//! positions, least recently used first out; a copy is never what a running request computes on (it is
//! written into the request's slot), so evicting one never disturbs a request.

use super::prefix_store::{key_of, SavedOnDisk};
use super::prompt_cache::Reuse;
use crate::transport::PrefixOp;

/// Shorter prefixes are not worth a copy: prefilling them takes about as long as restoring them.
pub const MIN_SAVED: usize = 64;

struct Entry {
    key: u64,
    tokens: Vec<u32>,
    in_memory: bool,
    on_disk: bool,
    used: u64,
}

/// A saved prefix a prompt can use: its key, its positions, and how many of them the prompt reuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Match {
    pub key: u64,
    pub saved: usize,
    pub positions: usize,
}

pub struct PrefixIndex {
    entries: Vec<Entry>,
    reuse: Reuse,
    memory_positions: usize,
    /// None without a disk tier.
    disk_positions: Option<usize>,
    /// What one saved recurrent state costs, in positions of rows (0 without linear layers).
    state_cost: usize,
    clock: u64,
}

impl PrefixIndex {
    /// An index of prefixes reused as `reuse` allows, holding at most `memory_positions` positions in
    /// memory and `disk_positions` on disk (None: no disk tier), starting from what the disk holds
    /// (oldest first).
    pub fn new(
        reuse: Reuse,
        memory_positions: usize,
        disk_positions: Option<usize>,
        on_disk: Vec<SavedOnDisk>,
    ) -> Self {
        let mut index =
            PrefixIndex { entries: Vec::new(), reuse, memory_positions, disk_positions, state_cost: 0, clock: 0 };
        for saved in on_disk.into_iter().filter(|_| disk_positions.is_some()) {
            index.clock += 1;
            let used = index.clock;
            index.entries.push(Entry { key: saved.key, tokens: saved.tokens, in_memory: false, on_disk: true, used });
        }
        index
    }

    /// Each saved prefix also holds a recurrent state as large as `positions` positions of rows: it
    /// counts in the budgets so.
    pub fn with_state_cost(mut self, positions: usize) -> Self {
        self.state_cost = positions;
        self
    }

    /// Positions held in memory and on disk (a recurrent state counted as its cost in positions).
    pub fn held(&self) -> (usize, usize) {
        let cost = |e: &Entry| e.tokens.len() + self.state_cost;
        let sum = |f: fn(&Entry) -> bool| self.entries.iter().filter(|e| f(e)).map(cost).sum();
        (sum(|e| e.in_memory), sum(|e| e.on_disk))
    }

    /// The saved prefix that gives back the most of `prompt` (never its last token), if one gives back
    /// more than `than`.
    pub fn best(&mut self, prompt: &[u32], than: usize) -> Option<Match> {
        let usable = |e: &Entry| {
            let common = e.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count();
            let common = common.min(prompt.len().saturating_sub(1));
            match self.reuse {
                Reuse::AnyPrefix => common,
                Reuse::Whole if common == e.tokens.len() => common,
                _ => 0,
            }
        };
        let (at, positions) = self.entries.iter().enumerate().map(|(i, e)| (i, usable(e))).max_by_key(|&(_, n)| n)?;
        if positions <= than || positions == 0 {
            return None;
        }
        self.clock += 1;
        let entry = &mut self.entries[at];
        entry.used = self.clock;
        Some(Match { key: entry.key, saved: entry.tokens.len(), positions })
    }

    /// A slot holds `tokens` at the end of a request: what every stage is to do to keep them (a save,
    /// and the copies it supersedes or pushes out of the budgets dropped).
    pub fn keep(&mut self, tokens: &[u32]) -> Vec<PrefixOp> {
        if tokens.len() < MIN_SAVED || matches!(self.reuse, Reuse::Off | Reuse::Window { .. }) {
            return Vec::new();
        }
        self.clock += 1;
        if let Some(e) = self.entries.iter_mut().find(|e| e.tokens == tokens) {
            e.used = self.clock;
            return Vec::new();
        }
        let mut ops = Vec::new();
        // Rows per position: a copy of a longer run serves every prompt a prefix of it served.
        if self.reuse == Reuse::AnyPrefix {
            self.entries.retain(|e| {
                let superseded = tokens.starts_with(&e.tokens);
                if superseded {
                    ops.push(PrefixOp::Forget { key: e.key, memory: true, disk: true });
                }
                !superseded
            });
        }
        let key = key_of(tokens);
        ops.push(PrefixOp::Save { key, positions: tokens.len() as u32, tokens: tokens.to_vec() });
        let on_disk = self.disk_positions.is_some();
        self.entries.push(Entry { key, tokens: tokens.to_vec(), in_memory: true, on_disk, used: self.clock });
        self.evict(&mut ops);
        ops
    }

    /// A saved prefix could not be restored somewhere: it is dropped everywhere.
    pub fn failed(&mut self, key: u64) -> PrefixOp {
        self.entries.retain(|e| e.key != key);
        PrefixOp::Forget { key, memory: true, disk: true }
    }

    /// Least recently used first: out of memory (the disk keeps its copy), then off the disk.
    fn evict(&mut self, ops: &mut Vec<PrefixOp>) {
        while self.held().0 > self.memory_positions {
            let Some(e) = self.entries.iter_mut().filter(|e| e.in_memory).min_by_key(|e| e.used) else { break };
            e.in_memory = false;
            ops.push(PrefixOp::Forget { key: e.key, memory: true, disk: false });
        }
        let disk_budget = self.disk_positions.unwrap_or(0);
        while self.held().1 > disk_budget {
            let Some(e) = self.entries.iter_mut().filter(|e| e.on_disk).min_by_key(|e| e.used) else { break };
            e.on_disk = false;
            ops.push(PrefixOp::Forget { key: e.key, memory: false, disk: true });
        }
        self.entries.retain(|e| e.in_memory || e.on_disk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(from: u32, len: u32) -> Vec<u32> {
        (from..from + len).collect()
    }

    fn saves(ops: &[PrefixOp]) -> usize {
        ops.iter().filter(|op| matches!(op, PrefixOp::Save { .. })).count()
    }

    #[test]
    fn a_prompt_gets_the_saved_prefix_that_gives_back_most_and_never_its_last_token() {
        let mut index = PrefixIndex::new(Reuse::AnyPrefix, 10_000, None, Vec::new());
        assert_eq!(saves(&index.keep(&run(0, 100))), 1);
        assert_eq!(saves(&index.keep(&run(1000, 80))), 1);
        let prompt: Vec<u32> = run(0, 70).into_iter().chain([7]).collect();
        let found = index.best(&prompt, 0).unwrap();
        assert_eq!((found.key, found.saved, found.positions), (key_of(&run(0, 100)), 100, 70));
        assert_eq!(index.best(&prompt, 70), None, "a slot giving back as much wins");
        assert_eq!(index.best(&run(0, 100), 0).unwrap().positions, 99, "the prompt's last token runs");
        assert_eq!(index.best(&[5000, 1], 0), None);
        assert!(index.keep(&run(0, 10)).is_empty(), "too short to keep");
    }

    #[test]
    fn a_longer_run_supersedes_its_prefix_but_a_state_keeps_both() {
        let mut index = PrefixIndex::new(Reuse::AnyPrefix, 10_000, None, Vec::new());
        index.keep(&run(0, 100));
        let ops = index.keep(&run(0, 150));
        assert!(ops.contains(&PrefixOp::Forget { key: key_of(&run(0, 100)), memory: true, disk: true }), "{ops:?}");
        assert_eq!(index.held().0, 150);
        assert!(index.keep(&run(0, 150)).is_empty(), "the same run again is kept once");

        let mut index = PrefixIndex::new(Reuse::Whole, 10_000, None, Vec::new());
        index.keep(&run(0, 100));
        index.keep(&run(0, 150));
        assert_eq!(index.held().0, 250);
        let diverging: Vec<u32> = run(0, 120).into_iter().chain([9, 9]).collect();
        assert_eq!(index.best(&diverging, 0).unwrap().positions, 100, "only a state the prompt extends");
    }

    #[test]
    fn the_least_recently_used_leave_memory_then_the_disk() {
        let mut index = PrefixIndex::new(Reuse::AnyPrefix, 200, Some(300), Vec::new());
        index.keep(&run(0, 100));
        index.keep(&run(1000, 100));
        // The first is used again: the second is now the least recently used.
        index.best(&run(0, 100), 0).unwrap();
        let ops = index.keep(&run(2000, 100));
        assert!(ops.contains(&PrefixOp::Forget { key: key_of(&run(1000, 100)), memory: true, disk: false }), "{ops:?}");
        assert_eq!(index.held(), (200, 300));
        // Still on disk: found, though not in memory.
        assert_eq!(index.best(&run(1000, 100), 0).unwrap().positions, 99);
        let ops = index.keep(&run(3000, 100));
        assert!(ops.contains(&PrefixOp::Forget { key: key_of(&run(0, 100)), memory: true, disk: false }), "{ops:?}");
        assert!(ops.contains(&PrefixOp::Forget { key: key_of(&run(0, 100)), memory: false, disk: true }), "{ops:?}");
        assert_eq!(index.held(), (200, 300));
        assert_eq!(index.best(&run(0, 100), 0), None, "gone from both");
        assert!(index.best(&run(2000, 100), 0).is_some());
        let key = key_of(&run(3000, 100));
        assert_eq!(index.failed(key), PrefixOp::Forget { key, memory: true, disk: true });
        assert_eq!(index.best(&run(3000, 100), 0), None);
    }

    #[test]
    fn what_the_disk_kept_is_found_after_a_restart() {
        let on_disk = vec![SavedOnDisk { key: key_of(&run(0, 100)), tokens: run(0, 100), bytes: 1 }];
        let mut index = PrefixIndex::new(Reuse::AnyPrefix, 1000, Some(1000), on_disk.clone());
        assert_eq!(index.held(), (0, 100));
        assert_eq!(index.best(&run(0, 100), 0).unwrap().saved, 100);
        let mut without_disk = PrefixIndex::new(Reuse::AnyPrefix, 1000, None, on_disk);
        assert_eq!(without_disk.best(&run(0, 100), 0), None);
    }
}
