//! A call-scoped allocator for policy plugins.
//!
//! A stage call allocates a handful of small blocks and frees every one of them by the end of
//! the call: the arguments the host copies into the instance (one allocation per string and
//! list), the plugin's own temporaries, and the decision's strings, freed by the call's
//! post-return. A general-purpose allocator keeps free lists for blocks that live for a
//! millisecond; [`Arena`] serves them from one fixed region instead, by moving a pointer, counts
//! the blocks alive, and starts the region over when the count drops to zero.
//!
//! - Allocations made before [`Arena::serve_calls`] (the module's `configure`: its parsed
//!   policy lives for the instance's lifetime) go to the system allocator, so they never hold
//!   the region.
//! - A block that does not fit in what is left of the region goes to the system allocator, and
//!   so does everything while a block kept from an earlier call holds the region. A plugin
//!   that keeps memory across calls is as fast as without the arena, never wrong.
//! - The region is a `static` (`.bss`: no bytes in the module), so the instance's memory limit
//!   covers it like any other data.
//!
//! ```text
//! #[global_allocator]
//! static ALLOCATOR: aura_plugin_arena::Arena<32768> = aura_plugin_arena::Arena::new();
//!
//! fn configure(/* … */) {
//!     // parse the configuration, keep the policy …
//!     ALLOCATOR.serve_calls();
//! }
//! ```
//!
//! The bookkeeping is [`Bump`], plain offsets with no memory of its own, tested on the host.

#![expect(
    unsafe_code,
    reason = "a global allocator is an unsafe trait over raw pointers"
)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;

/// Offsets into a region of `size` bytes: where the next block starts and how many blocks are
/// alive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bump {
    size: usize,
    next: usize,
    live: usize,
    serving: bool,
}

impl Bump {
    /// Bookkeeping for a region of `size` bytes, not serving yet.
    pub const fn new(size: usize) -> Self {
        Self {
            size,
            next: 0,
            live: 0,
            serving: false,
        }
    }

    /// From now on, blocks come from the region when they fit.
    pub fn serve(&mut self) {
        self.serving = true;
    }

    /// The offset of a new block of `size` bytes aligned to `align` (a power of two) from the
    /// region starting at address `base`; `None` when the arena is not serving or the block
    /// does not fit.
    pub fn alloc(&mut self, base: usize, size: usize, align: usize) -> Option<usize> {
        if !self.serving || size == 0 {
            return None;
        }
        let start = base.checked_add(self.next)?.checked_add(align - 1)? & !(align - 1);
        let offset = start - base;
        let end = offset.checked_add(size)?;
        if end > self.size {
            return None;
        }
        self.next = end;
        self.live += 1;
        Some(offset)
    }

    /// Whether the block at `offset` (from the region's base, possibly negative as a wrapped
    /// subtraction) lies in the region.
    pub fn owns(&self, offset: usize) -> bool {
        offset < self.size
    }

    /// Frees the block of `size` bytes at `offset`. The last block gives its bytes back at
    /// once; the region starts over when no block is alive.
    pub fn free(&mut self, offset: usize, size: usize) {
        self.live = self.live.saturating_sub(1);
        if self.live == 0 {
            self.next = 0;
        } else if offset + size == self.next {
            self.next = offset;
        }
    }

    /// Grows or shrinks the block at `offset` in place, which only the last block can do;
    /// `false` when it cannot.
    pub fn resize(&mut self, offset: usize, old_size: usize, new_size: usize) -> bool {
        if offset + old_size != self.next {
            return false;
        }
        match offset.checked_add(new_size) {
            Some(end) if end <= self.size => {
                self.next = end;
                true
            }
            _ => false,
        }
    }

    /// Blocks alive.
    pub fn live(&self) -> usize {
        self.live
    }

    /// Bytes in use from the region's start (a freed block before the last still counts).
    pub fn used(&self) -> usize {
        self.next
    }
}

/// A global allocator with a region of `N` bytes for call-scoped blocks; everything else goes
/// to the system allocator.
#[derive(Debug)]
pub struct Arena<const N: usize> {
    region: UnsafeCell<[u8; N]>,
    bump: UnsafeCell<Bump>,
}

// SAFETY: a `wasm32-wasip2` instance has one thread: nothing else touches the arena while a
// method runs. Other targets do not get `Sync`, so the arena cannot be a global allocator
// there (tests use it through a reference on one thread).
#[cfg(all(target_family = "wasm", not(target_feature = "atomics")))]
unsafe impl<const N: usize> Sync for Arena<N> {}

impl<const N: usize> Default for Arena<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> Arena<N> {
    /// An arena that does not serve yet.
    pub const fn new() -> Self {
        Self {
            region: UnsafeCell::new([0; N]),
            bump: UnsafeCell::new(Bump::new(N)),
        }
    }

    /// Starts serving call-scoped blocks from the region: call it at the end of `configure`.
    pub fn serve_calls(&self) {
        // SAFETY: one thread (see `Sync`), and no reference to the bookkeeping outlives a call.
        unsafe { (*self.bump.get()).serve() }
    }

    /// A copy of the bookkeeping, to look at.
    pub fn bump(&self) -> Bump {
        // SAFETY: as in `serve_calls`.
        unsafe { (*self.bump.get()).clone() }
    }

    fn base(&self) -> usize {
        self.region.get() as usize
    }

    fn offset(&self, ptr: *mut u8) -> usize {
        (ptr as usize).wrapping_sub(self.base())
    }
}

// SAFETY: blocks from the region are disjoint (`Bump` hands out each byte once until the region
// starts over, which happens only when no block is alive), aligned as asked, and `N` bytes at
// most; every other block is the system allocator's, and goes back to it.
unsafe impl<const N: usize> GlobalAlloc for Arena<N> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let base = self.base();
        // SAFETY: see `serve_calls`.
        let bump = unsafe { &mut *self.bump.get() };
        match bump.alloc(base, layout.size(), layout.align()) {
            // SAFETY: the offset is inside the region.
            Some(offset) => unsafe { self.region.get().cast::<u8>().add(offset) },
            // SAFETY: forwarded as is.
            None => unsafe { System.alloc(layout) },
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let offset = self.offset(ptr);
        // SAFETY: see `serve_calls`.
        let bump = unsafe { &mut *self.bump.get() };
        if bump.owns(offset) {
            bump.free(offset, layout.size());
        } else {
            // SAFETY: not the region's, so the system allocator's.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let offset = self.offset(ptr);
        // SAFETY: see `serve_calls`.
        let bump = unsafe { &mut *self.bump.get() };
        if !bump.owns(offset) {
            // SAFETY: the system allocator's block, forwarded as is.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        if bump.resize(offset, layout.size(), new_size) {
            return ptr;
        }
        // SAFETY: `layout.align()` is a valid alignment and the caller guarantees `new_size`
        // forms a valid layout with it.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: a fresh block of `new_size`, then the old block's bytes copied and the old
        // block freed, as `GlobalAlloc::realloc` does by default.
        unsafe {
            let new = self.alloc(new_layout);
            if !new.is_null() {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            new
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_comes_from_the_region_before_serving() {
        let mut bump = Bump::new(1024);
        assert_eq!(bump.alloc(4096, 16, 8), None);
        bump.serve();
        assert_eq!(bump.alloc(4096, 16, 8), Some(0));
    }

    #[test]
    fn blocks_are_aligned_disjoint_and_start_over_when_all_are_freed() {
        let mut bump = Bump::new(1024);
        bump.serve();
        // A base that is not 8-aligned: offsets make the addresses aligned.
        let base = 4100;
        let a = bump.alloc(base, 3, 1).expect("fits");
        let b = bump.alloc(base, 16, 8).expect("fits");
        let c = bump.alloc(base, 5, 4).expect("fits");
        assert!((base + b).is_multiple_of(8));
        assert!((base + c).is_multiple_of(4));
        assert!(a + 3 <= b && b + 16 <= c);
        assert_eq!(bump.live(), 3);
        bump.free(a, 3);
        bump.free(c, 5);
        // The last block gave its bytes back; the first did not (it was not last).
        assert_eq!(bump.used(), b + 16);
        bump.free(b, 16);
        assert_eq!((bump.live(), bump.used()), (0, 0));
        assert_eq!(bump.alloc(base, 3, 1), Some(a));
    }

    #[test]
    fn a_block_that_does_not_fit_is_refused_and_a_kept_block_holds_the_region() {
        let mut bump = Bump::new(64);
        bump.serve();
        assert_eq!(bump.alloc(0, 65, 1), None);
        let kept = bump.alloc(0, 8, 8).expect("fits");
        let mut temporary = Vec::new();
        while let Some(offset) = bump.alloc(0, 8, 8) {
            temporary.push(offset);
        }
        assert_eq!(temporary.len(), 7);
        for offset in temporary.into_iter().rev() {
            bump.free(offset, 8);
        }
        // Freed in reverse, each was last: the region is back to the kept block.
        assert_eq!(bump.used(), 8);
        assert!(bump.owns(kept) && !bump.owns(64) && !bump.owns(usize::MAX));
    }

    #[test]
    fn only_the_last_block_resizes_in_place_within_the_region() {
        let mut bump = Bump::new(64);
        bump.serve();
        let a = bump.alloc(0, 8, 8).expect("fits");
        let b = bump.alloc(0, 8, 8).expect("fits");
        assert!(!bump.resize(a, 8, 16));
        assert!(bump.resize(b, 8, 32));
        assert_eq!(bump.used(), b + 32);
        assert!(!bump.resize(b, 32, 64), "past the region's end");
        assert!(bump.resize(b, 32, 4));
        assert_eq!(bump.used(), b + 4);
    }

    #[test]
    fn alignment_overflow_near_the_top_of_the_address_space_is_refused() {
        let mut bump = Bump::new(64);
        bump.serve();
        assert_eq!(bump.alloc(usize::MAX - 2, 1, 8), None);
    }

    #[test]
    fn the_arena_serves_a_call_from_the_region_and_the_rest_from_the_system() {
        let arena: Arena<256> = Arena::new();
        let base = arena.base();
        let layout = Layout::from_size_align(24, 8).expect("layout");
        let inside = |p: *mut u8| (p as usize) >= base && (p as usize) < base + 256;
        // SAFETY: every block is freed with the layout it was allocated with.
        unsafe {
            let kept = arena.alloc(layout);
            assert!(!inside(kept), "before serve_calls: the system's");
            arena.serve_calls();
            let a = arena.alloc(layout);
            assert!(inside(a) && (a as usize).is_multiple_of(8));
            a.write_bytes(0xab, 24);
            // Grown in place (last block), then grown past the region: moved to the system
            // with its bytes.
            let a = arena.realloc(a, layout, 48);
            assert!(inside(a));
            let big = Layout::from_size_align(48, 8).expect("layout");
            let b = arena.realloc(a, big, 1024);
            assert!(!inside(b));
            assert!((0..24).all(|i| *b.add(i) == 0xab));
            assert_eq!(arena.bump().live(), 0);
            arena.dealloc(b, Layout::from_size_align(1024, 8).expect("layout"));
            arena.dealloc(kept, layout);
        }
        // Strings and vectors through the allocator API behave as ever.
        let mut s = String::new();
        s.push_str("ok");
        let v: Vec<u8> = s.bytes().collect();
        assert_eq!(v, b"ok");
    }
}
