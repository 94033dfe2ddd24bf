//! The join exchange on a join connection, both sides. The joiner sends its SPAKE2 message; the member
//! answers with a status byte (0, or why it refuses) and its own message; both derive a key from the
//! code and run the Noise handshake with it (a different code fails here, on both sides); inside, the
//! joiner introduces itself and the member replies with the cluster secret and the members.

use super::membership::{ClusterSecret, MemberRecord};
use super::messages::{self, JoinMessage};
use super::pairing::{self, Refusal};
use crate::net::secure::{self, Psk};
use crate::net::{ConnectionKind, NetError, Preamble, SecureReader, SecureWriter, HANDSHAKE_TIMEOUT};
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MAX_SPAKE_MESSAGE: usize = 128;
const MAX_JOIN_FRAME: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("{0}")]
    Refused(&'static str),
    /// The member refused for the rate of join attempts it gets (someone may be flooding it): worth
    /// trying again shortly.
    #[error("{}", Refusal::RateLimited.explain())]
    RateLimited,
    #[error("the join code is wrong or has expired (the key exchange with {0} failed); check the code shown by `shoal code`")]
    WrongCode(SocketAddr),
    #[error("could not reach {addr}: {source}")]
    Unreachable { addr: SocketAddr, source: NetError },
    #[error("the node at {addr} broke off the join: {reason}")]
    Protocol { addr: SocketAddr, reason: String },
}

/// Joins through the member at `addr` with `code`; returns the cluster secret and the members.
pub async fn request(
    addr: SocketAddr,
    code: &str,
    me: MemberRecord,
) -> Result<(ClusterSecret, Vec<MemberRecord>), JoinError> {
    let unreachable = |source: NetError| JoinError::Unreachable { addr, source };
    let protocol = |reason: String| JoinError::Protocol { addr, reason };
    let mut stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| unreachable(NetError::Timeout))?
        .map_err(|e| unreachable(e.into()))?;
    stream.set_nodelay(true).map_err(|e| unreachable(e.into()))?;
    let preamble = Preamble { kind: ConnectionKind::Join };
    let (state, message) = pairing::start(code);
    let exchange = async {
        let mut hello = preamble.bytes().to_vec();
        hello.push(message.len() as u8);
        hello.extend_from_slice(&message);
        stream.write_all(&hello).await?;
        let mut status = [0u8; 1];
        stream.read_exact(&mut status).await?;
        if status[0] != 0 {
            return Ok(Err(status[0]));
        }
        let reply = read_short(&mut stream).await?;
        Ok::<_, std::io::Error>(Ok(reply))
    };
    let reply = tokio::time::timeout(HANDSHAKE_TIMEOUT, exchange)
        .await
        .map_err(|_| unreachable(NetError::Timeout))?
        .map_err(|e| unreachable(e.into()))?;
    let reply = match reply {
        Ok(reply) => reply,
        Err(code) => {
            return Err(match Refusal::from_byte(code) {
                Some(Refusal::RateLimited) => JoinError::RateLimited,
                Some(refusal) => JoinError::Refused(refusal.explain()),
                None => protocol(format!("unknown refusal {code}")),
            })
        }
    };
    let key = pairing::finish(state, &reply).ok_or_else(|| protocol("malformed key exchange".into()))?;
    let (mut reader, mut writer) =
        secure::initiate(stream, preamble, &key).await.map_err(|_| JoinError::WrongCode(addr))?;
    writer
        .write_frame(&messages::encode(&JoinMessage::Request { node: me }))
        .await
        .map_err(|e| protocol(e.to_string()))?;
    let frame = tokio::time::timeout(HANDSHAKE_TIMEOUT, reader.read_frame(MAX_JOIN_FRAME))
        .await
        .map_err(|_| protocol("no answer".into()))?
        .map_err(|e| match e {
            NetError::Closed | NetError::Forged => JoinError::WrongCode(addr),
            e => protocol(e.to_string()),
        })?;
    match messages::decode::<JoinMessage>(&frame) {
        Ok(JoinMessage::Accepted { secret, members }) => Ok((secret, members)),
        Ok(other) => Err(protocol(format!("unexpected {other:?}"))),
        Err(e) => Err(protocol(e.to_string())),
    }
}

async fn read_short(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 1];
    stream.read_exact(&mut len).await?;
    let len = len[0] as usize;
    if len == 0 || len > MAX_SPAKE_MESSAGE {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "bad key-exchange message length"));
    }
    let mut msg = vec![0u8; len];
    stream.read_exact(&mut msg).await?;
    Ok(msg)
}

/// The member's side, up to the joiner's request: reads the joiner's SPAKE2 message, asks `decide`
/// whether a code is active (and which), answers, and completes the handshake with the derived key.
/// Returns the secure channel and the joiner's request, or why it failed.
pub async fn accept(
    mut stream: TcpStream,
    decide: impl FnOnce() -> Result<String, Refusal>,
) -> Result<(SecureReader, SecureWriter, MemberRecord), AcceptError> {
    let preamble = Preamble { kind: ConnectionKind::Join };
    let their_message = tokio::time::timeout(HANDSHAKE_TIMEOUT, read_short(&mut stream))
        .await
        .map_err(|_| AcceptError::Broken("timed out".into()))?
        .map_err(|e| AcceptError::Broken(e.to_string()))?;
    let code = match decide() {
        Ok(code) => code,
        Err(refusal) => {
            let _ = stream.write_all(&[refusal as u8]).await;
            return Err(AcceptError::Refused(refusal));
        }
    };
    let (state, message) = pairing::start(&code);
    let mut reply = vec![0u8, message.len() as u8];
    reply.extend_from_slice(&message);
    stream.write_all(&reply).await.map_err(|e| AcceptError::Broken(e.to_string()))?;
    let key: Psk = pairing::finish(state, &their_message).ok_or(AcceptError::WrongCode)?;
    let (mut reader, writer) = secure::respond(stream, preamble, &key).await.map_err(|e| match e {
        NetError::Handshake => AcceptError::WrongCode,
        e => AcceptError::Broken(e.to_string()),
    })?;
    let frame = tokio::time::timeout(HANDSHAKE_TIMEOUT, reader.read_frame(MAX_JOIN_FRAME))
        .await
        .map_err(|_| AcceptError::Broken("timed out".into()))?
        .map_err(|e| AcceptError::Broken(e.to_string()))?;
    match messages::decode::<JoinMessage>(&frame) {
        Ok(JoinMessage::Request { node }) => Ok((reader, writer, node)),
        Ok(_) => Err(AcceptError::Broken("unexpected message".into())),
        Err(e) => Err(AcceptError::Broken(e.to_string())),
    }
}

#[derive(Debug)]
pub enum AcceptError {
    Refused(Refusal),
    WrongCode,
    Broken(String),
}

/// Completes an accepted join: sends the secret and the members.
pub async fn welcome(
    mut writer: SecureWriter,
    secret: ClusterSecret,
    members: Vec<MemberRecord>,
) -> Result<(), NetError> {
    writer.write_frame(&messages::encode(&JoinMessage::Accepted { secret, members })).await
}
