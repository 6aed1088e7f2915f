//! The process's memory allocator: mimalloc, asked for alignment only where a type needs more
//! than every block of it has.
//!
//! The `mimalloc` crate's `GlobalAlloc` passes every layout's alignment to
//! `mi_malloc_aligned`. That call has a fast path only for blocks of at most 1 KiB whose free
//! block happens to be aligned; anything larger (a header map's entries, a request's future,
//! a read buffer) takes mimalloc's generic aligned path, which over-allocates by the alignment
//! and marks the page as holding aligned blocks. Measured with callgrind on the storage route,
//! five such allocations a request spent about 1,200 instructions in that path, for alignments
//! of 8 bytes that every mimalloc block has anyway: its size classes are multiples of 8 bytes,
//! and pages start at 16. So a layout aligned to at most [`BLOCK_ALIGN`] goes to `mi_malloc`
//! (as the standard library's system allocator goes to `malloc` for alignments `malloc`
//! guarantees), and any other to the aligned calls, as before: the allocating calls of a
//! request went from about 1,800 instructions to 1,000
//! (`bench/results/2026-12-05-allocator-alignment.md`).

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;
use std::time::Duration;

/// The alignment every block mimalloc hands out has, whatever its size: its size classes are
/// multiples of a word, and each page's first block starts at 16 bytes.
pub const BLOCK_ALIGN: usize = 8;

/// mimalloc, with plain calls for layouts its blocks are aligned for already.
#[derive(Debug, Default, Clone, Copy)]
pub struct Allocator;

impl Allocator {
    /// Whether a block of any size class fits `layout`'s alignment.
    #[inline]
    fn plain(layout: &Layout) -> bool {
        layout.align() <= BLOCK_ALIGN
    }
}

#[expect(
    unsafe_code,
    reason = "a global allocator is an unsafe trait over the C API"
)]
// SAFETY: each method hands the layout to the matching mimalloc call: plain ones only for
// alignments every mimalloc block satisfies (`BLOCK_ALIGN`), the aligned ones otherwise. Every
// pointer freed or reallocated came from mimalloc (this allocator), and `mi_free` and
// `mi_realloc` take blocks from either kind of call.
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl; a null answer is the allocation error the caller handles.
        unsafe {
            if Self::plain(&layout) {
                libmimalloc_sys::mi_malloc(layout.size()).cast()
            } else {
                libmimalloc_sys::mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe {
            if Self::plain(&layout) {
                libmimalloc_sys::mi_zalloc(layout.size()).cast()
            } else {
                libmimalloc_sys::mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (the trait's contract).
        unsafe { libmimalloc_sys::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout` (the trait's contract); the
        // new block keeps `layout`'s alignment.
        unsafe {
            if Self::plain(&layout) {
                libmimalloc_sys::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                libmimalloc_sys::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align())
                    .cast()
            }
        }
    }
}

/// Gives the memory freed since the last call back to the system, and the calling thread's
/// cached pages with it.
pub fn collect() {
    #[expect(unsafe_code, reason = "a call into the allocator's C API")]
    // SAFETY: `mi_collect` takes no pointer and may be called from any thread at any time.
    unsafe {
        libmimalloc_sys::mi_collect(true);
    }
}

/// Calls [`collect`] every `period`, for ever. mimalloc gives memory back only from inside its
/// own calls, some time after the memory was freed: a gateway that goes quiet right after a
/// burst (10,000 keep-alive connections answered, then idle and released) would keep the
/// burst's pages for as long as it stays quiet. Run on a worker, the collection takes that
/// worker's cached pages too; measured with `bench/run`, one a second cut an idle keep-alive
/// connection's resident memory by about half (6.8 to 3.3 KiB), where purging at every free
/// instead cost 8–14 % more CPU per request.
pub async fn trim_every(period: Duration) {
    let mut every = tokio::time::interval(period);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every layout a program asks for, through this allocator: the block is aligned as asked,
    /// holds its bytes (written to the last), keeps them through growing and shrinking, and
    /// a zeroed block reads zero.
    #[test]
    #[expect(unsafe_code, reason = "calling a global allocator is unsafe")]
    fn blocks_are_aligned_as_asked_and_keep_their_bytes_through_realloc() {
        let a = Allocator;
        let sizes = [
            1usize, 7, 8, 9, 15, 16, 17, 24, 40, 56, 100, 1000, 1024, 1025, 1500, 4096, 5000,
            70_000, 600_000, 3_000_000,
        ];
        let mut checked = 0;
        let mut expected = 0;
        for align in [1usize, 2, 4, 8, 16, 32, 64, 128, 4096] {
            for &size in &sizes {
                let layout = Layout::from_size_align(size, align).expect("layout");
                // Many blocks of one layout: a size class's blocks at every offset of a page.
                let rounds = if size > 8192 { 4 } else { 64 };
                expected += rounds;
                let mut held = Vec::new();
                for round in 0..rounds as u8 {
                    // SAFETY: a non-zero size; the block is freed below with its layout.
                    let p = unsafe { a.alloc(layout) };
                    assert!(!p.is_null(), "{size} bytes aligned {align}");
                    assert_eq!(p as usize % align, 0, "{size} bytes aligned {align}");
                    // SAFETY: `p` holds `size` bytes.
                    unsafe { std::ptr::write_bytes(p, round, size) };
                    held.push((p, round));
                }
                for (p, round) in held {
                    // SAFETY: `p` holds `size` bytes written with `round`.
                    let bytes = unsafe { std::slice::from_raw_parts(p, size) };
                    assert!(filled(bytes, round), "{size} aligned {align}");
                    let bigger = size * 3 + 5;
                    // SAFETY: `p` came from `alloc` with `layout`; `bigger` is not zero.
                    let q = unsafe { a.realloc(p, layout, bigger) };
                    assert!(!q.is_null());
                    assert_eq!(q as usize % align, 0, "{size} → {bigger} aligned {align}");
                    // SAFETY: the first `size` bytes were kept, `bigger` bytes are held.
                    let kept = unsafe { std::slice::from_raw_parts(q, size) };
                    assert!(filled(kept, round), "{size} → {bigger}");
                    let grown = Layout::from_size_align(bigger, align).expect("layout");
                    // SAFETY: `q` came from `realloc` to `grown`'s size.
                    let r = unsafe { a.realloc(q, grown, size.div_ceil(2)) };
                    assert_eq!(
                        r as usize % align,
                        0,
                        "{bigger} → {} aligned {align}",
                        size / 2
                    );
                    // SAFETY: the first half of the bytes were kept.
                    let half = unsafe { std::slice::from_raw_parts(r, size.div_ceil(2)) };
                    assert!(filled(half, round), "{bigger} → {}", size / 2);
                    let shrunk = Layout::from_size_align(size.div_ceil(2), align).expect("layout");
                    // SAFETY: `r` came from `realloc` with `shrunk`'s size.
                    unsafe { a.dealloc(r, shrunk) };
                    checked += 1;
                }
                // SAFETY: a non-zero size; freed right after.
                let z = unsafe { a.alloc_zeroed(layout) };
                assert_eq!(z as usize % align, 0, "zeroed {size} aligned {align}");
                // SAFETY: `z` holds `size` bytes.
                let zeroed = unsafe { std::slice::from_raw_parts(z, size) };
                assert!(filled(zeroed, 0), "zeroed {size} aligned {align}");
                // SAFETY: `z` came from `alloc_zeroed` with `layout`.
                unsafe { a.dealloc(z, layout) };
            }
        }
        assert_eq!(checked, expected);
        assert!(checked > 5_000, "{checked} blocks checked");
    }

    /// Whether every byte of `bytes` is `byte` (one comparison of slices: fast in a test build).
    fn filled(bytes: &[u8], byte: u8) -> bool {
        bytes == vec![byte; bytes.len()].as_slice()
    }
}
