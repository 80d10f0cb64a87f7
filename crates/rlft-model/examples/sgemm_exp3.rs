use std::time::Instant;
fn main() {
    for (m, n, k) in [
        (1024usize, 1536usize, 576usize),
        (1024, 576, 1536),
        (376, 1536, 576),
        (256, 49152, 576),
    ] {
        let a: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 * 0.1).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 7) as f32 * 0.1).collect();
        let mut c = vec![0f32; m * n];
        let fl = 2.0 * (m * n * k) as f64;
        let reps = (3e10 / fl) as usize + 3;
        let (cp, ap, bp) = (
            c.as_mut_ptr() as usize,
            a.as_ptr() as usize,
            b.as_ptr() as usize,
        );
        let half = |j0: usize, nj: usize| unsafe {
            gemm::gemm(
                m,
                nj,
                k,
                (cp as *mut f32).add(j0),
                1,
                n as isize,
                false,
                ap as *const f32,
                1,
                k as isize,
                (bp as *const f32).add(j0 * k),
                k as isize,
                1,
                1.0f32,
                1.0f32,
                false,
                false,
                false,
                gemm::Parallelism::None,
            )
        };
        for _ in 0..2 {
            let t = Instant::now();
            for _ in 0..reps {
                let h = (n / 2).next_multiple_of(16);
                rayon::join(|| half(0, h), || half(h, n - h));
            }
            let split = fl * reps as f64 / t.elapsed().as_secs_f64() / 1e9;
            let t = Instant::now();
            for _ in 0..reps {
                unsafe {
                    gemm::gemm(
                        m,
                        n,
                        k,
                        cp as *mut f32,
                        1,
                        n as isize,
                        false,
                        ap as *const f32,
                        1,
                        k as isize,
                        bp as *const f32,
                        k as isize,
                        1,
                        1.0f32,
                        1.0f32,
                        false,
                        false,
                        false,
                        gemm::Parallelism::Rayon(2),
                    )
                }
            }
            let own = fl * reps as f64 / t.elapsed().as_secs_f64() / 1e9;
            println!("{m}x{n}x{k}: split halves {split:.1} GFLOP/s, gemm's Rayon(2) {own:.1}");
        }
    }
}
