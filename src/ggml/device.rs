//! The compute devices ggml offers through its device registry: always the CPU, and a GPU where this
//! build of ggml has one (Metal on Apple Silicon, CUDA or Vulkan elsewhere). A device says what it is,
//! how much memory it has, and whether it can compute on memory the process already holds (a mapped model
//! file): Apple Silicon's GPU and the CPU can, a discrete GPU cannot and gets its own copy of the weights.

use super::sys;
use std::ffi::CStr;
use std::ptr::NonNull;

/// What kind of device it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Cpu,
    Gpu,
    /// A GPU sharing the host's memory, as a driver reports it (ggml's Metal device calls itself a `Gpu`,
    /// `MTL0`; that it computes on host memory shows in [`Device::maps_host_memory`]).
    IntegratedGpu,
    Accelerator,
}

impl DeviceKind {
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "CPU",
            DeviceKind::Gpu => "GPU",
            DeviceKind::IntegratedGpu => "integrated GPU",
            DeviceKind::Accelerator => "accelerator",
        }
    }
}

/// One device of ggml's registry. Devices live as long as the process.
#[derive(Clone, Copy)]
pub struct Device {
    raw: NonNull<sys::ggml_backend_device>,
}

// SAFETY: a device is a registry entry that ggml never frees or mutates after registration; its query
// functions are thread-safe.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.description())
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Device) -> bool {
        self.raw == other.raw
    }
}

impl Device {
    /// Every device of this build, in ggml's order (GPUs before the CPU).
    pub fn all() -> Vec<Device> {
        super::init();
        // SAFETY: plain registry queries; indices below the count are valid.
        (0..unsafe { sys::ggml_backend_dev_count() })
            .filter_map(|i| NonNull::new(unsafe { sys::ggml_backend_dev_get(i) }))
            .map(|raw| Device { raw })
            .filter(|d| d.kind_id() != sys::GGML_BACKEND_DEVICE_TYPE_META)
            .collect()
    }

    /// The CPU.
    pub fn cpu() -> Device {
        Device::all().into_iter().find(|d| d.kind() == DeviceKind::Cpu).expect("ggml always registers its CPU device")
    }

    /// The device a stage runs on unless told otherwise: the first GPU (dedicated or integrated), else the
    /// CPU.
    pub fn best() -> Device {
        let all = Device::all();
        all.iter()
            .find(|d| matches!(d.kind(), DeviceKind::Gpu | DeviceKind::IntegratedGpu))
            .copied()
            .unwrap_or_else(Device::cpu)
    }

    /// The device `--device` chose: the one called `name`, or the best one when none is named.
    pub fn chosen(name: Option<&str>) -> Result<Device, String> {
        name.map_or_else(|| Ok(Device::best()), Device::named)
    }

    /// The device called `name` (case does not matter; `cpu` is always there), or why there is none.
    pub fn named(name: &str) -> Result<Device, String> {
        let all = Device::all();
        all.iter().find(|d| d.name().eq_ignore_ascii_case(name)).copied().ok_or_else(|| {
            let names: Vec<String> = all.iter().map(Device::name).collect();
            format!("there is no device {name:?} here; this build of shoal has: {}", names.join(", "))
        })
    }

    pub fn name(&self) -> String {
        // SAFETY: the device is registered; ggml returns a static NUL-terminated string.
        unsafe { CStr::from_ptr(sys::ggml_backend_dev_name(self.raw.as_ptr())) }.to_string_lossy().into_owned()
    }

    pub fn description(&self) -> String {
        // SAFETY: as for `name`.
        unsafe { CStr::from_ptr(sys::ggml_backend_dev_description(self.raw.as_ptr())) }.to_string_lossy().into_owned()
    }

    fn kind_id(&self) -> sys::ggml_backend_dev_type {
        // SAFETY: a plain query of a registered device.
        unsafe { sys::ggml_backend_dev_type(self.raw.as_ptr()) }
    }

    pub fn kind(&self) -> DeviceKind {
        match self.kind_id() {
            sys::GGML_BACKEND_DEVICE_TYPE_CPU => DeviceKind::Cpu,
            sys::GGML_BACKEND_DEVICE_TYPE_IGPU => DeviceKind::IntegratedGpu,
            sys::GGML_BACKEND_DEVICE_TYPE_ACCEL => DeviceKind::Accelerator,
            _ => DeviceKind::Gpu,
        }
    }

    /// Free and total bytes of the device's memory, as its driver reports them (the host's for the CPU).
    pub fn memory(&self) -> (u64, u64) {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both out-pointers are valid for the call.
        unsafe { sys::ggml_backend_dev_memory(self.raw.as_ptr(), &mut free, &mut total) };
        (free as u64, total as u64)
    }

    /// Whether the device computes on host memory in place (so mapped weights need no copy).
    pub fn maps_host_memory(&self) -> bool {
        if self.kind() == DeviceKind::Cpu {
            return true;
        }
        // SAFETY: `props` is written by ggml for this registered device.
        let mut props: sys::ggml_backend_dev_props = unsafe { std::mem::zeroed() };
        unsafe { sys::ggml_backend_dev_get_props(self.raw.as_ptr(), &mut props) };
        props.caps.buffer_from_host_ptr
    }

    pub(super) fn raw(&self) -> *mut sys::ggml_backend_device {
        self.raw.as_ptr()
    }

    /// The device's own buffer type (device memory; host memory for the CPU).
    pub(super) fn buffer_type(&self) -> *mut sys::ggml_backend_buffer_type {
        // SAFETY: a plain query of a registered device; ggml owns the returned type.
        unsafe { sys::ggml_backend_dev_buffer_type(self.raw.as_ptr()) }
    }
}

/// Where a stage's weights live on its device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightPlacement {
    /// In place in the mapped file when the device can compute on host memory, else copied. On the CPU,
    /// the quantized matrices ggml has interleaved kernels for are copied once into that layout
    /// ([`super::Repacking`]), their pages of the mapping released; where the kernel offers huge pages
    /// (Linux), the rest are copied once as they are into memory it backs by them, which a decode step
    /// streams faster than a file's 4 KB pages (`engine::stage`).
    #[default]
    Automatic,
    /// As [`WeightPlacement::Automatic`], but the weights that are not repacked stay in place in the
    /// mapped file (no copy into huge pages: `--no-huge-pages`).
    Mapped,
    /// In place in the mapped file when the device can compute on host memory, exactly as the file lays
    /// it out (no repacked copies on the CPU), else copied.
    AsInFile,
    /// Copied once into the device's own buffer, as a discrete GPU needs (on the CPU: a test of that path).
    Copied,
}

impl WeightPlacement {
    /// The placement the `--copy-weights`, `--no-repack` and `--no-huge-pages` flags choose (the first
    /// wins).
    pub fn chosen(copy_weights: bool, no_repack: bool, no_huge_pages: bool) -> WeightPlacement {
        match (copy_weights, no_repack, no_huge_pages) {
            (true, _, _) => WeightPlacement::Copied,
            (false, true, _) => WeightPlacement::AsInFile,
            (false, false, true) => WeightPlacement::Mapped,
            (false, false, false) => WeightPlacement::Automatic,
        }
    }

    /// Whether the CPU's repacked layout is used where ggml has kernels for it.
    pub fn repacks(self) -> bool {
        matches!(self, WeightPlacement::Automatic | WeightPlacement::Mapped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_is_always_there_and_found_by_name() {
        let cpu = Device::cpu();
        assert_eq!(cpu.kind(), DeviceKind::Cpu);
        assert!(cpu.maps_host_memory());
        assert_eq!(Device::named(&cpu.name().to_lowercase()).unwrap(), cpu);
        let (free, total) = cpu.memory();
        assert!(total > 0 && free <= total, "{free} of {total}");
        let err = Device::named("quantum0").unwrap_err();
        assert!(err.contains(&cpu.name()), "{err}");
    }
}
