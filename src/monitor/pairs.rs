//! Loader of src/monitor/bpf/pairs.bpf.c: generic tracepoint pairs (the time from an enter
//! event to its exit event, per pair) and summed events, on classic (tracefs) tracepoints
//! with a BPF cookie per attachment, configured from the events' format files: no
//! recompiling for a new pair. Used for the file-system, journal and driver layers (built-in
//! sets, `stack_pairs`) and for the user's own pairs (`monitor: {extra}`, `--pair`).

use super::block::{Flavor, flavors, libbpf_log_tail, libbpf_print, lookup, lookup_sum, recursion_misses};
use super::model::{LayerOp, Summed, SummedField};
use super::window::Windows;
use anyhow::{Context, Result, anyhow, bail};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, TracepointCategory, TracepointOpts};
use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};

bpf_skeleton!("pairs.skel.rs");
use skel::{PairsSkel, PairsSkelBuilder};

// pairs.h
use super::defines::{MAX_ATTACH, MAX_FUSE_CONNS, MAX_PAIR_DEVS, MAX_PAIR_HISTS, MAX_SUMS, PAIRS_PER_ATTACH, SUM_FIELDS};
const FUSE_NCLASS: u32 = super::defines::FUSE_NCLASS as u32;
// the byte layouts built below are pairs.h's structs as the skeleton sees them
const _: () = assert!(size_of::<skel::types::att_pair>() == 32);
const _: () = assert!(size_of::<skel::types::att_cfg>() == 8 + 32 * PAIRS_PER_ATTACH);
/// Bytes of a `struct sum_cfg`: device offset, field count, then offsets and sizes.
const SUM_CFG: usize = 4 + 4 * SUM_FIELDS;
const _: () = assert!(size_of::<skel::types::sum_cfg>() == SUM_CFG);

/// A tracepoint, `SYS:NAME` (an events directory of tracefs).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Event {
    pub sys: String,
    pub name: String,
}

impl Event {
    pub fn parse(s: &str) -> Result<Event, String> {
        let ok = |p: &str| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        match s.split_once(':') {
            Some((sys, name)) if ok(sys) && ok(name) => Ok(Event { sys: sys.into(), name: name.into() }),
            _ => Err(format!("`{s}` is not a tracepoint; allowed: SYS:NAME as under /sys/kernel/tracing/events (e.g. ext4:ext4_sync_file_enter)")),
        }
    }
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.sys, self.name)
    }
}

/// What matches an exit to its enter.
#[derive(Clone, Debug, PartialEq)]
pub enum PairKey {
    /// The thread that hit the enter event hits the exit (a function's entry and return).
    Tid,
    /// A field both events have (e.g. a request's unique id), read at the offset each event's
    /// format gives.
    Field(String),
}

/// Names a class value (e.g. a FUSE opcode) for the row's op.
pub type ClassNames = fn(u64) -> String;

/// A pair of tracepoints whose interval is timed.
#[derive(Clone, Debug)]
pub struct Pair {
    /// `fs`, `journal`, `driver`, or `user`.
    pub layer: String,
    /// The row's op.
    pub name: String,
    pub enter: Event,
    pub exit: Event,
    pub key: PairKey,
    /// The key is (device field, key field): ids that are only unique per device.
    pub key_dev: bool,
    /// The device field both events are filtered on when they have it (`dev` for file
    /// systems and jbd2, `connection` for FUSE).
    pub dev_field: &'static str,
    /// An enter field that splits the figures (e.g. the FUSE opcode), with value names.
    pub class: Option<(&'static str, ClassNames)>,
    /// Only the watched processes' threads (`tasks` of `PairMonitor::start`).
    pub processes_only: bool,
    /// The driver layer's FUSE pair: the FUSE connections (kernel dev_t) it watches, for its
    /// BTF-typed programs (the classic pair filters on `devs` of `PairMonitor::start`).
    pub conns: Vec<u32>,
}

impl Pair {
    /// A user's pair (`monitor: {extra}` or `--pair`): filtered on the watched devices where
    /// the events have a `dev` field, and on the watched processes when some are given.
    pub fn user(name: &str, enter: &str, exit: &str, key: Option<&str>) -> Result<Pair, String> {
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
            return Err(format!("pair name `{name}`: allowed: letters, digits, _ and -"));
        }
        let key = match key {
            None | Some("tid") => PairKey::Tid,
            Some(f) if !f.is_empty() && f.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') => PairKey::Field(f.into()),
            Some(f) => return Err(format!("key `{f}`: allowed: tid, or the name of a field both events have")),
        };
        Ok(Pair {
            layer: "user".into(),
            name: name.into(),
            enter: Event::parse(enter)?,
            exit: Event::parse(exit)?,
            key,
            key_dev: false,
            dev_field: "dev",
            class: None,
            processes_only: true,
            conns: Vec::new(),
        })
    }

    /// `--pair NAME=SYS:ENTER,SYS:EXIT[,key=FIELD]`.
    pub fn parse_arg(s: &str) -> Result<Pair, String> {
        let form = "allowed: NAME=SYS:ENTER,SYS:EXIT[,key=tid|FIELD]";
        let (name, rest) = s.split_once('=').ok_or_else(|| format!("--pair `{s}`: no `=`; {form}"))?;
        let parts: Vec<&str> = rest.split(',').collect();
        let key = match parts.get(2) {
            None => None,
            Some(k) => Some(k.strip_prefix("key=").ok_or_else(|| format!("--pair `{s}`: `{k}`; {form}"))?),
        };
        if parts.len() < 2 || parts.len() > 3 {
            return Err(format!("--pair `{s}`: {form}"));
        }
        Pair::user(name, parts[0], parts[1], key).map_err(|e| format!("--pair `{s}`: {e}"))
    }

    fn tid(layer: &str, name: &str, sys: &str, enter: &str, exit: &str) -> Pair {
        Pair {
            layer: layer.into(),
            name: name.into(),
            enter: Event { sys: sys.into(), name: enter.into() },
            exit: Event { sys: sys.into(), name: exit.into() },
            key: PairKey::Tid,
            key_dev: false,
            dev_field: "dev",
            class: None,
            processes_only: false,
            conns: Vec::new(),
        }
    }
}

/// An event whose fields are added up (jbd2_run_stats).
#[derive(Clone, Debug)]
pub struct Sum {
    pub layer: String,
    pub event: Event,
    /// (field, unit): `jiffies` fields are reported in ms.
    pub fields: Vec<(&'static str, &'static str)>,
}

/// An event's fields from its tracefs format file: name -> (offset, size).
pub fn format(ev: &Event) -> Result<BTreeMap<String, (u16, u16)>> {
    let path = tracefs()?.join("events").join(&ev.sys).join(&ev.name).join("format");
    let text = std::fs::read_to_string(&path).with_context(|| format!("no tracepoint {ev} on this kernel ({})", path.display()))?;
    let mut fields = BTreeMap::new();
    for line in text.lines() {
        // "\tfield:unsigned long tic;\toffset:16;\tsize:8;\tsigned:0;"
        let mut decl = None;
        let (mut off, mut size) = (None, None);
        for part in line.trim().split(';') {
            let part = part.trim();
            if let Some(d) = part.strip_prefix("field:") {
                decl = d.split_whitespace().last().map(|n| n.split('[').next().unwrap_or(n).to_string());
            } else if let Some(v) = part.strip_prefix("offset:") {
                off = v.parse::<u16>().ok();
            } else if let Some(v) = part.strip_prefix("size:") {
                size = v.parse::<u16>().ok();
            }
        }
        if let (Some(n), Some(o), Some(s)) = (decl, off, size) {
            fields.insert(n, (o, s));
        }
    }
    Ok(fields)
}

/// Where tracefs is mounted; mounts it at /sys/kernel/tracing if it is nowhere (the kernel's
/// own place for it: left mounted, as on most systems).
pub fn tracefs() -> Result<PathBuf> {
    for p in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        if Path::new(p).join("events").is_dir() {
            return Ok(PathBuf::from(p));
        }
    }
    let p = Path::new("/sys/kernel/tracing");
    nix::mount::mount(Some("tracefs"), p, Some("tracefs"), nix::mount::MsFlags::empty(), None::<&str>)
        .with_context(|| format!("tracefs is not mounted and cannot be mounted at {}", p.display()))?;
    Ok(p.to_path_buf())
}

/// FUSE opcode names (include/uapi/linux/fuse.h) for the driver layer's rows.
fn fuse_opcode(op: u64) -> String {
    let n = match op {
        1 => "lookup",
        3 => "getattr",
        4 => "setattr",
        14 => "open",
        15 => "read",
        16 => "write",
        17 => "statfs",
        18 => "release",
        20 => "fsync",
        25 => "flush",
        26 => "init",
        43 => "fallocate",
        46 => "lseek",
        _ => return format!("op{op}"),
    };
    n.to_string()
}

/// The built-in pairs and sums for the file systems mounted on `devices` (from
/// /proc/self/mountinfo) and the FUSE files behind loop devices among them; docs/monitor.md
/// lists what each covers. Returns (pairs, sums, FUSE connections to watch, notes).
pub fn stack_pairs(devices: &[(u32, u32)], loops: &[PathBuf]) -> (Vec<Pair>, Vec<Sum>, Vec<u32>, Vec<String>) {
    let (mut pairs, mut sums, mut notes) = (Vec::new(), Vec::new(), Vec::new());
    let mounted = mounted_fs(devices);
    if mounted.iter().any(|t| t == "ext4") {
        for (name, e, x) in [
            ("sync_file", "ext4_sync_file_enter", "ext4_sync_file_exit"),
            ("da_write", "ext4_da_write_begin", "ext4_da_write_end"),
            ("write", "ext4_write_begin", "ext4_write_end"),
            ("fallocate", "ext4_fallocate_enter", "ext4_fallocate_exit"),
            ("unlink", "ext4_unlink_enter", "ext4_unlink_exit"),
            ("truncate", "ext4_truncate_enter", "ext4_truncate_exit"),
            ("writepages", "ext4_writepages", "ext4_writepages_result"),
        ] {
            pairs.push(Pair::tid("fs", &format!("ext4_{name}"), "ext4", e, x));
        }
        // a commit's phases, keyed by (journal device, transaction id)
        for (name, e, x) in [
            ("commit", "jbd2_start_commit", "jbd2_end_commit"),
            ("commit_lock", "jbd2_start_commit", "jbd2_commit_locking"),
            ("commit_locked", "jbd2_commit_locking", "jbd2_commit_flushing"),
            ("commit_flush", "jbd2_commit_flushing", "jbd2_commit_logging"),
            ("commit_log", "jbd2_commit_logging", "jbd2_end_commit"),
        ] {
            let mut p = Pair::tid("journal", name, "jbd2", e, x);
            p.key = PairKey::Field("transaction".into());
            p.key_dev = true;
            pairs.push(p);
        }
        sums.push(Sum {
            layer: "journal".into(),
            event: Event { sys: "jbd2".into(), name: "jbd2_run_stats".into() },
            fields: vec![
                ("wait", "jiffies"),
                ("request_delay", "jiffies"),
                ("running", "jiffies"),
                ("locked", "jiffies"),
                ("flushing", "jiffies"),
                ("logging", "jiffies"),
                ("handle_count", "count"),
                ("blocks", "count"),
                ("blocks_logged", "count"),
            ],
        });
    }
    if mounted.iter().any(|t| t == "xfs") {
        pairs.push(Pair::tid("fs", "xfs_log_reserve", "xfs", "xfs_log_reserve", "xfs_log_reserve_exit"));
        pairs.push(Pair::tid("fs", "xfs_itruncate_extents", "xfs", "xfs_itruncate_extents_start", "xfs_itruncate_extents_end"));
    }
    if mounted.iter().any(|t| t == "btrfs") {
        notes.push("btrfs has no enter/exit tracepoint pair for I/O work on this kernel: its file-system layer is not timed".into());
    }
    let conns = fuse_connections(loops);
    if !conns.is_empty() {
        let mut p = Pair::tid("driver", "fuse", "fuse", "fuse_request_send", "fuse_request_end");
        p.key = PairKey::Field("unique".into());
        p.dev_field = "connection";
        p.class = Some(("opcode", fuse_opcode));
        p.conns = conns.iter().copied().take(MAX_FUSE_CONNS).collect();
        pairs.push(p);
    }
    (pairs, sums, conns, notes)
}

/// File-system types mounted on the devices (major, minor).
fn mounted_fs(devices: &[(u32, u32)]) -> Vec<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut out = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let Some(dash) = f.iter().position(|x| *x == "-") else { continue };
        let (Some(mm), Some(t)) = (f.get(2), f.get(dash + 1)) else { continue };
        let Some((ma, mi)) = mm.split_once(':') else { continue };
        if let (Ok(ma), Ok(mi)) = (ma.parse(), mi.parse())
            && devices.contains(&(ma, mi))
            && !out.iter().any(|x| x == t)
        {
            out.push(t.to_string());
        }
    }
    out
}

/// The FUSE connections (kernel dev_t of the FUSE mount) behind loop devices' backing files.
fn fuse_connections(loops: &[PathBuf]) -> Vec<u32> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    for d in loops {
        let Some(name) = d.file_name().and_then(|n| n.to_str()) else { continue };
        let Ok(backing) = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")) else { continue };
        let backing = Path::new(backing.trim());
        let Ok(st) = nix::sys::statfs::statfs(backing) else { continue };
        if st.filesystem_type().0 as u64 != 0x6573_5546 {
            continue; // FUSE_SUPER_MAGIC
        }
        if let Ok(md) = std::fs::metadata(backing) {
            let dev = md.dev();
            let kdev = ((libc::major(dev) as u32) << 20) | libc::minor(dev) as u32;
            if !out.contains(&kdev) {
                out.push(kdev);
            }
        }
    }
    out
}

/// The pairs' figures.
#[derive(Clone, Debug, Default)]
pub struct PairResults {
    pub rows: Vec<LayerOp>,
    pub summed: Vec<Summed>,
    pub missed_events: u64,
    pub notes: Vec<String>,
    /// `baseline: windows`: (window, its rows, its summed events).
    pub windows: Vec<(u32, Vec<LayerOp>, Vec<Summed>)>,
}

/// A running pair monitor.
pub type PairMonitor = super::Running<PairResults>;

/// One pair resolved against the events' formats.
struct Resolved {
    pair: Pair,
    hist_base: u32,
    nclass: u32,
}

impl PairMonitor {
    /// Attach `pairs` and `sums`, filtered on devices `devs` (kernel dev_t: major << 20 |
    /// minor) and, for pairs that ask, on processes and threads `tasks`. User pairs whose
    /// events are missing are an error; built-in ones are left out with a note.
    /// With `windows`, per window too (`PairResults::windows`).
    pub fn start(pairs: Vec<Pair>, sums: Vec<Sum>, devs: Vec<u32>, tasks: Vec<u32>, windows: Option<Arc<Windows>>) -> Result<PairMonitor> {
        if devs.len() > MAX_PAIR_DEVS {
            bail!("the pair monitor filters on at most {MAX_PAIR_DEVS} devices");
        }
        if pairs.is_empty() && sums.is_empty() {
            bail!("no tracepoint pairs to watch");
        }
        PairMonitor::spawn("monitor-pairs", Box::new(move |ready, stop| run(pairs, sums, &devs, &tasks, windows.as_deref(), ready, stop)))
    }
}

type AttKey = (Event, bool);
/// The attachments' pair entries (`struct att_pair`, 32 bytes each) by (event, exit side).
type Atts = BTreeMap<AttKey, Vec<[u8; 32]>>;
/// The summed events' configurations (`struct sum_cfg`, `SUM_CFG` bytes).
type SumCfgs = Vec<[u8; SUM_CFG]>;

fn plan(pairs: Vec<Pair>, sums: &[Sum], notes: &mut Vec<String>) -> Result<(Vec<Resolved>, Atts, SumCfgs)> {
    let mut resolved = Vec::new();
    let mut atts: Atts = BTreeMap::new();
    let mut next_hist = 0u32;
    for pair in pairs {
        let (fe, fx) = match (format(&pair.enter), format(&pair.exit)) {
            (Ok(e), Ok(x)) => (e, x),
            (e, x) => {
                let why = e.err().or(x.err()).map(|e| format!("{e:#}")).unwrap_or_default();
                if pair.layer == "user" {
                    bail!("pair {}: {why}", pair.name);
                }
                if !(pair.name == "ext4_writepages" && why.contains("ext4_writepages ")) {
                    notes.push(format!("{} layer: {} not timed: {why}", pair.layer, pair.name));
                }
                continue;
            }
        };
        let nclass: u32 = if pair.class.is_some() { 64 } else { 1 };
        if next_hist as usize + nclass as usize > MAX_PAIR_HISTS || resolved.len() >= MAX_ATTACH {
            notes.push(format!("{} layer: {} not timed: too many pairs", pair.layer, pair.name));
            continue;
        }
        let idx = resolved.len() as u32;
        let mut sides = Vec::new();
        for (ev, f, exit) in [(&pair.enter, &fe, false), (&pair.exit, &fx, true)] {
            let (key_off, key_size) = match &pair.key {
                PairKey::Tid => (0, 0),
                PairKey::Field(k) => match f.get(k) {
                    Some(&(o, s)) if (1..=8).contains(&s) => (o, s),
                    Some(_) => bail!("pair {}: field {k} of {ev} is not 1 to 8 bytes", pair.name),
                    None => bail!(
                        "pair {}: {ev} has no field {k}; it has: {}",
                        pair.name,
                        f.keys().filter(|n| !n.starts_with("common_")).cloned().collect::<Vec<_>>().join(", ")
                    ),
                },
            };
            let dev_off = f.get(pair.dev_field).filter(|(_, s)| *s == 4).map_or(0, |(o, _)| *o);
            let (class_off, class_size) = match (&pair.class, exit) {
                (Some((c, _)), false) => f.get(*c).copied().unwrap_or((0, 0)),
                _ => (0, 0),
            };
            let mut b = [0u8; 32];
            b[0..4].copy_from_slice(&next_hist.to_ne_bytes());
            b[4..8].copy_from_slice(&nclass.to_ne_bytes());
            for (i, v) in [key_off, key_size, dev_off, class_off, class_size, pair.key_dev as u16, pair.processes_only as u16, 0].iter().enumerate() {
                b[8 + 2 * i..10 + 2 * i].copy_from_slice(&v.to_ne_bytes());
            }
            b[24..28].copy_from_slice(&idx.to_ne_bytes());
            sides.push(((ev.clone(), exit), b));
        }
        for (k, b) in sides {
            let v = atts.entry(k.clone()).or_default();
            if v.len() >= PAIRS_PER_ATTACH {
                bail!("pair {}: more than {PAIRS_PER_ATTACH} pairs use {} as their {}", pair.name, k.0, if k.1 { "exit" } else { "enter" });
            }
            v.push(b);
        }
        resolved.push(Resolved { pair, hist_base: next_hist, nclass });
        next_hist += nclass;
    }
    let mut sumcfgs = Vec::new();
    for s in sums.iter().take(MAX_SUMS) {
        let f = format(&s.event).with_context(|| format!("{} layer", s.layer))?;
        let mut b = [0u8; SUM_CFG];
        let dev_off = f.get("dev").filter(|(_, s)| *s == 4).map_or(0, |(o, _)| *o);
        b[0..2].copy_from_slice(&dev_off.to_ne_bytes());
        b[2..4].copy_from_slice(&(s.fields.len().min(SUM_FIELDS) as u16).to_ne_bytes());
        for (i, (name, _)) in s.fields.iter().take(SUM_FIELDS).enumerate() {
            let &(o, sz) = f.get(*name).with_context(|| format!("{} has no field {name}", s.event))?;
            b[4 + 2 * i..6 + 2 * i].copy_from_slice(&o.to_ne_bytes());
            b[4 + 2 * SUM_FIELDS + 2 * i..6 + 2 * SUM_FIELDS + 2 * i].copy_from_slice(&sz.to_ne_bytes());
        }
        sumcfgs.push(b);
    }
    Ok((resolved, atts, sumcfgs))
}

fn attach_all(skel: &PairsSkel<'_>, atts: &Atts, sums: &[Sum], sumcfgs: &[[u8; SUM_CFG]]) -> Result<Vec<Link>> {
    let mut links = Vec::new();
    for (i, ((ev, exit), ps)) in atts.iter().enumerate() {
        let mut v = vec![0u8; 8 + 32 * PAIRS_PER_ATTACH];
        v[0..4].copy_from_slice(&(ps.len() as u32).to_ne_bytes());
        for (j, p) in ps.iter().enumerate() {
            v[8 + 32 * j..8 + 32 * (j + 1)].copy_from_slice(p);
        }
        skel.maps.atts.update(&(i as u32).to_ne_bytes(), &v, MapFlags::ANY).context("cannot configure the pairs")?;
        let prog = if *exit { &skel.progs.pair_exit } else { &skel.progs.pair_enter };
        let opts = TracepointOpts { cookie: i as u64, ..Default::default() };
        links.push(
            prog.attach_tracepoint_with_opts(TracepointCategory::Custom(ev.sys.clone()), &ev.name, opts).with_context(|| format!("cannot attach to {ev}"))?,
        );
    }
    for (i, (s, b)) in sums.iter().zip(sumcfgs).enumerate() {
        skel.maps.sumcfg.update(&(i as u32).to_ne_bytes(), b, MapFlags::ANY).context("cannot configure the summed events")?;
        let opts = TracepointOpts { cookie: i as u64, ..Default::default() };
        links.push(
            skel.progs
                .field_sum
                .attach_tracepoint_with_opts(TracepointCategory::Custom(s.event.sys.clone()), &s.event.name, opts)
                .with_context(|| format!("cannot attach to {}", s.event))?,
        );
    }
    Ok(links)
}

/// Open, load and attach: the classic pairs and sums, and the driver layer's FUSE pair
/// `fuse` on its BTF-typed or raw-tracepoint programs (`flavor`) where one is given.
#[allow(clippy::too_many_arguments)]
fn setup<'o>(
    storage: &'o mut MaybeUninit<libbpf_rs::OpenObject>,
    pairs: Vec<Pair>,
    sums: &[Sum],
    devs: &[u32],
    tasks: &[u32],
    fuse: Option<(&Pair, Flavor)>,
    windows: Option<&Windows>,
    notes: &mut Vec<String>,
) -> Result<(PairsSkel<'o>, Vec<Link>, Vec<Resolved>)> {
    let (resolved, atts, sumcfgs) = plan(pairs, sums, notes)?;
    let mut open = PairsSkelBuilder::default().open(storage).context("cannot open the pairs BPF object")?;
    if let Some(w) = windows {
        let rodata = open.maps.rodata_data.as_deref_mut().context("no rodata in the pairs BPF object")?;
        (rodata.win_n, rodata.win_len_ns, rodata.win_settle_ns) = w.rodata();
        // the classic pairs' histograms, then the FUSE programs' classes
        w.size_map(&mut open.maps.whists, (MAX_PAIR_HISTS + FUSE_NCLASS as usize) as u32)?;
        w.size_map(&mut open.maps.wsums, MAX_SUMS as u32)?;
    }
    let flavor = fuse.map(|f| f.1);
    let p = &mut open.progs;
    p.btf_fuse_send.set_autoload(flavor == Some(Flavor::TpBtf));
    p.btf_fuse_end.set_autoload(flavor == Some(Flavor::TpBtf));
    p.raw_fuse_send.set_autoload(flavor == Some(Flavor::RawTp));
    p.raw_fuse_end.set_autoload(flavor == Some(Flavor::RawTp));
    if let Some((pair, _)) = fuse {
        let rodata = open.maps.rodata_data.as_deref_mut().context("no rodata in the pairs BPF object")?;
        rodata.fuse_nconns = pair.conns.len().min(MAX_FUSE_CONNS) as u32;
        for (i, c) in pair.conns.iter().take(MAX_FUSE_CONNS).enumerate() {
            rodata.fuse_conns[i] = *c;
        }
    }
    let skel = open.load().context("cannot load the pairs BPF programs")?;
    if let Some(w) = windows {
        w.register(&skel.maps.win_t0)?;
    }
    for d in devs {
        skel.maps.pdevs.update(&d.to_ne_bytes(), &[1u8], MapFlags::ANY).context("cannot set the watched devices")?;
    }
    for t in tasks {
        skel.maps.ptasks.update(&t.to_ne_bytes(), &[1u8], MapFlags::ANY).context("cannot set the watched processes")?;
    }
    let mut links = attach_all(&skel, &atts, sums, &sumcfgs)?;
    if let Some(f) = flavor {
        let p = &skel.progs;
        let (send, end) = if f == Flavor::TpBtf { (&p.btf_fuse_send, &p.btf_fuse_end) } else { (&p.raw_fuse_send, &p.raw_fuse_end) };
        links.push(send.attach().context("cannot attach to fuse_request_send")?);
        links.push(end.attach().context("cannot attach to fuse_request_end")?);
    }
    Ok((skel, links, resolved))
}

fn run(
    pairs: Vec<Pair>,
    sums: Vec<Sum>,
    devs: &[u32],
    tasks: &[u32],
    windows: Option<&Windows>,
    ready: mpsc::Sender<Result<&'static str>>,
    stop: mpsc::Receiver<()>,
) -> Result<PairResults> {
    libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Warn, libbpf_print)));
    let mut notes = Vec::new();
    // the driver layer's FUSE pair on tp_btf, then raw_tp (as FAULTLINE_MONITOR_ATTACH allows),
    // then everything on classic tracepoints
    let fuse_at = pairs.iter().position(|p| p.layer == "driver" && !p.conns.is_empty());
    let mut tries: Vec<Option<Flavor>> = Vec::new();
    if fuse_at.is_some() {
        tries.extend(flavors(true).unwrap_or_default().into_iter().filter(|f| *f != Flavor::Tracepoint).map(Some));
    }
    tries.push(None);
    let mut storage: Vec<MaybeUninit<libbpf_rs::OpenObject>> = tries.iter().map(|_| MaybeUninit::uninit()).collect();
    let mut why = Vec::new();
    let mut found = None;
    for (store, flavor) in storage.iter_mut().zip(&tries) {
        let mut ps = pairs.clone();
        let fuse = match (flavor, fuse_at) {
            (Some(f), Some(i)) => Some((ps.remove(i), *f)),
            _ => None,
        };
        let mut n = Vec::new();
        match setup(store, ps, &sums, devs, tasks, fuse.as_ref().map(|(p, f)| (p, *f)), windows, &mut n) {
            Ok(s) => {
                notes.extend(n);
                found = Some((s, fuse));
                break;
            }
            Err(e) => {
                let tail = libbpf_log_tail();
                match flavor {
                    Some(f) => why.push(format!("{}: {}", f.name(), format!("{e:#}").lines().next().unwrap_or(""))),
                    None => {
                        let err = anyhow!("BPF tracepoint pairs unavailable: {e:#}{tail}");
                        let _ = ready.send(Err(anyhow!("{err:#}")));
                        return Err(err);
                    }
                }
            }
        }
    }
    let Some(((skel, links, resolved), fuse)) = found else { bail!("no attach type tried") };
    if fuse_at.is_some() && fuse.is_none() && !why.is_empty() {
        notes.push(format!("driver layer on classic tracepoints: {}", why.join("; ")));
    }
    let _ = ready.send(Ok("tracepoint"));
    let _ = stop.recv();
    drop(links);
    let p = &skel.progs;
    let progs = [&p.pair_enter, &p.pair_exit, &p.field_sum, &p.btf_fuse_send, &p.btf_fuse_end, &p.raw_fuse_send, &p.raw_fuse_end];
    let mut out = PairResults { missed_events: progs.iter().map(|p| recursion_misses(*p)).sum(), notes, ..Default::default() };
    let class_op = |r: &Resolved, c: u32| match &r.pair.class {
        Some((_, names)) => format!("{}:{}", r.pair.name, if c + 1 == r.nclass { format!("op{c}+") } else { names(c as u64) }),
        None => r.pair.name.clone(),
    };
    let fuse_op = |fp: &Pair, c: u32| format!("{}:{}", fp.name, if c + 1 == FUSE_NCLASS { format!("op{c}+") } else { fuse_opcode(c as u64) });
    for (i, r) in resolved.iter().enumerate() {
        for c in 0..r.nclass {
            let v = lookup(&skel.maps.phists, r.hist_base + c)?;
            out.rows.extend(super::block::layer_row(&r.pair.layer, class_op(r, c), &v, false));
        }
        let st = lookup(&skel.maps.pstats, i as u32)?;
        if st[1] > 0 {
            out.notes.push(format!("{} layer: {}: {} starts not stored (table full)", r.pair.layer, r.pair.name, st[1]));
        }
    }
    if let Some((fp, _)) = &fuse {
        for c in 0..FUSE_NCLASS {
            let v = lookup_sum(&skel.maps.fuse_hists, c)?;
            out.rows.extend(super::block::layer_row(&fp.layer, fuse_op(fp, c), &v, false));
        }
        // fuse_stats[0], ends without their start, are the requests in flight at attach (as the
        // classic pair's unmatched): not noted
    }
    let hz = skel.maps.bss_data.as_deref().map_or(0, |b| b.kconfig_hz);
    for (i, s) in sums.iter().enumerate().take(MAX_SUMS) {
        let v = lookup(&skel.maps.sums, i as u32)?;
        let Some(sm) = summed(s, &v, hz) else { continue };
        if hz == 0 && s.fields.iter().any(|f| f.1 == "jiffies") {
            out.notes.push(format!("{}: the kernel's HZ is unknown (no /boot/config-$(uname -r) nor /proc/config.gz): times left in jiffies", s.event));
        }
        out.summed.push(sm);
    }
    if windows.is_some() {
        out.notes.extend(super::window::lost_note(&skel.maps.win_lost, "tracepoint-pair"));
        let mut per: BTreeMap<u32, (Vec<LayerOp>, Vec<Summed>)> = BTreeMap::new();
        for (k, idx, v) in super::window::read(&skel.maps.whists)? {
            let row = if idx >= MAX_PAIR_HISTS as u32 {
                let c = idx - MAX_PAIR_HISTS as u32;
                fuse.as_ref().and_then(|(fp, _)| super::window::row(&fp.layer, fuse_op(fp, c), &v, false))
            } else {
                resolved
                    .iter()
                    .find(|r| (r.hist_base..r.hist_base + r.nclass).contains(&idx))
                    .and_then(|r| super::window::row(&r.pair.layer, class_op(r, idx - r.hist_base), &v, false))
            };
            per.entry(k).or_default().0.extend(row);
        }
        for (k, i, v) in super::window::read(&skel.maps.wsums)? {
            if let Some(sm) = sums.get(i as usize).and_then(|s| summed(s, &v, hz)) {
                per.entry(k).or_default().1.push(sm);
            }
        }
        out.windows = per.into_iter().map(|(k, (rows, sm))| (k, rows, sm)).collect();
    }
    Ok(out)
}

/// A summed event's figures from its `struct sum_val` words (count, sums, maxima); None when
/// it was never hit. Jiffies become ms where the kernel's HZ is known.
fn summed(s: &Sum, v: &[u64], hz: u64) -> Option<Summed> {
    let count = v[0];
    if count == 0 {
        return None;
    }
    let mut fields = Vec::new();
    for (j, (name, unit)) in s.fields.iter().take(SUM_FIELDS).enumerate() {
        let (sum, max) = (v[1 + j] as f64, v[1 + SUM_FIELDS + j] as f64);
        let (scale, unit) = match (*unit, hz) {
            ("jiffies", 0) => (1.0, "jiffies"),
            ("jiffies", hz) => (1000.0 / hz as f64, "ms"),
            (u, _) => (1.0, u),
        };
        fields.push(SummedField { name: name.to_string(), unit: unit.into(), total: sum * scale, mean: sum * scale / count as f64, max: max * scale });
    }
    Some(Summed { layer: s.layer.clone(), event: s.event.to_string(), count, hz: hz as u32, fields })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pair_args() {
        let p = Pair::parse_arg("fsync=ext4:ext4_sync_file_enter,ext4:ext4_sync_file_exit").unwrap();
        assert_eq!((p.name.as_str(), p.enter.name.as_str(), p.exit.sys.as_str(), &p.key), ("fsync", "ext4_sync_file_enter", "ext4", &PairKey::Tid));
        let p = Pair::parse_arg("f=fuse:fuse_request_send,fuse:fuse_request_end,key=unique").unwrap();
        assert_eq!(p.key, PairKey::Field("unique".into()));
        assert!(Pair::parse_arg("f=fuse:a").unwrap_err().contains("allowed"));
        assert!(Pair::parse_arg("f=fuse,fuse:b").unwrap_err().contains("SYS:NAME"));
        assert!(Pair::parse_arg("f=a:b,a:c,unique").unwrap_err().contains("key="));
        assert!(Pair::parse_arg("=a:b,a:c").is_err());
    }
}
