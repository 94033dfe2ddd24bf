//! Throughput of a link, measured by a bulk transfer on a separate connection (so heartbeats never
//! queue behind it). The connection is authenticated with the cluster secret; the filler bytes travel
//! unencrypted so the figure is the link's, not the cipher's. Sizes grow until a transfer lasts long
//! enough to be meaningful.
//!
//! A node receives one transfer at a time (two senders would share its link and each see half), and
//! times it from its own "ready" to the last byte, so nothing queued before it was ready counts.

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

#[derive(Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ProbeMessage {
    Send { bytes: u64 },
    Ready,
    Received { bytes: u64, micros: u64 },
}

/// Bits per second from this node to the node at `addr`: transfers grow until one lasts long enough,
/// then one more of that size runs and the faster of the two counts (a single TCP loss recovery can
/// cost a short transfer a third of its rate).
pub async fn measure_outgoing(addr: SocketAddr, secret: &Psk) -> Result<u64, NetError> {
    let (mut reader, mut writer) = secure::connect(addr, ConnectionKind::LinkProbe, secret).await?;
    let mut sizes = SIZES.iter().copied();
    let mut size = sizes.next().expect("sizes");
    loop {
        let (bps, elapsed) = transfer(&mut reader, &mut writer, size).await?;
        match sizes.next() {
            Some(next) if elapsed < LONG_ENOUGH => size = next,
            _ => {
                let (again, _) = transfer(&mut reader, &mut writer, size).await?;
                return Ok(bps.max(again));
            }
        }
    }
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
        let Ok(ProbeMessage::Send { bytes }) = serde_json::from_slice(&frame) else {
            return Err(NetError::BadPreamble("malformed link probe request".into()));
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
