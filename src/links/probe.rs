//! Throughput of a link, measured by a bulk transfer on a separate connection (so heartbeats never
//! queue behind it). The connection is authenticated with the cluster secret; the filler bytes travel
//! unencrypted so the figure is the link's, not the cipher's. Sizes grow until a transfer lasts long
//! enough to be meaningful.
//!
//! A node receives one transfer at a time (two senders would share its link and each see half), and
//! times it from its own "ready" to the last byte, so nothing queued before it was ready counts.
//!
//! After the transfers, the same connection times the round trip of small frames between two waiting
//! threads ([`super::echo`]): the latency a model's sums and hops will see.

use super::echo;
use crate::net::secure::{self, Psk};
use crate::net::{ConnectionKind, NetError, SecureReader, SecureWriter};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::time::Duration;

/// Transfer sizes tried in turn.
const SIZES: [u64; 4] = [2 << 20, 16 << 20, 64 << 20, 256 << 20];
/// A transfer at least this long is taken as the result.
const LONG_ENOUGH: Duration = Duration::from_millis(250);
const MAX_FRAME: usize = 4096;
/// Most round trips a member may ask this node to echo.
const MAX_ECHO_ROUNDS: u32 = 256;

#[derive(Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ProbeMessage {
    Send {
        bytes: u64,
    },
    Ready,
    Received {
        bytes: u64,
        micros: u64,
    },
    /// "Send back each of my next `rounds` frames (and a few untimed ones first)"; the last request.
    Echo {
        rounds: u32,
    },
}

/// What one probe of a link found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Measured {
    /// Bits per second from this node to the peer.
    pub bps: u64,
    /// The median round trip of a small frame between waiting threads, in µs (None: the peer is older
    /// and does not echo, or the echo failed).
    pub round_trip_us: Option<u64>,
}

/// Bits per second from this node to the node at `addr`: transfers grow until one lasts long enough,
/// then one more of that size runs and the faster of the two counts (a single TCP loss recovery can
/// cost a short transfer a third of its rate). Then the round trip of small frames.
pub async fn measure_outgoing(addr: SocketAddr, secret: &Psk) -> Result<Measured, NetError> {
    let (mut reader, mut writer) = secure::connect(addr, ConnectionKind::LinkProbe, secret).await?;
    let mut sizes = SIZES.iter().copied();
    let mut size = sizes.next().expect("sizes");
    let bps = loop {
        let (bps, elapsed) = transfer(&mut reader, &mut writer, size).await?;
        match sizes.next() {
            Some(next) if elapsed < LONG_ENOUGH => size = next,
            _ => {
                let (again, _) = transfer(&mut reader, &mut writer, size).await?;
                break bps.max(again);
            }
        }
    };
    let round_trip_us =
        time_echo(reader, writer).await.inspect_err(|e| tracing::debug!("timing round trips to {addr}: {e}")).ok();
    Ok(Measured { bps, round_trip_us })
}

/// Asks the peer to echo small frames and times their round trips, on a thread that waits for them as
/// a model's do.
async fn time_echo(mut reader: SecureReader, mut writer: SecureWriter) -> Result<u64, NetError> {
    send(&mut writer, &ProbeMessage::Echo { rounds: echo::ROUNDS }).await?;
    let ready = reader.read_frame(MAX_FRAME).await?;
    if !matches!(serde_json::from_slice(&ready), Ok(ProbeMessage::Ready)) {
        return Err(NetError::BadPreamble("unexpected reply to an echo request".into()));
    }
    let mut stream = secure::into_stream(reader, writer)?;
    tokio::task::spawn_blocking(move || echo::time_round_trips(&mut stream)).await.map_err(|_| NetError::Closed)?
}

/// One transfer of `bytes`; returns bits per second and the receiver's time.
async fn transfer(
    reader: &mut SecureReader,
    writer: &mut SecureWriter,
    bytes: u64,
) -> Result<(u64, Duration), NetError> {
    send(writer, &ProbeMessage::Send { bytes }).await?;
    let ready = reader.read_frame(MAX_FRAME).await?;
    if !matches!(serde_json::from_slice(&ready), Ok(ProbeMessage::Ready)) {
        return Err(NetError::BadPreamble("unexpected reply to a link probe".into()));
    }
    writer.write_raw_filler(bytes).await?;
    let reply = reader.read_frame(MAX_FRAME).await?;
    let Ok(ProbeMessage::Received { bytes: got, micros }) = serde_json::from_slice(&reply) else {
        return Err(NetError::BadPreamble("unexpected reply to a link probe".into()));
    };
    let elapsed = Duration::from_micros(micros.max(1));
    Ok(((got as f64 * 8.0 / elapsed.as_secs_f64()) as u64, elapsed))
}

/// Serves one probe connection (after its handshake): receives transfers and reports their timing.
/// `one_at_a_time` is held while a transfer is received.
pub async fn serve(
    mut reader: SecureReader,
    mut writer: SecureWriter,
    one_at_a_time: &tokio::sync::Mutex<()>,
) -> Result<(), NetError> {
    loop {
        let frame = match reader.read_frame(MAX_FRAME).await {
            Err(NetError::Closed) => return Ok(()),
            other => other?,
        };
        let bytes = match serde_json::from_slice(&frame) {
            Ok(ProbeMessage::Send { bytes }) => bytes,
            Ok(ProbeMessage::Echo { rounds }) if rounds <= MAX_ECHO_ROUNDS => {
                let _turn = one_at_a_time.lock().await;
                send(&mut writer, &ProbeMessage::Ready).await?;
                let mut stream = secure::into_stream(reader, writer)?;
                return tokio::task::spawn_blocking(move || echo::echo(&mut stream, rounds))
                    .await
                    .map_err(|_| NetError::Closed)?;
            }
            _ => return Err(NetError::BadPreamble("malformed link probe request".into())),
        };
        if bytes > *SIZES.last().expect("sizes") {
            return Err(NetError::BadPreamble(format!("link probe of {bytes} bytes is too large")));
        }
        tracing::debug!("probe: {bytes} bytes requested by {:?}", reader.peer_addr());
        let _turn = one_at_a_time.lock().await;
        tracing::debug!("probe: ready for {:?}", reader.peer_addr());
        send(&mut writer, &ProbeMessage::Ready).await?;
        let started = std::time::Instant::now();
        reader.discard_raw(bytes).await?;
        let micros = started.elapsed().as_micros() as u64;
        tracing::debug!("probe: {bytes} bytes from {:?} in {micros} µs", reader.peer_addr());
        send(&mut writer, &ProbeMessage::Received { bytes, micros }).await?;
    }
}

async fn send(writer: &mut SecureWriter, message: &ProbeMessage) -> Result<(), NetError> {
    writer.write_frame(&serde_json::to_vec(message).expect("serialisable")).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node serving probes on loopback with `secret`: its address.
    async fn serving(secret: Psk) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let one_at_a_time = tokio::sync::Mutex::new(());
            while let Ok((mut socket, _)) = listener.accept().await {
                let Ok(preamble) = secure::read_preamble(&mut socket).await else { continue };
                // A prober without the secret fails its handshake and is not served.
                let Ok((reader, writer)) = secure::respond(socket, preamble, &secret).await else { continue };
                serve(reader, writer, &one_at_a_time).await.unwrap();
            }
        });
        addr
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_probe_times_the_throughput_and_the_round_trip_of_small_frames() {
        let addr = serving([4; 32]).await;
        let measured = measure_outgoing(addr, &[4; 32]).await.unwrap();
        assert!(measured.bps > 10_000_000, "loopback carries more than 10 Mbit/s: {measured:?}");
        // Loopback between two threads: more than nothing, far less than the agent's heartbeat interval.
        let rtt = measured.round_trip_us.expect("the echo ran");
        assert!((1..100_000).contains(&rtt), "{measured:?}");
        // A node without the secret gets nothing.
        assert!(measure_outgoing(addr, &[5; 32]).await.is_err());
    }

    #[tokio::test]
    async fn an_echo_of_too_many_rounds_is_refused() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let preamble = secure::read_preamble(&mut socket).await.unwrap();
            let (reader, writer) = secure::respond(socket, preamble, &[6; 32]).await.unwrap();
            serve(reader, writer, &tokio::sync::Mutex::new(())).await
        });
        let (_reader, mut writer) = secure::connect(addr, ConnectionKind::LinkProbe, &[6; 32]).await.unwrap();
        send(&mut writer, &ProbeMessage::Echo { rounds: MAX_ECHO_ROUNDS + 1 }).await.unwrap();
        let refused = server.await.unwrap().unwrap_err();
        assert!(refused.to_string().contains("malformed link probe request"), "{refused}");
    }
}
