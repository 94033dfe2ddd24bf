//! What a node reports about itself every second: memory (total, available, used by shoal), CPU, load,
//! OS, the device its stages compute on; on macOS also the chip and how much memory the GPU may use.
//! Sampling refreshes only memory, the load average, shoal's own processes and the device's free memory,
//! so it costs little.

use super::platform;
use crate::ggml::Device;
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
    /// Bytes of weights a decode step's products read per second on the CPU, for a 4-, an 8- and a
    /// 16-bit type, with one thread and with every core (engine::weight_rate); placement predicts a
    /// stage's step time from them.
    #[serde(default)]
    pub weight_rates: Vec<crate::engine::weight_rate::WeightRate>,
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
    /// The RDMA doctor's latest report on this node (refreshed when its network interfaces change).
    #[serde(default)]
    pub rdma: Option<Box<crate::rdma::NodeReport>>,
    /// The device this node's stages compute on (`--device`, else the best there is).
    #[serde(default)]
    pub device: Option<DeviceTelemetry>,
    pub sampled_at_ms: u64,
}

/// A node's compute device as its telemetry shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct DeviceTelemetry {
    /// ggml's name for it: `CPU`, `Metal`, `CUDA0`, `Vulkan0`, …
    pub name: String,
    /// `CPU`, `GPU`, `integrated GPU` or `accelerator`.
    pub kind: String,
    pub description: String,
    /// Its own memory, when it has memory apart from the host's (a discrete GPU): weights, KV cache and
    /// compute buffers must fit there, so it bounds what the node offers.
    pub own_memory: Option<DeviceMemory>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct DeviceMemory {
    pub total: u64,
    pub free: u64,
}

/// What a node can offer models: `host_offer` (the host's memory the node may use), bounded by a device
/// with memory of its own by that memory's free part less a tenth for the driver and other users.
pub fn offer_for_device(host_offer: u64, device: Option<&DeviceTelemetry>) -> u64 {
    match device.and_then(|d| d.own_memory) {
        Some(memory) => host_offer.min(memory.free.saturating_sub(memory.total / 10)),
        None => host_offer,
    }
}

pub struct TelemetrySampler {
    system: System,
    static_part: NodeTelemetry,
    pids: Vec<Pid>,
    memory_limit: Option<u64>,
    /// The device the node's stages run on (None when `--device` names none there is), and what does
    /// not change about it.
    device: Option<(Device, DeviceTelemetry)>,
}

/// Memory kept free for the OS and other apps: a tenth of the machine, at most 2 GiB.
fn headroom(total: u64) -> u64 {
    (total / 10).min(2 << 30)
}

/// Runs `measure` while no other shoal process on this machine measures: nodes started together on one
/// machine (network namespaces, or two nodes on one Mac) would otherwise time their memory and cores
/// while the others load them, and each would predict a fraction of its speed. A lock on a file in the
/// temporary directory, awaited at most [`MEASURING_WAIT`] (many nodes starting at once are not held up
/// for long: the later ones measure alongside); without the file, the measurement runs at once.
fn alone_on_this_machine<T>(measure: impl FnOnce() -> T) -> T {
    use rustix::fs::{flock, FlockOperation};
    let path = std::env::temp_dir().join("shoal-measuring.lock");
    let lock = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path);
    if let Ok(file) = &lock {
        let deadline = std::time::Instant::now() + MEASURING_WAIT;
        // Another process holds it: wait; any other error (no locks on this file system): go on.
        while flock(file, FlockOperation::NonBlockingLockExclusive) == Err(rustix::io::Errno::WOULDBLOCK)
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    let result = measure();
    // Closing the file releases the lock.
    drop(lock);
    result
}

/// How long a node waits for another on the same machine to finish measuring (one measures in about
/// 1.8 s on the 2-core VM, so three nodes started together measure one after another).
const MEASURING_WAIT: std::time::Duration = std::time::Duration::from_secs(4);

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
    /// A sampler; `memory_limit` caps what the node offers (--memory-limit), `device` names the device
    /// its stages run on (--device; the best one when None).
    pub fn new(memory_limit: Option<u64>, device: Option<&str>) -> TelemetrySampler {
        let device = Device::chosen(device).inspect_err(|e| tracing::warn!("--device: {e}")).ok();
        let device = device.map(|d| {
            let described = DeviceTelemetry {
                name: d.name(),
                kind: d.kind().name().to_string(),
                description: d.description(),
                own_memory: None,
            };
            (d, described)
        });
        let mut system = System::new().expect("sysinfo supports this OS");
        system.refresh_cpu_list(sysinfo::CpuRefreshKind::nothing());
        let cpu_model = system.cpus().first().map(|c| c.brand().trim().to_string()).unwrap_or_default();
        let threads = system.cpus().len();
        // One turn of the machine for both measurements (see alone_on_this_machine).
        let memory_bandwidth = alone_on_this_machine(|| {
            crate::engine::weight_rate::measure_once();
            measure_memory_bandwidth()
        });
        let static_part = NodeTelemetry {
            cpu_cores: System::physical_core_count().unwrap_or(threads),
            cpu_threads: threads,
            os: System::name().unwrap_or_default(),
            os_version: System::os_version().unwrap_or_default(),
            kernel: System::kernel_version().unwrap_or_default(),
            arch: System::cpu_arch(),
            chip: platform::apple_chip(&cpu_model),
            cpu_model,
            memory_bandwidth: Some(memory_bandwidth),
            ..NodeTelemetry::default()
        };
        let pids = vec![Pid::from_u32(std::process::id())];
        TelemetrySampler { system, static_part, pids, memory_limit, device }
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
        let device = self.device.as_ref().map(|(d, described)| DeviceTelemetry {
            own_memory: (!d.maps_host_memory()).then(|| {
                let (free, total) = d.memory();
                DeviceMemory { total, free }
            }),
            ..described.clone()
        });
        memory_offer = offer_for_device(memory_offer, device.as_ref());
        NodeTelemetry {
            weight_rates: crate::engine::weight_rate::measured(),
            memory_total,
            memory_available,
            memory_used_by_shoal,
            memory_offer,
            load_1m: System::load_average().map_or(0.0, |l| l.one),
            gpu_memory_limit,
            gpu_memory_limit_source,
            device,
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
        let mut s = TelemetrySampler::new(Some(64_000_000), None);
        let t = s.sample();
        let device = t.device.as_ref().expect("the best device");
        assert_eq!((device.name.as_str(), device.own_memory), ("CPU", None), "the CPU shares the host's memory");
        assert!(t.memory_total > 0 && t.memory_available <= t.memory_total);
        assert!(t.memory_offer <= 64_000_000 && t.memory_offer > 0, "the limit caps the offer");
        assert!(t.memory_bandwidth.is_some_and(|b| b > 100_000_000), "{:?}", t.memory_bandwidth);
        assert!(t.memory_used_by_shoal > 0, "this test process is counted");
        assert!(t.cpu_threads >= 1 && !t.os.is_empty());
    }

    #[test]
    fn a_gpu_with_memory_of_its_own_bounds_the_offer() {
        let gpu = |free: u64, total: u64| DeviceTelemetry {
            name: "CUDA0".into(),
            kind: "GPU".into(),
            description: "a card".into(),
            own_memory: Some(DeviceMemory { total, free }),
        };
        let gb = 1_000_000_000;
        // 24 GB card with 20 GB free: 20 less a tenth of 24 for the driver.
        assert_eq!(offer_for_device(100 * gb, Some(&gpu(20 * gb, 24 * gb))), 20 * gb - 24 * gb / 10);
        // The host's offer is the smaller.
        assert_eq!(offer_for_device(5 * gb, Some(&gpu(20 * gb, 24 * gb))), 5 * gb);
        // A device sharing the host's memory (the CPU, Apple Silicon) leaves the host's offer as it is.
        let shared = DeviceTelemetry { own_memory: None, ..gpu(0, 0) };
        assert_eq!(offer_for_device(7 * gb, Some(&shared)), 7 * gb);
        assert_eq!(offer_for_device(7 * gb, None), 7 * gb);
        assert_eq!(offer_for_device(7 * gb, Some(&gpu(gb, 24 * gb))), 0, "a full card offers nothing");
    }
}
