//! Writes small GGUF files for tests: crafted metadata and tensors, to check how shoal handles files
//! that are valid GGUF but not models it can run, and the random-weight models of `random_model`.

pub enum Meta {
    U32(u32),
    F32(f32),
    Str(String),
    StrArray(Vec<String>),
    /// Any value as shoal's reader returned it (to copy metadata from one file into another).
    Value(shoal::model::Value),
}

/// Writes `value` with its GGUF type id first (`tagged`) or alone (inside an array).
fn write_value(out: &mut Vec<u8>, v: &shoal::model::Value, tagged: bool) {
    use shoal::model::Value as V;
    let (id, bytes): (u32, Vec<u8>) = match v {
        V::U8(x) => (0, x.to_le_bytes().to_vec()),
        V::I8(x) => (1, x.to_le_bytes().to_vec()),
        V::U16(x) => (2, x.to_le_bytes().to_vec()),
        V::I16(x) => (3, x.to_le_bytes().to_vec()),
        V::U32(x) => (4, x.to_le_bytes().to_vec()),
        V::I32(x) => (5, x.to_le_bytes().to_vec()),
        V::F32(x) => (6, x.to_le_bytes().to_vec()),
        V::Bool(x) => (7, vec![*x as u8]),
        V::String(s) => {
            let mut b = Vec::new();
            string(&mut b, s);
            (8, b)
        }
        V::Array(items) => {
            let mut b = Vec::new();
            let item_id = items.first().map_or(4, |first| {
                let mut probe = Vec::new();
                write_value(&mut probe, first, true);
                u32::from_le_bytes(probe[..4].try_into().unwrap())
            });
            b.extend_from_slice(&item_id.to_le_bytes());
            b.extend_from_slice(&(items.len() as u64).to_le_bytes());
            items.iter().for_each(|item| write_value(&mut b, item, false));
            (9, b)
        }
        V::U64(x) => (10, x.to_le_bytes().to_vec()),
        V::I64(x) => (11, x.to_le_bytes().to_vec()),
        V::F64(x) => (12, x.to_le_bytes().to_vec()),
    };
    if tagged {
        out.extend_from_slice(&id.to_le_bytes());
    }
    out.extend_from_slice(&bytes);
}

#[derive(Clone)]
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

    /// An F32 tensor of the given values.
    pub fn f32_values(mut self, name: &str, shape: &[u64], values: &[f32]) -> Self {
        assert_eq!(shape.iter().product::<u64>() as usize, values.len(), "{name}: values do not fill the shape");
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensors.push(Tensor { name: name.into(), shape: shape.to_vec(), type_id: 0, data });
        self
    }

    /// An F16 tensor of the given values (rounded to F16).
    pub fn f16_values(mut self, name: &str, shape: &[u64], values: &[f32]) -> Self {
        assert_eq!(shape.iter().product::<u64>() as usize, values.len(), "{name}: values do not fill the shape");
        let data = values.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect();
        self.tensors.push(Tensor { name: name.into(), shape: shape.to_vec(), type_id: 1, data });
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
                Meta::Value(v) => write_value(&mut out, v, true),
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
