//! The C allocator's one setting the broker changes. glibc serves a block
//! of 128 KiB or more with mmap and gives it back when freed, but each
//! time such a block is freed it raises that threshold to the block's
//! size (up to 32 MiB). A broker allocates and frees large buffers all
//! the time (a group's log writes gathered 256 KiB at a time, the WAL's
//! larger rounds), so after the first of them they come from the heap
//! instead, and the heap keeps their pages when they are freed between
//! smaller blocks. Fixing the threshold at glibc's
//! starting value keeps them mmapped: under seed 5 on three nodes the
//! nodes' RSS was 351 MiB with it against 407 MiB without, at the same
//! latency (docs/benchmarks.md).

/// Blocks this large or larger are mmapped (glibc's own starting value).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD_BYTES: libc::c_int = 128 * 1024;

/// Fixes the mmap threshold, unless `MALLOC_MMAP_THRESHOLD_` (glibc's own
/// variable) already chose one; whether it was set here.
pub fn fix_mmap_threshold() -> bool {
    if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some() {
        return false;
    }
    set_mmap_threshold()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_mmap_threshold() -> bool {
    // SAFETY: mallopt only changes the allocator's parameters; it is safe
    // to call at any time, from any thread.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_mmap_threshold() -> bool {
    false
}
