//! One HTTP range request of a shard fetch, checked (a 206 whose `Content-Range` and length are exactly
//! what was asked), with its body streamed to a sink; and the progress meter every fetch reports through.

use super::{RangeReader, ShardError};
use crate::model::pull::{Hub, PullProgress, PullState};
use std::io::Read;
use std::ops::Range;
use std::time::{Duration, Instant};

/// Why a range request did not deliver all its bytes.
pub enum Failure {
    /// The connection broke after the bytes up to `reached` arrived intact: resume from there.
    Broken { reached: u64, reason: String },
    /// Nothing more can be trusted or fetched from this answer.
    Fatal(ShardError),
}

impl From<ShardError> for Failure {
    fn from(e: ShardError) -> Failure {
        Failure::Fatal(e)
    }
}

/// Where the bytes of an answer go: `sink(offset, bytes)`.
pub type Sink<'a> = dyn FnMut(u64, &[u8]) -> Result<(), ShardError> + 'a;

/// A URL answering range requests, asked through the hub's HTTP client (which sends the hub's token
/// only to the hub).
pub struct HubRanges {
    hub: Hub,
    url: String,
}

impl HubRanges {
    pub fn new(hub: &Hub, url: &str) -> HubRanges {
        HubRanges { hub: hub.clone(), url: url.to_string() }
    }
}

impl RangeReader for HubRanges {
    fn get(&mut self, range: Range<u64>, size: &mut Option<u64>, sink: &mut Sink<'_>) -> Result<u64, Failure> {
        get_range(&self.hub, &self.url, range, size, sink)
    }
}

/// Asks `url` for `range` and hands the body to `sink(offset, bytes)` as it arrives. `size` is the
/// whole file's length when known; the first answer tells it otherwise (then `range` may run past the
/// end of the file and is cut there). Returns the end of the bytes delivered.
fn get_range(
    hub: &Hub,
    url: &str,
    range: Range<u64>,
    size: &mut Option<u64>,
    sink: &mut Sink<'_>,
) -> Result<u64, Failure> {
    let (start, last) = (range.start, range.end - 1);
    let response =
        hub.get_range(url, &range).map_err(|reason| ShardError::Unreachable { url: url.to_string(), reason })?;
    let status = response.status().as_u16();
    let damaged = |reason: String| Failure::Fatal(ShardError::Damaged { url: url.to_string(), start, last, reason });
    if status == 200 {
        return Err(Failure::Fatal(ShardError::NoRanges { url: url.to_string() }));
    }
    if status != 206 {
        return Err(Failure::Fatal(ShardError::Status { url: url.to_string(), status, start, last }));
    }
    let header = response.headers().get("content-range").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let Some((answered, total)) = parse_content_range(&header) else {
        return Err(damaged(format!("its Content-Range {header:?} is not bytes FIRST-LAST/SIZE")));
    };
    if let Some(expected) = *size {
        if total != expected {
            return Err(Failure::Fatal(ShardError::WrongSize { url: url.to_string(), served: total, expected }));
        }
    }
    let end = range.end.min(total);
    if answered != (start..end) {
        let asked = format!("{start}-{}", end.saturating_sub(1));
        let got = format!("{}-{}", answered.start, answered.end.saturating_sub(1));
        return Err(damaged(format!("it holds bytes {got} instead of {asked}")));
    }
    *size = Some(total);
    let declared = response.body().content_length();
    if let Some(declared) = declared.filter(|&n| n != end - start) {
        return Err(damaged(format!("it announces {declared} bytes for the {} asked", end - start)));
    }
    let mut body = response.into_body().into_reader();
    let mut buffer = vec![0u8; 1 << 20];
    let mut at = start;
    loop {
        let n = match body.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Failure::Broken { reached: at, reason: format!("the connection broke: {e}") }),
        };
        if at + n as u64 > end {
            return Err(damaged(format!("it holds more than the {} bytes asked", end - start)));
        }
        sink(at, &buffer[..n])?;
        at += n as u64;
    }
    if at < end {
        let reason = format!("it ended after {} of {} bytes", at - start, end - start);
        // A length announced and not delivered is a broken connection; an answer without one that ends
        // early is a server that sent the wrong length.
        return Err(if declared.is_some() { Failure::Broken { reached: at, reason } } else { damaged(reason) });
    }
    Ok(end)
}

/// `bytes FIRST-LAST/SIZE` → (FIRST..LAST + 1, SIZE).
fn parse_content_range(value: &str) -> Option<(Range<u64>, u64)> {
    let (span, total) = value.trim().strip_prefix("bytes ")?.split_once('/')?;
    let (first, last) = span.split_once('-')?;
    let (first, last, total): (u64, u64, u64) = (first.parse().ok()?, last.parse().ok()?, total.parse().ok()?);
    (first <= last && last < total).then_some((first..last + 1, total))
}

/// Progress of one fetch, reported at most every 200 ms (and at every change of state).
pub(super) struct Meter<'a> {
    report: PullProgress,
    began: Instant,
    /// Bytes fetched over the network by this fetch.
    pub fetched: u64,
    last_report: Instant,
    callback: &'a mut dyn FnMut(&PullProgress),
}

impl<'a> Meter<'a> {
    pub fn new(file: &str, callback: &'a mut dyn FnMut(&PullProgress)) -> Meter<'a> {
        let report = PullProgress {
            file: file.to_string(),
            bytes_done: 0,
            bytes_total: 0,
            rate_bytes_per_second: 0,
            eta_seconds: None,
            state: PullState::Resolving,
        };
        callback(&report);
        let now = Instant::now();
        Meter { report, began: now, fetched: 0, last_report: now, callback }
    }

    /// The stage's bytes in all (`total`) and how many are already here (`done`).
    pub fn set(&mut self, done: u64, total: u64, state: PullState) {
        self.report.bytes_done = done;
        self.report.bytes_total = total;
        self.state(state);
    }

    pub fn state(&mut self, state: PullState) {
        self.report.state = state;
        if state == PullState::Done {
            self.report.eta_seconds = Some(0);
        }
        self.emit();
    }

    /// `n` more bytes arrived.
    pub fn add(&mut self, n: u64) {
        self.fetched += n;
        self.report.bytes_done += n;
        if self.last_report.elapsed() >= Duration::from_millis(200) || self.report.bytes_done == self.report.bytes_total
        {
            self.emit();
        }
    }

    fn emit(&mut self) {
        let seconds = self.began.elapsed().as_secs_f64().max(1e-3);
        let rate = (self.fetched as f64 / seconds) as u64;
        self.report.rate_bytes_per_second = rate;
        if self.report.state != PullState::Done {
            let left = self.report.bytes_total.saturating_sub(self.report.bytes_done);
            self.report.eta_seconds = (rate > 0).then(|| left / rate);
        }
        (self.callback)(&self.report);
        self.last_report = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_ranges() {
        assert_eq!(parse_content_range("bytes 0-99/1000"), Some((0..100, 1000)));
        assert_eq!(parse_content_range("bytes 5-4/1000"), None);
        assert_eq!(parse_content_range("bytes 0-1000/1000"), None);
        assert_eq!(parse_content_range("bytes */1000"), None);
    }
}
