//! LR schedules against transformers' `get_scheduler` (`tests/golden/lr_schedules.json`, from
//! `scripts/reference/lr_schedules_golden.py`), warmup rounding, and names in configs.

use rlft_train::{LrSchedule, LrScheduler, TrainError, Warmup};
use serde_json::{json, Value};

fn golden() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/golden/lr_schedules.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The golden case's schedule, built the way a config would: from JSON.
fn schedule_of(case: &Value) -> LrSchedule {
    let name = case["schedule"].as_str().unwrap();
    let repr = match case["kwargs"].get("min_lr_rate") {
        Some(r) => json!({ "type": name, "min_lr_rate": r }),
        None => json!(name),
    };
    serde_json::from_value(repr).unwrap()
}

#[test]
fn matches_transformers_get_scheduler() {
    let gold = golden();
    let cases = gold["cases"].as_array().unwrap();
    assert!(cases.len() >= 12);
    for case in cases {
        let total = case["total_steps"].as_u64().unwrap() as usize;
        let warmup: Warmup = serde_json::from_value(case["warmup"].clone()).unwrap();
        let want_warmup = case["warmup_steps"].as_u64().unwrap() as usize;
        assert_eq!(warmup.steps(total), want_warmup, "warmup steps of {case}");
        let sched = LrScheduler {
            base_lr: case["base_lr"].as_f64().unwrap(),
            schedule: schedule_of(case),
            warmup,
        };
        for (step, want) in case["lrs"].as_array().unwrap().iter().enumerate() {
            let want = want.as_f64().unwrap();
            let got = sched.lr_at(step, total);
            let tol = 1e-9 * want.abs().max(1e-12);
            assert!(
                (got - want).abs() <= tol,
                "{case}\nstep {step}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn warmup_follows_transformers_rounding() {
    // transformers 5 `warmup_steps`: >= 1 is a count (int()), < 1 a ratio (ceil(ratio * total)).
    let w = |x: f64| Warmup::try_from(x).unwrap();
    assert_eq!(w(0.1).steps(17), 2);
    assert_eq!(w(0.1).steps(100), 10);
    assert_eq!(w(0.05).steps(37), 2);
    assert_eq!(w(5.0).steps(3), 5);
    assert_eq!(w(2.7), Warmup::Steps(2));
    assert_eq!(w(0.0).steps(50), 0);
    assert!(Warmup::try_from(-1.0).is_err());
}

#[test]
fn names_deserialise_and_unknown_names_list_the_valid_ones() {
    for (name, want) in [
        ("constant", LrSchedule::Constant),
        ("constant_with_warmup", LrSchedule::Constant),
        ("linear", LrSchedule::Linear),
        ("cosine", LrSchedule::Cosine),
    ] {
        let got: LrSchedule = serde_json::from_value(json!(name)).unwrap();
        assert_eq!(got, want);
    }
    let got: LrSchedule =
        serde_json::from_value(json!({"type": "cosine_with_min_lr", "min_lr_rate": 0.1})).unwrap();
    assert_eq!(got, LrSchedule::CosineWithMinLr { min_lr_rate: 0.1 });

    let err = serde_json::from_value::<LrSchedule>(json!("cosine_annealing")).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("unknown lr schedule `cosine_annealing`"),
        "{msg}"
    );
    assert!(
        msg.contains("constant, constant_with_warmup, linear, cosine, cosine_with_min_lr"),
        "{msg}"
    );

    let err = serde_json::from_value::<LrSchedule>(json!("cosine_with_min_lr")).unwrap_err();
    assert!(err.to_string().contains("min_lr_rate = 0.1"), "{err}");
    let err = serde_json::from_value::<LrSchedule>(json!({"type": "linear", "min_lr_rate": 0.1}));
    assert!(err
        .unwrap_err()
        .to_string()
        .contains("only applies to `cosine_with_min_lr`"));
    let err = serde_json::from_value::<LrSchedule>(
        json!({"type": "cosine_with_min_lr", "min_lr_rate": 2.0}),
    );
    assert!(err.unwrap_err().to_string().contains("[0, 1]"));
    assert!(matches!(
        LrSchedule::from_name("step"),
        Err(TrainError::UnknownSchedule { .. })
    ));
}

#[test]
fn scheduler_round_trips_through_serde() {
    let s = LrScheduler {
        base_lr: 1e-6,
        schedule: LrSchedule::CosineWithMinLr { min_lr_rate: 0.1 },
        warmup: Warmup::Ratio(0.05),
    };
    let v = serde_json::to_value(s).unwrap();
    assert_eq!(
        v,
        json!({"base_lr": 1e-6, "schedule": {"type": "cosine_with_min_lr", "min_lr_rate": 0.1}, "warmup": 0.05})
    );
    assert_eq!(serde_json::from_value::<LrScheduler>(v).unwrap(), s);
    let s: LrScheduler =
        serde_json::from_value(json!({"base_lr": 1e-3, "schedule": "linear"})).unwrap();
    assert_eq!(s.warmup.steps(100), 0);
    assert_eq!(s.lr_at(0, 100), 1e-3);
}
