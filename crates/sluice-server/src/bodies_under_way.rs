//! The node-wide bound on message bodies under way: bodies whose content
//! header has arrived and whose last body frame has not.
//!
//! The memory alarm stops reading a publisher's socket mid-body, but it
//! cannot bound what is already half read: ten publishers each a third of
//! the way into a 100 MiB message hold a gigabyte, none of it a message a
//! consumer could take or the pager could move to disk, so memory never
//! falls and the alarm never clears. Instead a body larger than one socket
//! read reserves its announced size here when its header arrives; past the
//! bound its connection is not read until bodies under way elsewhere finish.
//! A connection whose body holds room is read on (not paused for a
//! congested queue, nor for room for another of its bodies, which then goes
//! without), so the bodies under way keep finishing; only the memory alarm
//! stops it, as it stops every publisher. The semaphore is fair: a large
//! body waits its turn rather than behind a stream of smaller ones, and one
//! larger than the whole bound goes alone.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::limits::READ_BUFFER_MAX_BYTES;

/// Bodies up to this size are not counted: one socket read brings them
/// whole, and each connection's reads are bounded already.
pub const COUNTED_FROM_BYTES: u64 = READ_BUFFER_MAX_BYTES as u64;

/// Reservations are counted in units of this many bytes, so that a bound of
/// terabytes fits the semaphore's permits.
const UNIT_BYTES: u64 = 1024;

pub struct BodiesUnderWay {
    room: Arc<Semaphore>,
    max_units: u32,
}

/// Room for one body under way, given back when dropped: when the body is
/// whole and handed on, or its channel or connection goes.
pub struct BodyReservation {
    _permit: OwnedSemaphorePermit,
}

impl BodiesUnderWay {
    pub fn new(max_bytes: u64) -> Arc<Self> {
        let max_units = (max_bytes / UNIT_BYTES).clamp(1, u64::from(u32::MAX >> 3)) as u32;
        Arc::new(BodiesUnderWay {
            room: Arc::new(Semaphore::new(max_units as usize)),
            max_units,
        })
    }

    /// Whether a body of `bytes` must reserve room before it is read.
    pub fn is_counted(bytes: u64) -> bool {
        bytes > COUNTED_FROM_BYTES
    }

    fn units(&self, bytes: u64) -> u32 {
        bytes.div_ceil(UNIT_BYTES).min(u64::from(self.max_units)) as u32
    }

    /// Room for a body of `bytes` now, or None when it must wait.
    pub fn try_reserve(&self, bytes: u64) -> Option<BodyReservation> {
        Arc::clone(&self.room)
            .try_acquire_many_owned(self.units(bytes))
            .ok()
            .map(|permit| BodyReservation { _permit: permit })
    }

    /// Room for a body of `bytes`, once bodies ahead of it have finished.
    pub async fn reserve(&self, bytes: u64) -> BodyReservation {
        let permit = Arc::clone(&self.room)
            .acquire_many_owned(self.units(bytes))
            .await
            .expect("the semaphore is never closed");
        BodyReservation { _permit: permit }
    }

    /// Bytes reserved by bodies under way, in reservation units.
    pub fn reserved_bytes(&self) -> u64 {
        u64::from(self.max_units - self.room.available_permits() as u32) * UNIT_BYTES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bodies_under_way_wait_for_room_in_turn_and_an_oversized_one_goes_alone() {
        let bodies = BodiesUnderWay::new(10 * 1024 * 1024);
        let first = bodies.try_reserve(6 << 20).expect("room for the first");
        assert!(
            bodies.try_reserve(6 << 20).is_none(),
            "no room for a second"
        );
        let small = bodies.try_reserve(1 << 20).expect("room for a small one");
        assert_eq!(bodies.reserved_bytes(), 7 << 20);

        // A waiting body gets the room when the first finishes.
        let waiting = {
            let bodies = Arc::clone(&bodies);
            tokio::spawn(async move { bodies.reserve(6 << 20).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(first);
        let second = waiting.await.unwrap();
        assert_eq!(bodies.reserved_bytes(), 7 << 20);

        // One larger than the bound waits for every other, then goes alone.
        let oversized = {
            let bodies = Arc::clone(&bodies);
            tokio::spawn(async move { bodies.reserve(100 << 20).await })
        };
        tokio::task::yield_now().await;
        // Fair: a small body asking after it waits behind it.
        assert!(bodies.try_reserve(1 << 20).is_none());
        drop(small);
        drop(second);
        let oversized = oversized.await.unwrap();
        assert_eq!(bodies.reserved_bytes(), 10 << 20);
        drop(oversized);
        assert_eq!(bodies.reserved_bytes(), 0);
    }
}
