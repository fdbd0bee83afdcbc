//! The allocator's mmap threshold, fixed at start. A test binary of its
//! own: it counts the allocator's mmapped blocks, which other tests running
//! beside it would change.

#![cfg(all(target_os = "linux", target_env = "gnu"))]

/// Blocks the allocator holds with mmap.
fn mmapped_blocks() -> usize {
    // SAFETY: mallinfo2 only reads the allocator's counters.
    unsafe { libc::mallinfo2() }.hblks
}

#[test]
fn malloc_large_blocks_stay_mmapped_after_a_larger_one_was_freed() {
    assert!(
        std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none(),
        "run without MALLOC_MMAP_THRESHOLD_, which the broker leaves alone"
    );
    assert!(sluice_server::malloc_tuning::fix_mmap_threshold());
    // Left to itself, glibc raises its threshold to 4 MiB when this block
    // is freed, and the 256 KiB block below comes from the heap.
    drop(std::hint::black_box(vec![1u8; 4 << 20]));
    let before = mmapped_blocks();
    let block = std::hint::black_box(vec![1u8; 256 * 1024]);
    assert_eq!(mmapped_blocks(), before + 1, "the 256 KiB block is mmapped");
    drop(block);
    assert_eq!(mmapped_blocks(), before, "and given back when freed");
}
