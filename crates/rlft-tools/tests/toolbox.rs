//! The tool box end to end: config tables, the built-in calculator, a command tool that
//! answers, fails, hangs, crashes and talks garbage, and an HTTP tool. Every failure is a failed
//! call the model reads; none is an error of the run, and none hangs it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::time::Instant;

use rlft_tools::{ToolBox, ToolCall, ToolSpec};
use serde_json::{json, Value};

fn specs(toml_text: &str) -> Vec<ToolSpec> {
    #[derive(serde::Deserialize)]
    struct Cfg {
        tools: Vec<ToolSpec>,
    }
    toml::from_str::<Cfg>(toml_text).unwrap().tools
}

fn call(name: &str, args: Value) -> ToolCall {
    ToolCall {
        name: name.into(),
        arguments: args.as_object().unwrap().clone(),
    }
}

#[test]
fn calculator_answers_and_explains_bad_calls() {
    let tools = ToolBox::new(&specs("[[tools]]\ntype = \"calculator\"\n")).unwrap();
    assert_eq!(tools.names(), vec!["calculator"]);
    let schema = &tools.schemas()[0];
    assert_eq!(schema["type"], "function");
    assert_eq!(schema["function"]["name"], "calculator");
    assert_eq!(
        schema["function"]["parameters"]["required"],
        json!(["expression"])
    );
    let a = tools.call(&call("calculator", json!({"expression": "17 * (18 - 14)"})));
    assert_eq!((a.content.as_str(), a.failed), ("68", false));
    let a = tools.call(&call("calculator", json!({"expression": "1 / 0"})));
    assert_eq!(
        (a.content.as_str(), a.failed),
        ("error: division by zero", true)
    );
    let a = tools.call(&call("calculator", json!({"expr": "1"})));
    assert!(a.failed && a.content.contains("\"expression\""), "{a:?}");
    let a = tools.call(&call("search", json!({})));
    assert!(
        a.failed && a.content.contains("unknown tool `search`"),
        "{a:?}"
    );
    assert!(a.content.contains("calculator"));
}

#[test]
fn config_errors_name_the_fix() {
    let err = |t: &str| match ToolBox::new(&specs(t)) {
        Ok(_) => panic!("accepted: {t}"),
        Err(e) => e.to_string(),
    };
    let e = err("[[tools]]\ntype = \"command\"\nname = \"s\"\ncommand = [\"x\"]\n");
    assert!(e.contains("tool `s`") && e.contains("description"), "{e}");
    let e = err("[[tools]]\ntype = \"calculator\"\n[[tools]]\ntype = \"calculator\"\n");
    assert!(e.contains("two [[tools]]"), "{e}");
    let e = err("[[tools]]\ntype = \"http\"\ndescription = \"d\"\nparameters = {}\n");
    assert!(e.contains("`url` is missing"), "{e}");
    let e = err("[[tools]]\ntype = \"calculator\"\nurl = \"http://x\"\n");
    assert!(e.contains("belong to command and http tools"), "{e}");
    let bad = toml::from_str::<toml::Value>("[[tools]]\ntype = \"calc\"\n").unwrap();
    let e = serde_json::from_value::<ToolSpec>(serde_json::to_value(&bad["tools"][0]).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("calculator") && e.contains("command"), "{e}");
}

const TOOL_PY: &str = r#"
import json, sys, time
for line in sys.stdin:
    req = json.loads(line)
    q = req["arguments"].get("q", "")
    if q == "hang":
        time.sleep(60)
    if q == "crash":
        sys.exit(3)
    if q == "garbage":
        print("not json", flush=True)
        continue
    if q == "fail":
        print(json.dumps({"error": "no such page"}), flush=True)
        continue
    print(json.dumps({"content": "found " + q}), flush=True)
"#;

#[test]
fn command_tool_answers_and_every_failure_is_a_failed_call() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("tool.py");
    std::fs::write(&script, TOOL_PY).unwrap();
    let t = format!(
        "[[tools]]\ntype = \"command\"\nname = \"search\"\ndescription = \"Search\"\n\
         parameters = {{ type = \"object\", properties = {{ q = {{ type = \"string\" }} }} }}\n\
         command = [\"python3\", \"{}\"]\ntimeout_s = 2\n",
        script.display()
    );
    let tools = ToolBox::new(&specs(&t)).unwrap();
    let ask = |q: &str| tools.call(&call("search", json!({ "q": q })));
    assert_eq!(ask("rust").content, "found rust");
    assert_eq!(ask("again").content, "found again");
    let a = ask("fail");
    assert_eq!(
        (a.content.as_str(), a.failed),
        ("error: no such page", true)
    );
    let a = ask("garbage");
    assert!(a.failed && a.content.contains("not JSON"), "{a:?}");
    let a = ask("crash");
    assert!(
        a.failed && a.content.contains("tool process") && a.content.contains("calls"),
        "{a:?}"
    );
    let t0 = Instant::now();
    let a = ask("hang");
    assert!(
        a.failed && a.content.contains("no answer within 2 s"),
        "{a:?}"
    );
    assert!(t0.elapsed().as_secs_f64() < 10.0);
    // A fresh process answers the next call.
    assert_eq!(ask("after").content, "found after");
}

#[test]
fn http_tool_posts_the_call() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut len = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
            if line == "\r\n" {
                break;
            }
        }
        let mut body = vec![0; len];
        reader.read_exact(&mut body).unwrap();
        let req: Value = serde_json::from_slice(&body).unwrap();
        let out = json!(format!("{} of {}", req["name"], req["arguments"]["city"])).to_string();
        let mut s = stream;
        write!(
            s,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{out}",
            out.len()
        )
        .unwrap();
    });
    let t = format!(
        "[[tools]]\ntype = \"http\"\nname = \"weather\"\ndescription = \"Weather\"\n\
         parameters = {{ type = \"object\" }}\nurl = \"http://{addr}/tool\"\n"
    );
    let tools = ToolBox::new(&specs(&t)).unwrap();
    let a = tools.call(&call("weather", json!({"city": "Paris"})));
    assert_eq!(
        (a.content.as_str(), a.failed),
        ("\"weather\" of \"Paris\"", false)
    );
    server.join().unwrap();
    // Nobody listens any more: a failed call, not an error.
    let a = tools.call(&call("weather", json!({"city": "Paris"})));
    assert!(a.failed && a.content.contains("POST http://"), "{a:?}");
}

/// 600 random expressions against Python (`scripts/reference/calculator_cases.py`): the same
/// value, written as Python's `repr` writes it, or the same kind of error.
#[test]
fn calculator_equals_python_on_random_expressions() {
    let cases: Vec<Value> =
        serde_json::from_str(include_str!("data/calculator_cases.json")).unwrap();
    assert_eq!(cases.len(), 600);
    for c in &cases {
        let e = c["expression"].as_str().unwrap();
        let got = rlft_tools::calculator::evaluate(e);
        match (&c["value"], &c["error"]) {
            (Value::String(want), _) => {
                assert_eq!(got.map(|v| v.to_string()), Ok(want.clone()), "{e}")
            }
            (_, Value::String(kind)) => {
                let err = got.expect_err(e);
                assert!(err.contains(kind.as_str()), "{e}: {err} (Python: {kind})");
            }
            _ => panic!("bad case {c}"),
        }
    }
}
