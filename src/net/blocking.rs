//! Waiting on a [`SecureStream`] from a thread of its own (no runtime): until the socket is ready, until
//! a whole frame has gone out, until the next frame has come, each bounded by an optional deadline. A
//! tensor-parallel group's handshakes and a link probe's echo use them; a timeout is an I/O error of
//! kind `TimedOut`.

use super::secure::SecureStream;
use super::NetError;
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use std::time::{Duration, Instant};

fn timed_out() -> NetError {
    std::io::Error::from(std::io::ErrorKind::TimedOut).into()
}

impl SecureStream {
    /// Waits until the socket is ready for `events` (or closed), at most until `deadline` (none: as long
    /// as it takes).
    pub fn wait_until(&self, events: PollFlags, deadline: Option<Instant>) -> Result<(), NetError> {
        let left = match deadline {
            Some(d) => Some(d.checked_duration_since(Instant::now()).ok_or_else(timed_out)?),
            None => None,
        };
        let timeout = left.map(|d| Timespec { tv_sec: d.as_secs() as _, tv_nsec: d.subsec_nanos() as _ });
        let mut fds = [PollFd::new(self.socket(), events)];
        match poll(&mut fds, timeout.as_ref()) {
            Ok(0) => Err(timed_out()),
            Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
            Err(e) => Err(std::io::Error::from(e).into()),
        }
    }

    /// Sends `frame` and waits until the socket has taken all of it.
    pub fn send_waiting(&mut self, frame: &[u8], deadline: Option<Instant>) -> Result<(), NetError> {
        self.queue(frame)?;
        loop {
            self.write_some()?;
            if !self.has_output() {
                return Ok(());
            }
            self.wait_until(PollFlags::OUT, deadline)?;
        }
    }

    /// Receives the next frame (of at most `max` bytes) into `frame`, cleared first: looking for it
    /// without sleeping for `spin` (a frame due within microseconds costs less to catch than a sleeping
    /// thread's wake-up), then sleeping until the socket has more.
    pub fn recv_waiting(
        &mut self,
        frame: &mut Vec<u8>,
        max: usize,
        deadline: Option<Instant>,
        spin: Duration,
    ) -> Result<(), NetError> {
        frame.clear();
        let started = Instant::now();
        loop {
            if self.next_frame(frame, max)? {
                return Ok(());
            }
            if started.elapsed() < spin {
                std::thread::yield_now();
            } else {
                self.wait_until(PollFlags::IN, deadline)?;
            }
            self.read_some()?;
        }
    }
}
