//! The control protocol as a script speaks it: raw JSON lines on the socket. A rule the disk
//! cannot apply is refused on every path (socket `add` and `arm`, rules file, `fault add`, an
//! agent's `control` op) with a message that says what is wrong, and the device keeps answering.

mod common;
use common::*;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::{Duration, Instant};

/// One connection to the control socket, spoken by hand.
struct Raw {
    r: BufReader<UnixStream>,
    w: UnixStream,
}

impl Raw {
    fn connect(s: &Serve) -> Raw {
        let w = UnixStream::connect(&s.socket).unwrap();
        w.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Raw { r: BufReader::new(w.try_clone().unwrap()), w }
    }

    /// Send one line, return the reply line parsed.
    fn send(&mut self, line: &str) -> Value {
        writeln!(self.w, "{line}").unwrap();
        let mut reply = String::new();
        self.r.read_line(&mut reply).unwrap();
        serde_json::from_str(&reply).unwrap_or_else(|e| panic!("reply {reply:?} is not JSON: {e}"))
    }

    /// A request that must be refused; returns its error message.
    fn refused(&mut self, req: &Value) -> String {
        let v = self.send(&req.to_string());
        assert_eq!(v["ok"], json!(false), "{req} was accepted: {v}");
        v["error"].as_str().unwrap().to_string()
    }
}

/// Read block 0 on another thread: it must complete within a few seconds (a request the disk
/// never answers leaves the reader in D state).
fn read_completes(s: &Serve) {
    let d = s.open();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(read_block(&d, 0).map(|b| b.len())));
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(r) => assert_eq!(r.unwrap(), BS as usize),
        Err(_) => panic!("a read of the device did not complete within 10 s"),
    }
}

#[test]
fn protocol_raw_socket_refuses_rules_the_disk_cannot_apply() {
    let s = Serve::start("16MiB", "rules: []\n");
    let mut c = Raw::connect(&s);
    // a valid uniform delay, as `list` prints it
    let v = c.send(r#"{"cmd":"add","rules":"rules:\n  - {type: delay, op: read, delay: {distribution: uniform, min: 1us, max: 2us}}\n"}"#);
    assert_eq!(v["ok"], json!(true), "{v}");
    let listed = c.send(r#"{"cmd":"list"}"#);
    let mut rule = listed["result"][0].clone();
    for k in ["id", "matched", "fired", "blocks", "realized_ratio", "runs"] {
        rule.as_object_mut().unwrap().remove(k);
    }
    assert!(rule["delay"]["uniform"].is_object(), "{listed}");
    assert_eq!(c.send(r#"{"cmd":"clear"}"#)["ok"], json!(true));
    // the same rule armed again is accepted: what `list` prints is what `arm` takes
    let v = c.send(&json!({"cmd": "arm", "rules": [rule.clone()]}).to_string());
    assert_eq!(v["ok"], json!(true), "{v}");
    assert_eq!(c.send(r#"{"cmd":"clear"}"#)["ok"], json!(true));

    // min and max swapped: the sampler would panic on the next read
    let mut swapped = rule.clone();
    let (min, max) = (rule["delay"]["uniform"]["min"].clone(), rule["delay"]["uniform"]["max"].clone());
    swapped["delay"]["uniform"] = json!({"min": max, "max": min});
    let e = c.refused(&json!({"cmd": "arm", "rules": [swapped]}));
    assert!(e.contains("rule #1") && e.contains("uniform delay: `max` must be >= `min`"), "{e}");

    // a pareto shape of 0, and a named rule second in its batch: the whole batch is refused
    let mut pareto = rule.clone();
    pareto["delay"] = json!({"pareto": {"scale": {"secs": 0, "nanos": 1000}, "shape": 0.0}});
    pareto["name"] = json!("tail");
    let e = c.refused(&json!({"cmd": "arm", "rules": [rule.clone(), pareto]}));
    assert!(e.contains("rule #2 (tail)") && e.contains("`shape: 0` must be a positive number"), "{e}");

    // patterns the engine would divide by: a burst period that is not length / ratio, every 0
    let mut burst = rule.clone();
    burst["pattern"] = json!({"burst": {"ratio": 0.5, "length": 2, "period": 0}});
    let e = c.refused(&json!({"cmd": "arm", "rules": [burst]}));
    assert!(e.contains("`period: 0`") && e.contains("allowed: 4"), "{e}");
    let mut every = rule.clone();
    every["pattern"] = json!({"interval": {"every": 0}});
    let e = c.refused(&json!({"cmd": "arm", "rules": [every]}));
    assert!(e.contains("`every: 0` is no interval"), "{e}");

    // target past the end, errno 0, times 0, flush for a bitflip
    let mut past = rule.clone();
    past["target"] = json!({"range": {"start": 0, "end": 1u64 << 40}});
    let e = c.refused(&json!({"cmd": "arm", "rules": [past]}));
    assert!(e.contains("beyond the end of the disk (16777216 bytes"), "{e}");
    let e = c.refused(&json!({"cmd": "arm", "rules": [{"name": null, "type": "error", "errno": 0, "ops": ["read"], "target": "any", "times": null,
        "probability": null, "seed": 0, "window": null, "after_requests": 0, "after_bytes": 0}]}));
    assert!(e.contains("errno 0 is out of range; allowed: 1..4095"), "{e}");
    let mut never = rule.clone();
    never["times"] = json!(0);
    assert!(c.refused(&json!({"cmd": "arm", "rules": [never]})).contains("`times: 0` would never fire"));
    let e = c.refused(&json!({"cmd": "arm", "rules": [{"name": null, "type": "bitflip", "at": {"byte": 0, "bit": 9}, "ops": ["read"], "target": "any",
        "times": null, "probability": null, "seed": 0, "window": null, "after_requests": 0, "after_bytes": 0}]}));
    assert!(e.contains("`bit: 9` is not a bit number"), "{e}");

    // the YAML path: the same message, with the line
    let e = c.refused(&json!({"cmd": "add", "rules": "rules:\n  - {type: delay, delay: {distribution: uniform, min: 2us, max: 1us}}\n"}));
    assert!(e.starts_with("rules:2:") && e.contains("uniform delay: `max` must be >= `min`"), "{e}");
    let e = c.refused(&json!({"cmd": "add", "rules": "rules:\n  - {type: delay, delay: {distribution: pareto, scale: 1us, shape: 0}}\n"}));
    assert!(e.starts_with("rules:2:") && e.contains("`shape: 0` must be a positive number"), "{e}");

    // nothing was armed, the connection still answers, and so does the device
    let v = c.send(r#"{"cmd":"list"}"#);
    assert_eq!(v, json!({"ok": true, "result": []}));
    read_completes(&s);
    s.stop();
}

#[test]
fn protocol_rules_file_and_fault_add_refuse_the_same_rules() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("swapped.yaml");
    std::fs::write(&bad, "rules:\n  - {type: error}\n  - {type: delay, delay: {distribution: uniform, min: 2ms, max: 1ms}}\n").unwrap();
    let t = Instant::now();
    let o = Command::new(bin()).args(["serve", "--size", "16MiB", "--rules"]).arg(&bad).output().unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && o.stdout.is_empty(), "serve with a bad rules file started: {e}");
    assert!(e.contains(&format!("{}:3:", bad.display())) && e.contains("rule #2") && e.contains("`max` must be >= `min`"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(30));

    let s = Serve::start("16MiB", "rules: []\n");
    let pareto = dir.path().join("pareto.yaml");
    std::fs::write(&pareto, "rules:\n  - {type: delay, op: read, delay: {distribution: pareto, scale: 1us, shape: -1}}\n").unwrap();
    let o = Command::new(bin()).arg("fault").arg("--socket").arg(&s.socket).arg("add").arg(&pareto).output().unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains(&format!("{}:2:", pareto.display())) && e.contains("`shape: -1` must be a positive number"), "{e}");
    assert!(s.rules().is_empty());
    read_completes(&s);
    s.stop();
}

/// A run hands each disk server its disk as one typed document (`serve --spec-json`), which
/// the server takes as given and `info` reports back; the disk's flags cannot be mixed in.
#[test]
fn protocol_serve_takes_its_disk_as_one_document() {
    use faultline::spec::disk::{DiskConfig, DiskSpec, RingMode};
    let spec = DiskSpec {
        disk: DiskConfig { size: Some(8 << 20), block_size: 512, ..Default::default() },
        front: faultline::spec::disk::FrontendOptions { ring: RingMode::Off, busy_poll: Duration::ZERO, ..Default::default() },
    };
    let json = serde_json::to_string(&spec).unwrap();
    assert_eq!(serde_json::from_str::<DiskSpec>(&json).unwrap(), spec, "{json}");
    let s = Serve::start_args(&["--spec-json", &json], "rules: []\n");
    let info = faultline::frontend::control::Client::socket(&s.socket).info().unwrap();
    assert_eq!((info.block_size, info.size), (512, 8 << 20), "{info:?}");
    assert!(info.transport.as_deref().is_some_and(|t| t.starts_with("/dev/fuse")), "{info:?}");
    let st = faultline::frontend::control::Client::socket(&s.socket).stats().unwrap();
    assert!(st.latency_model.is_none() && st.nbd_client.is_none() && st.nbd_server.is_none());
    s.stop();

    let o = Command::new(bin()).args(["serve", "--size", "1GiB", "--spec-json"]).arg(&json).output().unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("--spec-json") && e.contains("--size"), "{e}");
    let o = Command::new(bin()).args(["serve", "--spec-json", r#"{"disk":{"size":1}}"#]).output().unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("--spec-json: not a disk spec"), "{e}");
}

/// The agents' path: a run across machines arms a target's rules through its agent's
/// `control` op, which relays the typed request to the server's socket. The same check refuses
/// a rule the disk cannot apply there, the agent says so, and the device keeps answering.
#[test]
fn protocol_agent_control_refuses_rules_the_disk_cannot_apply() {
    use faultline::cluster::proto::Op;
    use faultline::cluster::{Agent, Channel};
    use faultline::fault::{Action, Op as IoOp, Rule, Target};
    use faultline::frontend::control::Request;
    use faultline::spec::rule::DelayDist;
    let s = Serve::start("16MiB", "rules: []\n");
    // `env` as the exec channel: the agent runs here, as it would behind ssh
    let mut a = Agent::connect(&Channel::Exec(vec!["env".into()]), bin()).unwrap();
    let swapped = DelayDist::Uniform { min: Duration::from_micros(2), max: Duration::from_micros(1) };
    let rule = Rule::new(Action::Delay { delay: swapped, hold: Default::default() }, &[IoOp::Read], Target::Any);
    let socket = s.socket.to_str().unwrap().to_string();
    let e = a.call(Op::Control { socket: socket.clone(), request: Request::Arm { rules: vec![rule] } }, Duration::from_secs(10)).unwrap_err();
    assert!(format!("{e:#}").contains("uniform delay: `max` must be >= `min`"), "{e:#}");
    // nothing armed; the agent and the device still answer
    let listed = a.call(Op::Control { socket, request: Request::List }, Duration::from_secs(10)).unwrap();
    assert_eq!(listed, json!([]));
    read_completes(&s);
    drop(a);
    s.stop();
}
