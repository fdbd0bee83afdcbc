//! A group's Raft node, which a hibernating member parks: shuts down, so
//! that an idle group holds none of what a running openraft node keeps
//! (its tasks, channels and buffers: most of an idle member's memory), and
//! starts again from its log and state machine the moment anything needs
//! it: a peer's message, a proposal, a wake-up.
//!
//! The state machine and the log are handles the node shares with this
//! slot, so a restart replays nothing: the machine still holds what it
//! applied, and a member that led restores itself as leader from its
//! committed vote (openraft's leader restore). A parked member answers
//! what it knew when it parked (its leader, its members, its positions).
//!
//! A node is parked only while nobody uses it: every use holds a
//! [`RaftInUse`], and a park finds none or leaves the node running.

use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use futures_util::future::BoxFuture;
use openraft::async_runtime::WatchReceiver;
use openraft::RaftMetrics;

use super::types::{Raft, TypeConfig};

/// Starts the group's Raft node again, on the log and state machine it
/// ran on before.
pub(super) type StartRaft = Box<dyn Fn() -> BoxFuture<'static, Result<Raft, String>> + Send + Sync>;

/// Members parked by any group of this process so far: the node returns
/// the memory they let go of once parks settle.
static PARKED_TOTAL: AtomicU64 = AtomicU64::new(0);

/// How many members have parked since the process started.
pub fn parked_total() -> u64 {
    PARKED_TOTAL.load(Ordering::Relaxed)
}

enum Slot {
    Running {
        raft: Raft,
        /// One clone per [`RaftInUse`]: a park needs this to be the only one.
        users: Arc<()>,
    },
    /// Shut down, while idle or for good (see `RaftSlot::stopped`); its
    /// metrics as they were.
    Parked(Box<RaftMetrics<TypeConfig>>),
}

pub(super) struct RaftSlot {
    slot: Mutex<Slot>,
    /// Parks, restarts and the stop, one at a time.
    transition: tokio::sync::Mutex<()>,
    start: StartRaft,
    /// Hibernating: a node started again keeps its timers off.
    asleep: AtomicBool,
    /// The group stopped: a parked node stays parked.
    stopped: AtomicBool,
    /// Moves on when the node starts again or stops, for those watching
    /// it while it runs.
    restarts: tokio::sync::watch::Sender<u64>,
}

/// The Raft node, running, and kept from being parked while this lives.
pub(super) struct RaftInUse {
    raft: Raft,
    _user: Arc<()>,
}

impl Deref for RaftInUse {
    type Target = Raft;

    fn deref(&self) -> &Raft {
        &self.raft
    }
}

fn lock(slot: &Mutex<Slot>) -> MutexGuard<'_, Slot> {
    slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn metrics_of(raft: &Raft) -> Box<RaftMetrics<TypeConfig>> {
    Box::new(raft.metrics().borrow_watched().clone())
}

impl RaftSlot {
    pub(super) fn new(raft: Raft, start: StartRaft) -> RaftSlot {
        RaftSlot {
            slot: Mutex::new(Slot::Running {
                raft,
                users: Arc::new(()),
            }),
            transition: tokio::sync::Mutex::new(()),
            start,
            asleep: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            restarts: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Reads the node's metrics: live while it runs, as they were when it
    /// parked or stopped otherwise. `read` must not read them again: a
    /// borrow held across a second one deadlocks against openraft's writer.
    pub(super) fn metrics<R>(&self, read: impl FnOnce(&RaftMetrics<TypeConfig>) -> R) -> R {
        let raft = {
            let slot = lock(&self.slot);
            match &*slot {
                Slot::Running { raft, .. } => raft.clone(),
                Slot::Parked(metrics) => return read(metrics),
            }
        };
        let metrics = raft.metrics();
        let metrics = metrics.borrow_watched();
        read(&metrics)
    }

    /// The node if it runs, without starting a parked one, and without
    /// keeping it from parking (for watching it while it runs).
    pub(super) fn if_running(&self) -> Option<Raft> {
        let slot = lock(&self.slot);
        match &*slot {
            Slot::Running { raft, .. } => Some(raft.clone()),
            Slot::Parked(_) => None,
        }
    }

    fn try_use(&self) -> Option<RaftInUse> {
        let slot = lock(&self.slot);
        match &*slot {
            Slot::Running { raft, users } => Some(RaftInUse {
                raft: raft.clone(),
                _user: Arc::clone(users),
            }),
            Slot::Parked(_) => None,
        }
    }

    /// The running node, started again first if it was parked.
    ///
    /// # Errors
    /// The group stopped, or its node could not be started again.
    pub(super) async fn in_use(&self) -> Result<RaftInUse, String> {
        if let Some(in_use) = self.try_use() {
            return Ok(in_use);
        }
        let _transition = self.transition.lock().await;
        if let Some(in_use) = self.try_use() {
            return Ok(in_use);
        }
        if self.stopped.load(Ordering::Acquire) {
            return Err("the group stopped".to_owned());
        }
        let raft = (self.start)().await?;
        if self.asleep.load(Ordering::Acquire) {
            set_timers(&raft, false);
        }
        let users = Arc::new(());
        let in_use = RaftInUse {
            raft: raft.clone(),
            _user: Arc::clone(&users),
        };
        *lock(&self.slot) = Slot::Running { raft, users };
        self.restarts.send_modify(|restarts| *restarts += 1);
        Ok(in_use)
    }

    /// Marks the slot parked and hands out its running node, to be shut
    /// down; none when it is not running, or when `only_unused` and
    /// someone uses it.
    fn take_running(&self, only_unused: bool) -> Option<Raft> {
        let mut slot = lock(&self.slot);
        let Slot::Running { raft, users } = &*slot else {
            return None;
        };
        if only_unused && Arc::strong_count(users) > 1 {
            return None;
        }
        let raft = raft.clone();
        *slot = Slot::Parked(metrics_of(&raft));
        Some(raft)
    }

    /// Shuts the node down if it runs and nobody uses it. True when it
    /// parked.
    pub(super) async fn park(&self) -> bool {
        let _transition = self.transition.lock().await;
        let Some(raft) = self.take_running(true) else {
            return false;
        };
        if let Err(error) = raft.shutdown().await {
            tracing::warn!(%error, "a parked raft node did not stop cleanly");
        }
        PARKED_TOTAL.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Shuts the node down for good.
    pub(super) async fn stop(&self) -> Result<(), String> {
        let _transition = self.transition.lock().await;
        self.stopped.store(true, Ordering::Release);
        self.restarts.send_modify(|restarts| *restarts += 1);
        let Some(raft) = self.take_running(false) else {
            return Ok(());
        };
        raft.shutdown().await.map_err(|error| error.to_string())
    }

    /// Turns the node's timers (heartbeats, election timeouts) off while it
    /// hibernates, on when it wakes; a node started while it hibernates
    /// keeps them off.
    pub(super) fn set_asleep(&self, asleep: bool) {
        self.asleep.store(asleep, Ordering::Release);
        if let Some(raft) = self.if_running() {
            set_timers(&raft, !asleep);
        }
    }

    /// Changes when the node starts again or the group stops.
    pub(super) fn restarts(&self) -> tokio::sync::watch::Receiver<u64> {
        self.restarts.subscribe()
    }

    pub(super) fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    pub(super) fn is_asleep(&self) -> bool {
        self.asleep.load(Ordering::Acquire)
    }
}

fn set_timers(raft: &Raft, on: bool) {
    let runtime = raft.runtime_config();
    runtime.tick(on);
    runtime.heartbeat(on);
}
