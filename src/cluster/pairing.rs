//! Joining with a short code. `shoal code` makes an 8-character code (40 bits, Crockford base32, shown
//! as `ABCD-EFGH`) valid for 10 minutes. The joiner and the member run SPAKE2 on the code: each learns
//! the same key only if both typed the same code, and an eavesdropper learns nothing it could test
//! offline. That key then keys a Noise handshake, inside which the member hands over the cluster
//! secret, so the secret never travels in clear. Each wrong attempt costs the attacker one online
//! guess. An address that gave three wrong codes may not try that code again (so one stranger cannot
//! revoke a valid code for everyone); the code is revoked only after [`MAX_FAILURES`] wrong attempts in
//! all, a bound high enough that reaching it takes a hundred addresses, and low enough that the chance
//! of guessing a 40-bit code on the way stays below one in three billion. Attempts are also
//! rate-limited per address and in all.

use crate::net::secure::Psk;
use spake2::{Ed25519Group, Identity, Password, Spake2};
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
pub const CODE_LEN: usize = 8;
pub const CODE_LIFETIME: Duration = Duration::from_secs(600);
/// Wrong attempts in all after which a code is revoked.
pub const MAX_FAILURES: u32 = 300;
/// Wrong attempts from one address after which that address may not try the code again.
pub const MAX_FAILURES_PER_ADDRESS: u32 = 3;
/// Addresses whose failures are remembered per code (a flood of addresses beyond it counts in all only).
const MAX_TRACKED_ADDRESSES: usize = 4096;
const SPAKE_IDENTITY: &[u8] = b"shoal join v1";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodeError {
    #[error("a join code has {CODE_LEN} letters and digits, like ABCD-EFGH")]
    Length,
    #[error("a join code has only letters and digits (it may contain {0:?} by a typo)")]
    Character(char),
}

/// An active code on a member.
#[derive(Clone, Debug)]
pub struct JoinCode {
    /// Normalised: 8 characters of the alphabet, no dash.
    code: String,
    expires: Instant,
    pub expires_at_ms: u64,
    failures: u32,
    failures_by_address: HashMap<IpAddr, u32>,
}

impl JoinCode {
    pub fn generate() -> JoinCode {
        let code = (0..CODE_LEN).map(|_| ALPHABET[rand::random_range(0..32)] as char).collect();
        JoinCode {
            code,
            expires: Instant::now() + CODE_LIFETIME,
            expires_at_ms: crate::util::now_ms() + CODE_LIFETIME.as_millis() as u64,
            failures: 0,
            failures_by_address: HashMap::new(),
        }
    }

    /// As shown to people: `ABCD-EFGH`.
    pub fn display(&self) -> String {
        format!("{}-{}", &self.code[..4], &self.code[4..])
    }

    pub fn normalized(&self) -> &str {
        &self.code
    }

    pub fn is_expired(&self) -> bool {
        Instant::now() >= self.expires
    }

    /// Counts a wrong attempt from `from`; returns whether the code is now revoked (for everyone).
    pub fn record_failure(&mut self, from: IpAddr) -> bool {
        self.failures += 1;
        if self.failures_by_address.len() < MAX_TRACKED_ADDRESSES || self.failures_by_address.contains_key(&from) {
            *self.failures_by_address.entry(from).or_default() += 1;
        }
        self.failures >= MAX_FAILURES
    }

    /// Whether `from` gave too many wrong codes to try this one again.
    pub fn is_blocked(&self, from: IpAddr) -> bool {
        self.failures_by_address.get(&from).is_some_and(|&n| n >= MAX_FAILURES_PER_ADDRESS)
    }

    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Addresses that gave a wrong code (as far as they are tracked).
    pub fn failing_addresses(&self) -> usize {
        self.failures_by_address.len()
    }
}

/// Canonical form of a typed code: case and dashes or spaces do not matter, and the letters people
/// confuse with digits (O, I, L) read as those digits.
pub fn normalize(input: &str) -> Result<String, CodeError> {
    let mut code = String::with_capacity(CODE_LEN);
    for c in input.chars().filter(|c| !matches!(c, '-' | ' ' | '_')) {
        let c = match c.to_ascii_uppercase() {
            'O' => '0',
            'I' | 'L' => '1',
            c if ALPHABET.contains(&(c as u8)) && c.is_ascii() => c,
            _ => return Err(CodeError::Character(c)),
        };
        code.push(c);
    }
    if code.len() != CODE_LEN {
        return Err(CodeError::Length);
    }
    Ok(code)
}

/// The first half of the key exchange: the state to keep, and the message to send.
pub fn start(code: &str) -> (Spake2<Ed25519Group>, Vec<u8>) {
    Spake2::<Ed25519Group>::start_symmetric(&Password::new(code.as_bytes()), &Identity::new(SPAKE_IDENTITY))
}

/// The key both sides share if they used the same code (otherwise two different keys, which the
/// handshake that follows detects).
pub fn finish(state: Spake2<Ed25519Group>, peer_message: &[u8]) -> Option<Psk> {
    state.finish(peer_message).ok()?.try_into().ok()
}

/// Why a member refuses a join before the key exchange (sent as one byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    NoCode = 1,
    RateLimited = 2,
    Expired = 3,
    TooManyWrong = 4,
}

impl Refusal {
    pub fn from_byte(b: u8) -> Option<Refusal> {
        match b {
            1 => Some(Refusal::NoCode),
            2 => Some(Refusal::RateLimited),
            3 => Some(Refusal::Expired),
            4 => Some(Refusal::TooManyWrong),
            _ => None,
        }
    }

    pub fn explain(self) -> &'static str {
        match self {
            Refusal::NoCode => {
                "that node has no active join code: run `shoal code` on a member and use the code it shows"
            }
            Refusal::RateLimited => "too many join attempts; wait ten seconds and try again",
            Refusal::Expired => "the join code has expired (codes last 10 minutes): run `shoal code` again",
            Refusal::TooManyWrong => {
                "this address gave a wrong join code too often: run `shoal code` on a member for a new code and type it carefully"
            }
        }
    }
}

/// Join attempts allowed per address, and in all, in each window. Guessing is bounded by the wrong
/// attempts a code survives ([`MAX_FAILURES`]), not by this rate, so the bound in all only keeps the key
/// exchanges' work small: high enough that a few flooding addresses (each held to its own three) leave
/// room for a joiner with the right code, whose node tries again a while when refused for the rate.
const PER_ADDRESS: usize = 3;
const IN_ALL: usize = 100;
const WINDOW: Duration = Duration::from_secs(10);

#[derive(Default)]
pub struct RateLimiter {
    per_address: HashMap<IpAddr, VecDeque<Instant>>,
    all: VecDeque<Instant>,
}

impl RateLimiter {
    /// Whether an attempt from `ip` may go ahead now (and counts it if so).
    pub fn allow(&mut self, ip: IpAddr) -> bool {
        let now = Instant::now();
        let expire = |q: &mut VecDeque<Instant>| {
            while q.front().is_some_and(|t| now.duration_since(*t) > WINDOW) {
                q.pop_front();
            }
        };
        expire(&mut self.all);
        let mine = self.per_address.entry(ip).or_default();
        expire(mine);
        if mine.len() >= PER_ADDRESS || self.all.len() >= IN_ALL {
            return false;
        }
        mine.push_back(now);
        self.all.push_back(now);
        self.per_address.retain(|_, q| !q.is_empty());
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_8_characters_and_typos_are_forgiven() {
        let c = JoinCode::generate();
        assert_eq!(c.normalized().len(), 8);
        assert_eq!(normalize(&c.display()).unwrap(), c.normalized());
        assert_eq!(normalize("abcd efgh").unwrap(), "ABCDEFGH");
        assert_eq!(normalize("0lI0-0000").unwrap(), "01100000");
        assert_eq!(normalize("ABC"), Err(CodeError::Length));
        assert_eq!(normalize("ABCD-EFG!"), Err(CodeError::Character('!')));
        assert_eq!(normalize("ABCD-EFGU"), Err(CodeError::Character('U')));
    }

    #[test]
    fn the_same_code_gives_the_same_key_and_another_code_does_not() {
        let (a, ma) = start("ABCDEFGH");
        let (b, mb) = start("ABCDEFGH");
        let (c, mc) = start("ABCDEFGJ");
        let ka = finish(a, &mb).unwrap();
        assert_eq!(Some(ka), finish(b, &ma));
        let (a2, ma2) = start("ABCDEFGH");
        assert_ne!(finish(a2, &mc), finish(c, &ma2));
        assert_eq!(finish(start("X").0, b"short"), None);
    }

    #[test]
    fn failures_block_their_address_and_revoke_only_in_bulk() {
        let mut c = JoinCode::generate();
        let stranger: IpAddr = "10.0.0.9".parse().unwrap();
        assert!(!(0..MAX_FAILURES_PER_ADDRESS).any(|_| c.record_failure(stranger)));
        assert!(c.is_blocked(stranger));
        assert!(!c.is_blocked("10.0.0.1".parse().unwrap()), "others may still use the code");
        let others =
            (0..MAX_FAILURES - MAX_FAILURES_PER_ADDRESS - 1).map(|i| IpAddr::from([10, 1, (i / 256) as u8, i as u8]));
        assert!(!others.into_iter().any(|ip| c.record_failure(ip)));
        assert!(c.record_failure("10.2.0.1".parse().unwrap()), "the global bound revokes the code");
        let mut r = RateLimiter::default();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        assert!((0..3).all(|_| r.allow(ip)));
        assert!(!r.allow(ip));
        assert!(r.allow("10.0.0.2".parse().unwrap()));
    }
}
