//! Threads the node cannot run without (the sync thread, the pager, the
//! queue timer). One that panics would leave the node up but half broken:
//! confirms that never come, queues that never page or expire. Instead the
//! node stops, saying which thread failed and why, as a supervisor would
//! want; what was confirmed is on disk already.

use std::panic::AssertUnwindSafe;
use std::thread::JoinHandle;

/// The exit status of a node stopped by a failed essential thread
/// (`EX_SOFTWARE`).
pub const EXIT_STATUS: i32 = 70;

/// Spawns `body` on a thread named `name`; a panic stops the process.
///
/// # Panics
/// When the thread cannot be started.
pub fn spawn(name: &str, body: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
    spawn_with(name, body, stop_the_node)
}

/// As [`spawn`], with what happens on a panic (the thread's name and the
/// panic's message) left to `on_panic`.
///
/// # Panics
/// When the thread cannot be started.
pub fn spawn_with(
    name: &str,
    body: impl FnOnce() + Send + 'static,
    on_panic: impl FnOnce(&str, &str) + Send + 'static,
) -> JoinHandle<()> {
    let thread_name = name.to_owned();
    std::thread::Builder::new()
        .name(thread_name.clone())
        .spawn(move || {
            if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(body)) {
                let message = panic
                    .downcast_ref::<&str>()
                    .copied()
                    .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
                    .unwrap_or("a panic without a message");
                on_panic(&thread_name, message);
            }
        })
        .unwrap_or_else(|error| panic!("the {name} thread cannot start: {error}"))
}

fn stop_the_node(thread: &str, message: &str) {
    tracing::error!(
        thread,
        panic = message,
        "fatal: an essential thread failed; stopping the node"
    );
    eprintln!("sluice: fatal: the {thread} thread failed ({message}); stopping");
    std::process::exit(EXIT_STATUS);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn essential_thread_panic_reaches_its_handler_with_name_and_message() {
        let (sender, receiver) = std::sync::mpsc::channel();
        let handle = spawn_with(
            "sluice-test-essential",
            || panic!("the disk caught fire"),
            move |thread, message| {
                sender
                    .send((thread.to_owned(), message.to_owned()))
                    .unwrap()
            },
        );
        handle.join().unwrap();
        assert_eq!(
            receiver.recv().unwrap(),
            (
                "sluice-test-essential".to_owned(),
                "the disk caught fire".to_owned()
            )
        );
        // A thread that ends normally calls nothing.
        let (sender, receiver) = std::sync::mpsc::channel::<()>();
        spawn_with(
            "sluice-test-calm",
            || {},
            move |_, _| sender.send(()).unwrap(),
        )
        .join()
        .unwrap();
        assert!(receiver.try_recv().is_err());
    }
}
