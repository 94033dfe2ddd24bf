//! Frames over records. A record is one encrypted Noise message (at most 65535 bytes on the wire); its
//! plaintext is a flags byte (bit 0: more records follow) and a chunk of the frame. A frame is the chunks
//! of consecutive records up to one without the flag, and may not exceed the connection's cap.
//! Everything here is pure, so malformed input can be tested directly.

/// Largest plaintext of one record: Noise's 65535-byte message minus its 16-byte tag.
pub const MAX_RECORD_PLAINTEXT: usize = 65535 - 16;
/// Largest chunk of a frame in one record.
pub const MAX_CHUNK: usize = MAX_RECORD_PLAINTEXT - 1;

const MORE: u8 = 1;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("empty record")]
    EmptyRecord,
    #[error("record has unknown flags {0:#04x}")]
    UnknownFlags(u8),
    #[error("frame of at least {size} bytes exceeds the {max}-byte limit")]
    TooLarge { size: usize, max: usize },
}

/// Calls `record` with the plaintext of each record of `frame`, in order.
pub fn split(frame: &[u8], mut record: impl FnMut(&[u8])) {
    let mut chunks = frame.chunks(MAX_CHUNK).peekable();
    let mut buf = Vec::with_capacity(MAX_RECORD_PLAINTEXT.min(frame.len() + 1));
    if frame.is_empty() {
        record(&[0]);
        return;
    }
    while let Some(chunk) = chunks.next() {
        buf.clear();
        buf.push(if chunks.peek().is_some() { MORE } else { 0 });
        buf.extend_from_slice(chunk);
        record(&buf);
    }
}

/// Appends one record's chunk to `frame` (a frame being reassembled); returns whether the frame is
/// complete. Enforces the cap before anything is appended.
pub fn append(record: &[u8], frame: &mut Vec<u8>, max_frame: usize) -> Result<bool, FrameError> {
    let (&flags, chunk) = record.split_first().ok_or(FrameError::EmptyRecord)?;
    if flags & !MORE != 0 {
        return Err(FrameError::UnknownFlags(flags));
    }
    if frame.len() + chunk.len() > max_frame {
        return Err(FrameError::TooLarge { size: frame.len() + chunk.len(), max: max_frame });
    }
    frame.extend_from_slice(chunk);
    Ok(flags & MORE == 0)
}

/// Reassembles frames from record plaintexts, enforcing the size cap as bytes arrive.
pub struct Reassembler {
    buf: Vec<u8>,
    max_frame: usize,
}

impl Reassembler {
    pub fn new(max_frame: usize) -> Reassembler {
        Reassembler { buf: Vec::new(), max_frame }
    }

    /// Adds one record's plaintext; returns the frame it completes, if any.
    pub fn push(&mut self, record: &[u8]) -> Result<Option<Vec<u8>>, FrameError> {
        if append(record, &mut self.buf, self.max_frame)? {
            Ok(Some(std::mem::take(&mut self.buf)))
        } else {
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip(frame: &[u8], max: usize) -> Result<Vec<Vec<u8>>, FrameError> {
        let mut records = Vec::new();
        split(frame, |r| records.push(r.to_vec()));
        let mut r = Reassembler::new(max);
        let mut out = Vec::new();
        for rec in records {
            if let Some(f) = r.push(&rec)? {
                out.push(f);
            }
        }
        Ok(out)
    }

    #[test]
    fn frames_of_every_size_round_trip() {
        for len in [0, 1, MAX_CHUNK - 1, MAX_CHUNK, MAX_CHUNK + 1, 3 * MAX_CHUNK + 7] {
            let frame: Vec<u8> = (0..len).map(|i| i as u8).collect();
            assert_eq!(round_trip(&frame, 1 << 20).unwrap(), vec![frame]);
        }
    }

    #[test]
    fn oversized_frames_are_rejected_before_they_are_buffered() {
        let frame = vec![7u8; 3 * MAX_CHUNK];
        let err = round_trip(&frame, 2 * MAX_CHUNK).unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { .. }));
    }

    proptest! {
        #[test]
        fn arbitrary_records_never_panic(records in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..20)) {
            let mut r = Reassembler::new(1000);
            for rec in records {
                match r.push(&rec) {
                    Ok(Some(f)) => prop_assert!(f.len() <= 1000),
                    Ok(None) => {}
                    Err(_) => break,
                }
            }
        }

        #[test]
        fn any_frame_round_trips(frame in proptest::collection::vec(any::<u8>(), 0..200_000)) {
            prop_assert_eq!(round_trip(&frame, 1 << 20).unwrap(), vec![frame]);
        }
    }
}
