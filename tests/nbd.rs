//! The NBD server against clients nobody here wrote (libnbd's nbdinfo, nbdcopy, nbdsh; qemu's
//! qemu-img and qemu-io where installed) and against hostile clients written here with raw
//! sockets. Needs root (the serve ledger), libnbd-bin, python3-libnbd (scripts/setup.sh).

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_faultline")
}

/// A `faultline serve --nbd` child; `lines` are its first stdout lines (device and/or URI).
struct Server {
    child: Child,
    lines: Vec<String>,
    socket: PathBuf,
    stderr: PathBuf,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start(nbd: &str, extra: &[&str], rules: &str) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let rules_path = dir.path().join("rules.yaml");
        std::fs::write(&rules_path, rules).unwrap();
        let socket = dir.path().join("ctl.sock");
        let stderr = dir.path().join("stderr");
        let nbd = nbd.replace("DIR", &dir.path().display().to_string());
        let mut child = Command::new(bin())
            .args(["serve", "--size", "64MiB", "--nbd", &nbd])
            .args(extra)
            .arg("--rules")
            .arg(&rules_path)
            .arg("--socket")
            .arg(&socket)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("spawn faultline serve");
        let n = if extra.contains(&"--no-loop") { 1 } else { 2 };
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let lines = (0..n)
            .map(|_| {
                let mut l = String::new();
                out.read_line(&mut l).unwrap();
                l.trim().to_string()
            })
            .collect();
        Server { child, lines, socket, stderr, _dir: dir }
    }

    fn uri(&self) -> &str {
        self.lines.last().unwrap()
    }

    fn tcp_addr(&self) -> String {
        self.uri().strip_prefix("nbd://").expect("a tcp server").trim_end_matches('/').to_string()
    }

    fn call(&self, req: Value) -> Value {
        faultline::frontend::control::call(&self.socket, &req).unwrap()
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    fn stop(mut self) -> String {
        // SAFETY: signalling our own child by its pid
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let st = self.child.wait().unwrap();
        let err = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        assert!(st.success(), "serve exited with {st}: {err}");
        assert!(!err.contains("panicked"), "serve panicked: {err}");
        err
    }
}

impl Drop for Server {
    /// A test that failed before `stop` does not leave its server running.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: signalling our own child by its pid, not yet reaped
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let _ = self.child.wait();
        }
    }
}

fn run(cmd: &mut Command) -> String {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e} (scripts/setup.sh installs the NBD clients)"));
    assert!(o.status.success(), "{cmd:?} failed: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

/// nbdsh runs `python3 -m nbd` from PATH: the system python has the bindings.
fn nbdsh(uri: &str, script: &str) -> String {
    let path = format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default());
    run(Command::new("nbdsh").env("PATH", path).args(["-u", uri, "-c", script]))
}

fn random_file(dir: &Path, len: u64, seed: u64) -> (PathBuf, Vec<u8>) {
    let mut x = seed | 1;
    let data: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let p = dir.join(format!("rand-{seed}"));
    std::fs::write(&p, &data).unwrap();
    (p, data)
}

#[test]
fn nbdinfo_shows_size_flags_and_exports() {
    let s = Server::start("tcp://127.0.0.1:0", &["--no-loop"], "rules: []\n");
    assert!(s.uri().starts_with("nbd://127.0.0.1:"), "first line is the URI: {:?}", s.lines);
    let j: Value = serde_json::from_str(&run(Command::new("nbdinfo").args(["--json", s.uri()]))).unwrap();
    assert_eq!(j["protocol"], "newstyle-fixed");
    assert_eq!(j["structured"], true);
    let e = &j["exports"][0];
    assert_eq!(e["export-size"], 64 * MIB);
    for (k, v) in [
        ("is_read_only", false),
        ("can_flush", true),
        ("can_fua", true),
        ("can_trim", true),
        ("can_zero", true),
        ("can_fast_zero", true),
        ("can_multi_conn", true),
        ("can_df", true),
    ] {
        assert_eq!(e[k], v, "{k} in {e}");
    }
    assert_eq!(e["block_size_minimum"], 1);
    assert_eq!(e["block_size_preferred"], 4096);
    assert_eq!(e["block_size_maximum"], 32 * MIB);
    // the named export, the list, and an unknown name
    let list = run(Command::new("nbdinfo").args(["--list", s.uri()]));
    assert!(list.contains("export=\"faultline\""), "{list}");
    let named = format!("{}/faultline", s.uri().trim_end_matches('/'));
    assert!(run(Command::new("nbdinfo").args(["--size", &named])).trim() == (64 * MIB).to_string());
    let bad = Command::new("nbdinfo").args(["--size", &format!("{}/nope", s.uri().trim_end_matches('/'))]).output().unwrap();
    assert!(!bad.status.success(), "an unknown export name must be refused");
    s.stop();
}

#[test]
fn nbdcopy_in_and_out_over_tcp_and_unix_with_several_connections() {
    let dir = tempfile::tempdir().unwrap();
    let (src, data) = random_file(dir.path(), 24 * MIB + 4096 * 3 + 512, 42);
    for addr in ["tcp://127.0.0.1:0", "unix:DIR/nbd.sock"] {
        let s = Server::start(addr, &["--no-loop"], "rules: []\n");
        // 4 connections at once (the server advertises multi-conn), many requests in flight
        run(Command::new("nbdcopy").args(["--connections=4", "--requests=16"]).arg(&src).arg(s.uri()));
        let back = dir.path().join("back");
        run(Command::new("nbdcopy").args(["--connections=4"]).arg(s.uri()).arg(&back));
        let got = std::fs::read(&back).unwrap();
        assert_eq!(got.len() as u64, 64 * MIB);
        assert!(got[..data.len()] == data[..], "{addr}: data out differs from data in");
        assert!(got[data.len()..].iter().all(|b| *b == 0), "{addr}: bytes past the copy changed");
        s.stop();
    }
}

/// Every rule action over NBD as over the loop device: errors map to NBD error codes, delays
/// become late replies that hold up no other request, bit flips and lost writes land.
#[test]
fn faults_reach_libnbd_clients() {
    let rules = "rules:\n\
  - {type: error, errno: EIO, op: read, target: {offset: 1MiB, length: 4KiB}}\n\
  - {type: error, errno: ENOSPC, op: write, target: {offset: 3MiB, length: 4KiB}}\n\
  - {type: error, errno: ETIMEDOUT, op: read, target: {offset: 5MiB, length: 4KiB}}\n\
  - {type: error, errno: EIO, op: flush, times: 1}\n\
  - {type: delay, op: read, delay: 300ms, target: {offset: 2MiB, length: 4KiB}}\n\
  - {type: bitflip, op: write, byte: 3, bit: 2, target: {offset: 4MiB, length: 4KiB}}\n\
  - {type: lost-write, target: {offset: 6MiB, length: 4KiB}}\n";
    let s = Server::start("unix:DIR/nbd.sock", &["--no-loop"], rules);
    let out = nbdsh(
        s.uri(),
        r#"
import time
def err(f):
    try:
        f()
        return "ok"
    except nbd.Error as e:
        return str(e.errno)
print("read-eio", err(lambda: h.pread(8192, (1<<20) - 4096)))
print("read-next", err(lambda: h.pread(4096, (1<<20) + 4096)))
print("write-enospc", err(lambda: h.pwrite(b"a" * 4096, 3<<20)))
print("read-etimedout", err(lambda: h.pread(4096, 5<<20)))
print("flush-eio", err(lambda: h.flush()))
print("flush-again", err(lambda: h.flush()))
h.pwrite(b"\x00" * 4096, 4<<20)
print("flipped", h.pread(8, 4<<20).hex())
h.pwrite(b"\x11" * 4096, 6<<20)
print("lost", h.pread(4, 6<<20).hex())
# a delayed read and an undelayed one in flight together on one connection
b1 = nbd.Buffer(4096); b2 = nbd.Buffer(4096)
t = time.time()
c1 = h.aio_pread(b1, 2<<20)
c2 = h.aio_pread(b2, 0)
done = {}
while len(done) < 2:
    h.poll(-1)
    for name, c in (("slow", c1), ("fast", c2)):
        if name not in done and h.aio_command_completed(c):
            done[name] = time.time() - t
print("slow", done["slow"])
print("fast", done["fast"])
"#,
    );
    let get = |k: &str| out.lines().find_map(|l| l.strip_prefix(&format!("{k} "))).unwrap_or_else(|| panic!("no {k} in {out}")).to_string();
    assert_eq!(get("read-eio"), "EIO", "{out}");
    assert_eq!(get("read-next"), "ok");
    assert_eq!(get("write-enospc"), "ENOSPC");
    // no NBD code for ETIMEDOUT: EIO on the wire (docs/nbd.md)
    assert_eq!(get("read-etimedout"), "EIO");
    assert_eq!(get("flush-eio"), "EIO");
    assert_eq!(get("flush-again"), "ok");
    assert_eq!(get("flipped"), "0000000400000000", "bit 2 of byte 3 flipped in the stored copy");
    assert_eq!(get("lost"), "00000000", "the lost write was acknowledged and not stored");
    let (slow, fast): (f64, f64) = (get("slow").parse().unwrap(), get("fast").parse().unwrap());
    assert!(slow >= 0.3, "the delayed read came back after {slow}s");
    assert!(fast < 0.2, "the undelayed read waited behind the delayed one: {fast}s");
    // the fault log names what was injected
    let log = s.call(json!({"cmd": "log", "since": 0, "max": 1000}));
    let actions: Vec<&str> = log.as_array().unwrap().iter().filter_map(|e| e["action"].as_str()).collect();
    for a in ["error", "delay", "bitflip", "lost-write"] {
        assert!(actions.iter().any(|x| x.contains(a)), "{a} missing from the fault log: {actions:?}");
    }
    s.stop();
}

/// With the loop device and NBD at once: one disk, both ways in; stdout says both.
#[test]
fn loop_device_and_nbd_serve_the_same_disk() {
    let s = Server::start("tcp://127.0.0.1:0", &[], "rules: []\n");
    assert!(s.lines[0].starts_with("/dev/loop"), "{:?}", s.lines);
    assert!(s.lines[1].starts_with("nbd://"), "{:?}", s.lines);
    let info = s.call(json!({"cmd": "info"}));
    assert_eq!(info["nbd"].as_str(), Some(s.uri()), "{info}");
    let f = std::fs::OpenOptions::new().write(true).open(&s.lines[0]).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(&[0x5a; 4096], 8 * MIB).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let out = nbdsh(s.uri(), "print(h.pread(4, 8<<20).hex())");
    assert_eq!(out.trim(), "5a5a5a5a");
    s.stop();
}

#[test]
fn qemu_clients_copy_and_compare() {
    if Command::new("qemu-img").arg("--version").output().is_err() {
        eprintln!("qemu-img is not installed: skipped (scripts/setup.sh installs qemu-utils)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = random_file(dir.path(), 64 * MIB, 7);
    let s = Server::start("tcp://127.0.0.1:0", &["--no-loop"], "rules: []\n");
    run(Command::new("qemu-img").args(["convert", "-n", "-f", "raw", "-O", "raw"]).arg(&src).arg(s.uri()));
    run(Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw"]).arg(&src).arg(s.uri()));
    run(Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 0xab 1M 64k", "-c", "flush", s.uri()]));
    let out = run(Command::new("qemu-io").args(["-f", "raw", "-c", "read -P 0xab 1M 64k", s.uri()]));
    assert!(!out.contains("Pattern verification failed"), "{out}");
    let zero = run(Command::new("qemu-io").args(["-f", "raw", "-c", "write -z 2M 128k", "-c", "read -P 0 2M 128k", s.uri()]));
    assert!(!zero.contains("Pattern verification failed"), "{zero}");
    s.stop();
}

// ---- hostile clients, raw sockets ----

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}

fn connect(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    s
}

/// True when the server closed the connection (EOF or reset) rather than answering.
fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 4096];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue, // replies before the close
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(e) => panic!("the server neither answered nor closed: {e}"),
        }
    }
}

fn greet(s: &mut TcpStream) {
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    assert_eq!(&g[..8], b"NBDMAGIC");
    assert_eq!(&g[8..16], b"IHAVEOPT");
    s.write_all(&3u32.to_be_bytes()).unwrap(); // fixed newstyle, no zeroes
}

fn option(s: &mut TcpStream, opt: u32, data: &[u8]) {
    let mut m = b"IHAVEOPT".to_vec();
    m.extend_from_slice(&opt.to_be_bytes());
    m.extend_from_slice(&(data.len() as u32).to_be_bytes());
    m.extend_from_slice(data);
    s.write_all(&m).unwrap();
}

/// Read one option reply: (type, data).
fn option_reply(s: &mut TcpStream) -> (u32, Vec<u8>) {
    let mut h = [0u8; 20];
    s.read_exact(&mut h).unwrap();
    assert_eq!(u64::from_be_bytes(h[..8].try_into().unwrap()), 0x3e889045565a9);
    let mut d = vec![0u8; be32(&h[16..]) as usize];
    s.read_exact(&mut d).unwrap();
    (be32(&h[12..]), d)
}

/// Handshake into transmission: structured replies and extended headers as asked.
fn open(addr: &str, structured: bool, extended: bool) -> TcpStream {
    let mut s = connect(addr);
    greet(&mut s);
    for (want, opt) in [(structured, 8u32), (extended, 11)] {
        if want {
            option(&mut s, opt, &[]);
            assert_eq!(option_reply(&mut s).0, 1, "option {opt} acknowledged");
        }
    }
    option(&mut s, 7, &[0, 0, 0, 0, 0, 0]); // GO, default export, no info requests
    loop {
        let (t, _) = option_reply(&mut s);
        if t == 1 {
            return s;
        }
        assert_eq!(t, 3, "NBD_REP_INFO before the ACK");
    }
}

fn rq(flags: u16, cmd: u16, cookie: u64, offset: u64, length: u64) -> faultline::nbd::Request {
    faultline::nbd::Request { flags, cmd, cookie, offset, length }
}

fn request(s: &mut TcpStream, ext: bool, r: faultline::nbd::Request, payload: &[u8]) {
    let mut m = r.encode(ext);
    m.extend_from_slice(payload);
    s.write_all(&m).unwrap();
}

/// A simple reply: (error, cookie), then `data` bytes if no error.
fn simple(s: &mut TcpStream, data: usize) -> (u32, u64, Vec<u8>) {
    let mut h = [0u8; 16];
    s.read_exact(&mut h).unwrap();
    assert_eq!(be32(&h), 0x67446698);
    let err = be32(&h[4..]);
    let mut d = vec![0u8; if err == 0 { data } else { 0 }];
    s.read_exact(&mut d).unwrap();
    (err, u64::from_be_bytes(h[8..16].try_into().unwrap()), d)
}

/// One structured/extended chunk: (flags, type, error if an error chunk).
fn chunk(s: &mut TcpStream, ext: bool) -> (u16, u16, u32) {
    let mut h = vec![0u8; if ext { 32 } else { 20 }];
    s.read_exact(&mut h).unwrap();
    let len = if ext { u64::from_be_bytes(h[24..32].try_into().unwrap()) } else { be32(&h[16..]) as u64 };
    let mut d = vec![0u8; len as usize];
    s.read_exact(&mut d).unwrap();
    let typ = u16::from_be_bytes([h[6], h[7]]);
    (u16::from_be_bytes([h[4], h[5]]), typ, if typ & 0x8000 != 0 { be32(&d) } else { 0 })
}

#[test]
fn hostile_clients_get_errors_or_closed_connections_never_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::start("tcp://127.0.0.1:0", &["--no-loop"], "rules: []\n");
    let addr = s.tcp_addr();
    let size = 64 * MIB;
    let (src, mut expect) = random_file(dir.path(), size, 99);
    run(Command::new("nbdcopy").arg(&src).arg(s.uri()));

    // handshake phase
    let mut c = connect(&addr);
    let mut g = [0u8; 18];
    c.read_exact(&mut g).unwrap();
    c.write_all(&0xffff_ffffu32.to_be_bytes()).unwrap();
    assert!(closed(&mut c), "unknown client flags end the session");
    let mut c = connect(&addr);
    greet(&mut c);
    c.write_all(b"NOTMAGIC\0\0\0\x07\0\0\0\0").unwrap();
    assert!(closed(&mut c), "bad option magic ends the session");
    let mut c = connect(&addr);
    greet(&mut c);
    let mut m = b"IHAVEOPT".to_vec();
    m.extend_from_slice(&7u32.to_be_bytes());
    m.extend_from_slice(&0xffff_fff0u32.to_be_bytes());
    c.write_all(&m).unwrap();
    assert_eq!(option_reply(&mut c).0, (1 << 31) + 9, "a huge option gets NBD_REP_ERR_TOO_BIG");
    assert!(closed(&mut c));
    let mut c = connect(&addr);
    greet(&mut c);
    option(&mut c, 7, &[0, 0, 1, 0, 0, 0]); // name length 256 in 6 bytes of data
    assert_eq!(option_reply(&mut c).0, (1 << 31) + 3, "malformed GO is NBD_REP_ERR_INVALID");
    option(&mut c, 4242, &[1, 2, 3]);
    assert_eq!(option_reply(&mut c).0, (1 << 31) + 1, "unknown option is NBD_REP_ERR_UNSUP");
    option(&mut c, 5, &[]);
    assert_eq!(option_reply(&mut c).0, (1 << 31) + 2, "STARTTLS is refused by policy");
    option(&mut c, 2, &[]);
    assert_eq!(option_reply(&mut c).0, 1, "ABORT is acknowledged");
    // truncated frames: half an option header, then gone
    let mut c = connect(&addr);
    greet(&mut c);
    c.write_all(b"IHAVE").unwrap();
    drop(c);

    // transmission phase, simple replies
    let mut c = open(&addr, false, false);
    request(&mut c, false, rq(0, 0, 1, size - 4096, 8192), &[]);
    assert_eq!(simple(&mut c, 8192).0, 22, "read across the end: EINVAL");
    request(&mut c, false, rq(0, 0, 2, u64::MAX - 10, 4096), &[]);
    assert_eq!(simple(&mut c, 4096).0, 22, "offset + length overflowing: EINVAL");
    request(&mut c, false, rq(0, 0, 3, 0, 0xffff_ffff), &[]);
    assert_eq!(simple(&mut c, 0).0, 22, "read longer than the maximum payload: EINVAL");
    request(&mut c, false, rq(0, 1, 4, size - 4096, 8192), &[0xee; 8192]);
    assert_eq!(simple(&mut c, 0).0, 28, "write across the end: ENOSPC");
    request(&mut c, false, rq(0, 1, 5, size, 4096), &[0xee; 4096]);
    assert_eq!(simple(&mut c, 0).0, 28, "write at the end: ENOSPC");
    request(&mut c, false, rq(0, 6, 6, size - 4096, 1 << 20), &[]);
    assert_eq!(simple(&mut c, 0).0, 28, "write-zeroes across the end: ENOSPC");
    request(&mut c, false, rq(0, 4, 7, u64::MAX - 4095, 8192), &[]);
    assert_eq!(simple(&mut c, 0).0, 22, "trim overflowing: EINVAL");
    request(&mut c, false, rq(0, 99, 8, 0, 0), &[]);
    assert_eq!(simple(&mut c, 0).0, 22, "unknown command: EINVAL");
    request(&mut c, false, rq(0x8000, 0, 9, 0, 4096), &[]);
    assert_eq!(simple(&mut c, 4096).0, 22, "unknown flag: EINVAL");
    // still in step: a good read and a good write
    request(&mut c, false, rq(0, 1, 10, 10 * MIB, 4096), &[0x77; 4096]);
    assert_eq!(simple(&mut c, 0), (0, 10, vec![]));
    expect[10 * MIB as usize..10 * MIB as usize + 4096].fill(0x77);
    request(&mut c, false, rq(0, 0, 11, 10 * MIB, 4096), &[]);
    let (e, cookie, d) = simple(&mut c, 4096);
    assert_eq!((e, cookie), (0, 11));
    assert!(d.iter().all(|b| *b == 0x77));
    // a write whose payload cannot be taken (beyond any maximum): the connection ends
    request(&mut c, false, rq(0, 1, 12, 0, 0xffff_ffff), &[1, 2, 3]);
    assert!(closed(&mut c), "a write of 4 GiB ends the connection");
    // bad request magic
    let mut c = open(&addr, false, false);
    c.write_all(&[0x12; 28]).unwrap();
    assert!(closed(&mut c));
    // truncated write payload, then gone
    let mut c = open(&addr, false, false);
    request(&mut c, false, rq(0, 1, 1, 20 * MIB, 65536), &[0xdd; 1000]);
    drop(c);
    // truncated request header
    let mut c = open(&addr, false, false);
    c.write_all(&[0x25, 0x60, 0x95, 0x13, 0, 0]).unwrap();
    drop(c);

    // structured replies and extended headers
    let mut c = open(&addr, true, false);
    request(&mut c, false, rq(0, 0, 1, 0, 0xffff_ffff), &[]);
    assert_eq!(chunk(&mut c, false), (1, 0x8001, 75), "oversized structured read: EOVERFLOW error chunk");
    request(&mut c, false, rq(0, 0, 2, size - 1, 2), &[]);
    assert_eq!(chunk(&mut c, false).2, 22);
    request(&mut c, false, rq(0, 1, 3, 13 * MIB, 4096), &[0x66; 4096]);
    assert_eq!(simple(&mut c, 0), (0, 3, vec![]), "a successful write under structured replies: a simple reply");
    expect[13 * MIB as usize..13 * MIB as usize + 4096].fill(0x66);
    let mut c = open(&addr, true, true);
    request(&mut c, true, rq(0, 0, 1, 0, 1 << 40), &[]);
    assert_eq!(chunk(&mut c, true).2, 75, "a 1 TiB read with extended headers: EOVERFLOW");
    request(&mut c, true, rq(0, 4, 2, 0, 1 << 40), &[]);
    assert_eq!(chunk(&mut c, true).2, 22, "a 1 TiB trim: EINVAL (beyond the export)");
    request(&mut c, true, rq(0, 1, 3, 0, 4096), &[]);
    assert_eq!(chunk(&mut c, true).2, 22, "a write without PAYLOAD_LEN under extended headers: EINVAL");
    request(&mut c, true, rq(1 << 5, 1, 4, 12 * MIB, 4096), &[0x55; 4096]);
    assert_eq!(chunk(&mut c, true), (1, 0, 0), "an extended write succeeds");
    expect[12 * MIB as usize..12 * MIB as usize + 4096].fill(0x55);
    request(&mut c, true, rq(1 << 5, 1, 5, 0, 1 << 40), &[]);
    assert!(closed(&mut c), "a 1 TiB write payload ends the connection");

    // a thousand connections at once: some are served, the rest refused, nothing dies
    let mut conns: Vec<TcpStream> = Vec::new();
    for _ in 0..1000 {
        match TcpStream::connect(&addr) {
            Ok(c) => conns.push(c),
            Err(e) => panic!("connect failed: {e}"),
        }
    }
    let mut greeted = 0;
    for c in &mut conns {
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut g = [0u8; 18];
        // a refused connection is closed at once: no greeting
        if c.read_exact(&mut g).is_ok() {
            greeted += 1;
        }
    }
    assert!((1..=faultline::frontend::nbd::server::MAX_CONNECTIONS).contains(&greeted), "{greeted} connections were served");
    assert!(s.alive(), "the server survived 1000 connections");
    drop(conns);

    // after all that, a good client is served and only the legitimate writes changed the disk
    let t = Instant::now();
    let back = dir.path().join("back");
    loop {
        let o = Command::new("nbdcopy").arg(s.uri()).arg(&back).output().unwrap();
        if o.status.success() {
            break;
        }
        // the refused connections' slots free up as their threads see the close
        assert!(t.elapsed() < Duration::from_secs(20), "no good client served: {}", String::from_utf8_lossy(&o.stderr));
        std::thread::sleep(Duration::from_millis(200));
    }
    let got = std::fs::read(&back).unwrap();
    let first_diff = got.iter().zip(&expect).position(|(a, b)| a != b);
    assert!(first_diff.is_none(), "the disk changed at byte {first_diff:?}");
    let err = s.stop();
    assert!(err.contains("refused a connection"), "refusals are reported: {err}");
}

/// The control socket's `stats` counts the server's connections and requests in flight (the
/// target queue-depth prober reads them): three reads held by a delay rule are in flight
/// together, and their time in flight adds up once they are answered.
#[test]
fn stats_count_connections_and_requests_in_flight() {
    let rules = "rules:\n  - {type: delay, op: read, delay: 800ms, target: {offset: 2MiB, length: 64KiB}}\n";
    let s = Server::start("unix:DIR/nbd.sock", &["--no-loop"], rules);
    let q0 = s.call(json!({"cmd": "stats"}))["nbd_server"].clone();
    assert_eq!(q0["in_flight"], 0, "{q0}");
    assert_eq!(q0["connections"], 0, "{q0}");
    let path = format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default());
    let script = r#"
bufs = [nbd.Buffer(4096) for _ in range(3)]
cs = [h.aio_pread(b, (2<<20) + i * 8192) for i, b in enumerate(bufs)]
# a completed command is retired: ask about each once
while cs:
    h.poll(-1)
    cs = [c for c in cs if not h.aio_command_completed(c)]
print("done")
"#;
    let client = Command::new("nbdsh").env("PATH", path).args(["-u", s.uri(), "-c", script]).stdout(Stdio::piped()).spawn().unwrap();
    let t = Instant::now();
    let mut seen = Value::Null;
    while t.elapsed() < Duration::from_secs(5) {
        seen = s.call(json!({"cmd": "stats"}))["nbd_server"].clone();
        if seen["in_flight"] == 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(seen["in_flight"], 3, "three delayed reads should be in flight: {seen}");
    assert_eq!(seen["connections"], 1, "{seen}");
    let o = client.wait_with_output().unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("done"));
    let t = Instant::now();
    let mut q = Value::Null;
    while t.elapsed() < Duration::from_secs(5) {
        q = s.call(json!({"cmd": "stats"}))["nbd_server"].clone();
        if q["connections"] == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(q["in_flight"], 0, "{q}");
    assert_eq!(q["connections"], 0, "{q}");
    let ns = q["in_flight_ns"].as_u64().unwrap();
    assert!(ns >= 3 * 800_000_000, "three reads delayed 800 ms each spent {ns} ns in flight");
    assert!(q["requests"].as_u64().unwrap() >= 3, "{q}");
    s.stop();
}
