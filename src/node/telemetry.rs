//! What a node reports about itself every second: memory (total, available, used by shoal), CPU, load,
//! OS; on macOS also the chip and how much memory the GPU may use. Sampling refreshes only memory, the
//! load average and shoal's own processes, so it costs little.

use super::platform;
use serde::{Deserialize, Serialize};
use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeTelemetry {
    pub memory_total: u64,
    pub memory_available: u64,
    /// Resident memory of this node's shoal processes (the agent and its workers).
    pub memory_used_by_shoal: u64,
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
    pub sampled_at_ms: u64,
}

pub struct TelemetrySampler {
    system: System,
    static_part: NodeTelemetry,
    pids: Vec<Pid>,
}

impl TelemetrySampler {
    pub fn new() -> TelemetrySampler {
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
            ..NodeTelemetry::default()
        };
        TelemetrySampler { system, static_part, pids: vec![Pid::from_u32(std::process::id())] }
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
        NodeTelemetry {
            memory_total,
            memory_available: self.system.available_memory(),
            memory_used_by_shoal: self.pids.iter().filter_map(|p| self.system.process(*p)).map(|p| p.memory()).sum(),
            load_1m: System::load_average().map_or(0.0, |l| l.one),
            gpu_memory_limit,
            gpu_memory_limit_source,
            sampled_at_ms: crate::util::now_ms(),
            ..self.static_part.clone()
        }
    }
}

impl Default for TelemetrySampler {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_reports_this_machine() {
        let mut s = TelemetrySampler::new();
        let t = s.sample();
        assert!(t.memory_total > 0 && t.memory_available <= t.memory_total);
        assert!(t.memory_used_by_shoal > 0, "this test process is counted");
        assert!(t.cpu_threads >= 1 && !t.os.is_empty());
    }
}
