//! `faultline crash explore`: record a workload's writes once, then check many crash states
//! of the log (`states`) on one served device whose store is switched between states
//! (`serve`, `overlay`): mount (the journal replays), the oracle, unmount, the file system's
//! own check. Results: OUT/states.jsonl (one line per state), OUT/summary.json,
//! OUT/failing.txt (with replay commands), OUT/explore.json (what `replay` needs), OUT/log,
//! and what the oracle needs (OUT/maps; OUT/writes.json or OUT/entries.json: `oracle`).

use super::oracle::{EndOracle, EntriesOracle, EntryJournal, FsyncOracle, LoggedEntryEvent, Oracle, OracleCounts, StateFacts, WriteJournal};
use super::states::{self, Plan, StateId, Variant};
use crate::disk::logwrites::Kind;
use crate::disk::logwrites::Log;
use crate::spec::disk::RingMode;
use crate::spec::stack::{FsKind, StackSpec};
use crate::spec::workload::config::SyncMode;
use crate::sys::ledger::{self, LedgerFile};
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// The mark after the workload returned and the file system (or device) was synced: every
/// write before it was durable at that point (`oracle::EndOracle`).
pub const MARK_SYNCED: &str = "synced";

/// What `replay` and a later look need to rebuild any state: OUT/explore.json.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Meta {
    /// The log (relative to the results directory, or absolute for a foreign log).
    pub log: PathBuf,
    pub size: u64,
    pub block_size: u32,
    pub seed: u64,
    pub per_epoch: u32,
    /// ext4, xfs, btrfs or raw.
    pub fs: String,
    pub mount: Vec<String>,
    /// The first epoch explored (the one the workload started in).
    pub first_epoch: usize,
    /// Index of the `synced` mark, if the log has one.
    pub synced_entry: Option<usize>,
    /// The experiment, or the foreign log, explored.
    pub source: String,
    /// The states' disk's FUSE transport (the experiment's `disk: {ring}`, or `--ring` with a
    /// foreign log); `replay` serves the state over it too.
    #[serde(default = "ring_auto")]
    pub ring: RingMode,
}

fn ring_auto() -> RingMode {
    RingMode::Auto
}

impl Meta {
    pub fn log_path(&self, dir: &Path) -> PathBuf {
        if self.log.is_absolute() { self.log.clone() } else { dir.join(&self.log) }
    }
    pub fn fs_kind(&self) -> Option<FsKind> {
        match self.fs.as_str() {
            "ext4" => Some(FsKind::Ext4),
            "xfs" => Some(FsKind::Xfs),
            "btrfs" => Some(FsKind::Btrfs),
            _ => None,
        }
    }
    pub fn load(dir: &Path) -> Result<Meta> {
        let p = dir.join("explore.json");
        let text = std::fs::read(&p).with_context(|| format!("{}: not a `faultline crash explore` results directory (no explore.json)", dir.display()))?;
        let m: Meta = serde_json::from_slice(&text).with_context(|| format!("{} is not an explore.json of faultline", p.display()))?;
        let log = m.log_path(dir);
        if !log.exists() {
            bail!("{}: its write log {} is missing; the states cannot be rebuilt without it", dir.display(), log.display());
        }
        Ok(m)
    }
}

pub struct Options {
    pub per_epoch: u32,
    pub seed: u64,
    pub out: PathBuf,
    pub quiet: bool,
    /// Stop after this many states (the rest is reported as not checked).
    pub max_states: Option<usize>,
}

/// One state's result (a line of states.jsonl).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StateResult {
    pub id: String,
    pub epoch: usize,
    pub variant: String,
    /// Log entries under the state (its base).
    pub base_entries: usize,
    /// Of the epoch's writes and discards: kept whole, lost, torn.
    pub kept: u64,
    pub lost: u64,
    pub torn: u64,
    /// `ok`, or why the mount failed (raw: `none`).
    pub mount: String,
    /// The file system's check after the mount's recovery: `clean`, `errors`, `failed`, `none`.
    pub check: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_exit: Option<i32>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub check_output: String,
    pub oracle: Option<OracleCounts>,
    pub failed: bool,
    pub reasons: Vec<String>,
    pub ms: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Summary {
    pub source: String,
    pub fs: String,
    pub log_entries: usize,
    pub epochs: usize,
    pub first_epoch: usize,
    pub states: usize,
    pub failing: usize,
    pub not_checked: usize,
    /// Failing states per epoch.
    pub failing_per_epoch: BTreeMap<usize, usize>,
    pub seconds: f64,
    pub states_per_s: f64,
    pub oracle: String,
}

/// The out directory: new or empty.
pub fn prepare_out(out: &Path) -> Result<()> {
    if out.exists() && std::fs::read_dir(out)?.next().is_some() {
        bail!("{}: the results directory must be new or empty", out.display());
    }
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))
}

/// Run the experiment's first setup once with the disk recording: the log in OUT/log, the
/// workload's maps in OUT/maps. Returns the exploration's metadata.
pub fn record(exp_path: &Path, opts: &Options) -> Result<Meta> {
    let exp = crate::spec::experiment::parse_experiment_file(exp_path).map_err(anyhow::Error::msg)?;
    if exp.hosts.is_some() {
        bail!("{}: crash explore runs local experiments only (this one has `hosts:`)", exp_path.display());
    }
    let setup = &exp.setups[0];
    let (fs, mount) = match &setup.stack {
        StackSpec::Raw => ("raw".to_string(), vec![]),
        StackSpec::Fs { kind, mount, .. } => (kind.name().to_string(), mount.clone()),
        s => bail!("{}: crash explore takes a raw stack or one file system on one disk, not `{}`", exp_path.display(), s.label()),
    };
    let server = Arc::new(crate::run::disks::DiskServer::start(&setup.disk, 0)?);
    let log = std::path::absolute(opts.out.join("log"))?;
    server.record(Some(log.clone()))?;
    let stack = crate::stack::fs::BuiltStack::build(&setup.stack, std::slice::from_ref(&server.device))?;
    let target = stack.mountpoint.clone().unwrap_or_else(|| server.device.clone());
    let w = exp.workload_for(setup, &target).map_err(anyhow::Error::msg)?;
    let mut maps = crate::workload::maps::Maps::new(&w)?;
    if !opts.quiet {
        eprintln!("crash explore: recording {} on {} ({})", exp.name, server.device.display(), fs);
    }
    // one thread issuing one write at a time with fsync:N or O_DSYNC: each write's
    // durability is known, so mark the log before each write (FsyncOracle)
    let journaled = w.threads == 1
        && w.engine == crate::spec::workload::config::IoEngine::Psync
        && w.personality.is_none()
        && matches!(w.sync, SyncMode::Fsync(_) | SyncMode::Dsync)
        && stack.mountpoint.is_some();
    let observer = journaled.then(|| {
        Arc::new(Journaler {
            server: server.clone(),
            journal: std::sync::Mutex::new(WriteJournal {
                sync: if w.sync == SyncMode::Dsync { "dsync".into() } else { "fsync".into() },
                every: match w.sync {
                    SyncMode::Fsync(n) => n as u64,
                    _ => 1,
                },
                writes: vec![],
            }),
            error: std::sync::Mutex::new(None),
        })
    });
    // a personality on a file system: its record of entries and versions, each change of it
    // kept with a mark in the log after it (EntriesOracle)
    let entry_log =
        (w.personality.is_some() && stack.mountpoint.is_some()).then(|| Arc::new(EntryRecorder { server: server.clone(), state: Default::default() }));
    if let Some(l) = &entry_log {
        maps.track_durability()?;
        maps.durability.as_mut().expect("just tracked").entry_log = Some(l.clone() as Arc<dyn crate::workload::entries::EntryLog>);
    }
    let start = server.mark(crate::run::MARK_START)?;
    if let Some(l) = &entry_log {
        l.state.lock().unwrap().start = start.map(|i| i as usize);
    }
    let res = crate::workload::run(&w, &maps, observer.clone().map(|o| o as Arc<dyn crate::workload::WriteObserver>), None)?;
    if let Some(o) = &observer {
        if let Some(e) = o.error.lock().unwrap().take() {
            bail!("marking the log before a write: {e}");
        }
        let j = std::mem::take(&mut *o.journal.lock().unwrap());
        std::fs::write(opts.out.join("writes.json"), serde_json::to_vec(&j)?)?;
    }
    if let Some(m) = res.maps {
        maps = m;
    }
    server.mark(crate::run::MARK_END)?;
    match &stack.mountpoint {
        Some(m) => crate::sys::mount::syncfs(m)?,
        None => std::fs::OpenOptions::new().write(true).open(&server.device)?.sync_all()?,
    }
    // the syncfs returned: the record credits everything (its event is marked after this)
    let entries = maps.durability.as_ref().and_then(|d| d.entries.as_deref());
    if let (Some(_), Some(e)) = (&entry_log, entries) {
        e.synced_all();
    }
    server.mark(MARK_SYNCED)?;
    if let Some(l) = &entry_log {
        let st = std::mem::take(&mut *l.state.lock().unwrap());
        if let Some(e) = st.error {
            bail!("marking the log after a change of the entry record: {e}");
        }
        let (Some(e), crate::spec::workload::config::Interface::File { dir, .. }, Some(mnt)) = (entries, &w.interface, &stack.mountpoint) else {
            bail!("a personality on a file system kept no entry record");
        };
        let dir =
            dir.strip_prefix(mnt).with_context(|| format!("the workload's directory {} is not below the mount point {}", dir.display(), mnt.display()))?;
        let j = EntryJournal { dir: dir.to_path_buf(), names: e.names.clone(), seed: maps.seed, events: st.events };
        std::fs::write(opts.out.join("entries.json"), serde_json::to_vec(&j)?)?;
    }
    stack.teardown()?;
    let rec = server.record(None)?;
    server.stop()?;
    if let Some(e) = rec.error {
        bail!("the recording failed: {e}");
    }
    maps.save(&opts.out.join("maps"))?;
    let l = Log::open(&log)?;
    let start = l.find_mark(crate::run::MARK_START).context("the recording has no workload-start mark")?;
    let eps = states::epochs(&l);
    Ok(Meta {
        log: PathBuf::from("log"),
        size: setup.disk.disk.size.context("the disk has a size")?,
        block_size: setup.disk.disk.block_size,
        seed: opts.seed,
        per_epoch: opts.per_epoch,
        fs,
        mount,
        first_epoch: eps.iter().position(|e| e.end > start).unwrap_or(0),
        synced_entry: l.find_mark(MARK_SYNCED),
        source: exp_path.display().to_string(),
        ring: setup.disk.front.ring,
    })
}

/// Marks the log `w{k}` before the workload's write k and keeps the writes (`WriteJournal`).
struct Journaler {
    server: Arc<crate::run::disks::DiskServer>,
    journal: std::sync::Mutex<WriteJournal>,
    error: std::sync::Mutex<Option<String>>,
}

impl crate::workload::WriteObserver for Journaler {
    fn before_write(&self, ev: &crate::workload::WriteEvent) {
        let mut j = self.journal.lock().unwrap();
        let k = j.writes.len();
        if let Err(e) = self.server.mark(&format!("w{k}")) {
            self.error.lock().unwrap().get_or_insert(format!("{e:#}"));
        }
        j.writes.push((ev.file.unwrap_or(0), ev.offset, ev.ids.to_vec()));
    }
}

/// Keeps a personality record's changes (`EntryLog`), each followed by a mark `n{k}` in the
/// log: OUT/entries.json. The mark is added with the record locked, so marks come in the
/// record's order; per thread, the last one says where its next syscall can start at the
/// earliest (`LoggedEntryEvent::since`).
struct EntryRecorder {
    server: Arc<crate::run::disks::DiskServer>,
    state: std::sync::Mutex<EntryRecording>,
}

#[derive(Default)]
struct EntryRecording {
    events: Vec<LoggedEntryEvent>,
    last: std::collections::HashMap<std::thread::ThreadId, usize>,
    /// The log index of the workload's start mark: every thread's first change started after
    /// it (None: no start mark, the first change is kept in every state).
    start: Option<usize>,
    error: Option<String>,
}

impl crate::workload::entries::EntryLog for EntryRecorder {
    fn event(&self, ev: crate::workload::entries::EntryEvent) {
        let mut st = self.state.lock().unwrap();
        if st.error.is_some() {
            return;
        }
        let k = st.events.len();
        match self.server.mark(&format!("n{k}")) {
            Ok(Some(at)) => {
                let at = at as usize;
                let since = st.last.insert(std::thread::current().id(), at).or(st.start);
                st.events.push(LoggedEntryEvent { ev, after: at, since });
            }
            Ok(None) => st.error = Some("the disk is not recording".into()),
            Err(e) => st.error = Some(format!("{e:#}")),
        }
    }
}

/// The oracle for the results in `out`: a personality's entries where the recording kept
/// them, per-write durability where it kept a write journal, else the end-of-workload one;
/// none without content maps (a foreign log). A journal that does not fit the log is an error.
fn load_oracle(out: &Path, log: &Log, meta: &Meta) -> Result<Option<(Box<dyn Oracle>, &'static str)>> {
    let p = out.join("entries.json");
    if p.exists() {
        let j: EntryJournal = serde_json::from_slice(&std::fs::read(&p)?).with_context(|| format!("{} is not an entry journal of faultline", p.display()))?;
        for (k, e) in j.events.iter().enumerate() {
            let name = format!("n{k}");
            if !matches!(log.entries.get(e.after).map(|x| &x.kind), Some(Kind::Mark(m)) if *m == name) {
                bail!(
                    "{}: event {k} names log entry {} as its mark {name}, which the log {} does not hold there",
                    p.display(),
                    e.after,
                    meta.log_path(out).display()
                );
            }
        }
        return Ok(Some((Box::new(EntriesOracle::new(j)), "entries")));
    }
    Ok(load_block_oracle(out, log, meta))
}

fn load_block_oracle(out: &Path, log: &Log, meta: &Meta) -> Option<(Box<dyn Oracle>, &'static str)> {
    let maps = crate::workload::maps::Maps::load(&out.join("maps")).ok()?;
    let journal = std::fs::read(out.join("writes.json")).ok().and_then(|b| serde_json::from_slice::<WriteJournal>(&b).ok());
    match (journal, &maps.target) {
        (Some(journal), crate::workload::maps::Target::File { names, .. }) => {
            let marks = log
                .entries
                .iter()
                .enumerate()
                .filter_map(|(i, e)| match &e.kind {
                    Kind::Mark(m) => m.strip_prefix('w').and_then(|k| k.parse::<usize>().ok()).map(|k| (i, k)),
                    _ => None,
                })
                .collect();
            Some((Box::new(FsyncOracle { journal, names: names.clone(), seed: maps.seed, marks, synced_entry: meta.synced_entry }), "fsync"))
        }
        _ => Some((Box::new(EndOracle { maps: std::sync::Mutex::new(maps) }), "end")),
    }
}

/// BLKFLSBUF: drop the block device's buffer cache, so the next reads reach the served state.
pub fn flush_buffers(dev: &Path) -> Result<()> {
    use std::os::fd::AsRawFd;
    nix::ioctl_none!(blkflsbuf, 0x12, 97);
    let f = std::fs::File::open(dev).with_context(|| format!("cannot open {}", dev.display()))?;
    // SAFETY: our open fd; the ioctl takes no argument
    unsafe { blkflsbuf(f.as_raw_fd()) }.with_context(|| format!("BLKFLSBUF on {}", dev.display()))?;
    Ok(())
}

/// The state server child and the line protocol to it.
struct StateServer {
    child: Child,
    to: Option<ChildStdin>,
    from: BufReader<ChildStdout>,
    device: PathBuf,
}

impl StateServer {
    fn start(meta: &Meta, log: &Path) -> Result<StateServer> {
        let exe = std::env::current_exe().context("cannot find the faultline executable")?;
        let mut c = Command::new(exe);
        c.args(["crash", "serve-states"])
            .arg("--log")
            .arg(log)
            .arg(format!("--size={}", meta.size))
            .arg(format!("--block-size={}", meta.block_size))
            .arg(format!("--seed={}", meta.seed))
            .arg(format!("--ring={}", meta.ring))
            .arg(format!("--owned-by={}", std::process::id()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        // its own process group: a Ctrl-C reaches the explorer, which tears down in order
        std::os::unix::process::CommandExt::process_group(&mut c, 0);
        let mut child = c.spawn().context("cannot start the crash-state server")?;
        let to = child.stdin.take();
        let mut from = BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        from.read_line(&mut line)?;
        if !line.starts_with("/dev/") {
            let s = child.wait()?;
            bail!("the crash-state server did not start ({s}; its error is above)");
        }
        Ok(StateServer { child, to, from, device: PathBuf::from(line.trim()) })
    }

    fn switch(&mut self, id: StateId) -> Result<()> {
        let to = self.to.as_mut().context("the state server is stopped")?;
        writeln!(to, "{id}")?;
        to.flush()?;
        let mut line = String::new();
        if self.from.read_line(&mut line)? == 0 {
            bail!("the crash-state server ended");
        }
        match line.trim() {
            "ok" => Ok(()),
            e => bail!("state {id}: {}", e.trim_start_matches("error: ")),
        }
    }

    fn stop(mut self) -> Result<()> {
        drop(self.to.take());
        let t = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait()? {
                if !s.success() {
                    bail!("the crash-state server ended with {s}");
                }
                return Ok(());
            }
            if t.elapsed() > Duration::from_secs(60) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("the crash-state server did not tear down within 60 s; killed it (`faultline cleanup` releases what it left)");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn check_cmd(kind: FsKind, dev: &Path) -> Command {
    let mut c = match kind {
        FsKind::Ext4 => {
            let mut c = Command::new("e2fsck");
            c.arg("-fn");
            c
        }
        FsKind::Xfs => {
            let mut c = Command::new("xfs_repair");
            c.arg("-n");
            c
        }
        FsKind::Btrfs => {
            let mut c = Command::new("btrfs");
            c.args(["check", "--readonly"]);
            c
        }
    };
    c.arg(dev).stdin(Stdio::null());
    c
}

/// One state: mount (recovery), oracle, unmount, the file system's check; or on a raw stack
/// the oracle on the device.
fn check_state(meta: &Meta, dev: &Path, mnt: &Path, plan: &Plan, horizon: usize, oracle: Option<&dyn Oracle>) -> StateResult {
    let t = Instant::now();
    let facts = StateFacts { past_sync: meta.synced_entry.is_some_and(|m| m < horizon), horizon, torn: matches!(plan.id.variant, Variant::Torn(_)) };
    let mut r = StateResult {
        id: plan.id.to_string(),
        epoch: plan.id.epoch,
        variant: match plan.id.variant {
            Variant::Boundary => "boundary",
            Variant::Subset(_) => "subset",
            Variant::Torn(_) => "torn",
        }
        .into(),
        base_entries: plan.base_end,
        kept: plan.kept,
        lost: plan.lost,
        torn: plan.torn,
        mount: "none".into(),
        check: "none".into(),
        check_exit: None,
        check_output: String::new(),
        oracle: None,
        failed: false,
        reasons: vec![],
        ms: 0.0,
    };
    let run_oracle = |root: &Path, r: &mut StateResult| {
        if let Some(o) = oracle {
            match o.check(&facts, root) {
                Ok(c) => {
                    r.reasons.extend(c.reasons());
                    r.oracle = Some(c);
                }
                Err(e) => r.reasons.push(format!("oracle: {e:#}")),
            }
        }
    };
    if let Err(e) = flush_buffers(dev) {
        r.reasons.push(format!("{e:#}"));
    }
    match meta.fs_kind() {
        None => run_oracle(dev, &mut r),
        Some(kind) => {
            let opts = meta.mount.join(",");
            let m = nix::mount::mount(Some(dev), mnt, Some(kind.name()), nix::mount::MsFlags::empty(), (!opts.is_empty()).then_some(opts.as_str()));
            match m {
                Ok(()) => {
                    r.mount = "ok".into();
                    run_oracle(mnt, &mut r);
                    // the check must read the file system as the unmount left it (see
                    // wait_unclaimed: a mount copied into another namespace keeps it alive)
                    if let Err(e) = unmount(mnt).and_then(|()| crate::stack::fs::wait_unclaimed(dev)) {
                        r.reasons.push(format!("unmount: {e:#}"));
                    }
                }
                Err(e) => {
                    r.mount = format!("failed: {e}");
                    r.reasons.push(format!("mount failed: {e}"));
                }
            }
            match check_cmd(kind, dev).output() {
                Ok(o) => {
                    r.check_exit = o.status.code();
                    r.check = match o.status.code() {
                        Some(0) => "clean".into(),
                        Some(c) if c < 8 => "errors".into(),
                        _ => "failed".into(),
                    };
                    if r.check != "clean" {
                        let text = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
                        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
                        r.check_output = lines[lines.len().saturating_sub(12)..].join("\n");
                        r.reasons.push(format!("{} {}", kind.name(), r.check));
                    }
                }
                Err(e) => {
                    r.check = "failed".into();
                    r.reasons.push(format!("cannot run the check: {e}"));
                }
            }
        }
    }
    r.failed = !r.reasons.is_empty();
    r.ms = t.elapsed().as_secs_f64() * 1e3;
    r
}

fn unmount(mnt: &Path) -> Result<()> {
    let t = Instant::now();
    loop {
        match nix::mount::umount2(mnt, nix::mount::MntFlags::empty()) {
            Ok(()) => return Ok(()),
            Err(nix::errno::Errno::EBUSY) if t.elapsed() < Duration::from_secs(3) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(e).with_context(|| format!("umount {}", mnt.display())),
        }
    }
}

/// Check every state of the log `meta` names; results into `opts.out`.
pub fn explore(meta: &Meta, opts: &Options) -> Result<Summary> {
    let out = &opts.out;
    std::fs::write(out.join("explore.json"), serde_json::to_vec_pretty(meta)?)?;
    let log_path = std::path::absolute(meta.log_path(out))?;
    let log = Log::open(&log_path)?;
    if meta.size < log.extent() {
        bail!("{}: the log writes up to byte {}, past the disk's {} bytes", log_path.display(), log.extent(), meta.size);
    }
    let eps = states::epochs(&log);
    let mut ids = states::enumerate(&eps, meta.first_epoch, meta.per_epoch);
    let not_checked = opts.max_states.map_or(0, |m| ids.len().saturating_sub(m));
    ids.truncate(ids.len() - not_checked);
    let oracle = load_oracle(out, &log, meta)?;
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())?;
    // the mount point and our mounts in a ledger: the state server (or `faultline cleanup`)
    // releases them if this process dies
    let mut ledger = LedgerFile::create()?;
    let mnt = ledger::run_dir().join(format!("crash-{}-{}", std::process::id(), ledger.seq));
    ledger.update(|l| {
        l.dirs.push(mnt.clone());
        l.fs_mounts.push(mnt.clone());
    })?;
    std::fs::create_dir_all(&mnt)?;
    let mut server = StateServer::start(meta, &log_path)?;
    let t0 = Instant::now();
    let mut lines = std::io::BufWriter::new(std::fs::File::create(out.join("states.jsonl"))?);
    let mut failing = Vec::new();
    let mut per_epoch: BTreeMap<usize, usize> = BTreeMap::new();
    let mut done = 0usize;
    let mut last_print = Instant::now();
    let mut result = Ok(());
    for id in &ids {
        if stop.load(Relaxed) {
            result = Err(anyhow::anyhow!("interrupted after {done} of {} states", ids.len()));
            break;
        }
        let plan = match states::plan(&log, &eps, *id, meta.seed) {
            Ok(p) => p,
            Err(e) => {
                result = Err(e);
                break;
            }
        };
        if let Err(e) = server.switch(*id) {
            result = Err(e);
            break;
        }
        let r = check_state(meta, &server.device, &mnt, &plan, eps[id.epoch].end, oracle.as_ref().map(|(o, _)| &**o));
        serde_json::to_writer(&mut lines, &r)?;
        lines.write_all(b"\n")?;
        if r.failed {
            *per_epoch.entry(r.epoch).or_default() += 1;
            failing.push(r);
        }
        done += 1;
        if !opts.quiet && last_print.elapsed() > Duration::from_secs(1) {
            last_print = Instant::now();
            eprintln!("crash explore: {done}/{} states, {:.1}/s, {} failing", ids.len(), done as f64 / t0.elapsed().as_secs_f64(), failing.len());
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    lines.flush()?;
    // a mount left by an interrupted state goes before the device does
    if crate::sys::mount::is_mounted(&mnt) {
        let _ = unmount(&mnt);
    }
    let stopped = server.stop();
    let _ = std::fs::remove_dir(&mnt);
    ledger.remove();
    result?;
    stopped?;
    let mut f = std::fs::File::create(out.join("failing.txt"))?;
    for r in &failing {
        writeln!(f, "{}\t{}\tfaultline crash replay {} {}", r.id, r.reasons.join("; "), out.display(), r.id)?;
    }
    let s = Summary {
        source: meta.source.clone(),
        fs: meta.fs.clone(),
        log_entries: log.entries.len(),
        epochs: eps.len(),
        first_epoch: meta.first_epoch,
        states: done,
        failing: failing.len(),
        not_checked,
        failing_per_epoch: per_epoch,
        seconds: secs,
        states_per_s: if secs > 0.0 { done as f64 / secs } else { 0.0 },
        oracle: oracle.as_ref().map_or("none", |(_, n)| n).into(),
    };
    std::fs::write(out.join("summary.json"), serde_json::to_vec_pretty(&s)?)?;
    Ok(s)
}
