//! The eight bytes that open every connection: `SHOAL`, the protocol version, the connection's kind and
//! a reserved zero. A wrong magic or version ends the connection before anything else is read.

use super::NetError;

pub const MAGIC: &[u8; 5] = b"SHOAL";
/// Bumped when the wire protocol changes incompatibly; nodes of different versions refuse each other
/// with a message that says so. 3: a step's rows carry their drafted tokens' count, and a `Draft` frame
/// travels ahead of them (speculative decoding).
pub const PROTOCOL_VERSION: u8 = 3;

/// What a connection is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectionKind {
    /// A member's control connection (keyed by the cluster secret).
    Member = 1,
    /// A node joining with a code (keyed by a PAKE on the code).
    Join = 2,
    /// A link measurement (keyed by the cluster secret, then raw bytes).
    LinkProbe = 3,
    /// A data-plane connection between model stages (keyed by the cluster secret).
    Stage = 4,
    /// A copy of model files between members (keyed by the cluster secret).
    ModelCopy = 5,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Preamble {
    pub kind: ConnectionKind,
}

impl Preamble {
    pub const LEN: usize = 8;

    pub fn bytes(&self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[..5].copy_from_slice(MAGIC);
        b[5] = PROTOCOL_VERSION;
        b[6] = self.kind as u8;
        b
    }

    pub fn parse(b: &[u8; 8]) -> Result<Preamble, NetError> {
        if &b[..5] != MAGIC {
            return Err(NetError::BadPreamble("it did not start with SHOAL".into()));
        }
        if b[5] != PROTOCOL_VERSION {
            return Err(NetError::BadPreamble(format!(
                "it speaks protocol version {}, this node {}; run the same shoal version on every node",
                b[5], PROTOCOL_VERSION
            )));
        }
        let kind = match b[6] {
            1 => ConnectionKind::Member,
            2 => ConnectionKind::Join,
            3 => ConnectionKind::LinkProbe,
            4 => ConnectionKind::Stage,
            5 => ConnectionKind::ModelCopy,
            k => return Err(NetError::BadPreamble(format!("unknown connection kind {k}"))),
        };
        if b[7] != 0 {
            return Err(NetError::BadPreamble("reserved byte is not zero".into()));
        }
        Ok(Preamble { kind })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejections() {
        let p = Preamble { kind: ConnectionKind::Join };
        assert_eq!(Preamble::parse(&p.bytes()).unwrap(), p);
        let mut b = p.bytes();
        b[5] = 9;
        assert!(Preamble::parse(&b).unwrap_err().to_string().contains("version 9"));
        assert!(Preamble::parse(b"GET / HT").is_err());
    }
}
