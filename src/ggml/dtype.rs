//! ggml's element types: which ids are real types, their names and the exact byte size of a row.

use super::sys;
use std::fmt;

/// A ggml element type (`ggml_type`), known to be one this build of ggml implements.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DType(sys::ggml_type);

impl DType {
    pub const F32: DType = DType(sys::GGML_TYPE_F32);
    pub const F16: DType = DType(sys::GGML_TYPE_F16);
    pub const I32: DType = DType(sys::GGML_TYPE_I32);
    pub const I64: DType = DType(sys::GGML_TYPE_I64);
    pub const Q4_0: DType = DType(sys::GGML_TYPE_Q4_0);
    pub const Q4_1: DType = DType(sys::GGML_TYPE_Q4_1);
    pub const Q5_0: DType = DType(sys::GGML_TYPE_Q5_0);
    pub const Q8_0: DType = DType(sys::GGML_TYPE_Q8_0);
    pub const Q4_K: DType = DType(sys::GGML_TYPE_Q4_K);

    /// The type with this GGUF/ggml id, or `None` for ids this ggml does not implement (unknown,
    /// removed or deprecated types).
    pub fn from_id(id: u32) -> Option<DType> {
        if id >= sys::GGML_TYPE_COUNT {
            return None;
        }
        // SAFETY: `id` is below GGML_TYPE_COUNT, so both lookups index ggml's type table in bounds.
        let (block, size) = unsafe { (sys::ggml_blck_size(id), sys::ggml_type_size(id)) };
        (block > 0 && size > 0).then_some(DType(id))
    }

    pub fn id(self) -> u32 {
        self.0
    }

    pub(super) fn raw(self) -> sys::ggml_type {
        self.0
    }

    /// ggml's own name of the type (`f32`, `q4_1`, …).
    pub fn name(self) -> &'static str {
        // SAFETY: the id is valid (checked at construction); ggml returns a static string.
        let name = unsafe { std::ffi::CStr::from_ptr(sys::ggml_type_name(self.0)) };
        name.to_str().unwrap_or("?")
    }

    /// Elements per quantization block (1 for plain types).
    pub fn block_elements(self) -> u64 {
        // SAFETY: valid id.
        unsafe { sys::ggml_blck_size(self.0) as u64 }
    }

    /// Bytes per quantization block (the element size for plain types).
    pub fn block_bytes(self) -> u64 {
        // SAFETY: valid id.
        unsafe { sys::ggml_type_size(self.0) as u64 }
    }

    /// Bytes of one row of `elements` values, or `None` when `elements` is not a whole number of blocks
    /// (such a tensor cannot exist in a valid file) or the size overflows.
    pub fn row_bytes(self, elements: u64) -> Option<u64> {
        let block = self.block_elements();
        if !elements.is_multiple_of(block) {
            return None;
        }
        (elements / block).checked_mul(self.block_bytes())
    }

    /// Exact bytes of a tensor of this type and `shape` (ggml order), or `None` for an impossible shape.
    pub fn tensor_bytes(self, shape: &[u64]) -> Option<u64> {
        let (&row, rest) = shape.split_first()?;
        rest.iter().try_fold(self.row_bytes(row)?, |acc, &n| acc.checked_mul(n))
    }

    pub fn is_quantized(self) -> bool {
        self.block_elements() > 1
    }
}

impl fmt::Debug for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_the_gguf_format() {
        assert_eq!(DType::F32.row_bytes(576), Some(2304));
        assert_eq!(DType::F16.row_bytes(576), Some(1152));
        // Q4_1: blocks of 32 values in 20 bytes (f16 scale, f16 min, 16 bytes of nibbles).
        assert_eq!(DType::Q4_1.row_bytes(576), Some(18 * 20));
        assert_eq!(DType::Q4_1.row_bytes(33), None);
        assert_eq!(DType::from_id(3), Some(DType::Q4_1));
    }

    #[test]
    fn removed_and_unknown_ids_are_rejected() {
        assert_eq!(DType::from_id(4), None); // Q4_2, removed from ggml
        assert_eq!(DType::from_id(5), None); // Q4_3, removed from ggml
        assert_eq!(DType::from_id(9999), None);
    }
}
