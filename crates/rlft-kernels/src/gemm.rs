//! Matrix products of the training kernels through the gemm crate: [`gemm`](fn@gemm), [`gemm_seq`]
//! (one thread, for products inside a parallel task) and [`gemm_new`] (into a buffer that is
//! not zero-filled first). On two threads a large product runs as two single-threaded halves
//! side by side rather than with gemm's own two-thread split (faster on the model's shapes,
//! `examples/matmul_bench.rs`).

use crate::math::Real;

/// The gemm parallelism for the current rayon pool.
fn parallelism() -> ::gemm::Parallelism {
    let threads = rayon::current_num_threads();
    if threads > 1 {
        ::gemm::Parallelism::Rayon(threads)
    } else {
        ::gemm::Parallelism::None
    }
}

/// Row-major `dst [m, n] (+)= a [m, k] @ b [k, n]`, where `a` and `b` may each be read
/// transposed: `a_t` means `a` is stored `[k, m]`, `b_t` means `b` is stored `[n, k]`.
/// `accumulate` adds to `dst` instead of overwriting it.
#[allow(clippy::too_many_arguments)]
pub fn gemm<T: Real>(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [T],
    a: &[T],
    a_t: bool,
    b: &[T],
    b_t: bool,
    accumulate: bool,
) {
    gemm_with(m, n, k, dst, a, a_t, b, b_t, accumulate, parallelism());
}

/// [`gemm`](fn@gemm) on the calling thread only (for many small products inside a rayon task).
#[allow(clippy::too_many_arguments)]
pub fn gemm_seq<T: Real>(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [T],
    a: &[T],
    a_t: bool,
    b: &[T],
    b_t: bool,
    accumulate: bool,
) {
    gemm_with(
        m,
        n,
        k,
        dst,
        a,
        a_t,
        b,
        b_t,
        accumulate,
        ::gemm::Parallelism::None,
    );
}

/// `a @ b` (transpositions as in [`gemm`](fn@gemm)) into a new row-major `[m, n]` buffer that gemm
/// writes without reading it first, so the buffer is not zero-filled before the product (a
/// memset of the whole output on the calling thread, the other core waiting).
#[allow(clippy::too_many_arguments)]
pub fn gemm_new<T: Real>(
    m: usize,
    n: usize,
    k: usize,
    a: &[T],
    a_t: bool,
    b: &[T],
    b_t: bool,
) -> Vec<T> {
    if m == 0 || n == 0 || k == 0 {
        return vec![T::from_f64(0.0); m * n];
    }
    let mut dst: Vec<T> = Vec::with_capacity(m * n);
    // SAFETY: the capacity holds m * n elements. Without `accumulate` gemm computes
    // `dst = a @ b` with alpha zero, and its kernels then store every element of the `[m, n]`
    // output without loading it (gemm-common: `read_dst == false` sets alpha to zero, alpha
    // status 0 stores only), so all m * n elements are initialised before `set_len`.
    unsafe {
        gemm_raw(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            m * n,
            a,
            a_t,
            b,
            b_t,
            false,
            parallelism(),
        );
        dst.set_len(m * n);
    }
    dst
}

#[allow(clippy::too_many_arguments)]
fn gemm_with<T: Real>(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [T],
    a: &[T],
    a_t: bool,
    b: &[T],
    b_t: bool,
    accumulate: bool,
    par: ::gemm::Parallelism,
) {
    // SAFETY: `dst` is an initialised slice of its own length.
    unsafe {
        gemm_raw(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            dst.len(),
            a,
            a_t,
            b,
            b_t,
            accumulate,
            par,
        )
    }
}

/// [`gemm_with`] into `dst_len` elements at `dst`.
///
/// # Safety
/// `dst` is valid for writes of `dst_len` elements (and for reads of them when `accumulate`)
/// and no other reference to them is used during the call.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_raw<T: Real>(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut T,
    dst_len: usize,
    a: &[T],
    a_t: bool,
    b: &[T],
    b_t: bool,
    accumulate: bool,
    par: ::gemm::Parallelism,
) {
    assert!(dst_len >= m * n && a.len() >= m * k && b.len() >= k * n);
    if m == 0 || n == 0 {
        return;
    }
    // (column stride, row stride) of each operand.
    let (a_cs, a_rs) = if a_t {
        (m as isize, 1)
    } else {
        (1, k as isize)
    };
    let (b_cs, b_rs) = if b_t {
        (k as isize, 1)
    } else {
        (1, n as isize)
    };
    let one = T::from_f64(1.0);
    // One product `dst[i0.., j0..] (+)= a[i0..i0 + mi, ..] @ b[.., j0..j0 + nj]` on `par`.
    // Pointers travel as addresses so the closure can be sent to another thread.
    let (d, ap, bp) = (dst as usize, a.as_ptr() as usize, b.as_ptr() as usize);
    let block = |i0: usize, mi: usize, j0: usize, nj: usize, par: ::gemm::Parallelism| {
        // SAFETY: the asserts above bound every index the strides reach: a is m*k, b is k*n
        // and dst is m*n elements, each addressed row-major (or transposed) within those
        // sizes; blocks run at the same time write disjoint parts of dst.
        unsafe {
            ::gemm::gemm(
                mi,
                nj,
                k,
                (d as *mut T).add(i0 * n + j0),
                1,
                n as isize,
                accumulate,
                (ap as *const T).offset(i0 as isize * a_rs),
                a_cs,
                a_rs,
                (bp as *const T).offset(j0 as isize * b_cs),
                b_cs,
                b_rs,
                one,
                one,
                false,
                false,
                false,
                par,
            );
        }
    };
    match par {
        // Two threads: each computes half of the output on its own (faster than gemm's own
        // two-thread split on the model's shapes, `examples/matmul_bench.rs`), splitting the
        // longer side.
        ::gemm::Parallelism::Rayon(2)
            if m.max(n) >= SPLIT_MIN_SIDE && m * n * k >= SPLIT_MIN_MACS =>
        {
            if n >= m {
                let h = (n / 2).next_multiple_of(16).min(n);
                rayon::join(
                    || block(0, m, 0, h, ::gemm::Parallelism::None),
                    || block(0, m, h, n - h, ::gemm::Parallelism::None),
                );
            } else {
                let h = (m / 2).next_multiple_of(16).min(m);
                rayon::join(
                    || block(0, h, 0, n, ::gemm::Parallelism::None),
                    || block(h, m - h, 0, n, ::gemm::Parallelism::None),
                );
            }
        }
        par => block(0, m, 0, n, par),
    }
}

/// Products below this many multiply-adds keep gemm's own threading.
const SPLIT_MIN_MACS: usize = 1 << 22;
/// The side split in two must have at least this many rows or columns.
const SPLIT_MIN_SIDE: usize = 64;

#[cfg(test)]
mod tests {
    /// The two-thread split (rows or columns, every transposition, accumulate) equals one
    /// single-threaded gemm.
    #[test]
    fn split_gemm_equals_one_gemm() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        for (m, n, k) in [(130usize, 250usize, 170usize), (301, 97, 150)] {
            assert!(m * n * k >= super::SPLIT_MIN_MACS);
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 23) as f32 - 11.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 19) as f32 - 9.0).collect();
            for (a_t, b_t, acc) in [
                (false, false, false),
                (true, false, false),
                (false, true, true),
                (true, true, true),
            ] {
                let init: Vec<f32> = (0..m * n).map(|i| (i % 5) as f32).collect();
                let mut want = init.clone();
                super::gemm_seq(m, n, k, &mut want, &a, a_t, &b, b_t, acc);
                let mut got = init;
                pool.install(|| super::gemm(m, n, k, &mut got, &a, a_t, &b, b_t, acc));
                assert_eq!(got, want, "{m}x{n}x{k} a_t {a_t} b_t {b_t} acc {acc}");
            }
        }
    }

    /// `gemm_new` (an output gemm writes without reading) equals `gemm` into a zeroed buffer,
    /// for every transposition, on one thread and split over two, and for an empty `k`.
    #[test]
    fn gemm_into_a_new_buffer_equals_gemm_into_zeros() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        for (m, n, k) in [(130usize, 250usize, 170usize), (7, 5, 3), (4, 6, 0)] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 23) as f32 - 11.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 19) as f32 - 9.0).collect();
            for (a_t, b_t) in [(false, false), (true, false), (false, true), (true, true)] {
                let mut want = vec![0f32; m * n];
                super::gemm_seq(m, n, k, &mut want, &a, a_t, &b, b_t, false);
                let got = pool.install(|| super::gemm_new(m, n, k, &a, a_t, &b, b_t));
                assert_eq!(got, want, "{m}x{n}x{k} a_t {a_t} b_t {b_t}");
            }
        }
    }
}
