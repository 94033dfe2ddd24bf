//! The Noise handshake (`NNpsk0`: both sides prove they hold the same 32-byte pre-shared key, and agree
//! fresh session keys) and the encrypted record stream after it, split into a reader and a writer half
//! that can live in different tasks. Each direction counts its own nonces, so a replayed, dropped or
//! reordered record fails authentication.

use super::frame::{self, MAX_RECORD_PLAINTEXT};
use super::{ConnectionKind, NetError, Preamble, HANDSHAKE_TIMEOUT};
use snow::StatelessTransportState;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

const PATTERN: &str = "Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s";
const TAG: usize = 16;
/// Handshake messages of this pattern are 48 bytes; anything much larger is not a handshake.
const MAX_HANDSHAKE_MESSAGE: usize = 256;

/// A 32-byte pre-shared key.
pub type Psk = [u8; 32];

/// Connects to `addr`, sends the preamble of `kind` and completes the handshake as initiator.
pub async fn connect(
    addr: SocketAddr,
    kind: ConnectionKind,
    psk: &Psk,
) -> Result<(SecureReader, SecureWriter), NetError> {
    let mut stream =
        tokio::time::timeout(HANDSHAKE_TIMEOUT, TcpStream::connect(addr)).await.map_err(|_| NetError::Timeout)??;
    stream.set_nodelay(true)?;
    let preamble = Preamble { kind };
    stream.write_all(&preamble.bytes()).await?;
    initiate(stream, preamble, psk).await
}

/// Reads and checks the preamble of an accepted connection.
pub async fn read_preamble(stream: &mut TcpStream) -> Result<Preamble, NetError> {
    let mut b = [0u8; Preamble::LEN];
    tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.read_exact(&mut b)).await.map_err(|_| NetError::Timeout)??;
    Preamble::parse(&b)
}

/// The Noise state for one side of a handshake bound to `preamble` (the prologue: a peer that sent
/// another preamble cannot complete it).
fn handshake_state(preamble: Preamble, psk: &Psk, initiator: bool) -> Result<snow::HandshakeState, NetError> {
    let prologue = preamble.bytes();
    let builder = snow::Builder::new(PATTERN.parse().expect("valid pattern"))
        .prologue(&prologue)
        .and_then(|b| b.psk(0, psk))
        .map_err(|_| NetError::Handshake)?;
    if initiator { builder.build_initiator() } else { builder.build_responder() }.map_err(|_| NetError::Handshake)
}

/// Completes the handshake as initiator on a stream whose preamble was already sent.
pub async fn initiate(
    mut stream: TcpStream,
    preamble: Preamble,
    psk: &Psk,
) -> Result<(SecureReader, SecureWriter), NetError> {
    let mut hs = handshake_state(preamble, psk, true)?;
    let steps = async {
        let mut buf = [0u8; MAX_HANDSHAKE_MESSAGE];
        let n = hs.write_message(&[], &mut buf).map_err(|_| NetError::Handshake)?;
        write_handshake(&mut stream, &buf[..n]).await?;
        let msg = read_handshake(&mut stream).await?;
        hs.read_message(&msg, &mut buf).map_err(|_| NetError::Handshake)?;
        Ok::<_, NetError>(())
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, steps).await.map_err(|_| NetError::Timeout)??;
    let transport = hs.into_stateless_transport_mode().map_err(|_| NetError::Handshake)?;
    Ok(split(stream, transport))
}

/// Completes the handshake as responder on a stream whose preamble was already read.
pub async fn respond(
    mut stream: TcpStream,
    preamble: Preamble,
    psk: &Psk,
) -> Result<(SecureReader, SecureWriter), NetError> {
    stream.set_nodelay(true)?;
    let mut hs = handshake_state(preamble, psk, false)?;
    let steps = async {
        let mut buf = [0u8; MAX_HANDSHAKE_MESSAGE];
        let msg = read_handshake(&mut stream).await?;
        // With a different key the first message does not decrypt: the peer is refused here.
        hs.read_message(&msg, &mut buf).map_err(|_| NetError::Handshake)?;
        let n = hs.write_message(&[], &mut buf).map_err(|_| NetError::Handshake)?;
        write_handshake(&mut stream, &buf[..n]).await?;
        Ok::<_, NetError>(())
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, steps).await.map_err(|_| NetError::Timeout)??;
    let transport = hs.into_stateless_transport_mode().map_err(|_| NetError::Handshake)?;
    Ok(split(stream, transport))
}

async fn write_handshake(stream: &mut TcpStream, msg: &[u8]) -> Result<(), NetError> {
    let mut out = Vec::with_capacity(2 + msg.len());
    out.extend_from_slice(&(msg.len() as u16).to_le_bytes());
    out.extend_from_slice(msg);
    stream.write_all(&out).await?;
    Ok(())
}

async fn read_handshake(stream: &mut TcpStream) -> Result<Vec<u8>, NetError> {
    let mut len = [0u8; 2];
    stream.read_exact(&mut len).await?;
    let len = u16::from_le_bytes(len) as usize;
    if len > MAX_HANDSHAKE_MESSAGE {
        return Err(NetError::Handshake);
    }
    let mut msg = vec![0u8; len];
    stream.read_exact(&mut msg).await?;
    Ok(msg)
}

fn split(stream: TcpStream, transport: StatelessTransportState) -> (SecureReader, SecureWriter) {
    let peer = stream.peer_addr().ok();
    let local = stream.local_addr().ok();
    let (read, write) = stream.into_split();
    let transport = Arc::new(transport);
    let opener = Opener { transport: transport.clone(), nonce: 0, record: Vec::new(), plain: Vec::new() };
    let sealer = Sealer { transport, nonce: 0, out: Vec::new(), plain: Vec::new() };
    (SecureReader { read, opener, peer, local }, SecureWriter { write, sealer })
}

/// Decrypts one direction's records, in order.
struct Opener {
    transport: Arc<StatelessTransportState>,
    nonce: u64,
    record: Vec<u8>,
    plain: Vec<u8>,
}

impl Opener {
    /// Checks a record's length prefix and sizes the record buffer for it.
    fn expect(&mut self, len: [u8; 2]) -> Result<&mut [u8], NetError> {
        let len = u16::from_le_bytes(len) as usize;
        if len < TAG {
            return Err(NetError::Forged);
        }
        self.record.resize(len, 0);
        Ok(&mut self.record)
    }

    /// Decrypts the record read into the buffer and appends its chunk to `frame`; true when the frame
    /// is complete.
    fn open_into(&mut self, frame: &mut Vec<u8>, max_frame: usize) -> Result<bool, NetError> {
        self.plain.resize(self.record.len(), 0);
        let n = self.transport.read_message(self.nonce, &self.record, &mut self.plain).map_err(|_| NetError::Forged)?;
        self.nonce += 1;
        Ok(frame::append(&self.plain[..n], frame, max_frame)?)
    }
}

/// Encrypts the other direction's frames into records.
struct Sealer {
    transport: Arc<StatelessTransportState>,
    nonce: u64,
    out: Vec<u8>,
    plain: Vec<u8>,
}

impl Sealer {
    /// The records of `frame`, encrypted and length-prefixed, ready to write in one go.
    fn seal(&mut self, frame: &[u8]) -> Result<&[u8], NetError> {
        self.out.clear();
        let mut failed = false;
        let (transport, out, nonce, plain) = (&self.transport, &mut self.out, &mut self.nonce, &mut self.plain);
        frame::split(frame, |record| {
            plain.resize(MAX_RECORD_PLAINTEXT + TAG, 0);
            match transport.write_message(*nonce, record, plain) {
                Ok(n) => {
                    out.extend_from_slice(&(n as u16).to_le_bytes());
                    out.extend_from_slice(&plain[..n]);
                    *nonce += 1;
                }
                Err(_) => failed = true,
            }
        });
        if failed {
            return Err(NetError::Forged);
        }
        Ok(&self.out)
    }
}

/// The receiving half of an established connection.
pub struct SecureReader {
    read: OwnedReadHalf,
    opener: Opener,
    peer: Option<SocketAddr>,
    local: Option<SocketAddr>,
}

impl SecureReader {
    /// The peer's address as this side sees it.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// This side's address of the connection (which tells the interface it uses).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local
    }

    /// Reads the next frame, at most `max_frame` bytes. Any malformed or forged record is an error
    /// (the caller closes the connection).
    pub async fn read_frame(&mut self, max_frame: usize) -> Result<Vec<u8>, NetError> {
        let mut frame = Vec::new();
        self.read_frame_into(max_frame, &mut frame).await?;
        Ok(frame)
    }

    /// Reads the next frame into `frame` (replacing its contents, reusing its allocation).
    pub async fn read_frame_into(&mut self, max_frame: usize, frame: &mut Vec<u8>) -> Result<(), NetError> {
        frame.clear();
        loop {
            let mut len = [0u8; 2];
            match self.read.read_exact(&mut len).await {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(NetError::Closed),
                Err(e) => return Err(e.into()),
            }
            let record = self.opener.expect(len)?;
            self.read.read_exact(record).await?;
            if self.opener.open_into(frame, max_frame)? {
                return Ok(());
            }
        }
    }

    /// Reads and discards `n` raw (unencrypted) bytes the peer sends between frames (link measurements).
    pub async fn discard_raw(&mut self, n: u64) -> Result<(), NetError> {
        let mut buf = vec![0u8; 256 * 1024];
        let mut left = n;
        while left > 0 {
            let want = buf.len().min(left as usize);
            let got = self.read.read(&mut buf[..want]).await?;
            if got == 0 {
                return Err(NetError::Closed);
            }
            left -= got as u64;
        }
        Ok(())
    }

    /// The raw socket half, for bulk bytes that need no encryption (link measurements).
    pub fn into_raw(self) -> OwnedReadHalf {
        self.read
    }
}

/// The sending half of an established connection.
pub struct SecureWriter {
    write: OwnedWriteHalf,
    sealer: Sealer,
}

impl SecureWriter {
    /// Encrypts and sends `frame` (split into records as needed) in one write.
    pub async fn write_frame(&mut self, frame: &[u8]) -> Result<(), NetError> {
        let bytes = self.sealer.seal(frame)?;
        self.write.write_all(bytes).await?;
        Ok(())
    }

    /// Sends `n` raw (unencrypted) filler bytes between frames (link measurements).
    pub async fn write_raw_filler(&mut self, n: u64) -> Result<(), NetError> {
        let block = vec![0x5au8; 256 * 1024];
        let mut left = n;
        while left > 0 {
            let len = block.len().min(left as usize);
            self.write.write_all(&block[..len]).await?;
            left -= len as u64;
        }
        Ok(())
    }

    /// The raw socket half, for bulk bytes that need no encryption (link measurements).
    pub fn into_raw(self) -> OwnedWriteHalf {
        self.write
    }
}

/// An established connection turned into blocking halves, for a thread that does its own I/O (the
/// stages' hot path: no hand-off between threads per frame). Call inside the tokio runtime.
pub fn into_blocking(reader: SecureReader, writer: SecureWriter) -> Result<(BlockingReader, BlockingWriter), NetError> {
    let stream = reader.read.reunite(writer.write).map_err(|_| NetError::Closed)?.into_std()?;
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    let read = stream.try_clone()?;
    Ok((BlockingReader { stream: read, opener: reader.opener }, BlockingWriter { stream, sealer: writer.sealer }))
}

pub struct BlockingReader {
    stream: std::net::TcpStream,
    opener: Opener,
}

impl BlockingReader {
    /// As [`SecureReader::read_frame_into`], blocking.
    pub fn read_frame_into(&mut self, max_frame: usize, frame: &mut Vec<u8>) -> Result<(), NetError> {
        use std::io::Read;
        frame.clear();
        loop {
            let mut len = [0u8; 2];
            match self.stream.read_exact(&mut len) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(NetError::Closed),
                Err(e) => return Err(e.into()),
            }
            let record = self.opener.expect(len)?;
            self.stream.read_exact(record)?;
            if self.opener.open_into(frame, max_frame)? {
                return Ok(());
            }
        }
    }
}

/// One connection used from a single thread without a runtime, both directions at once, its socket
/// non-blocking: frames are sealed into bytes waiting to be written, and bytes read are opened into
/// frames as their records complete. What a tensor-parallel rank needs to write to and read from every
/// other rank of its group at once ([`crate::transport::group`]).
pub struct SecureStream {
    stream: std::net::TcpStream,
    sealer: Sealer,
    opener: Opener,
    /// Sealed bytes not yet written, from `written` on.
    out: Vec<u8>,
    written: usize,
    /// Bytes read and not yet opened, from `read` on.
    raw: Vec<u8>,
    read: usize,
    /// The peer closed its side; what it sent before is still read first.
    closed: bool,
}

/// A connection made async, for [`SecureStream`] use.
pub fn into_stream(reader: SecureReader, writer: SecureWriter) -> Result<SecureStream, NetError> {
    let stream = reader.read.reunite(writer.write).map_err(|_| NetError::Closed)?.into_std()?;
    stream.set_nonblocking(true)?;
    stream.set_nodelay(true)?;
    Ok(SecureStream {
        stream,
        sealer: writer.sealer,
        opener: reader.opener,
        out: Vec::new(),
        written: 0,
        raw: Vec::new(),
        read: 0,
        closed: false,
    })
}

impl SecureStream {
    pub fn socket(&self) -> &std::net::TcpStream {
        &self.stream
    }

    /// Seals `frame` behind whatever is still to be written.
    pub fn queue(&mut self, frame: &[u8]) -> Result<(), NetError> {
        if self.written == self.out.len() {
            self.out.clear();
            self.written = 0;
        }
        let sealed = self.sealer.seal(frame)?;
        self.out.extend_from_slice(sealed);
        Ok(())
    }

    /// Whether sealed bytes wait to be written.
    pub fn has_output(&self) -> bool {
        self.written < self.out.len()
    }

    /// Writes what the socket takes now.
    pub fn write_some(&mut self) -> Result<(), NetError> {
        use std::io::Write;
        while self.written < self.out.len() {
            match self.stream.write(&self.out[self.written..]) {
                Ok(0) => return Err(NetError::Closed),
                Ok(n) => self.written += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Reads what the socket has now. The peer closing is an error, but only once the bytes it sent
    /// before have been handed out: a call that read some before finding the end returns them, and the
    /// next one the error, so that a peer's last frames before it closed are not lost.
    pub fn read_some(&mut self) -> Result<(), NetError> {
        use std::io::Read;
        if self.closed {
            return Err(NetError::Closed);
        }
        if self.read == self.raw.len() {
            self.raw.clear();
            self.read = 0;
        }
        let before = self.raw.len();
        let mut chunk = [0u8; 64 * 1024];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) if self.raw.len() > before => {
                    self.closed = true;
                    return Ok(());
                }
                Ok(0) => return Err(NetError::Closed),
                Ok(n) => self.raw.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Opens the records read so far into `frame` (a frame being reassembled, cleared by the caller
    /// before its first record); returns whether a frame is complete. Bytes after it stay for the next.
    pub fn next_frame(&mut self, frame: &mut Vec<u8>, max_frame: usize) -> Result<bool, NetError> {
        loop {
            let pending = &self.raw[self.read..];
            if pending.len() < 2 {
                return Ok(false);
            }
            let len = u16::from_le_bytes([pending[0], pending[1]]) as usize;
            if pending.len() < 2 + len {
                return Ok(false);
            }
            self.opener.expect([pending[0], pending[1]])?.copy_from_slice(&pending[2..2 + len]);
            self.read += 2 + len;
            if self.opener.open_into(frame, max_frame)? {
                return Ok(true);
            }
        }
    }
}

/// Shuts a blocking connection down in both directions when dropped.
pub struct ConnectionCloser(std::net::TcpStream);

impl Drop for ConnectionCloser {
    fn drop(&mut self) {
        let _ = self.0.shutdown(std::net::Shutdown::Both);
    }
}

pub struct BlockingWriter {
    stream: std::net::TcpStream,
    sealer: Sealer,
}

impl BlockingWriter {
    /// A handle that can shut the connection down from elsewhere (ending a thread blocked reading it).
    pub fn closer(&self) -> std::io::Result<ConnectionCloser> {
        Ok(ConnectionCloser(self.stream.try_clone()?))
    }

    /// As [`SecureWriter::write_frame`], blocking.
    pub fn write_frame(&mut self, frame: &[u8]) -> Result<(), NetError> {
        use std::io::Write;
        let bytes = self.sealer.seal(frame)?;
        self.stream.write_all(bytes)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    async fn pair(
        client_psk: Psk,
        server_psk: Psk,
    ) -> (Result<(SecureReader, SecureWriter), NetError>, Result<(SecureReader, SecureWriter), NetError>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let p = read_preamble(&mut s).await?;
            respond(s, p, &server_psk).await
        });
        let client = connect(addr, ConnectionKind::Member, &client_psk).await;
        (client, server.await.unwrap())
    }

    #[tokio::test]
    async fn frames_cross_in_both_directions() {
        let (client, server) = pair([7; 32], [7; 32]).await;
        let ((mut cr, mut cw), (mut sr, mut sw)) = (client.unwrap(), server.unwrap());
        let big: Vec<u8> = (0..200_000).map(|i| (i % 251) as u8).collect();
        cw.write_frame(b"hello").await.unwrap();
        cw.write_frame(&big).await.unwrap();
        assert_eq!(sr.read_frame(1 << 20).await.unwrap(), b"hello");
        assert_eq!(sr.read_frame(1 << 20).await.unwrap(), big);
        sw.write_frame(b"").await.unwrap();
        assert_eq!(cr.read_frame(16).await.unwrap(), b"");
        // A frame above the reader's cap is refused.
        cw.write_frame(&big).await.unwrap();
        assert!(matches!(sr.read_frame(1000).await, Err(NetError::Frame(_))));
    }

    #[tokio::test]
    async fn a_different_secret_is_refused_on_both_sides() {
        let (client, server) = pair([1; 32], [2; 32]).await;
        assert!(matches!(server, Err(NetError::Handshake)));
        assert!(client.is_err());
    }

    #[tokio::test]
    async fn tampered_records_fail_authentication() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let p = read_preamble(&mut s).await.unwrap();
            let (mut r, _w) = respond(s, p, &[3; 32]).await.unwrap();
            r.read_frame(1 << 16).await
        });
        let (_r, w) = connect(addr, ConnectionKind::Member, &[3; 32]).await.unwrap();
        // A record of garbage with a plausible length, written under the encryption.
        let mut raw = w.into_raw();
        let mut junk = vec![40u8, 0];
        junk.extend_from_slice(&[0xab; 40]);
        raw.write_all(&junk).await.unwrap();
        assert!(matches!(server.await.unwrap(), Err(NetError::Forged)));
    }

    #[tokio::test]
    async fn a_peers_last_frames_before_it_closes_are_read_then_the_close() {
        let (client, server) = pair([9; 32], [9; 32]).await;
        let (mut sender, mut receiver) = (into_stream_pair(client.unwrap()), into_stream_pair(server.unwrap()));
        sender.queue(b"last words").unwrap();
        sender.queue(b"and these").unwrap();
        sender.write_some().unwrap();
        assert!(!sender.has_output());
        drop(sender);
        std::thread::sleep(std::time::Duration::from_millis(50));
        // Both frames and the end are in the socket; one read finds them all.
        receiver.read_some().unwrap();
        let mut frame = Vec::new();
        assert!(receiver.next_frame(&mut frame, 64).unwrap());
        assert_eq!(frame, b"last words");
        frame.clear();
        assert!(receiver.next_frame(&mut frame, 64).unwrap());
        assert_eq!(frame, b"and these");
        assert!(matches!(receiver.read_some(), Err(NetError::Closed)));
    }

    fn into_stream_pair((reader, writer): (SecureReader, SecureWriter)) -> SecureStream {
        into_stream(reader, writer).unwrap()
    }
}
