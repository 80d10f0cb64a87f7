//! The environment client end to end: a python3 command environment that keeps episodes, bad
//! environments (crash, hang, garbage, answers out of protocol) that each stop with a clear
//! `EnvError::Failed` and never hang, an HTTP environment, and `[environment]` config errors.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::time::Instant;

use rlft_tools::environment::EnvironmentKind;
use rlft_tools::{EnvError, Environment, EnvironmentSpec, StepResult};
use serde_json::{json, Value};

/// Parses an `[environment]` table as a config file holds it.
fn spec(toml_text: &str) -> Result<EnvironmentSpec, String> {
    #[derive(serde::Deserialize)]
    struct Cfg {
        environment: EnvironmentSpec,
    }
    toml::from_str::<Cfg>(toml_text)
        .map(|c| c.environment)
        .map_err(|e| e.to_string())
}

/// A command environment running `script` (written to `dir`) with `timeout_s`.
fn command_env(dir: &Path, script: &str, timeout_s: f64) -> Environment {
    let path = dir.join("env.py");
    std::fs::write(&path, script).unwrap();
    let s = spec(&format!(
        "[environment]\ntype = \"command\"\ncommand = [\"python3\", \"{}\"]\ntimeout_s = {timeout_s}\n",
        path.display()
    ))
    .unwrap();
    Environment::new(&s).unwrap()
}

/// The message of an `EnvError::Failed` for `request` (panics on success or another error).
fn failure<T: std::fmt::Debug>(r: Result<T, EnvError>, request: &str) -> String {
    match r {
        Err(EnvError::Failed {
            request: got,
            message,
        }) => {
            assert_eq!(got, request, "{message}");
            message
        }
        other => panic!("expected EnvError::Failed for {request}, got {other:?}"),
    }
}

fn step(observation: Option<&str>, reward: Option<f64>, done: bool) -> StepResult {
    StepResult {
        observation: observation.map(String::from),
        reward,
        done,
    }
}

/// Guess the number `seed % row["n"]`; keeps each episode's state until `close`.
const GUESS_PY: &str = r#"
import json, sys
episodes = {}
for line in sys.stdin:
    req = json.loads(line)
    m = req["method"]
    if m == "reset":
        row = req["row"]
        episodes[req["episode"]] = {"seed": req["seed"], "row": row, "target": req["seed"] % row["n"]}
        if "obs" in row:
            out = {"observation": row["obs"]}
        elif row.get("no_key"):
            out = {}
        else:
            out = {"observation": "Guess a number below " + str(row["n"])}
    elif m == "step":
        a = req["action"]
        if a == "episodes":
            out = {"observation": ",".join(sorted(episodes)), "reward": None, "done": False}
        elif req["episode"] not in episodes:
            out = {"observation": "unknown episode " + req["episode"], "done": True}
        elif a == "echo":
            e = episodes[req["episode"]]
            out = {"observation": json.dumps({"seed": e["seed"], "row": e["row"]}), "done": False}
        elif a == "give up":
            out = {"observation": None, "reward": 0.25}
        else:
            g, t = int(a), episodes[req["episode"]]["target"]
            if g == t:
                out = {"observation": "correct", "reward": 1.0, "done": True}
            elif g < t:
                out = {"observation": "higher"}
            else:
                out = {"observation": "lower", "reward": None, "done": False}
    elif m == "close":
        for e in req["episodes"]:
            episodes.pop(e, None)
        out = {}
    print(json.dumps(out), flush=True)
"#;

/// A command environment keeps per-episode state: reset's observation comes from the row;
/// `null`, `""` and a missing `observation` are `None`; a step's observation, reward (`null` or
/// missing: `None`) and done are read as sent; the process receives `seed` (a full u64) and
/// `row` exactly; episodes interleave; close drops them.
#[test]
fn command_environment_runs_interleaved_episodes() {
    let dir = tempfile::tempdir().unwrap();
    let env = command_env(dir.path(), GUESS_PY, 10.0);
    assert_eq!(env.max_turns(), None);

    let obs = env.reset("e0", 7, &json!({"n": 10})).unwrap();
    assert_eq!(obs.as_deref(), Some("Guess a number below 10"));
    assert_eq!(env.reset("e1", 12, &json!({"n": 10})).unwrap(), obs);
    assert_eq!(
        env.reset("e2", 1, &json!({"n": 5, "obs": null})).unwrap(),
        None
    );
    assert_eq!(
        env.reset("e3", 1, &json!({"n": 5, "obs": ""})).unwrap(),
        None
    );
    assert_eq!(
        env.reset("e4", 1, &json!({"n": 5, "no_key": true}))
            .unwrap(),
        None
    );

    // The process got the seed and the row as sent (a u64 beyond f64's 2^53, unicode, nesting).
    let row = json!({"n": 3, "prompt": "héllo \"wörld\"\n", "meta": {"tags": [1, 2.5, null]}});
    env.reset("big", u64::MAX, &row).unwrap();
    let got = env.step("big", "echo").unwrap();
    assert!(!got.done && got.reward.is_none(), "{got:?}");
    let echoed: Value = serde_json::from_str(&got.observation.unwrap()).unwrap();
    assert_eq!(echoed, json!({"seed": u64::MAX, "row": row}));

    // Interleaved: e0's target is 7, e1's is 2.
    assert_eq!(
        env.step("e0", "3").unwrap(),
        step(Some("higher"), None, false)
    );
    assert_eq!(
        env.step("e1", "3").unwrap(),
        step(Some("lower"), None, false)
    );
    assert_eq!(
        env.step("e0", "9").unwrap(),
        step(Some("lower"), None, false)
    );
    assert_eq!(
        env.step("e1", "2").unwrap(),
        step(Some("correct"), Some(1.0), true)
    );
    assert_eq!(
        env.step("e0", "7").unwrap(),
        step(Some("correct"), Some(1.0), true)
    );
    assert_eq!(
        env.step("e2", "give up").unwrap(),
        step(None, Some(0.25), false)
    );

    // Close drops the episodes it names, and only those.
    let all = ["big", "e0", "e1", "e2", "e3", "e4"].join(",");
    assert_eq!(
        env.step("e0", "episodes").unwrap().observation.unwrap(),
        all
    );
    env.close(&["e0".to_string(), "e1".to_string()]).unwrap();
    env.close(&[]).unwrap();
    let left = env.step("e2", "episodes").unwrap().observation.unwrap();
    assert_eq!(left, "big,e2,e3,e4");
    let got = env.step("e0", "1").unwrap();
    assert_eq!(got, step(Some("unknown episode e0"), None, true));
}

/// Stateless; the action picks how it misbehaves. `pid` tells which process answers.
const BAD_PY: &str = r#"
import json, os, sys, time
for line in sys.stdin:
    req = json.loads(line)
    if req["method"] == "reset":
        obs = req["row"].get("obs", "hi")
        print(json.dumps(obs if req["row"].get("bare") else {"observation": obs}), flush=True)
        continue
    a = req["action"]
    if a == "crash":
        print("env: boom", file=sys.stderr, flush=True)
        sys.exit(3)
    if a == "hang":
        time.sleep(60)
    if a == "garbage":
        print("not json at all", flush=True)
        continue
    answers = {
        "reward": {"observation": "x", "reward": "high"},
        "nan": {"observation": "x", "reward": float("nan")},
        "done": {"observation": "x", "done": "yes"},
        "obs": {"observation": 3},
        "list": [1, 2],
        "pid": {"observation": str(os.getpid())},
    }
    print(json.dumps(answers[a]), flush=True)
"#;

/// Every bad environment stops with `EnvError::Failed` naming the request and what is wrong,
/// within a bounded time: a crash (exit status and stderr), a hang (killed at `timeout_s`),
/// non-JSON, a wrongly typed `reward`/`done`/`observation`, a non-object step answer. After a
/// crash or a hang the next request runs on a fresh process.
#[test]
fn bad_environments_fail_clearly_and_never_hang() {
    let dir = tempfile::tempdir().unwrap();
    // 2 s: each fresh interpreter must start and answer within it, also on a loaded machine.
    let env = command_env(dir.path(), BAD_PY, 2.0);
    let pid = |env: &Environment| env.step("e", "pid").unwrap().observation.unwrap();
    let first = pid(&env);

    let m = failure(env.step("e", "garbage"), "step of episode e");
    assert!(
        m.contains("not JSON") && m.contains("not json at all"),
        "{m}"
    );
    let m = failure(env.step("e", "reward"), "step of episode e");
    assert!(
        m.contains("`reward` must be a finite number") && m.contains("high"),
        "{m}"
    );
    // Python writes NaN, which is not JSON.
    let m = failure(env.step("e", "nan"), "step of episode e");
    assert!(m.contains("not JSON") && m.contains("NaN"), "{m}");
    let m = failure(env.step("e", "done"), "step of episode e");
    assert!(
        m.contains("`done` must be true or false") && m.contains("yes"),
        "{m}"
    );
    let m = failure(env.step("e", "obs"), "step of episode e");
    assert!(m.contains("`observation` must be a string or null"), "{m}");
    let m = failure(env.step("e", "list"), "step of episode e");
    assert!(m.contains("not an object") && m.contains("[1,2]"), "{m}");
    let m = failure(env.reset("r", 0, &json!({"obs": 3})), "reset of episode r");
    assert!(m.contains("`observation` must be a string or null"), "{m}");
    // A reset may answer the bare observation.
    let obs = env
        .reset("r", 0, &json!({"obs": "plain", "bare": true}))
        .unwrap();
    assert_eq!(obs.as_deref(), Some("plain"));
    let m = failure(
        env.reset("r", 0, &json!({"obs": [1], "bare": true})),
        "reset of episode r",
    );
    assert!(m.contains("`observation` must be a string or null"), "{m}");
    // Answers out of protocol leave the process in step: the same one answers.
    assert_eq!(pid(&env), first);

    let t0 = Instant::now();
    let m = failure(env.step("e", "crash"), "step of episode e");
    assert!(t0.elapsed().as_secs_f64() < 5.0);
    assert!(
        m.contains("environment process") && m.contains("exit") && m.contains("env: boom"),
        "{m}"
    );
    let second = pid(&env);
    assert_ne!(second, first, "a crashed process answered again");

    let t0 = Instant::now();
    let m = failure(env.step("e", "hang"), "step of episode e");
    let took = t0.elapsed().as_secs_f64();
    assert!((1.9..6.0).contains(&took), "took {took} s: {m}");
    assert!(
        m.contains("no answer within 2 s") && m.contains("timeout_s"),
        "{m}"
    );
    #[cfg(target_os = "linux")]
    assert!(
        !Path::new(&format!("/proc/{second}")).exists(),
        "the hung process {second} still runs"
    );
    let third = pid(&env);
    assert!(third != first && third != second);
}

/// A program that cannot start is a `Failed` request naming it, not a panic or a hang.
#[test]
fn missing_program_fails_the_request() {
    let s =
        spec("[environment]\ntype = \"command\"\ncommand = [\"/nonexistent/env-bin\"]\n").unwrap();
    let env = Environment::new(&s).unwrap();
    let m = failure(env.reset("e", 1, &json!({})), "reset of episode e");
    assert!(
        m.contains("/nonexistent/env-bin") && m.contains("cannot start"),
        "{m}"
    );
}

/// Serves `n` connections on `listener`, one request each, answering with `answer(request
/// line, body)`'s status and body; returns the request lines.
fn serve(
    listener: TcpListener,
    n: usize,
    mut answer: impl FnMut(&Value) -> (u16, String) + Send + 'static,
) -> std::thread::JoinHandle<Vec<String>> {
    std::thread::spawn(move || {
        let mut lines = Vec::new();
        for _ in 0..n {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut first = String::new();
            reader.read_line(&mut first).unwrap();
            lines.push(first.trim().to_string());
            let mut len = 0;
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap();
                }
                if line == "\r\n" || line.is_empty() {
                    break;
                }
            }
            let mut body = vec![0; len];
            reader.read_exact(&mut body).unwrap();
            let (status, out) = answer(&serde_json::from_slice(&body).unwrap());
            let mut s = stream;
            write!(
                s,
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{out}",
                out.len()
            )
            .unwrap();
        }
        lines
    })
}

/// An HTTP environment: reset and step are POSTed to the url with the same protocol and read
/// from the body; a 500 answer is a `Failed` request quoting the status and body.
#[test]
fn http_environment_round_trips_and_reports_errors() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut target = 0;
    let server = serve(listener, 3, move |req| match req["method"].as_str() {
        Some("reset") => {
            target = req["seed"].as_u64().unwrap() % req["row"]["n"].as_u64().unwrap();
            let obs = format!(
                "{}: guess below {}",
                req["episode"].as_str().unwrap(),
                req["row"]["n"]
            );
            (200, json!({ "observation": obs }).to_string())
        }
        Some("step") if req["action"] == target.to_string().as_str() => (
            200,
            json!({"observation": null, "reward": 1.0, "done": true}).to_string(),
        ),
        _ => (500, "environment exploded".to_string()),
    });
    let s = spec(&format!(
        "[environment]\ntype = \"http\"\nurl = \"http://{addr}/env\"\ntimeout_s = 5\nmax_turns = 3\n"
    ))
    .unwrap();
    let env = Environment::new(&s).unwrap();
    assert_eq!(env.max_turns(), Some(3));
    let obs = env.reset("h1", 13, &json!({"n": 10})).unwrap();
    assert_eq!(obs.as_deref(), Some("h1: guess below 10"));
    assert_eq!(env.step("h1", "3").unwrap(), step(None, Some(1.0), true));
    let m = failure(env.step("h1", "4"), "step of episode h1");
    assert!(
        m.contains(&format!("POST http://{addr}/env"))
            && m.contains("500")
            && m.contains("environment exploded"),
        "{m}"
    );
    let lines = server.join().unwrap();
    assert!(
        lines.iter().all(|l| l.starts_with("POST /env ")),
        "{lines:?}"
    );
    // Nobody listens any more: a Failed request, not a hang.
    let m = failure(env.close(&["h1".to_string()]), "close");
    assert!(m.contains("POST http://"), "{m}");
}

/// Each invalid `[environment]` table is refused with a message naming the fix.
#[test]
fn config_errors_name_the_fix() {
    let err = |t: &str| match Environment::new(&spec(t).unwrap()) {
        Ok(_) => panic!("accepted: {t}"),
        Err(e @ EnvError::Config(_)) => e.to_string(),
        Err(e) => panic!("not a config error: {e}"),
    };
    let cmd = "[environment]\ntype = \"command\"\n";
    let http = "[environment]\ntype = \"http\"\n";
    let e = err(cmd);
    assert!(
        e.starts_with("[environment]: `command` is empty") && e.contains("env.py"),
        "{e}"
    );
    let e = err(&format!("{cmd}command = [\" \"]\n"));
    assert!(e.contains("`command` is empty"), "{e}");
    let e = err(&format!("{cmd}command = [\"x\"]\nurl = \"http://h/\"\n"));
    assert!(
        e.contains("`url` belongs to type = \"http\"; remove it"),
        "{e}"
    );
    let e = err(&format!("{http}url = \"http://h/\"\ncommand = [\"x\"]\n"));
    assert!(
        e.contains("`command` belongs to type = \"command\"; remove it"),
        "{e}"
    );
    let e = err(http);
    assert!(
        e.contains("`url` is missing") && e.contains("http://"),
        "{e}"
    );
    let e = err(&format!("{http}url = \"https://h/\"\n"));
    assert!(e.contains("https"), "{e}");
    for t in ["0", "-1", "nan", "inf"] {
        let e = err(&format!("{cmd}command = [\"x\"]\ntimeout_s = {t}\n"));
        assert!(
            e.contains("timeout_s must be a positive number"),
            "{t}: {e}"
        );
    }
    let e = err(&format!("{cmd}command = [\"x\"]\ntimeout_s = 1e9\n"));
    assert!(e.contains("below 1e9"), "{e}");
    let e = err(&format!("{cmd}command = [\"x\"]\nmax_turns = 0\n"));
    assert!(
        e.contains("max_turns = 0") && e.contains("at least 1"),
        "{e}"
    );

    let e = spec(&format!("{cmd}command = [\"x\"]\nmax_turn = 2\n")).unwrap_err();
    assert!(
        e.contains("unknown field `max_turn`") && e.contains("max_turns"),
        "{e}"
    );
    let e = spec("[environment]\ntype = \"grpc\"\n").unwrap_err();
    assert!(
        e.contains("grpc") && e.contains("command") && e.contains("http"),
        "{e}"
    );
    let e = spec("[environment]\ncommand = [\"x\"]\n").unwrap_err();
    assert!(e.contains("type"), "{e}");

    // The defaults.
    let s = spec(&format!("{cmd}command = [\"x\"]\n")).unwrap();
    assert_eq!(
        (s.kind, s.timeout_s, s.max_turns),
        (EnvironmentKind::Command, 30.0, None)
    );
}

/// A huge `timeout_s` on an http environment is a config error, not a panic in
/// `Duration::from_secs_f64`.
#[test]
fn huge_http_timeout_is_a_config_error_not_a_panic() {
    let s =
        spec("[environment]\ntype = \"http\"\nurl = \"http://127.0.0.1:1/\"\ntimeout_s = 1e30\n")
            .unwrap();
    let r = std::panic::catch_unwind(|| Environment::new(&s).map(|_| ()));
    match r {
        Ok(Err(EnvError::Config(m))) => assert!(m.contains("timeout_s"), "{m}"),
        Ok(other) => panic!("accepted or wrong error: {other:?}"),
        Err(_) => panic!("Environment::new panicked on timeout_s = 1e30"),
    }
}

/// Process failures of an environment are not worded as a reward's (`reward \`environment\``,
/// "the next batch").
#[test]
fn process_failures_are_not_called_a_reward() {
    let dir = tempfile::tempdir().unwrap();
    let env = command_env(dir.path(), BAD_PY, 1.0);
    for action in ["crash", "hang"] {
        let m = failure(env.step("e", action), "step of episode e");
        assert!(
            !m.contains("reward `environment`") && !m.contains("batch"),
            "{m}"
        );
    }
}
