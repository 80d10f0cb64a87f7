//! The reward-model loss against TRL's formula in torch (`tests/data/reward_loss_golden.json`,
//! made by `scripts/reference/reward_loss_golden.py` from `trl/trainer/reward_trainer.py`
//! lines 786-815): the Bradley-Terry loss with and without a margin column and centring, its
//! gradients with respect to the scores, and the logged statistics.

mod common;

use candle_core::{DType, Device, Tensor, Var};
use common::golden::{f64s, load, scalar, vec1 as floats};
use rlft::algo::reward::{pair_losses, PairStats};
use serde_json::Value;

/// TRL's loss (the mean of the pair losses) and its gradients, in `dtype`.
fn loss_and_grads(
    c: &[f64],
    r: &[f64],
    m: Option<&[f64]>,
    k: Option<f64>,
    dtype: DType,
) -> (f64, Vec<f64>, Vec<f64>) {
    let d = Device::Cpu;
    let cv = Var::from_tensor(&Tensor::new(c, &d).unwrap().to_dtype(dtype).unwrap()).unwrap();
    let rv = Var::from_tensor(&Tensor::new(r, &d).unwrap().to_dtype(dtype).unwrap()).unwrap();
    let m = m.map(|m| Tensor::new(m, &d).unwrap().to_dtype(dtype).unwrap());
    let loss = pair_losses(cv.as_tensor(), rv.as_tensor(), m.as_ref(), k)
        .unwrap()
        .mean_all()
        .unwrap();
    let g = loss.backward().unwrap();
    (
        scalar(&loss),
        f64s(g.get(cv.as_tensor()).unwrap()),
        f64s(g.get(rv.as_tensor()).unwrap()),
    )
}

#[test]
fn bradley_terry_loss_matches_trl() {
    let g: Value = load("reward_loss_golden.json");
    let (c, r) = (floats(&g["chosen"]), floats(&g["rejected"]));
    for (i, case) in g["cases"].as_array().unwrap().iter().enumerate() {
        let m = case["margin_column"]
            .as_array()
            .map(|_| floats(&case["margin_column"]));
        let k = case["center_rewards_coefficient"].as_f64();
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
            let (loss, gc, gr) = loss_and_grads(&c, &r, m.as_deref(), k, dtype);
            let want = case["loss"].as_f64().unwrap();
            assert!(
                (loss - want).abs() <= tol * want.abs().max(1.0),
                "case {i} {dtype:?}: loss {loss} vs TRL {want}"
            );
            for (got, key) in [(gc, "grad_chosen"), (gr, "grad_rejected")] {
                for (j, (a, b)) in got.iter().zip(floats(&case[key])).enumerate() {
                    assert!(
                        (a - b).abs() <= tol,
                        "case {i} {dtype:?} {key}[{j}]: {a} vs {b}"
                    );
                }
            }
        }
        let cf: Vec<f32> = c.iter().map(|&x| x as f32).collect();
        let rf: Vec<f32> = r.iter().map(|&x| x as f32).collect();
        let s = PairStats::of(&cf, &rf);
        for (key, got) in [
            ("accuracy", s.accuracy),
            ("margin", s.margin),
            ("min_reward", s.min_reward),
            ("mean_reward", s.mean_reward),
            ("max_reward", s.max_reward),
        ] {
            let want = case[key].as_f64().unwrap();
            // TRL takes the accuracy's mean in float32.
            assert!((got - want).abs() < 1e-6, "case {i} {key}: {got} vs {want}");
        }
    }
}
