//! Global-norm clipping: PyTorch `clip_grad_norm_` semantics, computed in f64 by hand here.

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use rlft_train::{clip_grad_norm, global_grad_norm};

fn values(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// Two vars (one large enough for several parallel chunks) and their gradients.
fn setup() -> (Vec<Var>, GradStore, Vec<Vec<f32>>) {
    let dev = Device::Cpu;
    let shapes = [(300usize, 257usize), (1, 33)];
    let mut vars = Vec::new();
    let mut store = GradStore::default();
    let mut grads = Vec::new();
    for (k, &(r, c)) in shapes.iter().enumerate() {
        let v = Var::zeros((r, c), DType::F32, &dev).unwrap();
        let g: Vec<f32> = (0..r * c)
            .map(|i| ((i as f32) * 0.37 + k as f32).sin())
            .collect();
        store.insert(
            v.as_tensor(),
            Tensor::from_vec(g.clone(), (r, c), &dev).unwrap(),
        );
        vars.push(v);
        grads.push(g);
    }
    (vars, store, grads)
}

fn norm_f64(grads: &[Vec<f32>]) -> f64 {
    grads
        .iter()
        .flatten()
        .map(|&x| (x as f64) * (x as f64))
        .sum::<f64>()
        .sqrt()
}

#[test]
fn clips_to_max_norm_like_pytorch() {
    let (vars, mut store, grads) = setup();
    let want = norm_f64(&grads);
    let got = global_grad_norm(&store, &vars).unwrap();
    assert!((got - want).abs() <= 1e-12 * want, "{got} vs {want}");

    let max_norm = 1.0;
    let out = clip_grad_norm(&mut store, &vars, max_norm).unwrap();
    assert!(out.is_finite() && out.clipped());
    assert_eq!(out.total_norm, got);
    let coef = max_norm / (want + 1e-6);
    assert!((out.scale - coef).abs() < 1e-15);
    for (v, g) in vars.iter().zip(&grads) {
        let scaled = values(store.get(v.as_tensor()).unwrap());
        for (a, b) in scaled.iter().zip(g) {
            assert!((*a as f64 - *b as f64 * coef).abs() <= 1e-7 * b.abs() as f64 + 1e-12);
        }
    }
    let after = global_grad_norm(&store, &vars).unwrap();
    assert!(
        (after - max_norm).abs() < 1e-5,
        "norm after clipping {after}"
    );
}

#[test]
fn leaves_small_gradients_alone() {
    let (vars, mut store, grads) = setup();
    let out = clip_grad_norm(&mut store, &vars, 1e6).unwrap();
    assert!(!out.clipped());
    assert_eq!(out.scale, 1.0);
    assert_eq!(values(store.get(vars[1].as_tensor()).unwrap()), grads[1]);
}

#[test]
fn non_finite_norm_is_reported_and_nothing_is_scaled() {
    let (vars, mut store, mut grads) = setup();
    grads[1][5] = f32::NAN;
    let g = Tensor::from_vec(grads[1].clone(), (1, 33), &Device::Cpu).unwrap();
    store.insert(vars[1].as_tensor(), g);
    let out = clip_grad_norm(&mut store, &vars, 1.0).unwrap();
    assert!(!out.is_finite() && out.total_norm.is_nan());
    assert_eq!(out.scale, 1.0);
    assert_eq!(values(store.get(vars[0].as_tensor()).unwrap()), grads[0]);
}

#[test]
fn bf16_grads_missing_grads_and_repeated_vars() {
    let (mut vars, store, grads) = setup();
    let mut bf = GradStore::default();
    for v in &vars {
        let g = store
            .get(v.as_tensor())
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        bf.insert(v.as_tensor(), g);
    }
    let want: f64 = vars
        .iter()
        .flat_map(|v| values(bf.get(v.as_tensor()).unwrap()))
        .map(|x| (x as f64).powi(2))
        .sum::<f64>()
        .sqrt();
    // A var listed twice counts once; a var without a gradient counts as zero.
    vars.push(vars[0].clone());
    vars.push(Var::zeros(4, DType::F32, &Device::Cpu).unwrap());
    let got = global_grad_norm(&bf, &vars).unwrap();
    assert!((got - want).abs() <= 1e-12 * want, "{got} vs {want}");
    let out = clip_grad_norm(&mut bf, &vars, 0.5).unwrap();
    let after = global_grad_norm(&bf, &vars).unwrap();
    assert!(
        (after - 0.5).abs() < 0.5 * 1e-2,
        "bf16 norm after clipping {after}"
    );
    assert!(out.clipped() && (got - norm_f64(&grads)).abs() < 1e-2 * got);
}

#[test]
fn gradients_sharing_storage_are_scaled_once() {
    let dev = Device::Cpu;
    let a = Var::zeros(4, DType::F32, &dev).unwrap();
    let b = Var::zeros(4, DType::F32, &dev).unwrap();
    let g = Tensor::new(&[3f32, 0.0, 0.0, 0.0], &dev).unwrap();
    let mut store = GradStore::default();
    store.insert(a.as_tensor(), g.clone());
    store.insert(b.as_tensor(), g.clone());
    let out = clip_grad_norm(&mut store, &[a.clone(), b.clone()], 1.0).unwrap();
    let norm = (18f64).sqrt();
    assert!((out.total_norm - norm).abs() < 1e-12);
    for v in [&a, &b] {
        let x = values(store.get(v.as_tensor()).unwrap())[0] as f64;
        assert!((x - 3.0 / (norm + 1e-6)).abs() < 1e-6, "{x}");
    }
    assert_eq!(
        values(&g)[0],
        3.0,
        "the shared tensor itself was not modified"
    );
}

#[test]
fn rejects_a_bad_threshold() {
    let (vars, mut store, _) = setup();
    let err = clip_grad_norm(&mut store, &vars, 0.0)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("max_grad_norm") && err.contains("> 0"),
        "{err}"
    );
}
