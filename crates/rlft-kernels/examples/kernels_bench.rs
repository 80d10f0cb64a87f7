//! Micro-benchmark of the fused training kernels ([`rlft_kernels::fused`]) against candle's
//! composites, forward + backward, on the shapes of one SmolLM2-135M layer at batch 8 x 127
//! (f32, CPU). The LM head has its own benchmark (`examples/head_bench.rs`).
//!
//! `cargo run --release -p rlft-model --example kernels_bench [-- --reps N]`
//!
//! Prints, per kernel, the median wall time of forward + backward for both paths and the ratio.
//! Run it on a quiet machine (`flock /tmp/rlft-bench.lock`).

use std::time::Instant;

use candle_core::{Device, Tensor, Var, D};
use rlft_kernels::fused;

const B: usize = 8;
const T: usize = 127;
const HIDDEN: usize = 576;
const INTER: usize = 1536;
const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;
const RANK: usize = 16;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn rand(shape: &[usize], seed: u64) -> Res<Tensor> {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    Ok(Tensor::from_vec(v, shape, &Device::Cpu)?)
}

/// Median seconds of `reps` runs of `f` (after one warm-up).
fn time(reps: usize, mut f: impl FnMut() -> Res<()>) -> Res<f64> {
    f()?;
    let mut ts = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t0 = Instant::now();
        f()?;
        ts.push(t0.elapsed().as_secs_f64());
    }
    ts.sort_by(f64::total_cmp);
    Ok(ts[reps / 2])
}

/// Forward then backward of `sum(out * coef)` through `f(inputs)`.
fn fwd_bwd(f: &dyn Fn() -> Res<Tensor>, coef: &Tensor) -> Res<()> {
    let y = f()?;
    let loss = (y * coef)?.sum_all()?;
    let _grads = loss.backward()?;
    Ok(())
}

fn row(
    name: &str,
    reps: usize,
    fused: &dyn Fn() -> Res<Tensor>,
    comp: &dyn Fn() -> Res<Tensor>,
) -> Res<()> {
    let coef = rand(fused()?.dims(), 99)?;
    let tf = time(reps, || fwd_bwd(fused, &coef))?;
    let tc = time(reps, || fwd_bwd(comp, &coef))?;
    println!(
        "{name:<28} {:>9.2} ms {:>11.2} ms {:>7.2}x",
        tf * 1e3,
        tc * 1e3,
        tc / tf
    );
    Ok(())
}

/// As the `rlft` binary: buffers of 1 KiB and more start on a cache line.
#[global_allocator]
static ALLOC: rlft_kernels::alloc::CacheLineAlloc = rlft_kernels::alloc::CacheLineAlloc;

fn main() -> Res<()> {
    rlft_kernels::runtime::tune();
    let mut reps = 11;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--reps" {
            reps = args.next().and_then(|r| r.parse().ok()).ok_or("--reps N")?;
        }
    }
    let rows = B * T;
    println!(
        "fwd+bwd, f32, {} rayon threads, batch {B} x {T}, median of {reps}",
        rayon::current_num_threads()
    );
    println!(
        "{:<28} {:>12} {:>14} {:>8}",
        "kernel", "fused", "composite", "speedup"
    );

    let x = Var::from_tensor(&rand(&[B, T, HIDDEN], 1)?)?;
    let w = (rand(&[HIDDEN], 2)? + 1.0)?;
    row(
        "rms_norm [1016, 576]",
        reps,
        &|| Ok(fused::norm::rms_norm(x.as_tensor(), &w, 1e-5)?),
        &|| {
            let xs = x.as_tensor();
            let var = xs.sqr()?.mean_keepdim(D::Minus1)?;
            Ok(xs
                .broadcast_div(&(var + 1e-5)?.sqrt()?)?
                .broadcast_mul(&w)?)
        },
    )?;

    let g = Var::from_tensor(&rand(&[B, T, INTER], 3)?)?;
    let u = Var::from_tensor(&rand(&[B, T, INTER], 4)?)?;
    row(
        "swiglu [1016, 1536]",
        reps,
        &|| Ok(fused::act::swiglu(g.as_tensor(), u.as_tensor())?),
        &|| Ok((g.as_tensor().silu()? * u.as_tensor())?),
    )?;

    let qrows = Var::from_tensor(&rand(&[B, T, HEADS * HEAD_DIM], 5)?)?;
    let ang = (rand(&[B, T, HEAD_DIM / 2], 6)? * 3.0)?;
    let (cos, sin) = (ang.cos()?, ang.sin()?);
    row(
        "rope q [8, 9, 127, 64]",
        reps,
        &|| {
            Ok(fused::rope::rope_rows(
                qrows.as_tensor(),
                HEADS,
                &cos,
                &sin,
            )?)
        },
        &|| {
            let x = qrows
                .as_tensor()
                .reshape((B, T, HEADS, HEAD_DIM))?
                .transpose(1, 2)?;
            let d = HEAD_DIM;
            let x1 = x.narrow(D::Minus1, 0, d / 2)?;
            let x2 = x.narrow(D::Minus1, d / 2, d / 2)?;
            let c = Tensor::cat(&[&cos, &cos], D::Minus1)?.unsqueeze(1)?;
            let s = Tensor::cat(&[&sin, &sin], D::Minus1)?.unsqueeze(1)?;
            let rot = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
            Ok((x.broadcast_mul(&c)? + rot.broadcast_mul(&s)?)?)
        },
    )?;

    let q = Var::from_tensor(&rand(&[B, HEADS, T, HEAD_DIM], 7)?)?;
    let k = Var::from_tensor(&rand(&[B, KV_HEADS, T, HEAD_DIM], 8)?)?;
    let v = Var::from_tensor(&rand(&[B, KV_HEADS, T, HEAD_DIM], 9)?)?;
    let bias = rlft_kernels::fused::attention::causal_bias(&[0; B], 0, T, &Device::Cpu)?;
    let scale = 1.0 / (HEAD_DIM as f64).sqrt();
    row(
        "attention (GQA 9/3 heads)",
        reps,
        &|| {
            Ok(fused::attention::attention_rows(
                q.as_tensor(),
                k.as_tensor(),
                v.as_tensor(),
                &bias,
                scale,
            )?)
        },
        &|| {
            let groups = HEADS / KV_HEADS;
            let qg = q.as_tensor().reshape((B, KV_HEADS, groups * T, HEAD_DIM))?;
            let s = (qg.matmul(&k.as_tensor().t()?)? * scale)?
                .reshape((B, KV_HEADS, groups, T, T))?
                .broadcast_add(&bias.unsqueeze(1)?)?
                .reshape((B, KV_HEADS, groups * T, T))?;
            let p = candle_nn::ops::softmax(&s, D::Minus1)?;
            let o = p.matmul(v.as_tensor())?.reshape((B, HEADS, T, HEAD_DIM))?;
            Ok(o.transpose(1, 2)?.reshape((B, T, HEADS * HEAD_DIM))?)
        },
    )?;

    let xin = Var::from_tensor(&rand(&[B, T, HIDDEN], 10)?)?;
    let wg = rand(&[INTER, HIDDEN], 11)?;
    let wgv = Var::from_tensor(&wg)?;
    row(
        "linear, trainable [1536, 576]",
        reps,
        &|| {
            Ok(fused::linear::linear(
                xin.as_tensor(),
                wgv.as_tensor(),
                None,
            )?)
        },
        &|| {
            let x2 = xin.as_tensor().reshape((rows, HIDDEN))?;
            Ok(x2.matmul(&wgv.as_tensor().t()?)?.reshape((B, T, INTER))?)
        },
    )?;
    // What the adapter adds over its frozen base (same input, dx only).
    row(
        "frozen base [1536, 576]",
        reps,
        &|| Ok(fused::linear::linear(xin.as_tensor(), &wg, None)?),
        &|| {
            let x2 = xin.as_tensor().reshape((rows, HIDDEN))?;
            Ok(
                rlft_kernels::fused::constant::frozen_linear(&x2, &wg, None)?
                    .reshape((B, T, INTER))?,
            )
        },
    )?;
    let a = Var::from_tensor(&(rand(&[RANK, HIDDEN], 12)? * 0.05)?)?;
    let bm = Var::from_tensor(&(rand(&[INTER, RANK], 13)? * 0.05)?)?;
    row(
        "lora linear r16 [1536, 576]",
        reps,
        &|| {
            Ok(fused::linear::lora_linear(
                xin.as_tensor(),
                &wg,
                None,
                a.as_tensor(),
                bm.as_tensor(),
                2.0,
                None,
            )?)
        },
        &|| {
            let x2 = xin.as_tensor().reshape((rows, HIDDEN))?;
            let base = rlft_kernels::fused::constant::frozen_linear(&x2, &wg, None)?;
            let delta = (x2
                .matmul(&a.as_tensor().t()?)?
                .matmul(&bm.as_tensor().t()?)?
                * 2.0)?;
            Ok((base + delta)?.reshape((B, T, INTER))?)
        },
    )?;
    Ok(())
}
