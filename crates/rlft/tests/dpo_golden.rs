//! The DPO losses against TRL 1.16's `DPOTrainer` formulas in torch
//! (`scripts/reference/dpo_golden.py` -> `tests/data/dpo_golden.json`, float64): the sum of the
//! completion tokens' log-probs, every `loss_type` alone at two `beta`s, two weighted lists
//! (`loss_weights`), the gradients with respect to the per-token log-probs, and the logged
//! `rewards/*` and `logps/*` statistics.

mod common;

use candle_core::{DType, Device, Tensor, Var};
use common::golden::{f64s, load, padded, rows, scalar, vec1};
use rlft::algo::dpo_loss::{
    dpo_loss, sequence_logps, DpoLogps, DpoLossConfig, DpoLossType, DpoStats,
};
use serde_json::Value;

fn close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: {g} vs {w}"
        );
    }
}

struct Got {
    loss: f64,
    grad_chosen: Vec<f64>,
    grad_rejected: Vec<f64>,
    logps: (Vec<f64>, Vec<f64>),
    stats: DpoStats,
}

fn run(g: &Value, cfg: &DpoLossConfig, dtype: DType) -> Got {
    let d = Device::Cpu;
    let (pc, mc) = padded(&rows(&g["per_token_chosen"]), dtype);
    let (pr, mr) = padded(&rows(&g["per_token_rejected"]), dtype);
    let (vc, vr) = (
        Var::from_tensor(&pc).unwrap(),
        Var::from_tensor(&pr).unwrap(),
    );
    let lc = sequence_logps(vc.as_tensor(), &mc).unwrap();
    let lr = sequence_logps(vr.as_tensor(), &mr).unwrap();
    let t = |k: &str| {
        Tensor::new(vec1(&g[k]), &d)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    };
    let (rc, rr) = (t("ref_chosen"), t("ref_rejected"));
    let (nc, nr) = (mc.sum(1).unwrap(), mr.sum(1).unwrap());
    let x = DpoLogps::sums((&lc, &lr), (&rc, &rr)).with_lens(&nc, &nr);
    let out = dpo_loss(&x, cfg).unwrap();
    let loss = out.losses.mean_all().unwrap();
    let grads = loss.backward().unwrap();
    // A side the loss does not read (`sft`: the rejected one) has no gradient: zeros, as
    // torch's.
    let first_col = |v: &Var| -> Vec<f64> {
        match grads.get(v.as_tensor()) {
            Some(g) => f64s(&g.narrow(1, 0, 1).unwrap().squeeze(1).unwrap()),
            None => vec![0.0; v.dim(0).unwrap()],
        }
    };
    let logps = (f64s(&lc), f64s(&lr));
    let stats = DpoStats::of(
        &f64s(&out.chosen_rewards),
        &f64s(&out.rejected_rewards),
        (&logps.0, &logps.1),
    );
    Got {
        loss: scalar(&loss),
        grad_chosen: first_col(&vc),
        grad_rejected: first_col(&vr),
        logps,
        stats,
    }
}

fn config(case: &Value) -> DpoLossConfig {
    let types: Vec<DpoLossType> = case["loss_type"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().parse().unwrap())
        .collect();
    let weights = vec1(&case["loss_weights"]);
    DpoLossConfig {
        beta: case["beta"].as_f64().unwrap(),
        losses: types.into_iter().zip(weights).collect(),
        label_smoothing: case["label_smoothing"].as_f64().unwrap(),
        ..Default::default()
    }
}

#[test]
fn every_loss_type_matches_trl() {
    let g: Value = load("dpo_golden.json");
    let cases = g["cases"].as_array().unwrap();
    let mut seen = std::collections::HashSet::new();
    for case in cases {
        let cfg = config(case);
        seen.extend(cfg.losses.iter().map(|(t, _)| *t));
        for (dtype, tol) in [(DType::F64, 1e-10), (DType::F32, 2e-5)] {
            let what = format!("{:?} beta {} {dtype:?}", case["loss_type"], cfg.beta);
            let got = run(&g, &cfg, dtype);
            close(&[got.loss], &[case["loss"].as_f64().unwrap()], tol, &what);
            close(&got.grad_chosen, &vec1(&case["grad_chosen"]), tol, &what);
            close(
                &got.grad_rejected,
                &vec1(&case["grad_rejected"]),
                tol,
                &what,
            );
            close(&got.logps.0, &vec1(&g["logps_chosen"]), tol, "logps chosen");
            close(
                &got.logps.1,
                &vec1(&g["logps_rejected"]),
                tol,
                "logps rejected",
            );
            let s = &case["stats"];
            for (k, v) in got.stats.named("") {
                close(
                    &[v],
                    &[s[&k].as_f64().unwrap()],
                    tol,
                    &format!("{what} {k}"),
                );
            }
        }
    }
    assert_eq!(
        seen.len(),
        DpoLossType::ALL.len(),
        "every loss type has a case"
    );
}

#[test]
fn split_pairs_sum_to_the_whole() {
    // The per-pair losses of a pair-wise type do not depend on their batch neighbours, so a
    // trainer's sum over micro-batches / all pairs equals the mean over the step.
    let g: Value = load("dpo_golden.json");
    let cfg = DpoLossConfig {
        losses: vec![(DpoLossType::Sigmoid, 0.7), (DpoLossType::Ipo, 0.3)],
        ..Default::default()
    };
    let d = Device::Cpu;
    let v = |k: &str| vec1(&g[k]);
    let whole = |lo: usize, hi: usize| -> Vec<f64> {
        let t = |k: &str| Tensor::new(&v(k)[lo..hi], &d).unwrap();
        let (pc, pr, rc, rr) = (
            t("logps_chosen"),
            t("logps_rejected"),
            t("ref_chosen"),
            t("ref_rejected"),
        );
        let ones = Tensor::ones(hi - lo, DType::F64, &d).unwrap();
        let x = DpoLogps::sums((&pc, &pr), (&rc, &rr)).with_lens(&ones, &ones);
        f64s(&dpo_loss(&x, &cfg).unwrap().losses)
    };
    let all = whole(0, 6);
    let parts: Vec<f64> = [whole(0, 2), whole(2, 6)].concat();
    close(&parts, &all, 1e-14, "split");
}
