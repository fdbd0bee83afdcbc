//! Failed logins slow down the next ones from the same address: each
//! failure doubles the spacing between that address's attempts, up to a
//! ceiling, and attempts are spaced even when made in parallel, so a
//! password guesser gets a handful of tries a minute however many
//! connections it opens. The table of addresses is bounded: a flood of
//! failures from many addresses costs a fixed amount of memory.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The spacing after one failure; each further failure doubles it.
const FIRST_PENALTY: Duration = Duration::from_millis(250);
/// The longest spacing between two attempts from one address.
const PENALTY_MAX: Duration = Duration::from_secs(5);
/// An address that has not failed for this long starts afresh.
const FORGET_AFTER: Duration = Duration::from_secs(600);
/// Addresses tracked at once (each entry is a few dozen bytes).
pub const LOGIN_THROTTLE_ADDRESSES_MAX: usize = 65_536;

struct Penalty {
    failures: u32,
    /// When the address's next attempt may be checked.
    next_attempt: Instant,
    last_failure: Instant,
}

/// What a login attempt must do before its credentials are checked.
#[derive(Debug, PartialEq, Eq)]
pub enum Attempt {
    /// Check now, or after this wait.
    After(Duration),
    /// The address's queue of attempts reaches past `patience`: refuse
    /// without checking.
    Refuse,
}

#[derive(Default)]
pub struct LoginThrottle {
    addresses: Mutex<HashMap<IpAddr, Penalty>>,
}

impl LoginThrottle {
    /// Reserves the next slot for an attempt from `peer`, unless it is
    /// further away than `patience` (what is left of the handshake's time).
    pub fn attempt(&self, peer: IpAddr, now: Instant, patience: Duration) -> Attempt {
        let key = address_key(peer);
        let mut addresses = self.lock();
        let Some(penalty) = addresses.get_mut(&key) else {
            return Attempt::After(Duration::ZERO);
        };
        if now.duration_since(penalty.last_failure) >= FORGET_AFTER {
            addresses.remove(&key);
            return Attempt::After(Duration::ZERO);
        }
        let slot = penalty.next_attempt.max(now);
        let wait = slot - now;
        if wait > patience {
            return Attempt::Refuse;
        }
        penalty.next_attempt = slot + spacing(penalty.failures);
        Attempt::After(wait)
    }

    pub fn failed(&self, peer: IpAddr, now: Instant) {
        let key = address_key(peer);
        let mut addresses = self.lock();
        if !addresses.contains_key(&key) && addresses.len() >= LOGIN_THROTTLE_ADDRESSES_MAX {
            evict_one(&mut addresses, now);
        }
        let penalty = addresses.entry(key).or_insert(Penalty {
            failures: 0,
            next_attempt: now,
            last_failure: now,
        });
        penalty.failures = penalty.failures.saturating_add(1);
        penalty.last_failure = now;
        penalty.next_attempt = penalty.next_attempt.max(now + spacing(penalty.failures));
    }

    /// A successful login clears the address's record.
    pub fn succeeded(&self, peer: IpAddr) {
        self.lock().remove(&address_key(peer));
    }

    pub fn tracked_addresses(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Penalty>> {
        self.addresses
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn spacing(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    FIRST_PENALTY
        .saturating_mul(1 << doublings)
        .min(PENALTY_MAX)
}

/// IPv6 addresses count by their /64: one host is handed a whole /64, and
/// would otherwise have 2^64 fresh addresses to guess from.
fn address_key(peer: IpAddr) -> IpAddr {
    match peer {
        IpAddr::V6(address) => match address.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut segments = address.segments();
                segments[4..].fill(0);
                IpAddr::V6(segments.into())
            }
        },
        IpAddr::V4(_) => peer,
    }
}

/// Makes room: a forgotten entry if the first few looked at hold one, else
/// the first (an arbitrary one), so that a full table costs constant time.
fn evict_one(addresses: &mut HashMap<IpAddr, Penalty>, now: Instant) {
    const LOOK_AT: usize = 8;
    let victim = addresses
        .iter()
        .take(LOOK_AT)
        .find(|(_, penalty)| now.duration_since(penalty.last_failure) >= FORGET_AFTER)
        .or_else(|| addresses.iter().next())
        .map(|(key, _)| *key);
    if let Some(key) = victim {
        addresses.remove(&key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATIENCE: Duration = Duration::from_secs(10);

    fn address(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn login_throttle_spaces_attempts_after_failures() {
        let throttle = LoginThrottle::default();
        let (peer, start) = (address("10.0.0.7"), Instant::now());
        assert_eq!(
            throttle.attempt(peer, start, PATIENCE),
            Attempt::After(Duration::ZERO)
        );
        throttle.failed(peer, start);
        // Two attempts at once from the same address are spaced, not
        // checked together.
        assert_eq!(
            throttle.attempt(peer, start, PATIENCE),
            Attempt::After(Duration::from_millis(250))
        );
        assert_eq!(
            throttle.attempt(peer, start, PATIENCE),
            Attempt::After(Duration::from_millis(500))
        );
        // Another address is not held back.
        assert_eq!(
            throttle.attempt(address("10.0.0.8"), start, PATIENCE),
            Attempt::After(Duration::ZERO)
        );
        // Failures double the spacing up to its ceiling.
        for _ in 0..10 {
            throttle.failed(peer, start);
        }
        let later = start + Duration::from_secs(60);
        assert_eq!(
            throttle.attempt(peer, later, PATIENCE),
            Attempt::After(Duration::ZERO)
        );
        assert_eq!(
            throttle.attempt(peer, later, PATIENCE),
            Attempt::After(PENALTY_MAX)
        );
        // Queued beyond the handshake's time: refused unchecked.
        assert_eq!(
            throttle.attempt(peer, later, Duration::from_secs(1)),
            Attempt::Refuse
        );
        throttle.succeeded(peer);
        assert_eq!(
            throttle.attempt(peer, later, PATIENCE),
            Attempt::After(Duration::ZERO)
        );
    }

    #[test]
    fn login_throttle_forgets_an_address_that_stopped_failing() {
        let throttle = LoginThrottle::default();
        let (peer, start) = (address("10.0.0.7"), Instant::now());
        throttle.failed(peer, start);
        throttle.failed(peer, start);
        let much_later = start + FORGET_AFTER;
        assert_eq!(
            throttle.attempt(peer, much_later, PATIENCE),
            Attempt::After(Duration::ZERO)
        );
        assert_eq!(throttle.tracked_addresses(), 0);
    }

    #[test]
    fn login_throttle_counts_ipv6_hosts_by_their_prefix() {
        let throttle = LoginThrottle::default();
        let start = Instant::now();
        throttle.failed(address("2001:db8:1:2::1"), start);
        assert_ne!(
            throttle.attempt(address("2001:db8:1:2:ffff::9"), start, PATIENCE),
            Attempt::After(Duration::ZERO),
            "same /64"
        );
        assert_eq!(
            throttle.attempt(address("2001:db8:1:3::1"), start, PATIENCE),
            Attempt::After(Duration::ZERO)
        );
        throttle.failed(address("::ffff:10.0.0.9"), start);
        assert_ne!(
            throttle.attempt(address("10.0.0.9"), start, PATIENCE),
            Attempt::After(Duration::ZERO),
            "an IPv4-mapped address is its IPv4 address"
        );
    }

    #[test]
    fn login_throttle_table_stays_bounded_under_a_flood() {
        let throttle = LoginThrottle::default();
        let start = Instant::now();
        for host in 0..(LOGIN_THROTTLE_ADDRESSES_MAX as u32 + 1_000) {
            throttle.failed(IpAddr::V4(host.into()), start);
        }
        assert_eq!(throttle.tracked_addresses(), LOGIN_THROTTLE_ADDRESSES_MAX);
    }
}
