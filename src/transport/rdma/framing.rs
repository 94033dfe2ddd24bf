//! The RDMA framing layer, pure Rust: a message travels in fixed-size slots (whole 4 KiB frames, the
//! same size on both sides), each slot a header — magic, sequence number, message length, offset,
//! fragment length, CRC-32 — and a fragment of the message. UC queue pairs never retransmit and a
//! completion does not mean delivery, so the receiver checks every slot: a wrong checksum, a missing or
//! repeated sequence number, or a fragment that does not continue the message is an error, and the link
//! falls back to TCP. [`SendCredits`] hands out the send slots that are free to post.

use std::collections::VecDeque;

/// Bytes of the header at the start of each slot.
pub const HEADER_BYTES: usize = 32;
const MAGIC: u32 = u32::from_le_bytes(*b"SHRD");

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    #[error("a slot of {0} bytes cannot hold the {HEADER_BYTES}-byte header")]
    Short(usize),
    #[error("a slot without shoal's header (magic {0:#010x})")]
    BadMagic(u32),
    #[error("checksum mismatch in slot {seq}: the data was damaged in flight")]
    Checksum { seq: u64 },
    #[error("slot {got} arrived where {expected} was due: a slot was lost or repeated")]
    Sequence { expected: u64, got: u64 },
    #[error("malformed slot {seq}: {detail}")]
    Malformed { seq: u64, detail: String },
    #[error("a message of {len} bytes is over the limit of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("send slot {0} was returned twice")]
    SlotReturnedTwice(u32),
}

fn read_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn checksum(header: &[u8], payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&header[..24]);
    hasher.update(payload);
    hasher.finalize()
}

/// How many slots of `slot_bytes` a message of `len` bytes takes (an empty message takes one).
pub fn slots_for(len: usize, slot_bytes: usize) -> usize {
    len.div_ceil(slot_bytes - HEADER_BYTES).max(1)
}

/// The sending side: numbers the slots it fills.
#[derive(Debug, Default)]
pub struct Framer {
    next_seq: u64,
}

impl Framer {
    /// Writes the fragment of `message` that starts at `offset` into `slot`, with its header; returns
    /// the offset of the next fragment (`message.len()` after the last).
    pub fn write_fragment(&mut self, message: &[u8], offset: usize, slot: &mut [u8]) -> usize {
        assert!(slot.len() > HEADER_BYTES && offset <= message.len(), "a slot bigger than its header");
        let len = (message.len() - offset).min(slot.len() - HEADER_BYTES);
        let payload = &message[offset..offset + len];
        let (header, body) = slot.split_at_mut(HEADER_BYTES);
        header[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        header[4..12].copy_from_slice(&self.next_seq.to_le_bytes());
        header[12..16].copy_from_slice(&(message.len() as u32).to_le_bytes());
        header[16..20].copy_from_slice(&(offset as u32).to_le_bytes());
        header[20..24].copy_from_slice(&(len as u32).to_le_bytes());
        header[28..32].fill(0);
        body[..len].copy_from_slice(payload);
        let crc = checksum(header, payload);
        header[24..28].copy_from_slice(&crc.to_le_bytes());
        self.next_seq += 1;
        offset + len
    }
}

/// The receiving side: checks each slot and puts the message back together.
#[derive(Debug)]
pub struct Reassembler {
    expected_seq: u64,
    max_message: usize,
    message: Vec<u8>,
    /// The length of the message being assembled, once its first fragment is in.
    pending_len: Option<usize>,
}

impl Reassembler {
    pub fn new(max_message: usize) -> Reassembler {
        Reassembler { expected_seq: 0, max_message, message: Vec::new(), pending_len: None }
    }

    /// Reads one received slot. `Ok(true)` when it completed a message: [`Reassembler::message`] holds
    /// it until the next call.
    pub fn accept(&mut self, slot: &[u8]) -> Result<bool, FramingError> {
        if slot.len() < HEADER_BYTES {
            return Err(FramingError::Short(slot.len()));
        }
        let magic = read_u32(slot, 0);
        if magic != MAGIC {
            return Err(FramingError::BadMagic(magic));
        }
        let seq = u64::from_le_bytes(slot[4..12].try_into().expect("8 bytes"));
        let (total, offset, len) =
            (read_u32(slot, 12) as usize, read_u32(slot, 16) as usize, read_u32(slot, 20) as usize);
        let malformed = |detail: String| FramingError::Malformed { seq, detail };
        if len > slot.len() - HEADER_BYTES {
            return Err(malformed(format!("a fragment of {len} bytes in a slot of {}", slot.len())));
        }
        let payload = &slot[HEADER_BYTES..HEADER_BYTES + len];
        if checksum(&slot[..HEADER_BYTES], payload) != read_u32(slot, 24) {
            return Err(FramingError::Checksum { seq });
        }
        if seq != self.expected_seq {
            return Err(FramingError::Sequence { expected: self.expected_seq, got: seq });
        }
        if total > self.max_message {
            return Err(FramingError::TooLarge { len: total, max: self.max_message });
        }
        match self.pending_len {
            None if offset != 0 => return Err(malformed(format!("a message starts at offset {offset}"))),
            None => {
                self.message.clear();
                self.pending_len = Some(total);
            }
            Some(expected) if expected != total || offset != self.message.len() => {
                return Err(malformed(format!(
                    "fragment at {offset} of {total} bytes does not continue {} of {expected}",
                    self.message.len()
                )));
            }
            Some(_) => {}
        }
        if offset + len > total || (len == 0 && total != 0) {
            return Err(malformed(format!("fragment {offset}+{len} outside a message of {total}")));
        }
        self.expected_seq += 1;
        self.message.extend_from_slice(payload);
        let complete = self.message.len() == total;
        if complete {
            self.pending_len = None;
        }
        Ok(complete)
    }

    /// The last completed message.
    pub fn message(&self) -> &[u8] {
        &self.message
    }
}

/// Send slots free to post. A slot is taken for a send and given back when its completion arrives;
/// with none free the sender waits for completions (the receiver has that many receives posted).
#[derive(Debug)]
pub struct SendCredits {
    free: VecDeque<u32>,
    slots: u32,
}

impl SendCredits {
    pub fn new(slots: u32) -> SendCredits {
        SendCredits { free: (0..slots).collect(), slots }
    }

    pub fn take(&mut self) -> Option<u32> {
        self.free.pop_front()
    }

    pub fn give_back(&mut self, slot: u32) -> Result<(), FramingError> {
        if slot >= self.slots || self.free.contains(&slot) {
            return Err(FramingError::SlotReturnedTwice(slot));
        }
        self.free.push_back(slot);
        Ok(())
    }

    pub fn available(&self) -> usize {
        self.free.len()
    }

    /// No send is in flight.
    pub fn all_free(&self) -> bool {
        self.free.len() == self.slots as usize
    }
}

#[cfg(test)]
mod tests;
