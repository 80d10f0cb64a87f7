//! Allocator settings for training on the CPU, and [`CacheLineAlloc`], the binary's global
//! allocator.
//!
//! A training step allocates and frees hundreds of activation and gradient buffers of a few
//! MiB each. glibc's malloc serves blocks above its mmap threshold (128 KiB at first, adapting
//! up to 32 MiB) with fresh `mmap`s and returns freed heap tops to the OS, so every step pays
//! page faults to zero-fill the same memory again (seconds per forward+backward of
//! SmolLM2-135M on 2 cores; docs/kernels.md). [`tune_malloc`] raises the mmap threshold to its
//! maximum and stops trimming, so freed buffers are reused from the heap. Peak RSS is unchanged
//! (the buffers are live at the peak anyway); memory is kept until the process exits.
//!
//! It also keeps every thread on the one (main) arena. By default glibc gives each thread that
//! allocates its own arena, and a buffer freed into one arena is never reused by another: with
//! generation on a pool worker ([`crate::pool::on_pool`]) and training on the main thread, a
//! GRPO run held both phases' buffers at once (docs/memory.md). Small allocations still come
//! from each thread's cache, and the kernels allocate few large buffers, so one arena costs
//! no measurable time. `MALLOC_ARENA_MAX` in the environment wins.

/// Applies the settings (glibc on Linux; elsewhere a no-op). Call once, early in `main`.
/// `RLFT_MALLOC_TUNE=0` leaves the allocator alone
/// ([`Tuning::malloc_tune`](crate::tuning::Tuning::malloc_tune)).
pub fn tune_malloc() {
    if !crate::tuning::tuning().malloc_tune {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // From <malloc.h>.
        const M_TRIM_THRESHOLD: i32 = -1;
        const M_MMAP_THRESHOLD: i32 = -3;
        const M_ARENA_MAX: i32 = -8;
        extern "C" {
            fn mallopt(param: i32, value: i32) -> i32;
        }
        // SAFETY: mallopt only changes allocator parameters; called before threads allocate
        // heavily, and glibc serialises it internally.
        unsafe {
            // 32 MiB: the largest threshold glibc accepts on 64-bit (HEAP_MAX_SIZE / 2).
            mallopt(M_MMAP_THRESHOLD, 32 << 20);
            mallopt(M_TRIM_THRESHOLD, i32::MAX);
            // One arena for every thread (unless MALLOC_ARENA_MAX says otherwise): memory a
            // pool worker frees is reused by the main thread and the other way round.
            if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
                mallopt(M_ARENA_MAX, 1);
            }
        }
    }
}

/// Smallest allocation [`CacheLineAlloc`] aligns to a cache line: 1 KiB (a row of 256 f32).
pub const CACHE_LINE_FROM: usize = 1024;

/// A global allocator: the system allocator, with every allocation of at least
/// [`CACHE_LINE_FROM`] bytes starting on a 64-byte cache line.
///
/// Why: the matrix kernels load 16 f32 at a time. glibc's malloc returns 16-byte aligned
/// blocks, so most rows of a weight or activation start mid-line, and a 64-byte load that
/// straddles two lines costs two: the streaming kernel runs measurably slower on operands off a
/// line (`ALIGN=16 examples/tile_probe`, docs/kernels.md). Rows of the model's widths (576,
/// 1536 and 192 f32) are whole lines, so an aligned start keeps every row aligned.
///
/// How: a large block is taken from `malloc`/`calloc`/`realloc` with [`PAD`] bytes more, the
/// returned address is the first cache line boundary at least 8 bytes in, and the word before
/// it holds the block's own address for `free`. Asking the system for 64-byte alignment
/// instead (`posix_memalign`) made training slower and larger: zeroed buffers lost `calloc`'s
/// fresh pages (Rust zeroes an over-aligned block with `memset`), and the split-off remainders
/// fragmented the heap (higher peak RSS in `rlft bench fwd_bwd`, slower `grpo` steps).
///
/// The `rlft` binary declares it; a program using the library can do the same:
/// `#[global_allocator] static A: rlft_kernels::alloc::CacheLineAlloc = CacheLineAlloc;`.
/// Without it every kernel still computes the same values, only slower.
pub struct CacheLineAlloc;

/// Extra bytes a large block takes: the returned address is the first line boundary past an
/// 8-byte header, 8 to 71 bytes into the system's block (16 to 64 from glibc's 16-byte
/// aligned blocks).
pub const PAD: usize = 64 + 8;

impl CacheLineAlloc {
    /// Whether `layout` gets a cache-line start (large, and asking for at most 64-byte
    /// alignment; anything else goes to the system allocator as it is).
    fn padded(layout: std::alloc::Layout) -> bool {
        layout.size() >= CACHE_LINE_FROM && layout.align() <= 64
    }

    /// The system layout behind a padded block of `size` bytes.
    fn raw_layout(size: usize) -> Option<std::alloc::Layout> {
        std::alloc::Layout::from_size_align(size.checked_add(PAD)?, 16).ok()
    }

    /// The line-aligned address inside the raw block at `raw`, with `raw` stored before it.
    ///
    /// # Safety
    /// `raw` is a live block of at least `PAD` bytes more than the caller's size.
    unsafe fn place(raw: *mut u8) -> *mut u8 {
        if raw.is_null() {
            return raw;
        }
        let p = Self::line_in(raw);
        // SAFETY: `p` is at least 8 bytes into the live block at `raw` (`line_in`), so the
        // 8 bytes before it are inside the block; written unaligned, as they may be.
        unsafe { p.cast::<*mut u8>().sub(1).write_unaligned(raw) };
        p
    }

    /// The first cache line boundary at least 8 bytes into `raw`.
    fn line_in(raw: *mut u8) -> *mut u8 {
        let at = (raw as usize + 8).next_multiple_of(64);
        raw.wrapping_add(at - raw as usize)
    }

    /// A new block for `layout` from `system` (the system allocator's `alloc` or
    /// `alloc_zeroed`): as asked when it is not padded, else `PAD` bytes more, placed.
    ///
    /// # Safety
    /// `system` returns null or a live block of the layout it is given (the system
    /// allocator's `alloc` or `alloc_zeroed`, whose contracts the caller keeps).
    unsafe fn new_block(
        layout: std::alloc::Layout,
        system: impl FnOnce(std::alloc::Layout) -> *mut u8,
    ) -> *mut u8 {
        if !Self::padded(layout) {
            return system(layout);
        }
        match Self::raw_layout(layout.size()) {
            // SAFETY: `system` returned null or a live block of `size + PAD` bytes.
            Some(raw) => unsafe { Self::place(system(raw)) },
            None => std::ptr::null_mut(),
        }
    }

    /// The raw block behind a padded pointer.
    ///
    /// # Safety
    /// `p` came from [`Self::place`].
    unsafe fn raw(p: *mut u8) -> *mut u8 {
        // SAFETY: `place` stored the block's start in the 8 bytes before `p`, inside the block.
        unsafe { p.cast::<*mut u8>().sub(1).read_unaligned() }
    }
}

// SAFETY: small or unusually aligned blocks go to `System` unchanged. A padded block is a
// `System` block of `size + PAD` bytes (16-byte aligned, so `malloc`, `calloc`, `realloc`
// and `free`) whose returned address is 64-byte aligned with `size` bytes after it (at most
// 71 bytes in from the start) and the start stored in the 8 bytes before it; whether a block
// is padded depends only on the caller's layout, which `dealloc` and `realloc` receive again.
unsafe impl std::alloc::GlobalAlloc for CacheLineAlloc {
    /// # Safety
    /// `GlobalAlloc::alloc`'s contract.
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: `layout` has a non-zero size (our caller's contract) and so has the padded
        // layout `new_block` may ask for instead; `System.alloc` returns such a block or null.
        unsafe { Self::new_block(layout, |l| std::alloc::System.alloc(l)) }
    }

    /// # Safety
    /// `GlobalAlloc::alloc_zeroed`'s contract.
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // `calloc` for padded blocks too: fresh pages from the system are not written again.
        // SAFETY: as `alloc`.
        unsafe { Self::new_block(layout, |l| std::alloc::System.alloc_zeroed(l)) }
    }

    /// # Safety
    /// `GlobalAlloc::dealloc`'s contract.
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        if !Self::padded(layout) {
            // SAFETY: an unpadded block came from `System` with this very layout.
            return unsafe { std::alloc::System.dealloc(ptr, layout) };
        }
        if let Some(raw) = Self::raw_layout(layout.size()) {
            // SAFETY: a padded block's start is stored before `ptr` (`place`), and `System`
            // gave it with the layout `raw_layout` computes again from the same size.
            unsafe { std::alloc::System.dealloc(Self::raw(ptr), raw) };
        }
    }

    /// # Safety
    /// `GlobalAlloc::realloc`'s contract.
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        let Ok(new) = std::alloc::Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        match (Self::padded(layout), Self::padded(new)) {
            // SAFETY: an unpadded block came from `System` with this layout; the caller keeps
            // `realloc`'s contract for `new_size`.
            (false, false) => unsafe { std::alloc::System.realloc(ptr, layout, new_size) },
            (true, true) => {
                let (Some(old_raw), Some(_)) =
                    (Self::raw_layout(layout.size()), Self::raw_layout(new_size))
                else {
                    return std::ptr::null_mut();
                };
                // SAFETY: `ptr` is a padded block (its layout says so): its start is stored
                // before it, and `System` gave that block with `old_raw`.
                let raw = unsafe { Self::raw(ptr) };
                let offset = ptr as usize - raw as usize;
                // SAFETY: as above; `new_size + PAD` does not overflow (`raw_layout` checked).
                let moved = unsafe { std::alloc::System.realloc(raw, old_raw, new_size + PAD) };
                if moved.is_null() {
                    return moved;
                }
                // The data sit `offset` bytes into the moved block; its line boundary may be
                // at another offset. Move them there first, then write the header (which
                // may lie inside the data's old place).
                let p = Self::line_in(moved);
                // SAFETY: `moved` holds `new_size + PAD` bytes; the data start `offset`
                // (at most 71) bytes in and the line boundary `p` at most 71 bytes in, so
                // both ranges of `min(old, new)` bytes lie inside it (`copy` allows overlap);
                // `place` then writes the header before `p`, inside the block.
                unsafe {
                    let from = moved.add(offset);
                    if from != p {
                        std::ptr::copy(from, p, layout.size().min(new_size));
                    }
                    Self::place(moved)
                }
            }
            _ => {
                // Across the 1 KiB line: a new block, then the bytes.
                // SAFETY: `new` is a valid layout of non-zero size (`new_size`, the caller's
                // contract); the old block is live with `layout`, the new one holds at least
                // `min(old, new)` bytes and is another allocation, so they do not overlap.
                unsafe {
                    let to = self.alloc(new);
                    if !to.is_null() {
                        std::ptr::copy_nonoverlapping(ptr, to, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                    to
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::{GlobalAlloc, Layout};

    #[test]
    fn large_blocks_start_on_a_cache_line_and_keep_their_bytes() {
        let a = CacheLineAlloc;
        // SAFETY: each block is used within its size and freed with its current layout.
        unsafe {
            for size in [1024usize, 2304, 4100, 1 << 20] {
                let l = Layout::from_size_align(size, 4).unwrap();
                let p = a.alloc(l);
                assert!(!p.is_null());
                assert_eq!(p as usize % 64, 0, "{size} bytes");
                a.dealloc(p, l);
            }
            // Grow across the threshold and back: the bytes move along.
            let l = Layout::from_size_align(100, 4).unwrap();
            let p = a.alloc(l);
            for i in 0..100 {
                *p.add(i) = i as u8;
            }
            let p = a.realloc(p, l, 5000);
            assert_eq!(p as usize % 64, 0);
            assert!((0..100).all(|i| *p.add(i) == i as u8));
            // Grow a padded block many times (the system may move it to another offset).
            let mut p = p;
            let mut size = 5000;
            for step in 0..40 {
                let grown = size + 997 * step + 3;
                p = a.realloc(p, Layout::from_size_align(size, 4).unwrap(), grown);
                assert_eq!(p as usize % 64, 0);
                assert!((0..100).all(|i| *p.add(i) == i as u8), "step {step}");
                size = grown;
            }
            let l = Layout::from_size_align(size, 4).unwrap();
            let p = a.realloc(p, l, 50);
            assert!((0..50).all(|i| *p.add(i) == i as u8));
            a.dealloc(p, Layout::from_size_align(50, 4).unwrap());
            // Zeroed blocks are zero.
            let l = Layout::from_size_align(3000, 8).unwrap();
            let p = a.alloc_zeroed(l);
            assert_eq!(p as usize % 64, 0);
            assert!((0..3000).all(|i| *p.add(i) == 0));
            a.dealloc(p, l);
        }
    }
}
