//! The tensor table of a GGUF file read by the tests themselves, apart from shoal's reader, from the
//! format's documentation (ggml's `docs/gguf.md`): the header, the metadata skipped value by value, then
//! each tensor's name, shape, type and offset. A tensor's bytes come from ggml's block sizes, and the
//! file's data section is checked to end where the last tensor does — so expected byte counts in tests
//! do not come from the code under test.

use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::Path;

pub struct TensorEntry {
    pub name: String,
    /// Offset in the file (data section start plus the tensor's offset).
    pub offset: u64,
    pub bytes: u64,
}

pub struct TensorTable {
    /// Where the data section begins: the header's size.
    pub data_start: u64,
    pub tensors: Vec<TensorEntry>,
}

/// (block elements, block bytes) of the ggml types a test file may hold.
fn block(ggml_type: u32) -> (u64, u64) {
    match ggml_type {
        0 => (1, 4),      // F32
        1 => (1, 2),      // F16
        2 => (32, 18),    // Q4_0
        3 => (32, 20),    // Q4_1
        8 => (32, 34),    // Q8_0
        12 => (256, 144), // Q4_K
        13 => (256, 176), // Q5_K
        14 => (256, 210), // Q6_K
        30 => (1, 2),     // BF16
        other => panic!("the tests' GGUF reader does not know ggml type {other}"),
    }
}

struct Reader<R>(R);

impl<R: Read> Reader<R> {
    fn u32(&mut self) -> u32 {
        let mut b = [0; 4];
        self.0.read_exact(&mut b).unwrap();
        u32::from_le_bytes(b)
    }
    fn u64(&mut self) -> u64 {
        let mut b = [0; 8];
        self.0.read_exact(&mut b).unwrap();
        u64::from_le_bytes(b)
    }
    fn string(&mut self) -> String {
        let len = self.u64() as usize;
        let mut b = vec![0; len];
        self.0.read_exact(&mut b).unwrap();
        String::from_utf8(b).unwrap()
    }
    fn skip(&mut self, n: u64) {
        std::io::copy(&mut (&mut self.0).take(n), &mut std::io::sink()).unwrap();
    }
    /// Skips a metadata value of `kind`; returns it when it is a u32 (for `general.alignment`).
    fn value(&mut self, kind: u32) -> Option<u64> {
        match kind {
            0 | 1 | 7 => self.skip(1),
            2 | 3 => self.skip(2),
            4 => return Some(self.u32() as u64),
            5 | 6 => self.skip(4),
            8 => {
                self.string();
            }
            9 => {
                let (inner, n) = (self.u32(), self.u64());
                for _ in 0..n {
                    self.value(inner);
                }
            }
            10..=12 => self.skip(8),
            other => panic!("unknown GGUF value type {other}"),
        }
        None
    }
}

pub fn read(path: &Path) -> TensorTable {
    let mut file = std::io::BufReader::new(std::fs::File::open(path).unwrap());
    let mut r = Reader(&mut file);
    assert_eq!(r.u32(), u32::from_le_bytes(*b"GGUF"), "{} is not a GGUF file", path.display());
    assert_eq!(r.u32(), 3, "GGUF version");
    let (tensor_count, kv_count) = (r.u64(), r.u64());
    let mut alignment = 32;
    for _ in 0..kv_count {
        let key = r.string();
        let kind = r.u32();
        if let Some(v) = r.value(kind) {
            if key == "general.alignment" {
                alignment = v;
            }
        }
    }
    let mut raw = Vec::new();
    for _ in 0..tensor_count {
        let name = r.string();
        let dims = r.u32();
        let elements: u64 = (0..dims).map(|_| r.u64()).product();
        let (block_elements, block_bytes) = block(r.u32());
        let offset = r.u64();
        raw.push((name, offset, elements / block_elements * block_bytes));
    }
    let header_end = file.stream_position().unwrap();
    let data_start = header_end.div_ceil(alignment) * alignment;
    let file_len = file.seek(SeekFrom::End(0)).unwrap();
    let tensors: Vec<TensorEntry> =
        raw.into_iter().map(|(name, offset, bytes)| TensorEntry { name, offset: data_start + offset, bytes }).collect();
    let end = tensors.iter().map(|t| t.offset + t.bytes).max().unwrap_or(data_start);
    assert!(end <= file_len && file_len - end < alignment, "the tensors end at {end}, the file at {file_len}");
    TensorTable { data_start, tensors }
}

impl TensorTable {
    /// The tensors a pipeline stage of `layers` (of `layer_count`) reads, by the GGUF naming rule: its
    /// blocks' `blk.N.*`; on the first stage the token embedding; on the last the output norm and the
    /// output head (the token embedding again when the head is tied to it).
    pub fn stage(&self, layers: Range<usize>, layer_count: usize) -> Vec<&TensorEntry> {
        let has_head = self.tensors.iter().any(|t| t.name == "output.weight");
        let wanted = |name: &str| {
            if let Some(rest) = name.strip_prefix("blk.") {
                let n: usize = rest.split('.').next().unwrap().parse().unwrap();
                return layers.contains(&n);
            }
            let first = layers.start == 0;
            let last = layers.end == layer_count;
            match name {
                "token_embd.weight" => first || (last && !has_head),
                "output_norm.weight" | "output.weight" => last,
                _ => false,
            }
        };
        self.tensors.iter().filter(|t| wanted(&t.name)).collect()
    }

    /// Bytes of the tensors a stage of `layers` reads.
    pub fn stage_bytes(&self, layers: Range<usize>, layer_count: usize) -> u64 {
        self.stage(layers, layer_count).iter().map(|t| t.bytes).sum()
    }
}
