//! Hidden states crossing a stage boundary, and their byte form: the payload the transport carries
//! between stages on different machines (and `--split` passes between stages in one process).
//!
//! Layout (little-endian): `u8 version (1)`, `u8 format (0 = f32, 1 = f16)`, `u16 reserved (0)`,
//! `u32 width`, `u32 tokens`, then `width × tokens` values, token by token. f32 is the default so a
//! split model computes exactly what the unsplit one does; f16 halves the bytes on slow links.

use half::f16;

const VERSION: u8 = 1;
const HEADER_BYTES: usize = 12;

/// Element format on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WireFormat {
    #[default]
    F32,
    F16,
}

impl WireFormat {
    fn id(self) -> u8 {
        match self {
            WireFormat::F32 => 0,
            WireFormat::F16 => 1,
        }
    }

    fn element_bytes(self) -> usize {
        match self {
            WireFormat::F32 => 4,
            WireFormat::F16 => 2,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum HiddenError {
    #[error("hidden-state message is {0} bytes, shorter than its 12-byte header")]
    TooShort(usize),
    #[error(
        "hidden-state message has version {0}; this node reads version 1 (update every node to the same shoal version)"
    )]
    Version(u8),
    #[error("hidden-state message has unknown element format {0}")]
    Format(u8),
    #[error("hidden-state message has {0:#06x} in its reserved field, which must be 0")]
    Reserved(u16),
    #[error("hidden-state message says {width}×{tokens} values but carries {bytes} bytes of them")]
    Length { width: usize, tokens: usize, bytes: usize },
}

/// Hidden states of `tokens` consecutive positions, each `width` values.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HiddenStates {
    pub width: usize,
    pub tokens: usize,
    pub values: Vec<f32>,
}

impl HiddenStates {
    /// Writes `values` (`tokens` rows of `width`) to `out` in the wire layout, replacing its contents.
    pub fn encode(width: usize, tokens: usize, values: &[f32], format: WireFormat, out: &mut Vec<u8>) {
        assert_eq!(values.len(), width * tokens, "values must be width × tokens");
        out.clear();
        out.reserve(HEADER_BYTES + values.len() * format.element_bytes());
        out.extend_from_slice(&[VERSION, format.id(), 0, 0]);
        out.extend_from_slice(&(width as u32).to_le_bytes());
        out.extend_from_slice(&(tokens as u32).to_le_bytes());
        match format {
            WireFormat::F32 => values.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            WireFormat::F16 => values.iter().for_each(|v| out.extend_from_slice(&f16::from_f32(*v).to_le_bytes())),
        }
    }

    /// Reads a message in the wire layout into `self`, reusing its allocation.
    pub fn decode_from(&mut self, bytes: &[u8]) -> Result<(), HiddenError> {
        if bytes.len() < HEADER_BYTES {
            return Err(HiddenError::TooShort(bytes.len()));
        }
        if bytes[0] != VERSION {
            return Err(HiddenError::Version(bytes[0]));
        }
        let format = match bytes[1] {
            0 => WireFormat::F32,
            1 => WireFormat::F16,
            other => return Err(HiddenError::Format(other)),
        };
        let reserved = u16::from_le_bytes([bytes[2], bytes[3]]);
        if reserved != 0 {
            return Err(HiddenError::Reserved(reserved));
        }
        let width = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes")) as usize;
        let tokens = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize;
        let payload = &bytes[HEADER_BYTES..];
        let expected = width.checked_mul(tokens).and_then(|n| n.checked_mul(format.element_bytes()));
        if expected != Some(payload.len()) {
            return Err(HiddenError::Length { width, tokens, bytes: payload.len() });
        }
        self.width = width;
        self.tokens = tokens;
        self.values.clear();
        match format {
            WireFormat::F32 => {
                self.values.extend(payload.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))))
            }
            WireFormat::F16 => self
                .values
                .extend(payload.chunks_exact(2).map(|c| f16::from_le_bytes(c.try_into().expect("2 bytes")).to_f32())),
        }
        Ok(())
    }

    pub fn decode(bytes: &[u8]) -> Result<HiddenStates, HiddenError> {
        let mut h = HiddenStates::default();
        h.decode_from(bytes)?;
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_round_trip_is_exact() {
        let values: Vec<f32> = (0..12).map(|i| i as f32 * 0.37 - 1.5).collect();
        let mut bytes = Vec::new();
        HiddenStates::encode(4, 3, &values, WireFormat::F32, &mut bytes);
        assert_eq!(bytes.len(), 12 + 48);
        let h = HiddenStates::decode(&bytes).unwrap();
        assert_eq!((h.width, h.tokens), (4, 3));
        assert_eq!(h.values, values);
    }

    #[test]
    fn f16_halves_the_payload_and_keeps_three_digits() {
        let values = vec![1.0f32, -2.5, 0.333_333, 1000.0];
        let mut bytes = Vec::new();
        HiddenStates::encode(2, 2, &values, WireFormat::F16, &mut bytes);
        assert_eq!(bytes.len(), 12 + 8);
        let h = HiddenStates::decode(&bytes).unwrap();
        for (a, b) in h.values.iter().zip(&values) {
            assert!((a - b).abs() <= b.abs() * 1e-3, "{a} vs {b}");
        }
    }

    #[test]
    fn malformed_messages_are_rejected() {
        let mut bytes = Vec::new();
        HiddenStates::encode(2, 2, &[0.0; 4], WireFormat::F32, &mut bytes);
        assert_eq!(HiddenStates::decode(&bytes[..5]), Err(HiddenError::TooShort(5)));
        assert!(matches!(HiddenStates::decode(&bytes[..bytes.len() - 1]), Err(HiddenError::Length { .. })));
        let mut wrong = bytes.clone();
        wrong[0] = 9;
        assert_eq!(HiddenStates::decode(&wrong), Err(HiddenError::Version(9)));
        wrong = bytes.clone();
        wrong[1] = 7;
        assert_eq!(HiddenStates::decode(&wrong), Err(HiddenError::Format(7)));
        // A width × tokens product that overflows must not be trusted.
        wrong = bytes;
        wrong[4..12].copy_from_slice(&[0xff; 8]);
        assert!(matches!(HiddenStates::decode(&wrong), Err(HiddenError::Length { .. })));
    }
}
