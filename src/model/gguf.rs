//! Reading GGUF files: header, metadata and tensor directory, parsed in Rust from a memory map.
//!
//! Every length, count, type and offset is checked before it is used, so a truncated, bit-flipped or
//! foreign file yields a [`ModelError`] that names the file and the problem, never a crash or a huge
//! allocation. Tensor data is not read here: it stays in the mapping until a stage binds its own tensors.

use super::ModelError;
use crate::ggml::DType;
use memmap2::Mmap;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// Largest `general.alignment` accepted. llama.cpp requires a power of two and files use 32; a huge
/// one would place the tensor data gigabytes past the header (a served header could make a fetch
/// reserve that much).
const MAX_ALIGNMENT: u64 = 1 << 16;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    /// The value as an unsigned integer, whatever integer width the writer chose.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(items) => Some(items),
            _ => None,
        }
    }

    /// GGUF's name of the value's type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
        }
    }
}

/// One tensor of the file's directory.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: DType,
    /// ggml order: `shape[0]` is the row length.
    pub shape: Vec<u64>,
    /// Absolute offset of the tensor's data in the file.
    pub offset: u64,
    /// Exact size of the tensor's data in bytes.
    pub bytes: u64,
}

/// A parsed GGUF file, memory-mapped.
pub struct GgufFile {
    path: PathBuf,
    mapping: Arc<Mmap>,
    version: u32,
    metadata: BTreeMap<String, Value>,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    data_offset: u64,
}

impl GgufFile {
    /// Maps and parses the file at `path`.
    pub fn open(path: &Path) -> Result<GgufFile, ModelError> {
        let io_error = |source| ModelError::Open { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(io_error)?;
        if file.metadata().map_err(io_error)?.is_dir() {
            return Err(ModelError::NotGguf { path: path.to_path_buf(), reason: "it is a directory".into() });
        }
        let mapping = Arc::new(crate::os::map_file(&file).map_err(io_error)?);
        Self::parse(path, mapping)
    }

    fn parse(path: &Path, mapping: Arc<Mmap>) -> Result<GgufFile, ModelError> {
        let GgufHeader { version, metadata, tensors, data_offset } = GgufHeader::parse(path, &mapping)?;
        let file_len = mapping.len() as u64;
        for t in &tensors {
            if t.offset.checked_add(t.bytes).is_none_or(|end| end > file_len) {
                return Err(ModelError::Truncated {
                    path: path.into(),
                    what: format!("the data of tensor {} ({} bytes at byte {})", t.name, t.bytes, t.offset),
                    file_len,
                });
            }
        }
        let mut spans: Vec<(u64, u64, &str)> =
            tensors.iter().map(|t| (t.offset, t.offset + t.bytes, t.name.as_str())).collect();
        spans.sort_unstable();
        if let Some(w) = spans.windows(2).find(|w| w[1].0 < w[0].1) {
            return Err(ModelError::Corrupt {
                path: path.into(),
                reason: format!("tensors {} and {} overlap", w[0].2, w[1].2),
            });
        }
        let by_name = tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Ok(GgufFile { path: path.into(), mapping, version, metadata, tensors, by_name, data_offset })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// The memory map of the whole file (shared by every stage that binds tensors from it).
    pub fn mapping(&self) -> &Arc<Mmap> {
        &self.mapping
    }

    pub fn file_bytes(&self) -> u64 {
        self.mapping.len() as u64
    }

    /// Where tensor data begins: the bytes before it are the header, metadata and tensor directory.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    pub fn metadata(&self) -> &BTreeMap<String, Value> {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// Tensors in the order of the file's directory.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }
}

/// The header of a GGUF file: version, metadata and tensor directory, and where the tensor data begins.
/// It is parsed from the file's first bytes alone, so a shard fetch can read it before it has the rest;
/// bytes that end inside the header give [`ModelError::Truncated`].
pub struct GgufHeader {
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    /// Tensors in the order of the directory, with absolute offsets.
    pub tensors: Vec<TensorInfo>,
    /// Bytes of the header, metadata, tensor directory and alignment padding: where tensor data begins.
    pub data_offset: u64,
}

impl GgufHeader {
    /// Parses the header at the start of `bytes` (`path` only names the file in errors).
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<GgufHeader, ModelError> {
        let mut r = Reader { bytes, pos: 0, path };
        if bytes.len() < 4 || &bytes[..4] != MAGIC {
            return Err(ModelError::NotGguf {
                path: path.into(),
                reason: "it does not start with the bytes \"GGUF\"".into(),
            });
        }
        r.pos = 4;
        let version = r.u32("the format version")?;
        match version {
            2 | 3 => {}
            v if v.swap_bytes() <= 3 => {
                return Err(r.corrupt("it is a big-endian GGUF file; shoal reads little-endian GGUF files only".into()))
            }
            v => return Err(ModelError::UnsupportedVersion { path: path.into(), version: v }),
        }
        let n_tensors = r.u64("the tensor count")?;
        let n_kv = r.u64("the metadata count")?;
        // Every entry takes at least 8 bytes, so larger counts cannot be honest.
        if n_tensors > r.remaining() / 8 || n_kv > r.remaining() / 8 {
            return Err(ModelError::Truncated {
                path: path.into(),
                what: format!("the {n_tensors} tensors and {n_kv} metadata entries its header announces"),
                file_len: bytes.len() as u64,
            });
        }
        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            let key = r.string(&format!("the key of metadata entry {i}"))?;
            let type_id = r.u32(&format!("the type of metadata {key}"))?;
            let value = r.value(type_id, &key, 0)?;
            if metadata.insert(key.clone(), value).is_some() {
                return Err(r.corrupt(format!("metadata key {key} appears twice")));
            }
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a.is_power_of_two() && a <= MAX_ALIGNMENT => a,
                _ => {
                    return Err(
                        r.corrupt(format!("general.alignment is {v:?}, not a power of two up to {MAX_ALIGNMENT}"))
                    )
                }
            },
        };
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        let mut by_name = HashMap::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let name = r.string(&format!("the name of tensor {i}"))?;
            let n_dims = r.u32(&format!("the rank of tensor {name}"))?;
            if !(1..=4).contains(&n_dims) {
                return Err(r.corrupt(format!("tensor {name} has {n_dims} dimensions")));
            }
            let mut shape = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                let n = r.u64(&format!("the shape of tensor {name}"))?;
                if n > i64::MAX as u64 {
                    return Err(r.corrupt(format!("tensor {name} has a dimension of {n}")));
                }
                shape.push(n);
            }
            let type_id = r.u32(&format!("the type of tensor {name}"))?;
            let dtype = DType::from_id(type_id).ok_or_else(|| ModelError::UnsupportedTensorType {
                path: path.into(),
                tensor: name.clone(),
                type_id,
            })?;
            let offset = r.u64(&format!("the offset of tensor {name}"))?;
            if offset % alignment != 0 {
                return Err(
                    r.corrupt(format!("tensor {name} starts at offset {offset}, not a multiple of {alignment}"))
                );
            }
            let bytes = dtype
                .tensor_bytes(&shape)
                .ok_or_else(|| r.corrupt(format!("tensor {name} has a shape {shape:?} impossible for {dtype}")))?;
            if name.len() >= 64 {
                return Err(r.corrupt(format!("tensor name {name} is longer than 63 bytes")));
            }
            if by_name.insert(name.clone(), tensors.len()).is_some() {
                return Err(r.corrupt(format!("tensor {name} appears twice")));
            }
            tensors.push(TensorInfo { name, dtype, shape, offset, bytes });
        }
        let data_offset = (r.pos as u64).div_ceil(alignment) * alignment;
        for t in &mut tensors {
            t.offset = data_offset.checked_add(t.offset).ok_or_else(|| ModelError::Corrupt {
                path: path.into(),
                reason: format!("tensor {} has an impossible offset", t.name),
            })?;
        }
        Ok(GgufHeader { version, metadata, tensors, data_offset })
    }
}

/// A bounds-checked cursor over the file's bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

/// Nested arrays deeper than this are not GGUF any real writer produces.
const MAX_ARRAY_DEPTH: usize = 4;

impl Reader<'_> {
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn corrupt(&self, reason: String) -> ModelError {
        ModelError::Corrupt { path: self.path.into(), reason }
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&[u8], ModelError> {
        if n > self.remaining() {
            return Err(ModelError::Truncated {
                path: self.path.into(),
                what: format!("{what} ({n} bytes at byte {})", self.pos),
                file_len: self.bytes.len() as u64,
            });
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.bytes[start..self.pos])
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], ModelError> {
        Ok(self.take(N as u64, what)?.try_into().expect("took exactly N bytes"))
    }

    fn u32(&mut self, what: &str) -> Result<u32, ModelError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, ModelError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String, ModelError> {
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    fn value(&mut self, type_id: u32, key: &str, depth: usize) -> Result<Value, ModelError> {
        let what = &format!("the value of {key}");
        Ok(match type_id {
            0 => Value::U8(self.array::<1>(what)?[0]),
            1 => Value::I8(self.array::<1>(what)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            4 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            5 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            7 => match self.array::<1>(what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.corrupt(format!("{key} is a boolean with the value {b}"))),
            },
            8 => Value::String(self.string(what)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.corrupt(format!("{key} nests arrays more than {MAX_ARRAY_DEPTH} deep")));
                }
                let item_type = self.u32(what)?;
                let count = self.u64(what)?;
                let min_item = match item_type {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => 12,
                    t => return Err(self.corrupt(format!("{key} is an array of unknown type {t}"))),
                };
                if count > self.remaining() / min_item {
                    return Err(ModelError::Truncated {
                        path: self.path.into(),
                        what: format!("the {count} items of {key}"),
                        file_len: self.bytes.len() as u64,
                    });
                }
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(item_type, key, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            11 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            t => return Err(self.corrupt(format!("metadata {key} has unknown type {t}"))),
        })
    }
}
