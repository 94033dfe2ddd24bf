//! Which rows stage 0 runs in its next step: the policy of continuous batching, apart from the
//! machinery so that it can be read and tested alone.
//!
//! - Requests are served first come, first served: the oldest request's rows go first.
//! - Every request that has a token to feed decodes in the next step, all in one batch, so the weights
//!   are read once for all of them. On a ring of several stages the decoding requests are split into
//!   as many micro-batches as there are stages, so that while one micro-batch runs on one stage the
//!   others run on the others and no stage waits.
//! - Prompts are run in chunks that fill what the step has left of its batch. On a ring, each prompt is
//!   cut into about two chunks per stage, which follow each other through the stages: the stages work
//!   on one prompt at once and its first token comes sooner. Beside requests that decode, a step takes
//!   at most [`MIXED_PREFILL_TOKENS`] prompt tokens, so a long prompt does not stall them.

/// Most prompt tokens a step takes when it also decodes for other requests.
pub const MIXED_PREFILL_TOKENS: usize = 128;
/// The smallest chunk a prompt is cut into on a ring of stages.
pub const MIN_PIPELINED_CHUNK: usize = 32;

/// What one request needs of the next step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Nothing: its last step has not come back yet.
    Waiting,
    /// A token to feed.
    Decode,
    /// Prompt tokens still to run, and the size of the chunks its prompt is cut into.
    Prefill { remaining: usize, chunk: usize },
}

/// The chunks a prompt of `prompt` tokens is cut into on a ring of `stages` stages with steps of at most
/// `batch` tokens: the whole batch on one stage, else two chunks per stage (at least
/// [`MIN_PIPELINED_CHUNK`] tokens each).
pub fn prompt_chunk(prompt: usize, stages: usize, batch: usize) -> usize {
    if stages <= 1 {
        return batch.max(1);
    }
    prompt.div_ceil(2 * stages).max(MIN_PIPELINED_CHUNK).min(batch).max(1)
}

/// The next step: for each request that takes part (an index into `needs`, in admission order), how
/// many tokens. `needs` is in admission order; `stages` is the ring's length and `batch` the most
/// tokens a step takes.
pub fn next_step(needs: &[Need], stages: usize, batch: usize) -> Vec<(usize, usize)> {
    let decoding = needs.iter().filter(|n| !matches!(n, Need::Prefill { .. })).count();
    let micro_batch = if stages > 1 { decoding.div_ceil(stages) } else { decoding };
    let mut step: Vec<(usize, usize)> = needs
        .iter()
        .enumerate()
        .filter(|(_, n)| **n == Need::Decode)
        .map(|(i, _)| (i, 1))
        .take(micro_batch.min(batch))
        .collect();
    let mut budget = batch - step.len();
    if !step.is_empty() {
        budget = budget.min(MIXED_PREFILL_TOKENS);
    }
    for (i, need) in needs.iter().enumerate() {
        if budget == 0 {
            break;
        }
        if let Need::Prefill { remaining, chunk } = *need {
            let tokens = remaining.min(chunk).min(budget);
            if tokens > 0 {
                step.push((i, tokens));
                budget -= tokens;
            }
        }
    }
    step.sort_unstable();
    step
}

#[cfg(test)]
mod tests {
    use super::*;
    use Need::*;

    #[test]
    fn one_stage_decodes_everyone_in_one_step() {
        let needs = [Decode, Waiting, Decode, Decode];
        assert_eq!(next_step(&needs, 1, 512), vec![(0, 1), (2, 1), (3, 1)]);
        assert_eq!(next_step(&[Waiting, Waiting], 1, 512), vec![]);
    }

    #[test]
    fn a_ring_splits_the_decoding_requests_into_one_micro_batch_per_stage() {
        // Six decoding requests on three stages: two per step, oldest first.
        let mut needs = [Decode; 6];
        let mut steps = Vec::new();
        loop {
            let step = next_step(&needs, 3, 512);
            if step.is_empty() {
                break;
            }
            step.iter().for_each(|&(i, _)| needs[i] = Waiting);
            steps.push(step);
        }
        assert_eq!(steps, vec![vec![(0, 1), (1, 1)], vec![(2, 1), (3, 1)], vec![(4, 1), (5, 1)]]);
        // With fewer requests than stages, each is a micro-batch of its own.
        assert_eq!(next_step(&[Decode, Decode], 3, 512), vec![(0, 1)]);
    }

    #[test]
    fn prompts_fill_the_batch_alone_and_are_held_back_beside_decoding() {
        let prompt = Prefill { remaining: 1000, chunk: 512 };
        assert_eq!(next_step(&[prompt], 1, 512), vec![(0, 512)]);
        assert_eq!(next_step(&[prompt, Decode], 1, 512), vec![(0, MIXED_PREFILL_TOKENS), (1, 1)]);
        // Several prompts share what the step has left, oldest first.
        let short = Prefill { remaining: 20, chunk: 512 };
        assert_eq!(next_step(&[short, prompt], 1, 100), vec![(0, 20), (1, 80)]);
        // The batch bounds decoding rows too.
        assert_eq!(next_step(&[Decode, Decode, Decode], 1, 2), vec![(0, 1), (1, 1)]);
    }

    #[test]
    fn a_ring_cuts_prompts_into_two_chunks_per_stage() {
        assert_eq!(prompt_chunk(1024, 3, 512), 171);
        assert_eq!(prompt_chunk(1024, 1, 512), 512);
        assert_eq!(prompt_chunk(10, 3, 512), MIN_PIPELINED_CHUNK);
        assert_eq!(prompt_chunk(10_000, 2, 512), 512);
        assert_eq!(prompt_chunk(10, 3, 16), 16);
        let chunk = prompt_chunk(1024, 3, 512);
        assert_eq!(next_step(&[Prefill { remaining: 1024, chunk }], 3, 512), vec![(0, 171)]);
    }
}
