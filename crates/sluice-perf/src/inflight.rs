//! The publisher's in-flight window (PerfTest's `--confirm N`): at most N messages published
//! and not yet confirmed. The window is the back pressure the seed's sweeps measure: a full
//! window stops the publisher until the broker confirms.

/// Counts what one publisher has in flight. Invariant: `confirmed + nacked + in_flight ==
/// published` (see [`InflightWindow::validate`]).
#[derive(Debug, Clone)]
pub struct InflightWindow {
    /// `None`: no limit (confirms off, or PerfTest's `--confirm 0`).
    limit: Option<u64>,
    published: u64,
    confirmed: u64,
    nacked: u64,
}

impl InflightWindow {
    /// A window of `limit` messages; 0 means unlimited, as in PerfTest.
    pub fn new(limit: u64) -> Self {
        InflightWindow {
            limit: (limit > 0).then_some(limit),
            published: 0,
            confirmed: 0,
            nacked: 0,
        }
    }

    /// A window that never fills: for publishers that do not use confirms.
    pub fn unlimited() -> Self {
        Self::new(0)
    }

    pub fn in_flight(&self) -> u64 {
        self.published - self.confirmed - self.nacked
    }

    /// Whether another message may be published now.
    pub fn has_room(&self) -> bool {
        self.limit.is_none_or(|limit| self.in_flight() < limit)
    }

    /// Records a publish. The caller checks [`has_room`](Self::has_room) first.
    pub fn on_publish(&mut self) {
        debug_assert!(self.has_room(), "publish into a full window: {self:?}");
        self.published += 1;
    }

    /// Records the broker's answer for one message.
    ///
    /// # Panics
    /// In debug builds, if more answers arrive than messages were published.
    pub fn on_confirm(&mut self, acked: bool) {
        if acked {
            self.confirmed += 1;
        } else {
            self.nacked += 1;
        }
        self.validate();
    }

    pub fn published(&self) -> u64 {
        self.published
    }

    pub fn confirmed(&self) -> u64 {
        self.confirmed
    }

    pub fn nacked(&self) -> u64 {
        self.nacked
    }

    pub fn validate(&self) {
        debug_assert!(
            self.confirmed + self.nacked <= self.published,
            "more confirms than publishes: {self:?}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inflight_window_fills_and_drains() {
        let mut window = InflightWindow::new(3);
        for _ in 0..3 {
            assert!(window.has_room());
            window.on_publish();
        }
        assert!(!window.has_room());
        assert_eq!(window.in_flight(), 3);
        window.on_confirm(true);
        assert!(window.has_room());
        window.on_publish();
        assert!(!window.has_room());
        window.on_confirm(false);
        window.on_confirm(true);
        assert_eq!(window.in_flight(), 1);
        assert_eq!(
            (window.published(), window.confirmed(), window.nacked()),
            (4, 2, 1)
        );
    }

    #[test]
    fn inflight_window_zero_is_unlimited() {
        let mut window = InflightWindow::new(0);
        for _ in 0..100_000 {
            window.on_publish();
        }
        assert!(window.has_room());
        assert_eq!(window.in_flight(), 100_000);
        assert!(InflightWindow::unlimited().has_room());
    }

    #[test]
    fn inflight_window_of_one_alternates() {
        let mut window = InflightWindow::new(1);
        for _ in 0..10 {
            assert!(window.has_room());
            window.on_publish();
            assert!(!window.has_room());
            window.on_confirm(true);
        }
        assert_eq!(window.confirmed(), 10);
    }

    #[test]
    #[should_panic(expected = "more confirms than publishes")]
    #[cfg(debug_assertions)]
    fn inflight_window_rejects_a_confirm_without_publish() {
        InflightWindow::new(5).on_confirm(true);
    }
}
