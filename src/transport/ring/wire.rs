//! The messages on a ring link's TCP connection once RDMA was offered: frames with their numbers and
//! the switch to TCP (sender → receiver); acknowledgements and requests to fall back (receiver →
//! sender). One tag byte, a little-endian frame number, then the rest.

use crate::net::NetError;

/// Sender → receiver.
#[derive(Debug, PartialEq, Eq)]
pub enum Forward<'a> {
    /// Frame `seq`, sent over TCP.
    Frame { seq: u64, bytes: &'a [u8] },
    /// From frame `from` on, frames come over TCP (some of them may be repeats).
    Switch { from: u64 },
}

/// Receiver → sender.
#[derive(Debug, PartialEq, Eq)]
pub enum Backward {
    /// Every frame up to and including `seq` arrived over RDMA.
    Ack { seq: u64 },
    /// RDMA failed here; send again from frame `from`, over TCP.
    Fallback { from: u64, reason: String },
}

fn header(tag: u8, seq: u64) -> [u8; 9] {
    let mut h = [0; 9];
    h[0] = tag;
    h[1..].copy_from_slice(&seq.to_le_bytes());
    h
}

fn split(message: &[u8]) -> Result<(u8, u64, &[u8]), NetError> {
    if message.len() < 9 {
        return Err(NetError::BadPreamble(format!("a ring message of {} bytes is too short", message.len())));
    }
    let seq = u64::from_le_bytes(message[1..9].try_into().expect("8 bytes"));
    Ok((message[0], seq, &message[9..]))
}

impl Forward<'_> {
    /// Writes the message into `out` (cleared first).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.clear();
        match self {
            Forward::Frame { seq, bytes } => {
                out.extend_from_slice(&header(b'F', *seq));
                out.extend_from_slice(bytes);
            }
            Forward::Switch { from } => out.extend_from_slice(&header(b'S', *from)),
        }
    }

    pub fn decode(message: &[u8]) -> Result<Forward<'_>, NetError> {
        match split(message)? {
            (b'F', seq, bytes) => Ok(Forward::Frame { seq, bytes }),
            (b'S', from, _) => Ok(Forward::Switch { from }),
            (tag, ..) => Err(NetError::BadPreamble(format!("an unknown ring message (tag {tag:#04x})"))),
        }
    }
}

impl Backward {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Backward::Ack { seq } => header(b'A', *seq).to_vec(),
            Backward::Fallback { from, reason } => [&header(b'R', *from)[..], reason.as_bytes()].concat(),
        }
    }

    pub fn decode(message: &[u8]) -> Result<Backward, NetError> {
        match split(message)? {
            (b'A', seq, _) => Ok(Backward::Ack { seq }),
            (b'R', from, reason) => {
                Ok(Backward::Fallback { from, reason: String::from_utf8_lossy(reason).into_owned() })
            }
            (tag, ..) => Err(NetError::BadPreamble(format!("an unknown ring message (tag {tag:#04x})"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_survive_the_wire_and_garbage_is_refused() {
        let mut out = Vec::new();
        for message in [
            Forward::Frame { seq: 7, bytes: b"hidden" },
            Forward::Frame { seq: 0, bytes: b"" },
            Forward::Switch { from: 3 },
        ] {
            message.encode(&mut out);
            assert_eq!(Forward::decode(&out).unwrap(), message);
        }
        for message in
            [Backward::Ack { seq: u64::MAX }, Backward::Fallback { from: 9, reason: "slot 4 damaged".into() }]
        {
            assert_eq!(Backward::decode(&message.encode()).unwrap(), message);
        }
        assert!(Forward::decode(b"F1234").is_err());
        assert!(Forward::decode(b"X12345678").is_err());
        assert!(Backward::decode(b"F12345678").is_err());
    }
}
