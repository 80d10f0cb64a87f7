//! Allocator settings for training on the CPU.
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
