//! Allocator settings for training on the CPU, and [`CacheLineAlloc`], the binary's global
//! allocator.
//!
//! A training step allocates and frees hundreds of activation and gradient buffers of a few
//! MiB each. glibc's malloc serves blocks above its mmap threshold (128 KiB at first, adapting
//! up to 32 MiB) with fresh `mmap`s and returns freed heap tops to the OS, so every step pays
//! page faults to zero-fill the same memory again (about 2 s per forward+backward of
//! SmolLM2-135M at batch 8 x 128 on 2 cores). [`tune_malloc`] raises the mmap threshold to its
//! maximum and stops trimming, so freed buffers are reused from the heap. Peak RSS is unchanged
//! (the buffers are live at the peak anyway); memory is kept until the process exits.
//!
//! It also keeps every thread on the one (main) arena. By default glibc gives each thread that
//! allocates its own arena, and a buffer freed into one arena is never reused by another: with
//! generation on a pool worker ([`crate::runtime::on_pool`]) and training on the main thread, a
//! GRPO run held both phases' buffers at once (LoRA GRPO on the default model: 1461-1538 MiB
//! peak RSS against 1271 MiB with one arena, `scripts/plan-check.sh grpo-lora`). Small
//! allocations still come from each thread's cache, and the kernels allocate few large
//! buffers: `rlft bench generate lora` interleaved with and without showed no slowdown.
//! `MALLOC_ARENA_MAX` in the environment wins.

/// Applies the settings (glibc on Linux; elsewhere a no-op). Call once, early in `main`.
/// `RLFT_MALLOC_TUNE=0` leaves the allocator alone.
pub fn tune_malloc() {
    if crate::runtime::switched_off("RLFT_MALLOC_TUNE") {
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
/// straddles two lines costs two. For the streaming kernel (`kernels::matmul_wt`, one thread,
/// `examples/tile_probe`, `ALIGN=` places the operands) 176 x 576 x 576 ran at 105 GFLOP/s with
/// both operands 16 bytes off a line against 137 aligned, and 8 x 576 x 576 (a decode step's
/// product) at 104 against 116. Rows of the model's widths (576, 1536 and 192 f32) are whole
/// lines, so an aligned start keeps every row aligned.
///
/// The `rlft` binary declares it; a program using the library can do the same:
/// `#[global_allocator] static ALLOC: rlft_model::alloc::CacheLineAlloc = CacheLineAlloc;`.
/// Without it every kernel still computes the same values, only slower.
pub struct CacheLineAlloc;

impl CacheLineAlloc {
    /// The layout actually requested from the system allocator for `layout`.
    fn widen(layout: std::alloc::Layout) -> std::alloc::Layout {
        if layout.size() >= CACHE_LINE_FROM && layout.align() < 64 {
            // 64 is a power of two and `size` fits (it already fit with a smaller alignment,
            // and rounding up to 64 cannot overflow isize for sizes a system can serve).
            std::alloc::Layout::from_size_align(layout.size(), 64).unwrap_or(layout)
        } else {
            layout
        }
    }
}

// SAFETY: every block is allocated and freed by `System` with the same widened layout (the
// widening depends only on the caller's layout, which `dealloc` and `realloc` receive again),
// and a widened layout has the caller's size and at least its alignment.
unsafe impl std::alloc::GlobalAlloc for CacheLineAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        std::alloc::System.alloc(Self::widen(layout))
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        std::alloc::System.alloc_zeroed(Self::widen(layout))
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        std::alloc::System.dealloc(ptr, Self::widen(layout))
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        let old = Self::widen(layout);
        let Ok(new) = std::alloc::Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        let new = Self::widen(new);
        if old.align() == new.align() {
            return std::alloc::System.realloc(ptr, old, new_size);
        }
        // Crossing the 1 KiB line changes the alignment: move the block by hand.
        let to = std::alloc::System.alloc(new);
        if !to.is_null() {
            std::ptr::copy_nonoverlapping(ptr, to, layout.size().min(new_size));
            std::alloc::System.dealloc(ptr, old);
        }
        to
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
            let l = Layout::from_size_align(5000, 4).unwrap();
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
