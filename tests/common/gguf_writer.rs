//! Writes small GGUF files for tests: crafted metadata and tensors, to check how shoal handles files
//! that are valid GGUF but not models it can run.

pub enum Meta {
    U32(u32),
    F32(f32),
    Str(String),
    StrArray(Vec<String>),
}

pub struct Tensor {
    pub name: String,
    pub shape: Vec<u64>,
    pub type_id: u32,
    pub data: Vec<u8>,
}

#[derive(Default)]
pub struct GgufWriter {
    pub meta: Vec<(String, Meta)>,
    pub tensors: Vec<Tensor>,
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

impl GgufWriter {
    pub fn meta(mut self, key: &str, value: Meta) -> Self {
        self.meta.push((key.into(), value));
        self
    }

    /// An F32 tensor of zeros.
    pub fn f32_tensor(mut self, name: &str, shape: &[u64]) -> Self {
        let n: u64 = shape.iter().product();
        self.tensors.push(Tensor {
            name: name.into(),
            shape: shape.to_vec(),
            type_id: 0,
            data: vec![0; n as usize * 4],
        });
        self
    }

    pub fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.meta.len() as u64).to_le_bytes());
        for (key, value) in &self.meta {
            string(&mut out, key);
            match value {
                Meta::U32(v) => {
                    out.extend_from_slice(&4u32.to_le_bytes());
                    out.extend_from_slice(&v.to_le_bytes());
                }
                Meta::F32(v) => {
                    out.extend_from_slice(&6u32.to_le_bytes());
                    out.extend_from_slice(&v.to_le_bytes());
                }
                Meta::Str(s) => {
                    out.extend_from_slice(&8u32.to_le_bytes());
                    string(&mut out, s);
                }
                Meta::StrArray(items) => {
                    out.extend_from_slice(&9u32.to_le_bytes());
                    out.extend_from_slice(&8u32.to_le_bytes());
                    out.extend_from_slice(&(items.len() as u64).to_le_bytes());
                    items.iter().for_each(|s| string(&mut out, s));
                }
            }
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            string(&mut out, &t.name);
            out.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
            t.shape.iter().for_each(|d| out.extend_from_slice(&d.to_le_bytes()));
            out.extend_from_slice(&t.type_id.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset += (t.data.len() as u64).div_ceil(32) * 32;
        }
        while !out.len().is_multiple_of(32) {
            out.push(0);
        }
        for t in &self.tensors {
            out.extend_from_slice(&t.data);
            while !out.len().is_multiple_of(32) {
                out.push(0);
            }
        }
        out
    }
}
