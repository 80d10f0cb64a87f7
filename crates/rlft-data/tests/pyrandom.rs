//! `PyRandom` against values printed by CPython's `random.Random`
//! (`scripts/reference/pyrandom_golden.py` -> `tests/data/pyrandom_golden.json`).

use rlft_data::pyrandom::PyRandom;
use serde_json::Value;

fn golden() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/pyrandom_golden.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn int(v: &Value) -> i128 {
    match v {
        Value::String(s) => s.parse().unwrap(),
        Value::Number(n) => n.as_i64().map(i128::from).unwrap(),
        _ => panic!("not an integer: {v}"),
    }
}

/// A float stored as its Python `repr` string, parsed exactly.
fn float(v: &Value) -> f64 {
    v.as_str().unwrap().parse().unwrap()
}

fn ints(v: &Value) -> Vec<i128> {
    v.as_array().unwrap().iter().map(int).collect()
}

#[test]
fn matches_cpython_for_every_seed_and_method() {
    let doc = golden();
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 9);
    for case in cases {
        let seed = int(&case["seed"]);
        let fresh = || PyRandom::from_int(seed);
        let ctx = format!("seed {seed}");

        let mut r = fresh();
        let got: Vec<i128> = (0..8).map(|_| i128::from(r.next_u32())).collect();
        assert_eq!(got, ints(&case["getrandbits32"]), "{ctx} getrandbits32");

        let mut r = fresh();
        for (i, want) in case["random"].as_array().unwrap().iter().enumerate() {
            let got = r.random();
            assert_eq!(got.to_bits(), float(want).to_bits(), "{ctx} random #{i}");
        }

        let mut r = fresh();
        for pair in case["getrandbits"].as_array().unwrap() {
            let k = pair[0].as_u64().unwrap() as u32;
            assert_eq!(
                i128::from(r.getrandbits(k)),
                int(&pair[1]),
                "{ctx} getrandbits({k})"
            );
        }

        let mut r = fresh();
        let got: Vec<i128> = (0..20).map(|_| i128::from(r.randint(0, 20))).collect();
        assert_eq!(got, ints(&case["randint_0_20"]), "{ctx} randint(0, 20)");

        let mut r = fresh();
        for pair in case["randrange"].as_array().unwrap() {
            let args: Vec<i64> = ints(&pair[0]).into_iter().map(|x| x as i64).collect();
            let got = match args[..] {
                [a, b] => r.randrange(a, b),
                [a, b, s] => r.randrange_step(a, b, s),
                _ => unreachable!(),
            };
            assert_eq!(i128::from(got), int(&pair[1]), "{ctx} randrange{args:?}");
        }

        let mut r = fresh();
        for pair in case["randbelow"].as_array().unwrap() {
            let n = int(&pair[0]) as u64;
            assert_eq!(
                i128::from(r.randbelow(n)),
                int(&pair[1]),
                "{ctx} _randbelow({n})"
            );
        }

        let mut r = fresh();
        let got: Vec<i128> = (0..20).map(|_| r.choice(3) as i128).collect();
        assert_eq!(got, ints(&case["choice3"]), "{ctx} choice");

        let mut r = fresh();
        for (i, round) in case["mixed"].as_array().unwrap().iter().enumerate() {
            let f = r.random();
            let n = r.randint(0, 20);
            let c = *r.choose(&[0, 1, 2]);
            assert_eq!(f.to_bits(), float(&round[0]).to_bits(), "{ctx} mixed #{i}");
            assert_eq!(i128::from(n), int(&round[1]), "{ctx} mixed #{i}");
            assert_eq!(c, int(&round[2]), "{ctx} mixed #{i}");
        }
    }
}

#[test]
#[should_panic(expected = "empty range")]
fn empty_ranges_panic_like_python_raises() {
    PyRandom::new(1).randint(5, 4);
}
