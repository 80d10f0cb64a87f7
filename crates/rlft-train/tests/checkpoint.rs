//! Checkpoints: exact round trips (resuming AdamW through one is bit-identical), atomic saves
//! that leave earlier checkpoints intact when the disk fills up, retention as data, and errors
//! that name the damaged file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, Var};
use rlft_train::checkpoint::{
    checkpoints_to_delete, latest_checkpoint, load_checkpoint, save_checkpoint, scan_checkpoints,
    Checkpoint, CheckpointError, CheckpointManager, DataPosition, OptimizerState, TrainerState,
    Weights, ADAPTER_CONFIG_FILE, ADAPTER_FILE, MANIFEST_FILE, MODEL_FILE, OPTIMIZER_FILE,
};
use rlft_train::{AdamW, AdamWConfig, ParamGroup};
use serde_json::{json, Map, Value};

fn t(values: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(values.to_vec(), shape, &Device::Cpu).unwrap()
}

fn trainer_state(step: u64) -> TrainerState {
    let mut log = Map::new();
    log.insert("loss".into(), json!(1.25));
    log.insert("learning_rate".into(), json!(1e-5));
    log.insert("step".into(), json!(step));
    let mut ts = TrainerState {
        global_step: step,
        epoch: step as f64 / 8.0,
        max_steps: Some(100),
        ..Default::default()
    };
    ts.log_history.push(log);
    ts.rlft.scheduler_step = step;
    ts.rlft.data_position = DataPosition {
        epoch: step / 8,
        index: step % 8 * 4,
    };
    ts.rlft.extra.insert("config_sha256".into(), json!("ab12"));
    ts
}

fn checkpoint(step: u64, scale: f32) -> Checkpoint {
    let w = t(&[1.0, -2.0, 3.5, 4.0, 5.0, 6.0].map(|x| x * scale), &[2, 3]);
    Checkpoint {
        weights: Weights {
            tensors: vec![
                ("model.layers.0.mlp.up_proj.weight".into(), w.clone()),
                (
                    "model.norm.weight".into(),
                    t(&[0.5, 0.25], &[2]).to_dtype(DType::BF16).unwrap(),
                ),
                ("lm_head.weight".into(), w.to_dtype(DType::F16).unwrap()),
            ],
            adapter_config: None,
        },
        optimizer: Some(OptimizerState {
            tensors: vec![
                (
                    "state.0.step".into(),
                    Tensor::new(step as f64, &Device::Cpu).unwrap(),
                ),
                ("state.0.exp_avg".into(), w.affine(0.1, 0.0).unwrap()),
                ("state.0.exp_avg_sq".into(), w.sqr().unwrap()),
            ],
            state: json!({"step": step, "kernel": "fused"}),
        }),
        trainer_state: trainer_state(step),
        rng_state: json!({"sampler": [1, 2, 3], "torch_like": "0badc0de"}),
    }
}

fn bits(t: &Tensor) -> (DType, Vec<usize>, Vec<u64>) {
    let v = t
        .to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap();
    (
        t.dtype(),
        t.dims().to_vec(),
        v.iter().map(|x| x.to_bits()).collect(),
    )
}

fn assert_same_tensors(a: &[(String, Tensor)], b: &[(String, Tensor)]) {
    let names = |v: &[(String, Tensor)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(a), names(b), "names and order");
    for ((n, x), (_, y)) in a.iter().zip(b) {
        assert_eq!(bits(x), bits(y), "{n}");
    }
}

/// Every file under `dir` with its bytes (to prove a failed save changed nothing).
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p.clone());
                out.push((p, Vec::new()));
            } else {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn round_trip_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(12, 1.0);
    let saved = save_checkpoint(dir.path(), &ckpt).unwrap();
    assert_eq!(saved.path, dir.path().join("checkpoint-12"));
    assert!(saved.bytes > 0);
    let mut files: Vec<_> = std::fs::read_dir(&saved.path)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    files.sort();
    let expected = [
        MODEL_FILE,
        OPTIMIZER_FILE,
        MANIFEST_FILE,
        "rng_state.json",
        "trainer_state.json",
    ]
    .map(std::ffi::OsString::from);
    let mut expected = expected.to_vec();
    expected.sort();
    assert_eq!(files, expected);

    let back = load_checkpoint(&saved.path, &Device::Cpu).unwrap();
    assert_same_tensors(&back.weights.tensors, &ckpt.weights.tensors);
    assert_eq!(back.weights.adapter_config, None);
    let (opt, opt0) = (back.optimizer.unwrap(), ckpt.optimizer.unwrap());
    assert_same_tensors(&opt.tensors, &opt0.tensors);
    assert_eq!(opt.state, opt0.state);
    assert_eq!(back.trainer_state, ckpt.trainer_state);
    assert_eq!(back.rng_state, ckpt.rng_state);

    // Plain safetensors files that candle (and so transformers) read; HF-like trainer_state.json.
    let model = candle_core::safetensors::load(saved.path.join(MODEL_FILE), &Device::Cpu).unwrap();
    assert_eq!(
        bits(&model["model.norm.weight"]),
        bits(&ckpt.weights.tensors[1].1)
    );
    let ts: Value = serde_json::from_str(
        &std::fs::read_to_string(saved.path.join("trainer_state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(ts["global_step"], 12);
    assert_eq!(ts["log_history"][0]["loss"], 1.25);
    assert_eq!(ts["best_metric"], Value::Null);
    assert_eq!(
        ts["rlft"]["data_position"],
        json!({"epoch": 1, "index": 16})
    );
}

#[test]
fn lora_adapter_checkpoint_without_optimizer() {
    let dir = tempfile::tempdir().unwrap();
    let mut ckpt = checkpoint(5, 1.0);
    let cfg = json!({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]});
    ckpt.weights.adapter_config = Some(cfg.clone());
    ckpt.optimizer = None;
    let saved = save_checkpoint(dir.path(), &ckpt).unwrap();
    assert!(saved.path.join(ADAPTER_FILE).is_file());
    assert!(saved.path.join(ADAPTER_CONFIG_FILE).is_file());
    assert!(!saved.path.join(MODEL_FILE).exists() && !saved.path.join(OPTIMIZER_FILE).exists());
    let back = load_checkpoint(&saved.path, &Device::Cpu).unwrap();
    assert_eq!(back.weights.adapter_config, Some(cfg));
    assert_same_tensors(&back.weights.tensors, &ckpt.weights.tensors);
    assert!(back.optimizer.is_none());
}

/// Three AdamW steps, save, three more; versus: load the checkpoint into fresh vars and a fresh
/// optimizer, three steps. Bit-identical, bf16 parameter (with its f32 master) included.
#[test]
fn adamw_resumes_bit_identically_through_a_checkpoint() {
    let make = |w: Tensor, b: Tensor| {
        let (w, b) = (Var::from_tensor(&w).unwrap(), Var::from_tensor(&b).unwrap());
        let cfg = AdamWConfig {
            lr: 1e-2,
            weight_decay: 0.1,
            ..Default::default()
        };
        let opt = AdamW::new(vec![ParamGroup::new(vec![w.clone(), b.clone()])], cfg).unwrap();
        (w, b, opt)
    };
    let step = |w: &Var, b: &Var, opt: &mut AdamW, i: usize| {
        let x = t(&[1.0, 2.0, -1.0].map(|v| v * (i as f32 + 1.0)), &[3, 1]);
        let y = w
            .as_tensor()
            .matmul(&x)
            .unwrap()
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap();
        let z = b
            .as_tensor()
            .to_dtype(DType::F32)
            .unwrap()
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap();
        let grads = (y + z).unwrap().backward().unwrap();
        opt.step(&grads).unwrap();
    };
    let w0 = t(&[0.1, -0.2, 0.3, 0.4, 0.5, -0.6], &[2, 3]);
    let b0 = t(&[1.0, -0.5], &[2]).to_dtype(DType::BF16).unwrap();
    let (w, b, mut opt) = make(w0, b0);
    for i in 0..3 {
        step(&w, &b, &mut opt, i);
    }
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint {
        weights: Weights {
            tensors: vec![
                ("w".into(), w.as_tensor().copy().unwrap()),
                ("b".into(), b.as_tensor().copy().unwrap()),
            ],
            adapter_config: None,
        },
        optimizer: Some(OptimizerState {
            tensors: opt.state_tensors().unwrap(),
            state: Value::Null,
        }),
        trainer_state: trainer_state(3),
        rng_state: Value::Null,
    };
    let saved = save_checkpoint(dir.path(), &ckpt).unwrap();
    for i in 3..6 {
        step(&w, &b, &mut opt, i);
    }

    let back = load_checkpoint(&saved.path, &Device::Cpu).unwrap();
    let weights: HashMap<_, _> = back.weights.tensors.into_iter().collect();
    let (w2, b2, mut opt2) = make(weights["w"].clone(), weights["b"].clone());
    let state: HashMap<_, _> = back.optimizer.unwrap().tensors.into_iter().collect();
    assert!(
        state.contains_key("state.1.master"),
        "bf16 param's master is saved: {:?}",
        state.keys()
    );
    opt2.load_state_tensors(&state).unwrap();
    for i in 3..6 {
        step(&w2, &b2, &mut opt2, i);
    }
    assert_eq!(bits(w.as_tensor()), bits(w2.as_tensor()));
    assert_eq!(bits(b.as_tensor()), bits(b2.as_tensor()));
}

#[test]
fn keep_last_follows_save_total_limit() {
    let s = [10, 20, 30, 40, 50];
    assert_eq!(checkpoints_to_delete(&s, None, None), Vec::<u64>::new());
    assert_eq!(checkpoints_to_delete(&s, Some(2), None), vec![10, 20, 30]);
    assert_eq!(checkpoints_to_delete(&s, Some(10), None), Vec::<u64>::new());
    // The best takes the second-newest slot: keep 2 -> best + newest.
    assert_eq!(
        checkpoints_to_delete(&s, Some(2), Some(20)),
        vec![10, 30, 40]
    );
    assert_eq!(checkpoints_to_delete(&s, Some(3), Some(20)), vec![10, 30]);
    // keep 1 with an older best keeps both; with the newest as best, just it.
    assert_eq!(
        checkpoints_to_delete(&s, Some(1), Some(20)),
        vec![10, 30, 40]
    );
    assert_eq!(
        checkpoints_to_delete(&s, Some(1), Some(50)),
        vec![10, 20, 30, 40]
    );
    // A best that is not on disk changes nothing; 0 never deletes the newest.
    assert_eq!(
        checkpoints_to_delete(&s, Some(2), Some(35)),
        vec![10, 20, 30]
    );
    assert_eq!(
        checkpoints_to_delete(&s, Some(0), None),
        vec![10, 20, 30, 40]
    );
    // Order and duplicates of the input do not matter.
    assert_eq!(
        checkpoints_to_delete(&[50, 10, 30, 10], Some(1), None),
        vec![10, 30]
    );
    assert_eq!(
        checkpoints_to_delete(&[], Some(1), Some(3)),
        Vec::<u64>::new()
    );
}

#[test]
fn manager_rotates_and_protects_the_best() {
    let dir = tempfile::tempdir().unwrap();
    let mgr = CheckpointManager::new(dir.path()).keep_last(Some(2));
    let mut deleted = Vec::new();
    for step in [10, 20, 30, 40] {
        let mut ckpt = checkpoint(step, 1.0);
        ckpt.trainer_state.best_global_step = Some(20);
        let saved = mgr.save(&ckpt).unwrap();
        assert!(saved.not_deleted.is_empty());
        deleted.extend(saved.deleted);
    }
    assert_eq!(deleted, vec![10, 30]);
    let steps: Vec<u64> = scan_checkpoints(dir.path())
        .unwrap()
        .iter()
        .map(|e| e.step)
        .collect();
    assert_eq!(steps, vec![20, 40]);
}

#[test]
fn latest_skips_temp_and_incomplete_directories() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    assert!(matches!(
        latest_checkpoint(&out.join("nope")),
        Err(CheckpointError::NotFound(_))
    ));
    assert_eq!(latest_checkpoint(out).unwrap(), None);
    save_checkpoint(out, &checkpoint(10, 1.0)).unwrap();
    save_checkpoint(out, &checkpoint(20, 1.0)).unwrap();
    // Debris a crash or a careless copy can leave behind, all newer than step 20.
    std::fs::create_dir(out.join(".checkpoint-90.tmp-1")).unwrap();
    std::fs::create_dir(out.join("checkpoint-80")).unwrap();
    std::fs::write(out.join("checkpoint-80/model.safetensors"), b"partial").unwrap();
    std::fs::write(out.join("checkpoint-70"), b"a file, not a directory").unwrap();
    let c60 = save_checkpoint(out, &checkpoint(60, 1.0)).unwrap().path;
    let model = c60.join(MODEL_FILE);
    let len = std::fs::metadata(&model).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&model)
        .unwrap()
        .set_len(len - 1)
        .unwrap();

    assert_eq!(
        latest_checkpoint(out).unwrap(),
        Some(out.join("checkpoint-20"))
    );
    let scan = scan_checkpoints(out).unwrap();
    let summary: Vec<_> = scan.iter().map(|e| (e.step, e.problem.is_none())).collect();
    assert_eq!(
        summary,
        vec![(10, true), (20, true), (60, false), (80, false)]
    );
    let p60 = scan[2].problem.as_deref().unwrap();
    assert!(
        p60.contains("model.safetensors") && p60.contains("expected"),
        "{p60}"
    );
    assert!(scan[3].problem.as_deref().unwrap().contains(MANIFEST_FILE));
}

#[test]
fn load_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = save_checkpoint(dir.path(), &checkpoint(7, 1.0))
        .unwrap()
        .path;

    let err = load_checkpoint(&dir.path().join("checkpoint-8"), &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no checkpoint at") && err.contains("checkpoint-8"),
        "{err}"
    );

    // One flipped bit in the optimizer state.
    let opt = path.join(OPTIMIZER_FILE);
    let mut bytes = std::fs::read(&opt).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&opt, &bytes).unwrap();
    let err = load_checkpoint(&path, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("optimizer.safetensors") && err.contains("corrupt") && err.contains("CRC-32C"),
        "{err}"
    );
    bytes[last] ^= 0x01;
    std::fs::write(&opt, &bytes).unwrap();
    load_checkpoint(&path, &Device::Cpu).unwrap();

    std::fs::remove_file(path.join("rng_state.json")).unwrap();
    let err = load_checkpoint(&path, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("incomplete") && err.contains("`rng_state.json` is missing"),
        "{err}"
    );

    std::fs::write(path.join(MANIFEST_FILE), b"{not json").unwrap();
    let err = load_checkpoint(&path, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("rlft_checkpoint.json") && err.contains("corrupt"),
        "{err}"
    );
}

#[test]
fn resaving_a_step_replaces_it() {
    let dir = tempfile::tempdir().unwrap();
    save_checkpoint(dir.path(), &checkpoint(4, 1.0)).unwrap();
    let path = save_checkpoint(dir.path(), &checkpoint(4, 2.0))
        .unwrap()
        .path;
    let back = load_checkpoint(&path, &Device::Cpu).unwrap();
    assert_same_tensors(&back.weights.tensors, &checkpoint(4, 2.0).weights.tensors);
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names,
        vec![std::ffi::OsString::from("checkpoint-4")],
        "no temp or swapped-aside dirs left"
    );
}

#[test]
fn disk_full_at_any_point_leaves_earlier_checkpoints_intact() {
    let dir = tempfile::tempdir().unwrap();
    save_checkpoint(dir.path(), &checkpoint(10, 1.0)).unwrap();
    let before = snapshot(dir.path());
    let total = std::fs::read_dir(dir.path().join("checkpoint-10"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum::<u64>();
    // Fail in the header, the tensor data, the JSON files and the manifest.
    for budget in [0, 5, 100, 300, total / 2, total - 200, total - 1] {
        let mgr = CheckpointManager::new(dir.path())
            .keep_last(Some(1))
            .simulate_disk_full_after(budget);
        let err = mgr.save(&checkpoint(20, 3.0)).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("saving checkpoint-20"), "{msg}");
        assert!(msg.contains("earlier checkpoints are untouched"), "{msg}");
        assert!(
            msg.contains("No space left on device") && msg.contains("the disk is full"),
            "{msg}"
        );
        assert!(
            msg.contains(".checkpoint-20.tmp-"),
            "names the file being written: {msg}"
        );
        assert_eq!(
            snapshot(dir.path()),
            before,
            "budget {budget}: output dir changed"
        );
    }
    // With room, the same save works and keep_last(1) then removes checkpoint-10.
    let mgr = CheckpointManager::new(dir.path())
        .keep_last(Some(1))
        .simulate_disk_full_after(total + 10_000);
    assert_eq!(mgr.save(&checkpoint(20, 3.0)).unwrap().deleted, vec![10]);
}

#[test]
fn blocked_temp_dir_is_an_error_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    save_checkpoint(dir.path(), &checkpoint(1, 1.0)).unwrap();
    let blocker = dir
        .path()
        .join(format!(".checkpoint-2.tmp-{}", std::process::id()));
    std::fs::write(&blocker, b"in the way").unwrap();
    let before = snapshot(dir.path());
    let err = save_checkpoint(dir.path(), &checkpoint(2, 1.0))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cannot create directory") && err.contains(".checkpoint-2.tmp-"),
        "{err}"
    );
    assert_eq!(snapshot(dir.path()), before);
}

#[test]
fn stale_temp_dirs_of_dead_processes_are_cleaned_up() {
    if !Path::new("/proc/self").exists() {
        return; // liveness is only known on Linux
    }
    let dir = tempfile::tempdir().unwrap();
    let stale = dir.path().join(".checkpoint-5.tmp-4000000000"); // above any pid_max
    std::fs::create_dir(&stale).unwrap();
    std::fs::write(stale.join(MODEL_FILE), b"half").unwrap();
    save_checkpoint(dir.path(), &checkpoint(6, 1.0)).unwrap();
    assert!(!stale.exists());
}

#[test]
fn duplicate_tensor_names_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let mut ckpt = checkpoint(3, 1.0);
    let dup = ckpt.weights.tensors[0].clone();
    ckpt.weights.tensors.push(dup);
    let err = save_checkpoint(dir.path(), &ckpt).unwrap_err().to_string();
    assert!(err.contains("appears twice"), "{err}");
    assert_eq!(latest_checkpoint(dir.path()).unwrap(), None);
}

/// A real ENOSPC: a 256 KiB tmpfs mounted in a private mount namespace (`unshare -rm`), the
/// test binary re-run inside it. Skipped where user namespaces are not available.
#[test]
fn real_disk_full_on_a_small_tmpfs() {
    const CHILD: &str = "RLFT_TMPFS_CHILD_DIR";
    if let Ok(dir) = std::env::var(CHILD) {
        let dir = Path::new(&dir);
        let small = save_checkpoint(dir, &checkpoint(10, 1.0)).unwrap();
        let before = snapshot(dir);
        let mut big = checkpoint(20, 1.0);
        let n = 128 * 1024; // 512 KiB of f32 > the 256 KiB filesystem
        big.weights.tensors.push((
            "big".into(),
            Tensor::zeros(n, DType::F32, &Device::Cpu).unwrap(),
        ));
        let msg = save_checkpoint(dir, &big).unwrap_err().to_string();
        assert!(
            msg.contains("No space left on device") && msg.contains("the disk is full"),
            "{msg}"
        );
        assert_eq!(snapshot(dir), before);
        load_checkpoint(&small.path, &Device::Cpu).unwrap();
        println!("real ENOSPC: {msg}");
        return;
    }
    let probe = std::process::Command::new("unshare")
        .args(["-rm", "true"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("skipped: `unshare -rm` is not available here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new("unshare")
        .args([
            "-rm",
            "sh",
            "-c",
            "mount -t tmpfs -o size=256k tmpfs \"$0\" && exec \"$@\"",
        ])
        .arg(dir.path())
        .arg(exe)
        .args([
            "--exact",
            "real_disk_full_on_a_small_tmpfs",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, dir.path())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(
        text.contains("real ENOSPC") && text.contains("1 passed"),
        "{text}"
    );
    let at = text.find("real ENOSPC").unwrap();
    println!("{}", text[at..].lines().next().unwrap());
}
