//! How a stage is sized and run: its context, sequences, batch, threads, device and KV cache type, and the default
//! number of compute threads on this machine.

use super::kv_cache::KvType;
use super::EngineError;
use crate::ggml::{Device, WeightPlacement};

/// How a stage is sized and run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageOptions {
    /// Positions of each sequence the cache holds (rounded up to a multiple of 256).
    pub context: usize,
    /// Sequences (requests) the cache holds at once.
    pub sequences: usize,
    /// Compute threads.
    pub threads: usize,
    /// Most tokens one forward step takes (prompts are processed in chunks of this size).
    pub batch: usize,
    /// The device to run on, by ggml's name for it (`CPU`, `Metal`, `Vulkan0`, …); the best one when
    /// absent.
    pub device: Option<String>,
    /// Where the weights live on the device.
    pub weights: WeightPlacement,
    /// The element type of the KV cache.
    pub kv_type: KvType,
    /// Drafted tokens a step's decode rows may carry in all (speculative decoding): the last stage sizes
    /// its compute buffer for a step of every sequence's decode row and that many drafts, each asking
    /// logits.
    pub draft_rows: usize,
}

impl Default for StageOptions {
    fn default() -> StageOptions {
        StageOptions {
            context: 4096,
            sequences: 1,
            threads: default_threads(),
            batch: 512,
            device: None,
            weights: WeightPlacement::Automatic,
            kv_type: KvType::F16,
            draft_rows: 0,
        }
    }
}

impl StageOptions {
    /// The device these options name, or the best one.
    pub fn device(&self) -> Result<Device, EngineError> {
        Device::chosen(self.device.as_deref()).map_err(EngineError::Backend)
    }
}

/// One compute thread per core, as llama.cpp does by default; on Apple Silicon one per performance core
/// (`hw.perflevel0.physicalcpu`), as llama.cpp does there too: a step waits for its slowest thread, and a
/// thread on an efficiency core makes every step wait for it.
pub fn default_threads() -> usize {
    threads_for(crate::os::sysctl_integer("hw.perflevel0.physicalcpu"), std::thread::available_parallelism().ok())
}

/// The default thread count from the performance cores (where the OS reports them) or else all cores.
fn threads_for(performance_cores: Option<u64>, cores: Option<std::num::NonZeroUsize>) -> usize {
    match performance_cores {
        Some(p) if p > 0 => p as usize,
        _ => cores.map_or(4, |n| n.get()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroUsize;

    #[test]
    fn default_threads_are_the_performance_cores_where_the_os_reports_them() {
        let cores = NonZeroUsize::new(32);
        assert_eq!(threads_for(Some(24), cores), 24, "an M3 Ultra: 24 performance of 32 cores");
        assert_eq!(threads_for(None, cores), 32, "Linux and Intel Macs: every core");
        assert_eq!(threads_for(Some(0), cores), 32);
        assert_eq!(threads_for(None, None), 4);
        if !cfg!(target_os = "macos") {
            assert_eq!(default_threads(), std::thread::available_parallelism().unwrap().get());
        }
    }
}
