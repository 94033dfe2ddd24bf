//! What a node reports about itself every second: memory (total, available, used by shoal), CPU, load,
//! OS; on macOS also the chip and how much memory the GPU may use. Sampling refreshes only memory, the
//! load average and shoal's own processes, so it costs little.

use super::platform;
use serde::{Deserialize, Serialize};
use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct NodeTelemetry {
    pub memory_total: u64,
    pub memory_available: u64,
    /// Resident memory of this node's shoal processes (the agent and its workers).
    pub memory_used_by_shoal: u64,
    /// What this node offers models: available memory less headroom for the OS and other apps, capped
    /// by --memory-limit (less what shoal's workers already use) and, on macOS, by the GPU limit.
    pub memory_offer: u64,
    /// Measured memory read bandwidth in bytes/s (a decode step reads its weights once).
    pub memory_bandwidth: Option<u64>,
    pub cpu_model: String,
    pub cpu_cores: usize,
    pub cpu_threads: usize,
    pub load_1m: f64,
    pub os: String,
    pub os_version: String,
    pub kernel: String,
    pub arch: String,
    /// Apple silicon chip (macOS), e.g. "Apple M3 Ultra".
    pub chip: Option<String>,
    /// Memory the GPU may use (macOS unified memory): the `iogpu.wired_limit_mb` setting when set,
    /// otherwise an estimate of macOS's default share.
    pub gpu_memory_limit: Option<u64>,
    /// Where `gpu_memory_limit` comes from: "sysctl iogpu.wired_limit_mb" or "macOS default (estimate)".
    pub gpu_memory_limit_source: Option<String>,
    /// The RDMA doctor's latest report on this node (refreshed every minute).
    #[serde(default)]
    pub rdma: Option<Box<crate::rdma::NodeReport>>,
    pub sampled_at_ms: u64,
}

pub struct TelemetrySampler {
    system: System,
    static_part: NodeTelemetry,
    pids: Vec<Pid>,
    memory_limit: Option<u64>,
}

/// Memory kept free for the OS and other apps: a tenth of the machine, at most 2 GiB.
fn headroom(total: u64) -> u64 {
    (total / 10).min(2 << 30)
}

/// Reads a 64 MiB buffer a few times and keeps the best rate: about 50 ms, once per process.
pub fn measure_memory_bandwidth() -> u64 {
    let words = vec![1u64; 8 << 20];
    let mut best = f64::MAX;
    let mut sum = 0u64;
    for _ in 0..4 {
        let t = std::time::Instant::now();
        sum = sum.wrapping_add(words.iter().fold(0u64, |a, &w| a.wrapping_add(w)));
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(sum);
    ((words.len() * 8) as f64 / best.max(1e-9)) as u64
}

impl TelemetrySampler {
    /// A sampler; `memory_limit` caps what the node offers (--memory-limit).
    pub fn new(memory_limit: Option<u64>) -> TelemetrySampler {
        let mut system = System::new().expect("sysinfo supports this OS");
        system.refresh_cpu_list(sysinfo::CpuRefreshKind::nothing());
        let cpu_model = system.cpus().first().map(|c| c.brand().trim().to_string()).unwrap_or_default();
        let threads = system.cpus().len();
        let static_part = NodeTelemetry {
            cpu_cores: System::physical_core_count().unwrap_or(threads),
            cpu_threads: threads,
            os: System::name().unwrap_or_default(),
            os_version: System::os_version().unwrap_or_default(),
            kernel: System::kernel_version().unwrap_or_default(),
            arch: System::cpu_arch(),
            chip: platform::apple_chip(&cpu_model),
            cpu_model,
            memory_bandwidth: Some(measure_memory_bandwidth()),
            ..NodeTelemetry::default()
        };
        TelemetrySampler { system, static_part, pids: vec![Pid::from_u32(std::process::id())], memory_limit }
    }

    /// Counts `pid` (a worker) in `memory_used_by_shoal` from now on.
    pub fn track_process(&mut self, pid: u32) {
        self.pids.push(Pid::from_u32(pid));
    }

    pub fn sample(&mut self) -> NodeTelemetry {
        self.system.refresh_memory();
        self.system.refresh_processes_specifics(
            ProcessesToUpdate::Some(&self.pids),
            true,
            ProcessRefreshKind::nothing().with_memory(),
        );
        self.pids.retain(|pid| self.system.process(*pid).is_some());
        let memory_total = self.system.total_memory();
        let (gpu_memory_limit, gpu_memory_limit_source) = match platform::gpu_memory_limit(memory_total) {
            Some((bytes, source)) => (Some(bytes), Some(source.to_string())),
            None => (None, None),
        };
        let memory_available = self.system.available_memory();
        let memory_used_by_shoal: u64 =
            self.pids.iter().filter_map(|p| self.system.process(*p)).map(|p| p.memory()).sum();
        let mut memory_offer = memory_available.saturating_sub(headroom(memory_total));
        if let Some(limit) = self.memory_limit {
            // The agent itself is not counted against the limit; its workers are.
            let agent = self.system.process(self.pids[0]).map_or(0, |p| p.memory());
            memory_offer = memory_offer.min(limit.saturating_sub(memory_used_by_shoal.saturating_sub(agent)));
        }
        if let Some(gpu) = gpu_memory_limit {
            memory_offer = memory_offer.min(gpu.saturating_sub(memory_used_by_shoal));
        }
        NodeTelemetry {
            memory_total,
            memory_available,
            memory_used_by_shoal,
            memory_offer,
            load_1m: System::load_average().map_or(0.0, |l| l.one),
            gpu_memory_limit,
            gpu_memory_limit_source,
            sampled_at_ms: crate::util::now_ms(),
            ..self.static_part.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_reports_this_machine() {
        let mut s = TelemetrySampler::new(Some(64_000_000));
        let t = s.sample();
        assert!(t.memory_total > 0 && t.memory_available <= t.memory_total);
        assert!(t.memory_offer <= 64_000_000 && t.memory_offer > 0, "the limit caps the offer");
        assert!(t.memory_bandwidth.is_some_and(|b| b > 100_000_000), "{:?}", t.memory_bandwidth);
        assert!(t.memory_used_by_shoal > 0, "this test process is counted");
        assert!(t.cpu_threads >= 1 && !t.os.is_empty());
    }
}
