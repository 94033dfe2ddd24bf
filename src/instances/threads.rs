//! How many compute threads a stage this node starts gets when the launch does not say: the cores the
//! stages it already hosts leave, at least one. Stages of other instances (or several stages of one
//! instance on one node) then do not ask for more threads than the machine has; when they still do
//! (`--threads` given, or nodes sharing a machine), the stages lease cores step by step
//! ([`crate::engine::cores`]).

/// Threads for a new stage on a machine of `cores` cores whose stages already use `hosted` threads.
pub fn for_new_stage(cores: usize, hosted: &[usize]) -> usize {
    cores.saturating_sub(hosted.iter().sum()).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_stage_gets_the_cores_left_and_at_least_one() {
        assert_eq!(for_new_stage(8, &[]), 8);
        assert_eq!(for_new_stage(8, &[3]), 5);
        assert_eq!(for_new_stage(8, &[4, 4]), 1);
        assert_eq!(for_new_stage(2, &[2, 2]), 1);
    }
}
