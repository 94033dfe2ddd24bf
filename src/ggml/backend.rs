//! Runs graphs on a device through ggml's scheduler: the device's own back end (a GPU where there is
//! one) with the CPU back end beside it for any operation the device lacks, a persistent CPU thread pool,
//! one compute buffer per back end, and graph execution. On the CPU alone the scheduler has one back end.

use super::{sys, DType, Device, DeviceKind, Element, Graph};
use std::ptr::NonNull;

/// Most nodes a graph may have (the scheduler sizes its tables by it). A stage's largest graph has a few
/// thousand nodes; this leaves room for hundreds of layers.
const MAX_GRAPH_NODES: usize = 1 << 16;

/// Runs graphs on one device (and the CPU). Exactly one graph is allocated at a time, and only that one
/// can be computed.
pub struct Backend {
    scheduler: NonNull<sys::ggml_backend_sched>,
    /// The device's back end when the device is not the CPU.
    device_backend: Option<NonNull<sys::ggml_backend>>,
    cpu: NonNull<sys::ggml_backend>,
    threadpool: NonNull<sys::ggml_threadpool>,
    threads: usize,
    device: Device,
    /// Id of the graph whose intermediate tensors currently own the compute buffers.
    allocated: Option<u64>,
}

// SAFETY: the back ends, pool and scheduler have no thread affinity; `&mut self` serialises their use.
unsafe impl Send for Backend {}

impl Drop for Backend {
    fn drop(&mut self) {
        // SAFETY: each was created in `new` and is freed once: the scheduler before the back ends it uses,
        // the pool after the CPU back end that uses it.
        unsafe {
            sys::ggml_backend_sched_free(self.scheduler.as_ptr());
            if let Some(device) = self.device_backend {
                sys::ggml_backend_free(device.as_ptr());
            }
            sys::ggml_backend_free(self.cpu.as_ptr());
            sys::ggml_threadpool_free(self.threadpool.as_ptr());
        }
    }
}

impl Backend {
    /// A back end on `device` with `threads` CPU threads. Between graphs, idle threads poll for work for
    /// a while (ggml's default, which saves a wake-up per graph) unless `sleep_when_idle`: then they
    /// sleep at once, leaving the core to others (stages sharing a machine's cores).
    pub fn new(device: Device, threads: usize, sleep_when_idle: bool) -> Result<Backend, String> {
        super::init();
        let threads = threads.clamp(1, 512);
        // SAFETY: plain constructors; failures are reported as null, checked, and what was made is freed.
        unsafe {
            let cpu = NonNull::new(sys::ggml_backend_cpu_init()).ok_or("ggml could not start its CPU back end")?;
            let mut params = sys::ggml_threadpool_params_default(threads as i32);
            if sleep_when_idle {
                params.poll = 0;
            }
            let Some(threadpool) = NonNull::new(sys::ggml_threadpool_new(&mut params)) else {
                sys::ggml_backend_free(cpu.as_ptr());
                return Err(format!("ggml could not start a pool of {threads} threads"));
            };
            sys::ggml_backend_cpu_set_n_threads(cpu.as_ptr(), threads as i32);
            sys::ggml_backend_cpu_set_threadpool(cpu.as_ptr(), threadpool.as_ptr());
            let device_backend = if device.kind() == DeviceKind::Cpu {
                None
            } else {
                match NonNull::new(sys::ggml_backend_dev_init(device.raw(), std::ptr::null())) {
                    Some(b) => Some(b),
                    None => {
                        sys::ggml_backend_free(cpu.as_ptr());
                        sys::ggml_threadpool_free(threadpool.as_ptr());
                        return Err(format!("ggml could not start the {} back end", device.name()));
                    }
                }
            };
            // The scheduler's last back end must be the CPU's, which takes what the device cannot run.
            let mut backends: Vec<*mut sys::ggml_backend> = device_backend.iter().map(|b| b.as_ptr()).collect();
            backends.push(cpu.as_ptr());
            let scheduler = sys::ggml_backend_sched_new(
                backends.as_mut_ptr(),
                std::ptr::null_mut(),
                backends.len() as i32,
                MAX_GRAPH_NODES,
                false,
                false,
            );
            let Some(scheduler) = NonNull::new(scheduler) else {
                if let Some(b) = device_backend {
                    sys::ggml_backend_free(b.as_ptr());
                }
                sys::ggml_backend_free(cpu.as_ptr());
                sys::ggml_threadpool_free(threadpool.as_ptr());
                return Err("ggml could not create a graph scheduler".into());
            };
            Ok(Backend { scheduler, device_backend, cpu, threadpool, threads, device, allocated: None })
        }
    }

    /// The device this back end computes on.
    pub fn device(&self) -> Device {
        self.device
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The first node of `graph` neither the device nor the CPU can compute, described for a user (for
    /// example a weight in a quantization no kernel here takes).
    pub fn unsupported_node(&self, graph: &Graph) -> Option<String> {
        (0..graph.node_count()).find_map(|i| {
            // SAFETY: `i` is a valid node index of a live graph.
            unsafe {
                let node = sys::ggml_graph_node(graph.raw(), i as i32);
                let on_device = self.device_backend.is_some_and(|b| sys::ggml_backend_supports_op(b.as_ptr(), node));
                if on_device || sys::ggml_backend_supports_op(self.cpu.as_ptr(), node) {
                    return None;
                }
                let op = std::ffi::CStr::from_ptr(sys::ggml_op_desc(node)).to_string_lossy().into_owned();
                let srcs: Vec<String> = (*node)
                    .src
                    .iter()
                    .take_while(|s| !s.is_null())
                    .map(|&s| {
                        let name = std::ffi::CStr::from_ptr((*s).name.as_ptr()).to_string_lossy();
                        let dtype = DType::from_id((*s).type_).map_or("?", |t| t.name());
                        format!("{name} ({dtype})")
                    })
                    .collect();
                Some(format!("{op} of {}", srcs.join(", ")))
            }
        })
    }

    /// Sizes the compute buffers for `graph` (use the largest graph that will run) and returns their bytes.
    pub fn reserve(&mut self, graph: &Graph) -> Result<usize, String> {
        // SAFETY: the graph is alive; reserving only sizes buffers and assigns no tensor data.
        let ok = unsafe { sys::ggml_backend_sched_reserve(self.scheduler.as_ptr(), graph.raw()) };
        self.allocated = None;
        if !ok {
            return Err("could not allocate the compute buffer".into());
        }
        Ok(self.compute_buffer_bytes())
    }

    /// Bytes of the compute buffers holding intermediate tensors (the device's and the CPU's).
    pub fn compute_buffer_bytes(&self) -> usize {
        let backends = self.device_backend.iter().copied().chain([self.cpu]);
        // SAFETY: each back end is one of the scheduler's.
        backends.map(|b| unsafe { sys::ggml_backend_sched_get_buffer_size(self.scheduler.as_ptr(), b.as_ptr()) }).sum()
    }

    /// Gives `graph`'s intermediate tensors their place in the compute buffer, unless it already has it.
    /// Allocating another graph takes the place away.
    pub fn allocate(&mut self, graph: &Graph) -> Result<(), String> {
        if self.allocated == Some(graph.id) {
            return Ok(());
        }
        self.allocated = None;
        // SAFETY: the graph is alive; resetting and allocating may grow the buffers, which only
        // invalidates the previously allocated graph, and that one is no longer marked as allocated.
        let ok = unsafe {
            sys::ggml_backend_sched_reset(self.scheduler.as_ptr());
            sys::ggml_backend_sched_alloc_graph(self.scheduler.as_ptr(), graph.raw())
        };
        if !ok {
            return Err("could not allocate the compute buffer".into());
        }
        self.allocated = Some(graph.id);
        Ok(())
    }

    fn check_allocated(&self, graph: &Graph) {
        assert_eq!(self.allocated, Some(graph.id), "graph must be allocated on this back end before use");
    }

    /// Copies `data` into the graph input `name`. Panics on a missing input, a type or length mismatch,
    /// or a graph that is not the allocated one: these are programming errors.
    pub fn set_input<T: Element>(&mut self, graph: &Graph, name: &str, data: &[T]) {
        self.check_allocated(graph);
        let t = graph.input(name);
        // SAFETY: the input is alive; an input no node of the graph reads got no memory and takes no
        // data (a stage of only linear-attention layers reads no positions).
        if unsafe { (*t.as_ptr()).buffer.is_null() } {
            return;
        }
        // SAFETY: the input is alive and allocated; the copy's size is checked against the tensor's.
        unsafe {
            assert_eq!((*t.as_ptr()).type_, T::DTYPE.raw(), "input {name} has another element type");
            let bytes = std::mem::size_of_val(data);
            assert_eq!(bytes, sys::ggml_nbytes(t.as_ptr()), "input {name} has another size");
            sys::ggml_backend_tensor_set(t.as_ptr(), data.as_ptr().cast(), 0, bytes);
        }
    }

    /// Runs the allocated graph with `threads` of the pool's CPU threads (at most its size).
    pub fn compute(&mut self, graph: &Graph, threads: usize) -> Result<(), String> {
        self.check_allocated(graph);
        // SAFETY: the CPU back end is alive; its pool was made with `self.threads` threads.
        unsafe { sys::ggml_backend_cpu_set_n_threads(self.cpu.as_ptr(), threads.clamp(1, self.threads) as i32) };
        // SAFETY: the graph is allocated and all its inputs and stored tensors are alive.
        let status = unsafe { sys::ggml_backend_sched_graph_compute(self.scheduler.as_ptr(), graph.raw()) };
        if status != sys::GGML_STATUS_SUCCESS {
            return Err(format!("ggml compute failed with status {status}"));
        }
        Ok(())
    }

    /// Copies the output of the last compute of `graph` into `out` (F32 outputs only).
    pub fn read_output(&self, graph: &Graph, out: &mut Vec<f32>) {
        self.check_allocated(graph);
        let t = graph.output;
        // SAFETY: the output is alive, allocated and flagged as output, so no later node overwrote it.
        unsafe {
            assert_eq!((*t.as_ptr()).type_, DType::F32.raw(), "graph output must be F32");
            let bytes = sys::ggml_nbytes(t.as_ptr());
            out.clear();
            out.reserve(bytes / 4);
            sys::ggml_backend_tensor_get(t.as_ptr(), out.as_mut_ptr().cast(), 0, bytes);
            out.set_len(bytes / 4);
        }
    }
}

/// Computes `graph` once on a new CPU back end of `threads` threads, its inputs set by `set_inputs`, and
/// returns its output (the ggml module's tests).
#[cfg(test)]
pub(super) fn run_on_cpu(graph: &Graph, threads: usize, set_inputs: impl FnOnce(&mut Backend)) -> Vec<f32> {
    let mut backend = Backend::new(super::Device::cpu(), threads, false).unwrap();
    backend.allocate(graph).unwrap();
    set_inputs(&mut backend);
    backend.compute(graph, threads).unwrap();
    let mut got = Vec::new();
    backend.read_output(graph, &mut got);
    got
}
