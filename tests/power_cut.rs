//! The volatile write cache and power cuts at block level, with real clients: O_DIRECT writes
//! and fsync of /dev/loopN (both FUSE transports), libnbd's nbdsh with FLUSH and FUA, buffered
//! writes through the loop device's page cache, `faultline fault power-cut/power-on` and the
//! control socket. docs/crash.md is what they check.

mod common;

use common::{BS, Serve, bin, transports};
use faultline::disk::cache::{CutReport, Keep, SurvivalModel, plan};
use faultline::workload::direct::AlignedBuf;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const MODELS: [&str; 5] = ["lose-all", "keep-prefix", "random-subset", "torn", "reorder"];

fn fault(socket: &Path, args: &[&str]) -> std::process::Output {
    Command::new(bin()).arg("fault").args(args).arg("--socket").arg(socket).output().unwrap()
}

/// `fault power-cut` through the CLI; its JSON reply.
fn cut(socket: &Path, model: &str, seed: u64) -> CutReport {
    let o = fault(socket, &["power-cut", "--model", model, "--seed", &seed.to_string()]);
    assert!(o.status.success(), "power-cut: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("power-cut printed {}: {e}", String::from_utf8_lossy(&o.stdout)))
}

fn power_on(socket: &Path) {
    let o = fault(socket, &["power-on"]);
    assert!(o.status.success(), "power-on: {}", String::from_utf8_lossy(&o.stderr));
}

fn block(tag: u8, b: u64) -> AlignedBuf {
    let mut buf = AlignedBuf::new(BS as usize);
    for (i, x) in buf.iter_mut().enumerate() {
        // distinct per tag, block and sector, never zero
        *x = ((tag as u32 * 97 + b as u32 * 7 + (i / 512) as u32 * 3) % 251 + 1) as u8;
    }
    buf
}

/// Every model over the loop device, on each transport: flushed writes (fsync of the device)
/// survive, and of the unflushed ones exactly what the model's plan for the seed says, byte
/// for byte and sector by sector; while the power is off reads, writes and flushes fail with
/// EIO.
#[test]
fn each_model_keeps_what_it_says_over_the_loop_device() {
    const DURABLE: u64 = 8;
    const EPOCH: u64 = 12;
    for ring in transports() {
        let ring_args: &[&str] = if ring == "on" { &["--ring", "on", "--ring-threads", "1"] } else { &["--ring", ring] };
        let args: Vec<&str> = ["--size", "64MiB", "--write-cache", "volatile"].iter().copied().chain(ring_args.iter().copied()).collect();
        let s = Serve::start_args(&args, "rules: []\n");
        let dev = s.open();
        for (round, model) in MODELS.iter().enumerate() {
            let seed = 40 + round as u64;
            // a durable generation: blocks 0..DURABLE+EPOCH, flushed
            let era = round as u8 * 2;
            for b in 0..DURABLE + EPOCH {
                dev.write_at(&block(era, b), b * BS).unwrap();
            }
            dev.sync().unwrap();
            // the epoch: one write per block, in order, not flushed
            let epoch: Vec<u64> = (DURABLE..DURABLE + EPOCH).collect();
            for &b in &epoch {
                dev.write_at(&block(era + 1, b), b * BS).unwrap();
            }
            let r = cut(&s.socket, model, seed);
            assert_eq!(r.unflushed, EPOCH, "{ring} {model}: {r:?}");
            // off: every request fails
            let mut buf = AlignedBuf::new(BS as usize);
            for (what, e) in [("read", dev.read_at(&mut buf, 0).err()), ("write", dev.write_at(&block(9, 0), 0).err()), ("flush", dev.sync().err())] {
                assert_eq!(e.and_then(|e| e.raw_os_error()), Some(libc::EIO), "{ring} {model}: a {what} while the power is off");
            }
            power_on(&s.socket);
            let keep = plan(model.parse::<SurvivalModel>().unwrap(), seed, &epoch.iter().map(|b| (b * BS, BS, false)).collect::<Vec<_>>());
            let (mut kept, mut lost, mut torn) = (0, 0, 0);
            for b in 0..DURABLE + EPOCH {
                dev.read_at(&mut buf, b * BS).unwrap();
                let (old, new) = (block(era, b), block(era + 1, b));
                let want: Vec<u8> = match b.checked_sub(DURABLE).map(|i| &keep[i as usize]) {
                    None | Some(Keep::Nothing) => old.to_vec(),
                    Some(Keep::All) => new.to_vec(),
                    Some(Keep::Sectors(sec)) => (0..BS as usize).map(|i| if sec[i / 512] { new[i] } else { old[i] }).collect(),
                };
                assert!(
                    buf[..] == want[..],
                    "{ring} {model} seed {seed}: block {b} is not what the model keeps ({:?})",
                    b.checked_sub(DURABLE).map(|i| &keep[i as usize])
                );
                // the bytes alone say what happened to each epoch write
                if b >= DURABLE {
                    let secs: Vec<bool> = (0..8).map(|k| buf[k * 512..(k + 1) * 512] == new[k * 512..(k + 1) * 512]).collect();
                    match (secs.iter().all(|x| *x), secs.iter().any(|x| *x)) {
                        (true, _) => kept += 1,
                        (false, false) => lost += 1,
                        _ => torn += 1,
                    }
                }
            }
            assert_eq!((r.kept, r.lost, r.torn), (kept, lost, torn), "{ring} {model}: the report's counts against the bytes");
            match *model {
                "lose-all" => assert_eq!(lost, EPOCH),
                "reorder" => assert!(kept >= 1 && lost >= 1),
                "torn" => assert!(torn >= 1, "12 writes of 8 sectors each, none torn"),
                _ => {}
            }
        }
        let st = s.call(json!({"cmd": "stats"}));
        let wc = &st["write_cache"];
        assert_eq!((wc["cuts"].as_u64(), wc["powered"].as_bool(), wc["mode"].as_str()), (Some(5), Some(true), Some("volatile")), "{st}");
        assert!(wc["flushes"].as_u64().unwrap() >= 5, "{st}");
        drop(dev);
        s.stop();
    }
}

/// Nothing in the loop device's page cache outlives a cut: a buffered write never synced is
/// dirty in the page cache (the device never saw it); after a cut (lose-all) and power-on a
/// buffered read of the device must show what the device holds, not that page.
#[test]
fn the_page_cache_above_the_device_does_not_leak_pre_cut_data() {
    for ring in transports() {
        let ring_args: &[&str] = if ring == "on" { &["--ring", "on", "--ring-threads", "1"] } else { &["--ring", ring] };
        let args: Vec<&str> = ["--size", "64MiB", "--write-cache", "volatile"].iter().copied().chain(ring_args.iter().copied()).collect();
        let s = Serve::start_args(&args, "rules: []\n");
        let direct = s.open();
        direct.write_at(&block(1, 5), 5 * BS).unwrap();
        direct.sync().unwrap();
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&s.dev).unwrap();
        let dirty = vec![0xEEu8; BS as usize];
        f.write_all_at(&dirty, 5 * BS).unwrap();
        let mut seen = vec![0u8; BS as usize];
        f.read_exact_at(&mut seen, 5 * BS).unwrap();
        assert_eq!(seen, dirty, "{ring}: the buffered write is in the page cache");
        let r = cut(&s.socket, "lose-all", 1);
        assert!(r.kept == 0, "{ring}: {r:?}");
        power_on(&s.socket);
        let g = std::fs::File::open(&s.dev).unwrap();
        g.read_exact_at(&mut seen, 5 * BS).unwrap();
        assert!(seen[..] == block(1, 5)[..], "{ring}: a buffered read after power-on shows {:#x}.. , not the flushed block", seen[0]);
        drop((f, g, direct));
        s.stop();
    }
}

/// A `faultline serve --no-loop --nbd unix:...` child.
struct NbdServe {
    child: Child,
    uri: String,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl NbdServe {
    fn start(cache: &str) -> NbdServe {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("ctl.sock");
        let nbd = format!("unix:{}/nbd.sock", dir.path().display());
        let mut child = Command::new(bin())
            .args(["serve", "--size", "16MiB", "--no-loop", "--nbd", &nbd, "--write-cache", cache, "--socket"])
            .arg(&socket)
            .env("FAULTLINE_RUN_DIR", common::run_root())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut uri = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut uri).unwrap();
        NbdServe { child, uri: uri.trim().to_string(), socket, _dir: dir }
    }
    fn call(&self, req: Value) -> Result<Value, String> {
        faultline::frontend::control::call(&self.socket, &req).map_err(|e| format!("{e:#}"))
    }
}

impl Drop for NbdServe {
    fn drop(&mut self) {
        // SAFETY: signalling our own child by its pid, not yet reaped
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let st = self.child.wait().unwrap();
        if !std::thread::panicking() {
            assert!(st.success(), "serve exited with {st}");
        }
    }
}

fn nbdsh(uri: &str, script: &str) -> std::process::Output {
    let path = format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default());
    Command::new("nbdsh").env("PATH", path).args(["-u", uri, "-c", script]).output().expect("nbdsh (scripts/setup.sh installs libnbd-bin)")
}

/// Over NBD: data a FLUSH covered and data written with NBD_CMD_FLAG_FUA survive lose-all;
/// unflushed writes (also one a later FUA write did not cover, and one under a FUA write of
/// another block) are gone; requests fail while the power is off.
#[test]
fn flush_and_fua_over_nbd() {
    let s = NbdServe::start("volatile");
    let out = nbdsh(
        &s.uri,
        "h.pwrite(b'A' * 4096, 0)\n\
         h.flush()\n\
         h.pwrite(b'B' * 4096, 4096)\n\
         h.pwrite(b'C' * 4096, 8192, nbd.CMD_FLAG_FUA)\n\
         h.pwrite(b'D' * 4096, 0)\n\
         h.pwrite(b'E' * 4096, 12288)\n\
         h.pwrite(b'F' * 4096, 12288, nbd.CMD_FLAG_FUA)\n\
         h.pwrite(b'G' * 1000, 16384 + 100)\n",
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: CutReport = serde_json::from_value(s.call(json!({"cmd": "power_cut", "model": "lose-all", "seed": 3})).unwrap()).unwrap();
    assert_eq!((r.unflushed, r.fua, r.kept, r.lost), (6, 2, 2, 4), "{r:?}");
    let off = nbdsh(&s.uri, "h.pread(4096, 0)\n");
    assert!(!off.status.success() && String::from_utf8_lossy(&off.stderr).contains("Input/output error"), "a read with the power off: {off:?}");
    s.call(json!({"cmd": "power_on"})).unwrap();
    let out = nbdsh(
        &s.uri,
        "for o in range(0, 20480, 4096): print(h.pread(4096, o)[:1].hex(), h.pread(4096, o)[-1:].hex())\nprint(h.pread(1000, 16484)[:1].hex())\n",
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    // A (flushed; D lost), nothing (B lost), C (FUA), F (FUA over the lost E), nothing (G lost)
    assert_eq!(text, "41 41\n00 00\n43 43\n46 46\n00 00\n00\n", "after the cut");
}

/// Bad input is refused with a message that says what is wrong and what is allowed: an unknown
/// model (CLI and socket), a cut on a disk without the volatile cache, a cut while the power
/// is off, power-on while it is on.
#[test]
fn bad_power_requests_are_refused_clearly() {
    let plain = NbdServe::start("none");
    let e = plain.call(json!({"cmd": "power_cut", "model": "lose-all"})).unwrap_err();
    assert!(e.contains("no volatile write cache") && e.contains("--write-cache volatile"), "{e}");
    let s = NbdServe::start("volatile");
    let o = fault(&s.socket, &["power-cut", "--model", "sideways"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("sideways") && err.contains("keep-prefix") && err.contains("reorder"), "{err}");
    let e = s.call(json!({"cmd": "power_cut", "model": "sideways"})).unwrap_err();
    assert!(e.contains("sideways") && e.contains("lose-all") && e.contains("torn"), "{e}");
    let e = s.call(json!({"cmd": "power_on"})).unwrap_err();
    assert!(e.contains("the power is on"), "{e}");
    let o = fault(&s.socket, &["power-on"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("the power is on"));
    s.call(json!({"cmd": "power_cut", "model": "torn"})).unwrap();
    let e = s.call(json!({"cmd": "power_cut", "model": "torn"})).unwrap_err();
    assert!(e.contains("already off") && e.contains("power-on"), "{e}");
    s.call(json!({"cmd": "power_on"})).unwrap();
    let st = s.call(json!({"cmd": "stats"})).unwrap();
    assert_eq!(st["write_cache"]["cuts"], 1, "{st}");
}

/// A cut with the default seed (drawn) reports the seed it drew; that seed again on the same
/// writes keeps the same ones (over NBD, random-subset).
#[test]
fn a_seed_repeats_its_survivors() {
    let mut seen: Vec<(u64, String)> = Vec::new();
    for _ in 0..2 {
        let s = NbdServe::start("volatile");
        let out = nbdsh(&s.uri, "for i in range(32): h.pwrite(bytes([i + 1]) * 4096, i * 4096)\n");
        assert!(out.status.success());
        let mut req = json!({"cmd": "power_cut", "model": "random-subset"});
        if let Some((seed, _)) = seen.first() {
            req["seed"] = json!(seed);
        }
        let r: CutReport = serde_json::from_value(s.call(req).unwrap()).unwrap();
        s.call(json!({"cmd": "power_on"})).unwrap();
        let out = nbdsh(&s.uri, "print(''.join(h.pread(1, i * 4096).hex() for i in range(32)))\n");
        let kept = String::from_utf8(out.stdout).unwrap();
        assert_eq!(r.kept as usize, (0..32).filter(|i| &kept[i * 2..i * 2 + 2] != "00").count(), "{r:?} {kept}");
        seen.push((r.seed, kept));
    }
    assert_eq!(seen[0], seen[1], "the same seed over the same writes kept other writes");
}
