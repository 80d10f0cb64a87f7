//! The engine on tiny random models against `rlft_model::generate`: a job alone gives the same
//! tokens and text; jobs joining and leaving a running batch (more than fit at once) each give
//! what they give alone; streamed texts concatenate to the completion; a dropped receiver
//! cancels its job; the queue limits answer with their errors.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rlft_model::config::Family;
use rlft_model::load::{load_model, LoadOptions};
use rlft_model::tiny::{save_tiny_hf_dir, tiny_config};
use rlft_model::{generate, FinishReason, GenerateRequest, SamplingParams};
use rlft_serve::{Engine, EngineConfig, Event, Job, Registry, ServedModel, SubmitError};
use rlft_text::StopStrings;

fn served(family: Family, dir: &std::path::Path) -> Arc<ServedModel> {
    let path = dir.join(format!("{family:?}"));
    save_tiny_hf_dir(tiny_config(family), 9, &path).unwrap();
    let opts = LoadOptions {
        device: candle_core::Device::Cpu,
        dtype: candle_core::DType::F32,
        ..Default::default()
    };
    let reg = Registry::new(load_model(&path, &opts).unwrap(), "tiny").unwrap();
    reg.base().clone()
}

fn job(m: &Arc<ServedModel>, prompts: Vec<Vec<u32>>, n: usize, t: f32, seed: u64) -> Job {
    Job {
        model: m.clone(),
        prompts,
        n,
        max_tokens: 12,
        sampling: SamplingParams {
            temperature: t,
            ..SamplingParams::default()
        },
        seed,
        stop: StopStrings::new(Vec::<String>::new()).unwrap(),
        ignore_eos: false,
        top_logprobs: None,
    }
}

/// What a job produced per choice: ids, streamed text, finish reason.
type Outcome = Vec<(Vec<u32>, String, FinishReason)>;

fn run(engine: &Engine, j: Job) -> Outcome {
    let mut rx = engine.submit(j.clone()).unwrap();
    let mut out: Outcome = (0..j.rows())
        .map(|_| (Vec::new(), String::new(), FinishReason::Length))
        .collect();
    let mut open = j.rows();
    while open > 0 {
        match rx.blocking_recv().expect("events until every choice ends") {
            Event::Token {
                choice,
                token,
                text,
                ..
            } => {
                out[choice].0.push(token.token);
                out[choice].1.push_str(&text);
            }
            Event::Finished { choice, reason } => {
                out[choice].2 = reason;
                open -= 1;
            }
            Event::Failed(e) => panic!("{e}"),
        }
    }
    out
}

/// `rlft_model::generate` for the same job.
fn reference(j: &Job) -> Outcome {
    let m = &j.model;
    let req = GenerateRequest {
        prompts: j.prompts.clone(),
        n: j.n,
        max_new_tokens: j.max_tokens,
        sampling: j.sampling.clone(),
        seed: j.seed,
        eos_token_ids: m.eos_token_ids.clone(),
        stop_strings: j.stop.as_slice().to_vec(),
        pad_token_id: 0,
    };
    let detok = |ids: &[u32]| m.text.decode(ids, true).unwrap_or_default();
    generate(&m.model, &req, &detok)
        .unwrap()
        .into_iter()
        .map(|c| (c.token_ids, c.text, c.finish_reason))
        .collect()
}

#[test]
fn a_job_alone_generates_what_generate_does() {
    let tmp = tempfile::tempdir().unwrap();
    for family in [Family::Llama, Family::Qwen2, Family::Qwen3] {
        let m = served(family, tmp.path());
        let engine = Engine::start(EngineConfig::default());
        let prompts = vec![vec![1u32, 40, 41, 42, 43], vec![1u32, 40, 41, 60]];
        for (t, seed) in [(0.0, 0), (1.5, 3), (0.7, 4)] {
            let j = job(&m, prompts.clone(), 3, t, seed);
            let got = run(&engine, j.clone());
            assert_eq!(got, reference(&j), "{family:?} T {t}");
        }
        // A stop string taken from the middle of a sampled text cuts it there, as generate does.
        let mut j = job(&m, vec![prompts[0].clone()], 1, 1.5, 3);
        j.max_tokens = 40;
        let text = run(&engine, j.clone())[0].1.clone();
        let chars: Vec<char> = text.chars().collect();
        assert!(
            chars.len() >= 6,
            "{family:?}: a longer sample is needed: {text:?}"
        );
        let stop: String = chars[2..4].iter().collect();
        let mut j = j;
        j.stop = StopStrings::new([stop.clone()]).unwrap();
        let got = run(&engine, j.clone());
        assert_eq!(got, reference(&j), "{family:?} stop {stop:?}");
        assert_eq!(got[0].2, FinishReason::Stop);
        assert!(got[0].0.len() < 40 && !got[0].1.contains(&stop));
    }
}

#[test]
fn jobs_joining_a_running_batch_decode_as_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let m = served(Family::Qwen2, tmp.path());
    // Room for 4 sequences: 6 jobs of 2 wait, join as others finish, and leave at their end.
    let engine = Arc::new(Engine::start(EngineConfig {
        max_num_seqs: 4,
        ..EngineConfig::default()
    }));
    let jobs: Vec<Job> = (0..6)
        .map(|i| {
            let mut j = job(&m, vec![vec![1, 50 + i, 51, 52 + 2 * i]], 2, 1.2, i as u64);
            j.max_tokens = 4 + 3 * i as usize;
            j
        })
        .collect();
    let handles: Vec<_> = jobs
        .iter()
        .map(|j| {
            let (e, j) = (engine.clone(), j.clone());
            std::thread::spawn(move || run(&e, j))
        })
        .collect();
    for (h, j) in handles.into_iter().zip(&jobs) {
        assert_eq!(h.join().unwrap(), reference(j));
    }
    wait_idle(&engine, "a finished job was not counted out");
}

/// Waits (up to 20 s) for the engine thread to count every job out: it does so right after it
/// sends their last events, so a client may see those events first.
fn wait_idle(engine: &Engine, why: &str) {
    let t0 = Instant::now();
    while engine.in_flight() > 0 {
        assert!(t0.elapsed() < Duration::from_secs(20), "{why}");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        engine.running_seqs(),
        0,
        "jobs counted out before their sequences"
    );
}

#[test]
fn a_dropped_receiver_cancels_its_job() {
    let tmp = tempfile::tempdir().unwrap();
    let m = served(Family::Llama, tmp.path());
    let engine = Engine::start(EngineConfig::default());
    let mut j = job(&m, vec![vec![1, 7, 8]], 2, 1.0, 1);
    j.max_tokens = 400;
    j.ignore_eos = true;
    let mut rx = engine.submit(j).unwrap();
    assert!(matches!(rx.blocking_recv(), Some(Event::Token { .. })));
    drop(rx);
    wait_idle(&engine, "the job kept running");
}

#[test]
fn limits_answer_with_their_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let m = served(Family::Llama, tmp.path());
    let engine = Engine::start(EngineConfig {
        max_num_seqs: 2,
        max_queue: 0,
        ..EngineConfig::default()
    });
    let e = engine
        .submit(job(&m, vec![vec![1, 5]], 3, 1.0, 0))
        .unwrap_err();
    assert_eq!(e, SubmitError::TooManyRows { rows: 3, max: 2 });
    let e = engine
        .submit(job(&m, vec![vec![1, 5]], 1, 1.0, 0))
        .unwrap_err();
    assert_eq!(e, SubmitError::QueueFull(0));
    let engine = Engine::start(EngineConfig::default());
    engine.drain();
    let e = engine
        .submit(job(&m, vec![vec![1, 5]], 1, 1.0, 0))
        .unwrap_err();
    assert_eq!(e, SubmitError::Draining);
}
