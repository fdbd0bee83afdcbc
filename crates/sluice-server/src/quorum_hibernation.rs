//! Idle quorum queues cost nothing: a group member that saw no entry for
//! [`HIBERNATE_AFTER`] turns its timers off (no heartbeats, no election
//! timeouts: no wake-ups at all), and at the next sweep compacts its log
//! and parks its Raft node, which then holds no memory beyond its log and
//! state machine (`RaftGroup::park`). It wakes when it applies an entry, when
//! it leads and a client proposes one, and when a peer goes down or comes
//! back while that peer leads it, or it leads, or it knows no leader: then
//! a dead leader is replaced and a returning member is caught up. A
//! follower whose leader is alive stays asleep through others' failures:
//! waking it would only have it stand against a leader it has not heard
//! from in a while.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use sluice_cluster::consensus::RaftGroup;
use sluice_cluster::link::Links;
use sluice_cluster::node_name::NodeName;

/// How long a member goes without entries before it hibernates.
pub const HIBERNATE_AFTER: Duration = Duration::from_secs(10);
/// How often the node looks for members to put to sleep: one task for all.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One member's last activity, and whether it sleeps.
pub struct Activity {
    /// Milliseconds since `epoch`.
    last_ms: AtomicU64,
    asleep: AtomicBool,
    epoch: Instant,
    group: OnceLock<Weak<RaftGroup>>,
}

impl Activity {
    pub fn new() -> Arc<Activity> {
        Arc::new(Activity {
            last_ms: AtomicU64::new(0),
            asleep: AtomicBool::new(false),
            epoch: Instant::now(),
            group: OnceLock::new(),
        })
    }

    /// The member's group, once started.
    pub fn attach(&self, group: &Arc<RaftGroup>) {
        let _ = self.group.set(Arc::downgrade(group));
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Something happened in the group; `wake` when it needs this member's
    /// timers.
    pub fn touch(&self, wake: bool) {
        self.last_ms.store(self.now_ms(), Ordering::Relaxed);
        if wake && self.asleep.load(Ordering::Relaxed) {
            self.wake();
        }
    }

    pub fn wake(&self) {
        if self.asleep.swap(false, Ordering::AcqRel) {
            self.last_ms.store(self.now_ms(), Ordering::Relaxed);
            if let Some(group) = self.group.get().and_then(Weak::upgrade) {
                group.wake();
            }
        }
    }

    /// Puts the member to sleep once idle, and parks it at a later sweep;
    /// one started again while asleep (by a peer's message, a proposal)
    /// parks again.
    fn sleep_if_idle(&self) {
        let idle = self
            .now_ms()
            .saturating_sub(self.last_ms.load(Ordering::Relaxed));
        if idle < HIBERNATE_AFTER.as_millis() as u64 {
            return;
        }
        let Some(group) = self.group.get().and_then(Weak::upgrade) else {
            return;
        };
        if !self.asleep.load(Ordering::Relaxed) {
            self.asleep.store(true, Ordering::Release);
            group.hibernate();
        } else if group.runs_while_asleep() {
            group.park();
        }
    }
}

/// What parked members let go of goes back to the system: glibc keeps
/// freed memory in its arenas, and a thousand members parking free a
/// hundred megabytes, scattered between what stays. Once the parks of a
/// wave are over (a sweep with none), the allocator is trimmed, once.
#[derive(Default)]
struct ParkedMemory {
    /// Parks seen at the last sweep, and at the last trim.
    seen: u64,
    trimmed: u64,
}

impl ParkedMemory {
    fn return_if_settled(&mut self) {
        let parked = sluice_cluster::consensus::parked_total();
        if parked == self.seen && parked != self.trimmed {
            crate::alarm::return_free_memory();
            tracing::info!(
                parked = parked - self.trimmed,
                "idle quorum queue members parked; their memory returned"
            );
            self.trimmed = parked;
        }
        self.seen = parked;
    }
}

/// The node's running groups, with their activity.
pub type RunningGroups = Arc<Mutex<HashMap<u64, (Arc<RaftGroup>, Arc<Activity>)>>>;

/// Starts the node's sweeper, and (in a cluster) the watch on its peers.
pub fn start(running: &RunningGroups, links: Option<&Arc<Links>>) {
    let weak = Arc::downgrade(running);
    tokio::spawn(async move {
        let mut parks = ParkedMemory::default();
        loop {
            tokio::time::sleep(SWEEP_EVERY).await;
            let Some(running) = weak.upgrade() else {
                return;
            };
            let members: Vec<Arc<Activity>> = lock(&running)
                .values()
                .map(|(_, activity)| Arc::clone(activity))
                .collect();
            for activity in members {
                activity.sleep_if_idle();
            }
            parks.return_if_settled();
        }
    });
    let Some(links) = links else {
        return;
    };
    for peer in links.peers() {
        let Some(mut state) = links.watch_peer(peer) else {
            continue;
        };
        let (peer, weak) = (peer.clone(), Arc::downgrade(running));
        tokio::spawn(async move {
            while state.changed().await.is_ok() {
                let Some(running) = weak.upgrade() else {
                    return;
                };
                wake_for(&running, &peer);
            }
        });
    }
}

/// `peer` went down or came back: the members that must act on it wake.
fn wake_for(running: &RunningGroups, peer: &NodeName) {
    let members: Vec<(Arc<RaftGroup>, Arc<Activity>)> = lock(running)
        .values()
        .map(|(group, activity)| (Arc::clone(group), Arc::clone(activity)))
        .collect();
    for (group, activity) in members {
        let leader = group.leader();
        if group.is_leader() || leader.is_none() || leader.as_ref() == Some(peer) {
            activity.wake();
        }
    }
}
