//! ggml's CPU back end: a persistent thread pool, one compute-buffer allocator, and graph execution.

use super::{sys, DType, Element, Graph};
use std::ptr::NonNull;

/// Runs graphs on the CPU. It owns the thread pool (created once, not per compute) and the allocator of
/// intermediate tensors; exactly one graph is allocated at a time, and only that one can be computed.
pub struct CpuBackend {
    backend: NonNull<sys::ggml_backend>,
    threadpool: NonNull<sys::ggml_threadpool>,
    allocator: NonNull<sys::ggml_gallocr>,
    threads: usize,
    /// Id of the graph whose intermediate tensors currently own the compute buffer.
    allocated: Option<u64>,
}

// SAFETY: the back end, pool and allocator have no thread affinity; `&mut self` serialises their use.
unsafe impl Send for CpuBackend {}

impl Drop for CpuBackend {
    fn drop(&mut self) {
        // SAFETY: each was created in `new` and is freed once; the pool after the back end that uses it.
        unsafe {
            sys::ggml_gallocr_free(self.allocator.as_ptr());
            sys::ggml_backend_free(self.backend.as_ptr());
            sys::ggml_threadpool_free(self.threadpool.as_ptr());
        }
    }
}

impl CpuBackend {
    pub fn new(threads: usize) -> Result<CpuBackend, String> {
        super::init();
        let threads = threads.clamp(1, 512);
        // SAFETY: plain constructors; failures are reported as null and checked.
        unsafe {
            let backend = NonNull::new(sys::ggml_backend_cpu_init()).ok_or("ggml could not start its CPU back end")?;
            let mut params = sys::ggml_threadpool_params_default(threads as i32);
            let Some(threadpool) = NonNull::new(sys::ggml_threadpool_new(&mut params)) else {
                sys::ggml_backend_free(backend.as_ptr());
                return Err(format!("ggml could not start a pool of {threads} threads"));
            };
            sys::ggml_backend_cpu_set_n_threads(backend.as_ptr(), threads as i32);
            sys::ggml_backend_cpu_set_threadpool(backend.as_ptr(), threadpool.as_ptr());
            let Some(allocator) = NonNull::new(sys::ggml_gallocr_new(sys::ggml_backend_cpu_buffer_type())) else {
                sys::ggml_backend_free(backend.as_ptr());
                sys::ggml_threadpool_free(threadpool.as_ptr());
                return Err("ggml could not create a graph allocator".into());
            };
            Ok(CpuBackend { backend, threadpool, allocator, threads, allocated: None })
        }
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The first node of `graph` this back end cannot compute, described for a user
    /// (for example a weight in a quantization the CPU kernels lack).
    pub fn unsupported_node(&self, graph: &Graph) -> Option<String> {
        (0..graph.node_count()).find_map(|i| {
            // SAFETY: `i` is a valid node index of a live graph.
            unsafe {
                let node = sys::ggml_graph_node(graph.raw(), i as i32);
                if sys::ggml_backend_supports_op(self.backend.as_ptr(), node) {
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

    /// Sizes the compute buffer for `graph` (use the largest graph that will run) and returns its bytes.
    pub fn reserve(&mut self, graph: &Graph) -> Result<usize, String> {
        // SAFETY: the graph is alive; reserving only sizes buffers and assigns no tensor data.
        let ok = unsafe { sys::ggml_gallocr_reserve(self.allocator.as_ptr(), graph.raw()) };
        self.allocated = None;
        if !ok {
            return Err("could not allocate the compute buffer".into());
        }
        Ok(self.compute_buffer_bytes())
    }

    /// Bytes of the compute buffer holding intermediate tensors.
    pub fn compute_buffer_bytes(&self) -> usize {
        // SAFETY: buffer 0 is the allocator's only buffer.
        unsafe { sys::ggml_gallocr_get_buffer_size(self.allocator.as_ptr(), 0) }
    }

    /// Gives `graph`'s intermediate tensors their place in the compute buffer, unless it already has it.
    /// Allocating another graph takes the place away.
    pub fn allocate(&mut self, graph: &Graph) -> Result<(), String> {
        if self.allocated == Some(graph.id) {
            return Ok(());
        }
        self.allocated = None;
        // SAFETY: the graph is alive; the allocator may grow its buffer, which only invalidates the
        // previously allocated graph, and that one is no longer marked as allocated.
        if !unsafe { sys::ggml_gallocr_alloc_graph(self.allocator.as_ptr(), graph.raw()) } {
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
        // SAFETY: the input is alive and allocated; the copy's size is checked against the tensor's.
        unsafe {
            assert_eq!((*t.as_ptr()).type_, T::DTYPE.raw(), "input {name} has another element type");
            let bytes = std::mem::size_of_val(data);
            assert_eq!(bytes, sys::ggml_nbytes(t.as_ptr()), "input {name} has another size");
            sys::ggml_backend_tensor_set(t.as_ptr(), data.as_ptr().cast(), 0, bytes);
        }
    }

    /// Runs the allocated graph.
    pub fn compute(&mut self, graph: &Graph) -> Result<(), String> {
        self.check_allocated(graph);
        // SAFETY: the graph is allocated and all its inputs and stored tensors are alive.
        let status = unsafe { sys::ggml_backend_graph_compute(self.backend.as_ptr(), graph.raw()) };
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
