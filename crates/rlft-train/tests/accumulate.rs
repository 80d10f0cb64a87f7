//! Gradient accumulation: batch B x accum 1 == batch 1 x accum B on a small candle linear model.

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Module, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use rlft_train::{AdamW, AdamWConfig, GradAccumulator, ParamGroup};

const IN: usize = 6;
const OUT: usize = 3;

/// A linear layer with deterministic weights, and its vars.
fn model() -> (candle_nn::Linear, Vec<Var>) {
    let map = VarMap::new();
    let vb = VarBuilder::from_varmap(&map, DType::F32, &Device::Cpu);
    let lin = candle_nn::linear(IN, OUT, vb.pp("lin")).unwrap();
    let mut named: Vec<(String, Var)> = map.data().lock().unwrap().clone().into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0)); // a fixed order, so two models' vars pair up
    let mut vars = Vec::new();
    for (name, var) in &named {
        let n = var.elem_count();
        let v: Vec<f32> = (0..n)
            .map(|i| (0.3 * i as f32 + name.len() as f32).sin())
            .collect();
        var.set(&Tensor::from_vec(v, var.shape(), &Device::Cpu).unwrap())
            .unwrap();
        vars.push(var.clone());
    }
    (lin, vars)
}

/// Rows `rows` of a fixed dataset: inputs `[rows, IN]`, targets `[rows, OUT]`.
fn data(rows: std::ops::Range<usize>) -> (Tensor, Tensor) {
    let n = rows.len();
    let x: Vec<f32> = rows
        .clone()
        .flat_map(|r| (0..IN).map(move |j| ((r * IN + j) as f32 * 0.71).cos()))
        .collect();
    let y: Vec<f32> = rows
        .flat_map(|r| (0..OUT).map(move |j| ((r * OUT + j) as f32 * 1.3).sin()))
        .collect();
    let dev = Device::Cpu;
    (
        Tensor::from_vec(x, (n, IN), &dev).unwrap(),
        Tensor::from_vec(y, (n, OUT), &dev).unwrap(),
    )
}

/// Mean squared error over the rows (a "token mean": every row is one token).
fn grads(lin: &candle_nn::Linear, rows: std::ops::Range<usize>) -> GradStore {
    let (x, y) = data(rows);
    let loss = (lin.forward(&x).unwrap() - y)
        .unwrap()
        .sqr()
        .unwrap()
        .mean_all()
        .unwrap();
    loss.backward().unwrap()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

fn assert_close(a: &GradStore, b: &GradStore, vars: &[Var], what: &str) {
    for v in vars {
        let (x, y) = (
            values(a.get(v.as_tensor()).unwrap()),
            values(b.get(v.as_tensor()).unwrap()),
        );
        for (p, q) in x.iter().zip(&y) {
            assert!(
                (p - q).abs() <= 1e-6 * q.abs().max(1.0),
                "{what}: {p} vs {q}"
            );
        }
    }
}

#[test]
fn batch_2_accum_1_equals_batch_1_accum_2() {
    let (lin, vars) = model();
    let full = grads(&lin, 0..2);
    let mut acc = GradAccumulator::new(vars.clone());
    for r in 0..2 {
        acc.add_mean(&grads(&lin, r..r + 1), 2).unwrap();
    }
    assert_eq!(acc.micro_batches(), 2);
    let accumulated = acc.finish();
    assert_eq!(acc.micro_batches(), 0);
    assert_close(&accumulated, &full, &vars, "mean of 2 micro-batches");

    // And the optimizer step that follows is the same.
    let step = |g: &GradStore| {
        let (_, vs) = model();
        let remapped = remap(g, &vars, &vs);
        let mut opt =
            AdamW::new(vec![ParamGroup::new(vs.clone())], AdamWConfig::default()).unwrap();
        opt.step(&remapped).unwrap();
        vs.iter()
            .flat_map(|v| values(v.as_tensor()))
            .collect::<Vec<f32>>()
    };
    let (a, b) = (step(&accumulated), step(&full));
    for (p, q) in a.iter().zip(&b) {
        assert!((p - q).abs() <= 1e-6 * q.abs().max(1.0), "{p} vs {q}");
    }
}

/// `g` keyed by `to` instead of `from` (same order).
fn remap(g: &GradStore, from: &[Var], to: &[Var]) -> GradStore {
    let mut out = GradStore::default();
    for (f, t) in from.iter().zip(to) {
        out.insert(t.as_tensor(), g.get(f.as_tensor()).unwrap().clone());
    }
    out
}

#[test]
fn token_weighted_micro_batches_of_unequal_size_equal_the_full_batch() {
    let (lin, vars) = model();
    let full = grads(&lin, 0..4);
    let mut acc = GradAccumulator::new(vars.clone());
    acc.add_token_weighted(&grads(&lin, 0..3), 3, 4).unwrap();
    acc.add_token_weighted(&grads(&lin, 3..4), 1, 4).unwrap();
    assert_close(&acc.finish(), &full, &vars, "token-weighted 3 + 1 rows");
}

#[test]
fn owned_stores_accumulate_like_borrowed_ones() {
    let (lin, vars) = model();
    let parts = [0..1, 1..3, 3..4];
    let mut borrowed = GradAccumulator::new(vars.clone());
    let mut owned = GradAccumulator::new(vars.clone());
    for r in parts.clone() {
        let n = r.len();
        borrowed
            .add(&grads(&lin, r.clone()), n as f64 / 4.0)
            .unwrap();
        owned.add_owned(grads(&lin, r), n as f64 / 4.0).unwrap();
    }
    let full = grads(&lin, 0..4);
    assert_close(&borrowed.finish(), &full, &vars, "borrowed");
    assert_close(&owned.finish(), &full, &vars, "owned, weighted");
    // Weight 1: the first store's tensors become the sums and later ones add into them.
    let mut owned = GradAccumulator::new(vars.clone());
    let mut borrowed = GradAccumulator::new(vars.clone());
    for r in parts {
        owned.add_owned(grads(&lin, r.clone()), 1.0).unwrap();
        borrowed.add(&grads(&lin, r), 1.0).unwrap();
    }
    assert_eq!(owned.micro_batches(), 3);
    assert_close(
        &owned.finish(),
        &borrowed.finish(),
        &vars,
        "owned, weight 1",
    );
    // A view into a larger buffer is copied, never used as a sum.
    let big = Tensor::ones((2, 3 * IN * OUT), DType::F32, &Device::Cpu).unwrap();
    let mut store = GradStore::default();
    for v in &vars {
        let n = v.elem_count();
        let view = big.narrow(1, 0, n).unwrap().get(1).unwrap();
        store.insert(v.as_tensor(), view.reshape(v.dims()).unwrap());
    }
    let mut acc = GradAccumulator::new(vars.clone());
    acc.add_owned(store, 1.0).unwrap();
    acc.add_owned(grads(&lin, 0..1), 1.0).unwrap();
    drop(acc.finish());
    assert!(values(&big).iter().all(|&x| x == 1.0));
}

#[test]
fn accumulation_never_writes_into_the_callers_gradients() {
    let (lin, vars) = model();
    let (g0, g1) = (grads(&lin, 0..1), grads(&lin, 1..2));
    let before: Vec<Vec<f32>> = vars
        .iter()
        .map(|v| values(g0.get(v.as_tensor()).unwrap()))
        .collect();
    let mut acc = GradAccumulator::new(vars.clone());
    acc.add(&g0, 1.0).unwrap();
    acc.add(&g1, 1.0).unwrap();
    let sum = acc.finish();
    for (v, b) in vars.iter().zip(&before) {
        assert_eq!(&values(g0.get(v.as_tensor()).unwrap()), b);
        let s = values(sum.get(v.as_tensor()).unwrap());
        let g1v = values(g1.get(v.as_tensor()).unwrap());
        for ((s, a), c) in s.iter().zip(b).zip(&g1v) {
            assert!((s - (a + c)).abs() <= 1e-6);
        }
    }
}

#[test]
fn bf16_gradients_accumulate_in_f32() {
    let (lin, vars) = model();
    let to_bf16 = |g: &GradStore| {
        let mut out = GradStore::default();
        for v in &vars {
            out.insert(
                v.as_tensor(),
                g.get(v.as_tensor()).unwrap().to_dtype(DType::BF16).unwrap(),
            );
        }
        out
    };
    let (g0, g1) = (to_bf16(&grads(&lin, 0..1)), to_bf16(&grads(&lin, 1..2)));
    let mut acc = GradAccumulator::new(vars.clone());
    acc.add_mean(&g0, 2).unwrap();
    acc.add_mean(&g1, 2).unwrap();
    let out = acc.finish();
    for v in &vars {
        let s = out.get(v.as_tensor()).unwrap();
        assert_eq!(s.dtype(), DType::F32);
        let want = ((g0.get(v.as_tensor()).unwrap().to_dtype(DType::F32).unwrap()
            + g1.get(v.as_tensor()).unwrap().to_dtype(DType::F32).unwrap())
        .unwrap()
            * 0.5)
            .unwrap();
        assert_eq!(values(s), values(&want));
    }
}

#[test]
fn bad_weights_are_rejected() {
    let (lin, vars) = model();
    let g = grads(&lin, 0..1);
    let mut acc = GradAccumulator::new(vars);
    assert!(acc
        .add_mean(&g, 0)
        .unwrap_err()
        .to_string()
        .contains(">= 1"));
    assert!(acc.add_token_weighted(&g, 5, 4).is_err());
    assert!(acc.add(&g, f64::NAN).is_err());
}

/// Sums in the parameter's dtype: bf16 sums of bf16 vars, each addition computed in f32 and
/// rounded once, so they stay within a bf16 rounding per micro-batch of the f32 sums; f32 vars
/// keep f32 sums, the same as without it.
#[test]
fn sums_in_the_parameter_dtype() {
    let n = 40_000;
    let init = Tensor::from_vec(
        (0..n).map(|i| (i as f32 * 0.01).sin()).collect::<Vec<_>>(),
        n,
        &Device::Cpu,
    )
    .unwrap();
    let (wide, narrow) = (
        Var::from_tensor(&init).unwrap(),
        Var::from_tensor(&init.to_dtype(DType::BF16).unwrap()).unwrap(),
    );
    let vars = vec![wide.clone(), narrow.clone()];
    let mut f32_sums = GradAccumulator::new(vars.clone());
    let mut own = GradAccumulator::new(vars).in_param_dtype();
    for k in 0..3 {
        let g: Vec<f32> = (0..n)
            .map(|i| ((i * 7 + k * 13) as f32 * 0.003).cos())
            .collect();
        let g = Tensor::from_vec(g, n, &Device::Cpu).unwrap();
        let mut store = GradStore::default();
        store.insert(wide.as_tensor(), g.clone());
        store.insert(narrow.as_tensor(), g.to_dtype(DType::BF16).unwrap());
        f32_sums.add_mean(&store, 3).unwrap();
        own.add_mean(&store, 3).unwrap();
    }
    let (a, b) = (f32_sums.finish(), own.finish());
    let vals = |t: &Tensor| t.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(b.get(narrow.as_tensor()).unwrap().dtype(), DType::BF16);
    assert_eq!(b.get(wide.as_tensor()).unwrap().dtype(), DType::F32);
    assert_eq!(
        vals(a.get(wide.as_tensor()).unwrap()),
        vals(b.get(wide.as_tensor()).unwrap())
    );
    let (x, y) = (
        vals(a.get(narrow.as_tensor()).unwrap()),
        vals(b.get(narrow.as_tensor()).unwrap()),
    );
    for (x, y) in x.iter().zip(&y) {
        // Three roundings of partial sums below 1 in magnitude, each within half a bf16 ulp
        // (2^-9 of it).
        assert!((x - y).abs() <= 3.0 / 512.0, "{x} vs {y}");
    }
}
