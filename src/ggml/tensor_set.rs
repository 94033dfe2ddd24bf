//! Tensors whose data lives in one buffer on a device: weights mapped from a model file (in place where
//! the device computes on host memory, else copied into the device's memory), or an allocated KV cache.

use super::{sys, DType, Device, Repacking, WeightPlacement};
use memmap2::Mmap;
use std::collections::HashMap;
use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::Arc;

/// ggml's CPU buffers must start on this boundary (`TENSOR_ALIGNMENT`).
const BUFFER_ALIGNMENT: usize = 32;

/// A tensor to bind to bytes of a mapped file.
pub struct MappedTensor<'a> {
    pub name: &'a str,
    pub dtype: DType,
    /// ggml order: `shape[0]` is the row length.
    pub shape: &'a [u64],
    /// Absolute byte offset of the tensor's data in the file.
    pub file_offset: u64,
}

/// A tensor assembled from byte ranges of a mapped file (a tensor-parallel rank's columns of a matrix:
/// a piece of every row), copied into a buffer of its own.
pub struct GatheredTensor<'a> {
    pub name: &'a str,
    pub dtype: DType,
    pub shape: &'a [u64],
    /// (absolute file offset, bytes) of each piece, in order; together exactly the tensor's bytes.
    pub pieces: &'a [(u64, u64)],
}

/// A tensor to allocate (zeroed) in a new buffer.
pub struct SetTensor<'a> {
    pub name: &'a str,
    pub dtype: DType,
    pub shape: &'a [u64],
}

/// Owns a ggml context of tensor descriptions and the buffer holding their data.
pub(super) struct SetInner {
    ctx: NonNull<sys::ggml_context>,
    buffer: NonNull<sys::ggml_backend_buffer>,
    /// Keeps the file mapping alive for as long as tensors point into it.
    _mapping: Option<Arc<Mmap>>,
}

// SAFETY: the context and buffer are plain heap objects with no thread affinity; all mutation goes
// through `&mut` or happens inside ggml compute calls serialised by the owning backend.
unsafe impl Send for SetInner {}
unsafe impl Sync for SetInner {}

impl Drop for SetInner {
    fn drop(&mut self) {
        // SAFETY: both were created by this set and are freed exactly once, buffer first.
        unsafe {
            sys::ggml_backend_buffer_free(self.buffer.as_ptr());
            sys::ggml_free(self.ctx.as_ptr());
        }
    }
}

/// A handle to one tensor of a [`TensorSet`]; it keeps the set alive.
#[derive(Clone)]
pub struct SetTensorRef {
    pub(super) raw: NonNull<sys::ggml_tensor>,
    pub(super) owner: Arc<SetInner>,
}

// SAFETY: see `SetInner`; the handle itself is only a pointer plus an owning reference.
unsafe impl Send for SetTensorRef {}
unsafe impl Sync for SetTensorRef {}

impl SetTensorRef {
    pub fn shape(&self) -> [i64; 4] {
        // SAFETY: the tensor lives as long as `owner`.
        unsafe { self.raw.as_ref().ne }
    }

    pub fn dtype(&self) -> DType {
        // SAFETY: as above; the type was valid when the tensor was created.
        DType::from_id(unsafe { self.raw.as_ref().type_ }).expect("tensor type was validated")
    }

    pub fn bytes(&self) -> usize {
        // SAFETY: as above.
        unsafe { sys::ggml_nbytes(self.raw.as_ptr()) }
    }

    /// Whether both handles are the same tensor.
    pub fn is(&self, other: &SetTensorRef) -> bool {
        self.raw == other.raw
    }

    /// Copies `out.len()` bytes of the tensor's data from byte `offset` into `out` (from any device).
    pub fn read_bytes(&self, offset: usize, out: &mut [u8]) -> Result<(), String> {
        self.check_range(offset, out.len())?;
        // SAFETY: the range lies inside the tensor (checked); the tensor lives as long as `owner`.
        unsafe { sys::ggml_backend_tensor_get(self.raw.as_ptr(), out.as_mut_ptr().cast(), offset, out.len()) };
        Ok(())
    }

    /// Copies `data` into the tensor's data from byte `offset` (on any device). The caller owns the
    /// tensor's set for the moment (no graph reads or writes the tensor meanwhile): a KV cache's rows are
    /// written between steps, by the thread that runs them.
    pub fn write_bytes(&self, offset: usize, data: &[u8]) -> Result<(), String> {
        self.check_range(offset, data.len())?;
        // SAFETY: as in `read_bytes`; exclusive use as the caller promises.
        unsafe { sys::ggml_backend_tensor_set(self.raw.as_ptr(), data.as_ptr().cast(), offset, data.len()) };
        Ok(())
    }

    fn check_range(&self, offset: usize, len: usize) -> Result<(), String> {
        match offset.checked_add(len) {
            Some(end) if end <= self.bytes() => Ok(()),
            _ => Err(format!("bytes {offset}..+{len} lie outside a tensor of {} bytes", self.bytes())),
        }
    }
}

/// Tensors with their data in one buffer.
pub struct TensorSet {
    inner: Arc<SetInner>,
    by_name: HashMap<String, NonNull<sys::ggml_tensor>>,
    data_bytes: u64,
    /// A mapped set's tensors' byte ranges (start, end in the mapping), by name: what the set reads.
    /// The buffer spans more (everything between its first and last tensor), but the bytes between them
    /// belong to other stages and may be holes in a shard's sparse file.
    file_ranges: HashMap<String, (usize, usize)>,
}

// SAFETY: see `SetInner`.
unsafe impl Send for TensorSet {}
unsafe impl Sync for TensorSet {}

impl TensorSet {
    /// Binds `tensors` to their bytes inside `mapping` for `device`. Where the device computes on host
    /// memory (the CPU, Apple Silicon's GPU) and `placement` allows, nothing is copied: one buffer wraps
    /// the span from the first to the last tensor, so pages become resident only when a computation reads
    /// them. Otherwise each tensor is copied once into a buffer of the device's own memory.
    ///
    /// Fails (never aborts) when a tensor lies outside the mapping, overlaps the end, or is misaligned.
    pub fn map(
        mapping: Arc<Mmap>,
        tensors: &[MappedTensor<'_>],
        device: Device,
        placement: WeightPlacement,
    ) -> Result<TensorSet, String> {
        if tensors.is_empty() {
            return Err("no tensors to map".into());
        }
        let mut first = u64::MAX;
        let mut last = 0u64;
        let mut sizes = Vec::with_capacity(tensors.len());
        for t in tensors {
            let size =
                t.dtype.tensor_bytes(t.shape).ok_or_else(|| format!("tensor {} has an impossible shape", t.name))?;
            let end = t.file_offset.checked_add(size).filter(|&end| end <= mapping.len() as u64).ok_or_else(|| {
                format!("tensor {} ({} bytes at offset {}) runs past the end of the file", t.name, size, t.file_offset)
            })?;
            first = first.min(t.file_offset);
            last = last.max(end);
            sizes.push(size);
        }
        if placement == WeightPlacement::Copied || !device.maps_host_memory() {
            return Self::copy(&mapping, tensors, &sizes, device);
        }
        let first = first as usize / BUFFER_ALIGNMENT * BUFFER_ALIGNMENT;
        let span = last as usize - first;
        let largest = sizes.iter().copied().max().unwrap_or(0) as usize;
        let ctx = new_context(tensors.len())?;
        let mut by_name = HashMap::with_capacity(tensors.len());
        // SAFETY: the span lies inside the mapping (checked above) and the mapping outlives the buffer
        // (stored in `SetInner`). ggml never writes to weight buffers. `first` is 32-aligned and the map
        // itself is page-aligned, which satisfies ggml's alignment assertion.
        let base = unsafe { mapping.as_ptr().add(first) } as *mut std::ffi::c_void;
        let buffer =
            NonNull::new(unsafe { sys::ggml_backend_dev_buffer_from_host_ptr(device.raw(), base, span, largest) });
        let Some(buffer) = buffer else {
            unsafe { sys::ggml_free(ctx.as_ptr()) };
            return Err(format!("ggml could not wrap the mapped file for {}", device.name()));
        };
        // From here on `inner` frees the context and buffer on every exit path.
        let inner = Arc::new(SetInner { ctx, buffer, _mapping: Some(mapping.clone()) });
        unsafe { sys::ggml_backend_buffer_set_usage(buffer.as_ptr(), sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS) };
        for t in tensors {
            let raw = create_tensor(ctx, t.name, t.dtype, t.shape)?;
            let offset = t.file_offset as usize;
            if !offset.is_multiple_of(BUFFER_ALIGNMENT) {
                return Err(format!("tensor {} is not {}-byte aligned in the file", t.name, BUFFER_ALIGNMENT));
            }
            // SAFETY: offset..offset+size lies in [first, last), i.e. inside the buffer (checked above),
            // and matches ggml_nbytes of the tensor because both derive from the same type and shape.
            let status =
                unsafe { sys::ggml_backend_tensor_alloc(buffer.as_ptr(), raw.as_ptr(), base.add(offset - first)) };
            if status != sys::GGML_STATUS_SUCCESS {
                return Err(format!("ggml could not bind tensor {}", t.name));
            }
            by_name.insert(t.name.to_string(), raw);
        }
        let data_bytes = sizes.iter().sum();
        let file_ranges = tensors
            .iter()
            .zip(&sizes)
            .map(|(t, &size)| (t.name.to_string(), (t.file_offset as usize, (t.file_offset + size) as usize)))
            .collect();
        Ok(TensorSet { inner, by_name, data_bytes, file_ranges })
    }

    /// Copies `tensors` (of `sizes` bytes) out of `mapping` into a new buffer of `device`'s memory.
    fn copy(mapping: &Mmap, tensors: &[MappedTensor<'_>], sizes: &[u64], device: Device) -> Result<TensorSet, String> {
        let specs: Vec<SetTensor<'_>> =
            tensors.iter().map(|t| SetTensor { name: t.name, dtype: t.dtype, shape: t.shape }).collect();
        // Every byte is written below: no need to clear the buffer first.
        let set = TensorSet::allocate_uncleared(&specs, device)?;
        // SAFETY: the buffer was just allocated for these tensors.
        unsafe {
            sys::ggml_backend_buffer_set_usage(set.inner.buffer.as_ptr(), sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
        };
        for (t, &size) in tensors.iter().zip(sizes) {
            let raw = set.by_name[t.name];
            // SAFETY: offset..offset+size lies inside the mapping (checked by `map`), and `size` is the
            // tensor's ggml_nbytes: both derive from the same type and shape.
            unsafe {
                let source = mapping.as_ptr().add(t.file_offset as usize);
                sys::ggml_backend_tensor_set(raw.as_ptr(), source.cast(), 0, size as usize);
            }
        }
        Ok(set)
    }

    /// Copies each of `tensors` from its pieces of `mapping` into one new buffer of `device`'s memory.
    /// Fails (never aborts) when a piece lies outside the mapping or the pieces do not add up to the
    /// tensor's size.
    pub fn gather(mapping: &Mmap, tensors: &[GatheredTensor<'_>], device: Device) -> Result<TensorSet, String> {
        for t in tensors {
            let size =
                t.dtype.tensor_bytes(t.shape).ok_or_else(|| format!("tensor {} has an impossible shape", t.name))?;
            let mut sum = 0u64;
            for &(offset, len) in t.pieces {
                offset.checked_add(len).filter(|&end| end <= mapping.len() as u64).ok_or_else(|| {
                    format!(
                        "a piece of tensor {} ({len} bytes at offset {offset}) runs past the end of the file",
                        t.name
                    )
                })?;
                sum += len;
            }
            if sum != size {
                return Err(format!("the pieces of tensor {} hold {sum} bytes, not its {size}", t.name));
            }
        }
        let specs: Vec<SetTensor<'_>> =
            tensors.iter().map(|t| SetTensor { name: t.name, dtype: t.dtype, shape: t.shape }).collect();
        // Every byte is written below.
        let set = TensorSet::allocate_uncleared(&specs, device)?;
        // SAFETY: the buffer was just allocated for these tensors.
        unsafe {
            sys::ggml_backend_buffer_set_usage(set.inner.buffer.as_ptr(), sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
        };
        for t in tensors {
            let raw = set.by_name[t.name];
            let mut at = 0usize;
            for &(offset, len) in t.pieces {
                // SAFETY: each piece lies inside the mapping and the pieces fill the tensor exactly (both
                // checked above).
                unsafe {
                    let source = mapping.as_ptr().add(offset as usize);
                    sys::ggml_backend_tensor_set(raw.as_ptr(), source.cast(), at, len as usize);
                }
                at += len as usize;
            }
        }
        Ok(set)
    }

    /// Allocates `tensors` in one new buffer of `device`'s memory, filled with zeros.
    pub fn allocate(tensors: &[SetTensor<'_>], device: Device) -> Result<TensorSet, String> {
        let mut set = Self::allocate_uncleared(tensors, device)?;
        set.clear();
        Ok(set)
    }

    /// Allocates `tensors` in one new buffer of `device`'s memory, left as the allocator gives it.
    fn allocate_uncleared(tensors: &[SetTensor<'_>], device: Device) -> Result<TensorSet, String> {
        Self::allocate_in(tensors, device.buffer_type(), &device.name())
    }

    /// Allocates `tensors` in one new buffer of `buffer_type` (of the device named `place`), left as the
    /// allocator gives it.
    fn allocate_in(
        tensors: &[SetTensor<'_>],
        buffer_type: *mut sys::ggml_backend_buffer_type,
        place: &str,
    ) -> Result<TensorSet, String> {
        if tensors.is_empty() {
            return Err("no tensors to allocate".into());
        }
        let ctx = new_context(tensors.len())?;
        let mut by_name = HashMap::with_capacity(tensors.len());
        let mut data_bytes = 0u64;
        for t in tensors {
            let raw = match create_tensor(ctx, t.name, t.dtype, t.shape) {
                Ok(raw) => raw,
                Err(e) => {
                    unsafe { sys::ggml_free(ctx.as_ptr()) };
                    return Err(e);
                }
            };
            data_bytes += t.dtype.tensor_bytes(t.shape).unwrap_or(0);
            by_name.insert(t.name.to_string(), raw);
        }
        // SAFETY: ctx holds only tensors without data; ggml allocates one buffer for all of them.
        let buffer = NonNull::new(unsafe { sys::ggml_backend_alloc_ctx_tensors_from_buft(ctx.as_ptr(), buffer_type) });
        let Some(buffer) = buffer else {
            unsafe { sys::ggml_free(ctx.as_ptr()) };
            return Err(format!("could not allocate {data_bytes} bytes on {place}"));
        };
        // Weights and caches in host memory are streamed through every step: from huge pages where the
        // kernel offers them (advised before anything is written, so the first writes fault them in).
        // SAFETY: plain queries of the buffer just allocated.
        if unsafe { sys::ggml_backend_buffer_is_host(buffer.as_ptr()) } {
            let base = unsafe { sys::ggml_backend_buffer_get_base(buffer.as_ptr()) } as *mut u8;
            crate::os::advise_huge_pages(base, unsafe { sys::ggml_backend_buffer_get_size(buffer.as_ptr()) });
        }
        Ok(TensorSet {
            inner: Arc::new(SetInner { ctx, buffer, _mapping: None }),
            by_name,
            data_bytes,
            file_ranges: HashMap::new(),
        })
    }

    /// Copies `weights` (named, each in a set whose data is in host memory: a mapped file or a CPU
    /// buffer) into one new buffer of `repacking`'s layout, ggml rearranging them as it copies. Only the
    /// graphs know whether that is right for a weight ([`Repacking::eligible`]); a weight in a type or
    /// shape the layout has no kernel for is refused. `progress` receives the bytes copied so far.
    pub fn repacked(
        repacking: &Repacking,
        weights: &[(&str, SetTensorRef)],
        progress: impl FnMut(u64),
    ) -> Result<TensorSet, String> {
        // ggml's copy into the layout would dereference the missing kernel of such a weight.
        if let Some((name, _)) = weights.iter().find(|(_, w)| !repacking.has_kernel_for(w.raw.as_ptr())) {
            return Err(format!("tensor {name} has no repacked kernel on this CPU"));
        }
        Self::copied_into(repacking.buffer_type(), "the CPU (repacked)", weights, progress)
    }

    /// Copies `weights` (named, each in a set whose data is in host memory) as they are into one new
    /// buffer of the CPU's memory, which [`TensorSet::allocate_in`] backs by huge pages where it can.
    /// `progress` receives the bytes copied so far.
    pub fn copied_to_cpu(weights: &[(&str, SetTensorRef)], progress: impl FnMut(u64)) -> Result<TensorSet, String> {
        Self::copied_into(Device::cpu().buffer_type(), "the CPU", weights, progress)
    }

    fn copied_into(
        buffer_type: *mut sys::ggml_backend_buffer_type,
        place: &str,
        weights: &[(&str, SetTensorRef)],
        mut progress: impl FnMut(u64),
    ) -> Result<TensorSet, String> {
        let mut names: Vec<&str> = weights.iter().map(|(name, _)| *name).collect();
        names.sort_unstable();
        if let Some(twice) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("tensor {} is named twice among the weights to copy", twice[0]));
        }
        let shapes: Vec<Vec<u64>> = weights
            .iter()
            .map(|(_, w)| {
                // SAFETY: the tensor lives as long as its set.
                let dims = unsafe { sys::ggml_n_dims(w.raw.as_ptr()) } as usize;
                w.shape()[..dims].iter().map(|&n| n as u64).collect()
            })
            .collect();
        let specs: Vec<SetTensor<'_>> =
            weights.iter().zip(&shapes).map(|((name, w), shape)| SetTensor { name, dtype: w.dtype(), shape }).collect();
        // Every byte is written below.
        let set = Self::allocate_in(&specs, buffer_type, place)?;
        // SAFETY: the buffer was just allocated for these tensors.
        unsafe {
            sys::ggml_backend_buffer_set_usage(set.inner.buffer.as_ptr(), sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
        };
        let mut copied = 0u64;
        for (name, source) in weights {
            let raw = *set.by_name.get(*name).ok_or_else(|| format!("tensor {name} was not allocated"))?;
            // SAFETY: the source is a live tensor of the same type and shape whose data is host memory
            // (checked); a buffer type's copy (a repacking one rearranges) takes the whole tensor at once.
            unsafe {
                let from = source.raw.as_ptr();
                let buffer = (*from).buffer;
                if buffer.is_null() || !sys::ggml_backend_buffer_is_host(buffer) || (*from).data.is_null() {
                    return Err(format!("tensor {name} is not in host memory, so it cannot be copied to {place}"));
                }
                let bytes = sys::ggml_nbytes(from);
                sys::ggml_backend_tensor_set(raw.as_ptr(), (*from).data, 0, bytes);
                copied += bytes as u64;
            }
            progress(copied);
        }
        Ok(set)
    }

    /// Whether this set's tensors are mapped from a file (rather than copied or allocated).
    pub fn is_mapped(&self) -> bool {
        self.inner._mapping.is_some()
    }

    /// Every tensor of the set, by name.
    pub fn tensors(&self) -> impl Iterator<Item = (&str, SetTensorRef)> + '_ {
        self.by_name.iter().map(|(name, &raw)| (name.as_str(), SetTensorRef { raw, owner: self.inner.clone() }))
    }

    /// Stops counting and reading the named tensor of a mapped set, which a copy elsewhere replaced:
    /// it no longer counts in [`TensorSet::data_bytes`], [`TensorSet::prefault`] skips it, and the pages
    /// that only it covers leave this process's resident memory (the kernel keeps them cached as file
    /// data, and reads them again should anything still touch them).
    pub fn release(&mut self, name: &str) {
        let Some(raw) = self.by_name.remove(name) else { return };
        // SAFETY: the tensor lives as long as the set.
        self.data_bytes -= unsafe { sys::ggml_nbytes(raw.as_ptr()) } as u64;
        let (Some((start, end)), Some(mapping)) = (self.file_ranges.remove(name), &self.inner._mapping) else {
            return;
        };
        const PAGE: usize = 4096;
        let (first_page, end_page) = (start.div_ceil(PAGE) * PAGE, end / PAGE * PAGE);
        if end_page > first_page {
            // SAFETY: dropping a read-only file mapping's pages loses nothing: a later read faults them in
            // again from the file. The range lies inside the mapping (checked when it was mapped).
            let _ = unsafe {
                mapping.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, first_page, end_page - first_page)
            };
        }
    }

    /// A handle to the named tensor.
    pub fn get(&self, name: &str) -> Option<SetTensorRef> {
        self.by_name.get(name).map(|&raw| SetTensorRef { raw, owner: self.inner.clone() })
    }

    /// Bytes of tensor data in this set (the exact sum of its tensors' sizes).
    pub fn data_bytes(&self) -> u64 {
        self.data_bytes
    }

    /// Reads every page of a mapped set's tensors once, so the first computation does not wait on the
    /// disk. Only the tensors' own pages are touched, not the other stages' bytes between them (which a
    /// shard's sparse file does not have). `progress` receives the fraction done, about every 2%.
    pub fn prefault(&self, mut progress: impl FnMut(f32)) {
        let Some(mapping) = &self.inner._mapping else { return };
        const PAGE: usize = 4096;
        let mut ranges: Vec<(usize, usize)> = self.file_ranges.values().copied().collect();
        ranges.sort_unstable();
        ranges.dedup_by(|next, prev| {
            let touches = next.0 <= prev.1;
            if touches {
                prev.1 = prev.1.max(next.1);
            }
            touches
        });
        let total: usize = ranges.iter().map(|(start, end)| end - start).sum();
        let step = (total / 50).max(PAGE);
        let mut sum = 0u8;
        let (mut done, mut next_report) = (0, 0);
        for &(start, end) in &ranges {
            // The first byte of the range, then the first byte of each later page.
            let mut at = start;
            while at < end {
                sum = sum.wrapping_add(mapping[at]);
                let next = ((at / PAGE) + 1) * PAGE;
                done += next.min(end) - at;
                at = next;
                if done >= next_report {
                    progress(done as f32 / total.max(1) as f32);
                    next_report += step;
                }
            }
        }
        std::hint::black_box(sum);
        progress(1.0);
    }

    /// Sets every byte of the set's buffer to zero.
    pub fn clear(&mut self) {
        // SAFETY: the buffer is owned by this set; `&mut self` excludes concurrent users of this handle.
        unsafe { sys::ggml_backend_buffer_clear(self.inner.buffer.as_ptr(), 0) };
    }
}

fn new_context(n_tensors: usize) -> Result<NonNull<sys::ggml_context>, String> {
    let params = sys::ggml_init_params {
        // SAFETY: a pure size computation.
        mem_size: unsafe { sys::ggml_tensor_overhead() } * (n_tensors + 1),
        mem_buffer: std::ptr::null_mut(),
        no_alloc: true,
    };
    // SAFETY: params describe a context whose memory ggml allocates itself.
    NonNull::new(unsafe { sys::ggml_init(params) }).ok_or_else(|| "ggml could not create a context".to_string())
}

fn create_tensor(
    ctx: NonNull<sys::ggml_context>,
    name: &str,
    dtype: DType,
    shape: &[u64],
) -> Result<NonNull<sys::ggml_tensor>, String> {
    if shape.is_empty() || shape.len() > 4 {
        return Err(format!("tensor {name} has {} dimensions; ggml supports 1 to 4", shape.len()));
    }
    if name.len() >= 64 || name.contains('\0') {
        return Err(format!("tensor name {name:?} is longer than ggml allows"));
    }
    dtype.tensor_bytes(shape).ok_or_else(|| format!("tensor {name} has an impossible shape {shape:?}"))?;
    let ne: Vec<i64> = shape.iter().map(|&n| i64::try_from(n).unwrap_or(i64::MAX)).collect();
    let cname = CString::new(name).expect("checked for NUL above");
    // SAFETY: ctx has room for one more tensor (sized at creation); the type id and shape were validated.
    let raw = unsafe { sys::ggml_new_tensor(ctx.as_ptr(), dtype.raw(), ne.len() as i32, ne.as_ptr()) };
    let raw = NonNull::new(raw).ok_or_else(|| format!("ggml could not create tensor {name}"))?;
    // SAFETY: the name is shorter than GGML_MAX_NAME and NUL-terminated.
    unsafe { sys::ggml_set_name(raw.as_ptr(), cname.as_ptr()) };
    Ok(raw)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// Host buffers are advised to huge pages before anything is written to them: a 64 MB set, once
    /// cleared, lies mostly in huge pages where the kernel offers them (without the advice, a kernel set
    /// to `madvise` gives none).
    #[test]
    fn host_buffers_are_backed_by_huge_pages_where_the_kernel_offers_them() {
        if !crate::os::huge_pages_available() {
            eprintln!("this kernel offers no transparent huge pages: nothing to check");
            return;
        }
        let shape = [4096u64, 4096];
        let set = TensorSet::allocate(&[SetTensor { name: "w", dtype: DType::F32, shape: &shape }], Device::cpu())
            .expect("64 MB on the CPU");
        // SAFETY: a plain query of the set's live buffer.
        let base = unsafe { sys::ggml_backend_buffer_get_base(set.inner.buffer.as_ptr()) } as *const u8;
        let size = unsafe { sys::ggml_backend_buffer_get_size(set.inner.buffer.as_ptr()) };
        let huge = crate::os::huge_page_bytes_in(base, size).expect("the buffer's mappings are in /proc/self/smaps");
        assert!(huge >= 32 << 20, "only {huge} bytes of a 64 MB weight buffer are in huge pages");
    }
}
