//! The pager: one thread per node that does a queue's slow disk work off
//! the paths that publish and deliver. It reads paged messages back into a
//! queue's window as consumers drain it, and compacts a journal whose old
//! segments are pinned by a few live messages.
//!
//! Disk reads happen without the queue's lock, so publishers into a queue
//! that consumers are catching up on keep publishing at their own rate: the
//! pager takes the lock only to copy out what to read and to hand over what
//! it read.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use sluice_store::GroupCommit;

use crate::paging::{NodeResident, StoreSettings};

/// What queues need from the node to page and journal messages.
pub struct QueueStorage {
    pub group: Arc<GroupCommit>,
    pub pager: Arc<Pager>,
    pub settings: StoreSettings,
    /// Paging files of non-durable queues live here, one directory each;
    /// emptied at start, since nothing in them outlives the process.
    pub paging_dir: PathBuf,
    /// What all queues hold in their read-ahead windows.
    pub resident: Arc<NodeResident>,
}

/// A queue's work for the pager: implemented by the queue kinds that page.
pub trait PagerWork: Send + Sync {
    /// Reads paged messages back and compacts, off the queue's lock
    /// except to copy out and hand over.
    fn run_pager_work(&self);

    /// The queue's name, for the log.
    fn name(&self) -> &str;
}

pub struct Pager {
    /// Queues with work waiting, each at most once (the queue keeps a flag),
    /// so this holds at most as many entries as the node has queues.
    work: Mutex<VecDeque<Arc<dyn PagerWork>>>,
    wake: Condvar,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Pager {
    pub fn start() -> Arc<Self> {
        let pager = Arc::new(Pager {
            work: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
        });
        let worker = Arc::clone(&pager);
        let thread = sluice_store::essential_thread::spawn("sluice-pager", move || worker.run());
        *lock(&pager.thread) = Some(thread);
        pager
    }

    /// Asks for `queue`'s paging work to be done. The queue calls this at
    /// most once until the pager has looked at it.
    pub fn request(&self, queue: Arc<dyn PagerWork>) {
        lock(&self.work).push_back(queue);
        self.wake.notify_one();
    }

    fn run(&self) {
        loop {
            let queue = {
                let mut work = lock(&self.work);
                loop {
                    if self.stop.load(Ordering::Acquire) {
                        return;
                    }
                    if let Some(queue) = work.pop_front() {
                        break queue;
                    }
                    work = self
                        .wake
                        .wait(work)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                }
            };
            queue.run_pager_work();
        }
    }

    /// Stops the thread after the work in hand; queued work is dropped
    /// (the node is stopping).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake.notify_all();
        let thread = lock(&self.thread).take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
        lock(&self.work).clear();
    }
}
