//! How many compute threads a stage this node starts gets when the launch does not say: on a GPU the
//! default (its CPU threads only feed the device and take the few operations it lacks); on the CPU the
//! cores the stages it already hosts leave, at least one. Stages of other instances (or several stages of one
//! instance on one node) then do not ask for more threads than the machine has; when they still do
//! (`--threads` given, or nodes sharing a machine), the stages lease cores step by step
//! ([`crate::engine::cores`]).

/// Threads for a new stage on a machine of `cores` cores (the default thread count) whose stages already
/// use `hosted` threads; `on_gpu`: the node's stages compute on a GPU.
pub fn for_new_stage(cores: usize, hosted: &[usize], on_gpu: bool) -> usize {
    if on_gpu {
        return cores.max(1);
    }
    cores.saturating_sub(hosted.iter().sum()).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_stage_gets_the_cores_left_and_at_least_one() {
        assert_eq!(for_new_stage(8, &[], false), 8);
        assert_eq!(for_new_stage(8, &[3], false), 5);
        assert_eq!(for_new_stage(8, &[4, 4], false), 1);
        assert_eq!(for_new_stage(2, &[2, 2], false), 1);
    }

    #[test]
    fn stages_on_a_gpu_do_not_divide_the_cores() {
        assert_eq!(for_new_stage(8, &[], true), 8);
        assert_eq!(for_new_stage(8, &[8, 8], true), 8);
    }
}
