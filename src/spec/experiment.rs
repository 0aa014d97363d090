//! Experiment files (`faultline run FILE`): disk + stack + workload + faults + repeat, and
//! optionally `setups:` (a sweep: each setup overrides the stack, disk, faults or repeat of the
//! base). Every key is documented in docs/experiment.md. Everything is validated before any
//! disk is created; errors name the file, line, column and what is allowed.

use super::disk::{CpuLatency, DEFAULT_EXPERIMENT_SIZE, DiskConfig, DiskSpec, RingMode, RqAffinity, StoreSpec};
use super::rule::check::DiskGeometry;
use super::rule::yaml::{FaultSpec, RawRule, WordOr, validate_fault};
pub use super::stack::{Cmdline, CommandSpec, FsKind, StackSpec};
use super::units::{BusyPoll, Dur, Size};
use super::workload::WorkloadYaml;
use serde::Deserialize;
use serde_saphyr::Spanned;

mod matrix;
pub use matrix::MAX_SETUPS as MAX_MATRIX_SETUPS;
use matrix::{MatrixBase, RawMatrix, expand_matrix};

pub const STACK_WORDS: &str = "raw, ext4, xfs, btrfs, btrfs-raid1, dedup (btrfs), dedup-xfs";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExperiment {
    name: Option<String>,
    description: Option<String>,
    disk: Option<Spanned<RawDisk>>,
    stack: Option<Spanned<WordOr<RawStack>>>,
    workload: Option<Spanned<WorkloadYaml>>,
    faults: Option<Vec<Spanned<RawRule>>>,
    repeat: Option<Spanned<u32>>,
    setups: Option<Vec<Spanned<RawSetup>>>,
    monitor: Option<Spanned<RawMonitorValue>>,
    /// Host faults on the disk servers (docs/host.md), per repetition, windows from the start
    /// of the workload.
    host_faults: Option<Vec<Spanned<super::host::RawHostFault>>>,
    /// Pair every repetition with a run of the same setup without faults, or windows of one
    /// run without and with them (docs/experiment.md).
    baseline: Option<Spanned<RawBaseline>>,
    /// A cross product of partial setups instead of `setups:` (docs/experiment.md).
    matrix: Option<Spanned<RawMatrix>>,
    /// Several cross products, their setups one after the other (docs/experiment.md).
    matrices: Option<Spanned<Vec<Spanned<RawMatrix>>>>,
    /// Networked experiments (docs/experiment.md, "Hosts"): client and target hosts.
    hosts: Option<Spanned<super::networked::RawHosts>>,
    /// Network faults between the hosts, windows from the start of the workload.
    net_faults: Option<Vec<Spanned<super::networked::RawNetFault>>>,
}

const BASELINE_ALLOWED: &str = "allowed: true (paired runs), false, windows, or {windows: {length: 5s, settle: 1s, warmup: 0s}}";

#[derive(Deserialize)]
#[serde(untagged, expecting = "not a baseline setting; allowed: true (paired runs), false, windows, or {windows: {length: 5s, settle: 1s, warmup: 0s}}")]
enum RawBaseline {
    Flag(bool),
    Word(String),
    Map(RawBaselineMap),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBaselineMap {
    windows: RawWindows,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawWindows {
    length: Option<Dur>,
    settle: Option<Dur>,
    warmup: Option<Dur>,
}

/// `baseline:`: paired runs (`true`), none, or paired windows of one run (`windows`).
fn baseline(b: &Spanned<RawBaseline>, source: &str) -> Result<(bool, Option<super::windows::WindowPlan>), String> {
    let at = loc(b);
    let windows = |w: &RawWindows| {
        let mut p = super::windows::WindowPlan::default();
        if let Some(l) = w.length {
            p.length = l.0;
        }
        if let Some(s) = w.settle {
            p.settle = s.0;
        }
        if let Some(x) = w.warmup {
            p.warmup = x.0;
        }
        if p.length < std::time::Duration::from_millis(10) {
            return Err(format!("{source}:{at}: baseline: windows: `length` must be at least 10ms"));
        }
        if p.settle >= p.length {
            return Err(format!(
                "{source}:{at}: baseline: windows: `settle` must be shorter than `length` (a window must measure something); allowed: 0s up to less than the length"
            ));
        }
        Ok(p)
    };
    match &b.value {
        RawBaseline::Flag(f) => Ok((*f, None)),
        RawBaseline::Word(w) if w == "windows" => Ok((false, Some(windows(&RawWindows::default())?))),
        RawBaseline::Word(w) => Err(format!("{source}:{at}: baseline: unknown value `{w}`; {BASELINE_ALLOWED}")),
        RawBaseline::Map(m) => Ok((false, Some(windows(&m.windows)?))),
    }
}

/// What `baseline: windows` cannot go with, for one setup; its duration is checked with the
/// resolved workload.
fn check_windows_setup(s: &Setup, source: &str, at: &str) -> Result<(), String> {
    let what = |why: String| Err(format!("{source}:{at}: `baseline: windows`: setup `{}`: {why}", s.name));
    if matches!(s.stack, StackSpec::Command { .. }) {
        return what("a `command` stack has no workload latencies to compare (allowed: raw or file-system stacks)".into());
    }
    if s.power_cut.is_some() {
        return what("a power cut ends the run; windows need the whole run (allowed: paired runs, `baseline: true`, or no baseline)".into());
    }
    if !s.host_faults.is_empty() || !s.net_faults.is_empty() {
        return what("host and network faults keep their own windows; only disk `faults:` are armed in the paired windows".into());
    }
    for f in &s.faults {
        if f.rule.window.is_some() {
            return what(format!("{} has its own `window`; the paired windows arm every fault (leave `window` out)", f.label));
        }
        if f.trigger != super::rule::yaml::Trigger::Start || f.deferred.is_some() {
            return what(format!(
                "{} is placed by workload progress (`when:` or a workload target); the paired windows arm faults by time (allowed: rules armed from the start)",
                f.label
            ));
        }
    }
    Ok(())
}

/// YAML reads a bare `on`/`off` as a boolean: both spellings are taken.
#[derive(Deserialize)]
#[serde(untagged, expecting = "not a monitor setting; allowed: auto, on, off, or a map {enabled, interval, extra, layers}")]
enum RawFlag {
    Flag(bool),
    Word(String),
}

#[derive(Deserialize)]
#[serde(untagged, expecting = "not a monitor setting; allowed: auto, on, off, or a map {enabled, interval, extra, layers}")]
enum RawMonitorValue {
    Flag(RawFlag),
    Map(RawMonitor),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMonitor {
    enabled: Option<RawFlag>,
    interval: Option<Dur>,
    extra: Option<Vec<Spanned<RawExtraPair>>>,
    layers: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExtraPair {
    name: String,
    enter: String,
    exit: String,
    key: Option<String>,
}

/// A user's tracepoint pair (`monitor: {extra: [{name, enter, exit, key}]}`): the time from
/// `enter` to `exit` (both `SYS:NAME` tracepoints), matched by thread or by a field both
/// events have (docs/monitor.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtraPair {
    pub name: String,
    pub enter: String,
    pub exit: String,
    /// None or `tid`: the thread; else a field name.
    pub key: Option<String>,
}

/// Whether a run times the stack's layers with BPF (docs/monitor.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MonitorMode {
    /// Where BPF can be loaded; otherwise the run goes on and its notes say why not.
    #[default]
    Auto,
    /// A repetition fails where BPF cannot be loaded.
    On,
    Off,
}

/// `monitor: auto|on|off` or `monitor: {enabled: auto|on|off, interval: 1s, extra: [...]}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MonitorSpec {
    pub mode: MonitorMode,
    /// Length of one interval of the monitor's time series.
    pub interval: std::time::Duration,
    pub extra: Vec<ExtraPair>,
    /// The layers timed (`MONITOR_LAYERS`); `DEFAULT_MONITOR_LAYERS` unless the experiment says.
    pub layers: Vec<String>,
}

/// The monitor's layers (docs/monitor.md says what each costs).
pub const MONITOR_LAYERS: &[&str] = &["block", "fs", "journal", "driver", "syscall"];
/// The cheap ones, on unless the experiment names its own: a program per block request and
/// one pair per journal commit.
pub const DEFAULT_MONITOR_LAYERS: &[&str] = &["block", "journal"];

impl Default for MonitorSpec {
    fn default() -> Self {
        MonitorSpec {
            mode: MonitorMode::Auto,
            interval: std::time::Duration::from_secs(1),
            extra: Vec::new(),
            layers: DEFAULT_MONITOR_LAYERS.iter().map(|l| l.to_string()).collect(),
        }
    }
}

/// `outer`: the monitor value's position, for when the pair's own is lost (serde keeps no
/// positions inside the untagged `monitor` value).
fn extra_pair(p: &Spanned<RawExtraPair>, source: &str, outer: &str) -> Result<ExtraPair, String> {
    let at = if p.referenced.line() == 0 { outer.to_string() } else { loc(p) };
    let word = |w: &str| !w.is_empty() && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    let r = &p.value;
    if r.name.is_empty() || !r.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        return Err(format!("{source}:{at}: monitor: extra: name `{}`: allowed: letters, digits, _ and -", r.name));
    }
    for (what, ev) in [("enter", &r.enter), ("exit", &r.exit)] {
        if !ev.split_once(':').is_some_and(|(s, n)| word(s) && word(n)) {
            return Err(format!(
                "{source}:{at}: monitor: extra: {what} `{ev}`: allowed: SYS:NAME, a tracepoint as under /sys/kernel/tracing/events (e.g. ext4:ext4_sync_file_enter)"
            ));
        }
    }
    if let Some(k) = &r.key
        && !word(k)
    {
        return Err(format!("{source}:{at}: monitor: extra: key `{k}`: allowed: tid, or the name of a field both events have"));
    }
    Ok(ExtraPair { name: r.name.clone(), enter: r.enter.clone(), exit: r.exit.clone(), key: r.key.clone() })
}

fn monitor(m: &Spanned<RawMonitorValue>, source: &str) -> Result<MonitorSpec, String> {
    let at = loc(m);
    let mode = |f: &RawFlag| match f {
        RawFlag::Flag(true) => Ok(MonitorMode::On),
        RawFlag::Flag(false) => Ok(MonitorMode::Off),
        RawFlag::Word(w) if w == "auto" => Ok(MonitorMode::Auto),
        RawFlag::Word(w) if w == "on" => Ok(MonitorMode::On),
        RawFlag::Word(w) if w == "off" => Ok(MonitorMode::Off),
        RawFlag::Word(o) => Err(format!("{source}:{at}: monitor: unknown value `{o}`; allowed: auto, on, off, or a map {{enabled, interval, extra, layers}}")),
    };
    let mut spec = MonitorSpec::default();
    match &m.value {
        RawMonitorValue::Flag(f) => spec.mode = mode(f)?,
        RawMonitorValue::Map(r) => {
            if let Some(e) = &r.enabled {
                spec.mode = mode(e)?;
            }
            if let Some(i) = r.interval {
                if i.0 < std::time::Duration::from_millis(10) {
                    return Err(format!("{source}:{at}: monitor: interval must be at least 10ms"));
                }
                spec.interval = i.0;
            }
            for p in r.extra.iter().flatten() {
                let e = extra_pair(p, source, &at)?;
                if spec.extra.iter().any(|x| x.name == e.name) {
                    return Err(format!("{source}:{at}: monitor: extra: two pairs named `{}`", e.name));
                }
                spec.extra.push(e);
            }
            if let Some(ls) = &r.layers {
                spec.layers.clear();
                for l in ls {
                    if !MONITOR_LAYERS.contains(&l.as_str()) {
                        return Err(format!("{source}:{at}: monitor: layers: unknown layer `{l}`; allowed: {}", MONITOR_LAYERS.join(", ")));
                    }
                    if !spec.layers.contains(l) {
                        spec.layers.push(l.clone());
                    }
                }
                if !spec.layers.iter().any(|l| l == "block") {
                    return Err(format!("{source}:{at}: monitor: layers must include `block` (the other layers are added to it)"));
                }
            }
        }
    }
    Ok(spec)
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct RawDisk {
    size: Option<Size>,
    block_size: Option<Size>,
    store: Option<String>,
    busy_poll: Option<BusyPoll>,
    ring: Option<RingMode>,
    rq_affinity: Option<RqAffinity>,
    cpu_latency: Option<CpuLatency>,
    /// a latency model inline, or a file (relative to the experiment file)
    latency: Option<Spanned<WordOr<super::latency::RawLatency>>>,
    populate: Option<bool>,
    /// The volatile write cache (docs/crash.md).
    write_cache: Option<crate::spec::disk::CacheMode>,
    write_cache_size: Option<Size>,
    ring_threads: Option<usize>,
    /// The NBD client's policy for an `nbd://` store (docs/nbd.md).
    nbd: Option<RawNbdPolicy>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct RawNbdPolicy {
    timeout: Option<Dur>,
    retries: Option<u32>,
    backoff: Option<RawBackoff>,
    connections: Option<u32>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct RawBackoff {
    initial: Option<Dur>,
    max: Option<Dur>,
}

/// Apply an experiment's `nbd:` map to a policy (the same checks as the URI's keys).
fn nbd_policy(p: &mut super::nbd::NbdPolicy, r: &RawNbdPolicy) -> Result<(), String> {
    use super::units::format_duration as fd;
    if let Some(t) = &r.timeout {
        p.set("timeout", &fd(t.0))?;
    }
    if let Some(n) = r.retries {
        p.set("retries", &n.to_string())?;
    }
    if let Some(c) = r.connections {
        p.set("connections", &c.to_string())?;
    }
    if let Some(b) = &r.backoff {
        if let Some(i) = &b.initial {
            p.set("backoff_initial", &fd(i.0))?;
        }
        if let Some(m) = &b.max {
            p.set("backoff_max", &fd(m.0))?;
        }
    }
    Ok(())
}

#[derive(Deserialize, Clone, Default)]
#[serde(deny_unknown_fields)]
struct RawStack {
    fs: Option<String>,
    mkfs: Option<Vec<String>>,
    mount: Option<Vec<String>>,
    raid1: Option<bool>,
    dedup: Option<bool>,
    command: Option<String>,
    timeout: Option<Dur>,
    /// The command writes its acknowledged commits to FAULTLINE_ACKS (docs/crash.md).
    acks: Option<bool>,
    /// Run after a power cut, power-on and remount: exit 0 = consistent (docs/crash.md).
    check: Option<String>,
    /// `blocks` (default: share exactly the copies the content map lists) or `duperemove`.
    dedupe_with: Option<String>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct RawSetup {
    name: String,
    description: Option<String>,
    disk: Option<Spanned<RawDisk>>,
    stack: Option<Spanned<WordOr<RawStack>>>,
    faults: Option<Vec<Spanned<RawRule>>>,
    repeat: Option<Spanned<u32>>,
    /// Replaces the experiment's `workload:` for this setup (e.g. one personality per setup).
    workload: Option<Spanned<WorkloadYaml>>,
    /// Replaces the experiment's `host_faults:` for this setup.
    host_faults: Option<Vec<Spanned<super::host::RawHostFault>>>,
    /// Replaces the experiment's `net_faults:` for this setup.
    net_faults: Option<Vec<Spanned<super::networked::RawNetFault>>>,
    /// The clients' NBD policy in this setup, key by key over `hosts: {nbd: ...}`.
    nbd: Option<Spanned<super::networked::RawNbd>>,
}

/// One setup of an experiment, fully validated.
#[derive(Clone, Debug)]
pub struct Setup {
    pub name: String,
    pub description: String,
    /// Its size is always set.
    pub disk: DiskSpec,
    pub stack: StackSpec,
    pub faults: Vec<FaultSpec>,
    /// A power cut during the workload, then the crash + check phase (docs/crash.md).
    pub power_cut: Option<crate::spec::rule::yaml::PowerCutSpec>,
    pub repeat: u32,
    /// The setup's own `workload:`, replacing the experiment's.
    pub workload: Option<Spanned<WorkloadYaml>>,
    /// Host faults on the setup's disk servers (docs/host.md).
    pub host_faults: Vec<super::host::HostFault>,
    /// Setups made by `matrix:`: (axis, entry name) for each axis, in the file's order.
    pub axes: Vec<(String, String)>,
    /// Network faults between the experiment's hosts (docs/experiment.md, "Hosts").
    pub net_faults: Vec<super::networked::NetFaultSpec>,
    /// The clients' NBD policy of this setup (its `nbd:`), over the experiment's
    /// `hosts: {nbd: ...}` key by key (`NetworkedHosts::nbd_query_for`).
    pub nbd: Option<super::networked::NbdPolicy>,
}

#[derive(Clone, Debug)]
pub struct Experiment {
    pub name: String,
    /// The file as written (echoed into results.json).
    pub text: String,
    pub source: String,
    pub workload: Option<Spanned<WorkloadYaml>>,
    pub setups: Vec<Setup>,
    pub monitor: MonitorSpec,
    /// `baseline: true`: every repetition runs twice, without then with the faults.
    pub baseline: bool,
    /// `baseline: windows`: the faults armed in alternating windows of each run.
    pub windows: Option<super::windows::WindowPlan>,
    /// `hosts:`: a networked experiment (run::hosts), None for a local one.
    pub hosts: Option<super::networked::NetworkedHosts>,
}

impl Experiment {
    /// The workload of `setup` against `target` (the device on a raw stack, the mount point on
    /// a file system): the shared `workload:` with the interface the stack implies. `files` and
    /// `file_size` apply on file systems only, `device` and `span` on raw devices only, so one
    /// workload serves a sweep across both.
    pub fn workload_for(&self, setup: &Setup, target: &std::path::Path) -> Result<super::workload::Workload, String> {
        let Some(w) = setup.workload.as_ref().or(self.workload.as_ref()) else {
            return Err(format!("{}: setup `{}` has no workload", self.source, setup.name));
        };
        let mut w = w.clone();
        let file = setup.stack.has_fs();
        let iface = if file { "file" } else { "block" };
        if let Some(i) = &w.value.interface
            && i.value != iface
        {
            return Err(format!(
                "{}:{}:{}: interface: `{}` does not fit setup `{}` (stack {}); leave `interface` out, the stack decides it ({iface})",
                self.source,
                i.referenced.line(),
                i.referenced.column(),
                i.value,
                setup.name,
                setup.stack.label()
            ));
        }
        w.value.interface = Some(Spanned { value: iface.to_string(), referenced: w.referenced, defined: w.defined });
        if file {
            w.value.device = None;
            w.value.span = None;
        } else {
            w.value.dir = None;
            w.value.files = None;
            w.value.file_size = None;
        }
        let at = if file { super::workload::Where::Dir(target.to_path_buf()) } else { super::workload::Where::Device(target.to_path_buf()) };
        let l = w.referenced;
        super::workload::resolve(&w.value, &self.source, at)
            .map_err(|e| e.replacen(&format!("{}: workload:", self.source), &format!("{}:{}:{}: workload:", self.source, l.line(), l.column()), 1))
    }
}

fn loc<T>(s: &Spanned<T>) -> String {
    format!("{}:{}", s.referenced.line(), s.referenced.column())
}

pub fn parse_experiment_file(path: &std::path::Path) -> Result<Experiment, String> {
    let text = super::read_text(path, "experiment file")?;
    parse_experiment(&text, &path.display().to_string())
}

pub fn parse_experiment(text: &str, source: &str) -> Result<Experiment, String> {
    let raw: RawExperiment = serde_saphyr::from_str(text).map_err(|e| super::yaml_error(source, &e))?;
    let name = raw.name.clone().ok_or_else(|| format!("{source}: missing `name` (used for the results directory and the report)"))?;
    if name.is_empty() || name.contains('/') {
        return Err(format!("{source}: `name: {name}` must be non-empty and contain no `/`"));
    }
    let workload = raw.workload;
    let monitor_spec = match &raw.monitor {
        Some(m) => monitor(m, source)?,
        None => MonitorSpec::default(),
    };
    let base_repeat = match &raw.repeat {
        Some(r) => repeat(r, source)?,
        None => 1,
    };
    let base_disk = disk(raw.disk.as_ref(), None, source)?;
    let base_stack = match &raw.stack {
        Some(s) => stack(s, source)?,
        None => StackSpec::Raw,
    };
    let networked_hosts = raw.hosts.as_ref().map(|h| super::networked::hosts(h, source)).transpose()?;
    // through agents a `kill` takes the target's server down and the controller starts it again
    let agents = networked_hosts.as_ref().is_some_and(|h| !h.agents.is_empty());
    let base_host_faults = super::host::validate_experiment(raw.host_faults.unwrap_or_default(), source, agents)?;
    let base_net_faults = super::networked::net_faults(raw.net_faults.clone().unwrap_or_default(), networked_hosts.as_ref(), source)?;
    let mut setups = Vec::new();
    let base = MatrixBase {
        disk: &base_disk,
        stack: raw.stack.as_ref(),
        faults: raw.faults.as_ref(),
        repeat: base_repeat,
        host_faults: &base_host_faults,
        net_faults: &base_net_faults,
        hosts: networked_hosts.as_ref(),
        agents,
    };
    if let Some(m) = &raw.matrix {
        if raw.setups.is_some() || raw.matrices.is_some() {
            return Err(format!("{source}:{}: give `setups` (a list), `matrix` (a cross product) or `matrices` (several), only one of them", loc(m)));
        }
        setups = expand_matrix(m, &base, source)?;
    }
    if let Some(ms) = &raw.matrices {
        if raw.setups.is_some() {
            return Err(format!("{source}:{}: give `setups` (a list), `matrix` (a cross product) or `matrices` (several), only one of them", loc(ms)));
        }
        if ms.value.is_empty() {
            return Err(format!("{source}:{}: `matrices` is empty; give at least one matrix (a map of axes)", loc(ms)));
        }
        for m in &ms.value {
            for s in expand_matrix(m, &base, source)? {
                if setups.iter().any(|x: &Setup| x.name == s.name) {
                    return Err(format!(
                        "{source}:{}: setup `{}` is made by two of the `matrices`; setup names must be unique (rename an axis entry)",
                        loc(m),
                        s.name
                    ));
                }
                setups.push(s);
            }
        }
        if setups.len() > MAX_MATRIX_SETUPS {
            return Err(format!("{source}:{}: `matrices` make {} setups; allowed: at most {MAX_MATRIX_SETUPS}", loc(ms), setups.len()));
        }
    }
    match raw.setups {
        _ if raw.matrix.is_some() || raw.matrices.is_some() => {}
        None => {
            let (faults, power_cut) = faults(raw.faults, &base_disk, &base_stack, source)?;
            setups.push(Setup {
                name: name.clone(),
                description: raw.description.clone().unwrap_or_default(),
                disk: base_disk,
                stack: base_stack,
                faults,
                power_cut,
                repeat: base_repeat,
                workload: None,
                host_faults: base_host_faults,
                axes: Vec::new(),
                net_faults: base_net_faults,
                nbd: None,
            });
        }
        Some(list) => {
            if list.is_empty() {
                return Err(format!("{source}: `setups` is empty; give at least one setup, or leave the key out"));
            }
            for s in list {
                let at = loc(&s);
                let s = s.value;
                if setups.iter().any(|x: &Setup| x.name == s.name) || s.name.is_empty() || s.name.contains('/') {
                    return Err(format!("{source}:{at}: setup name `{}` must be unique, non-empty, without `/`", s.name));
                }
                let d = disk(s.disk.as_ref(), Some(&base_disk), source)?;
                let st = match &s.stack {
                    Some(x) => stack(x, source)?,
                    None => base_stack.clone(),
                };
                // a setup's faults replace the base list (a baseline setup says `faults: []`)
                let (f, power_cut) = match s.faults {
                    Some(f) => faults(Some(f), &d, &st, source)?,
                    None => faults(raw.faults.clone(), &d, &st, source)?,
                };
                let rep = match &s.repeat {
                    Some(r) => repeat(r, source)?,
                    None => base_repeat,
                };
                let hf = match s.host_faults {
                    Some(h) => super::host::validate_experiment(h, source, agents)?,
                    None => base_host_faults.clone(),
                };
                let nf = match s.net_faults {
                    Some(n) => super::networked::net_faults(n, networked_hosts.as_ref(), source)?,
                    None => base_net_faults.clone(),
                };
                let nbd = s.nbd.as_ref().map(|n| super::networked::setup_nbd(n, networked_hosts.is_some(), &s.name, source)).transpose()?;
                setups.push(Setup {
                    name: s.name,
                    description: s.description.unwrap_or_default(),
                    disk: d,
                    stack: st,
                    faults: f,
                    power_cut,
                    repeat: rep,
                    workload: s.workload,
                    host_faults: hf,
                    axes: Vec::new(),
                    net_faults: nf,
                    nbd,
                });
            }
        }
    }
    for s in &setups {
        let needs_workload = !matches!(s.stack, StackSpec::Command { .. });
        if needs_workload && workload.is_none() && s.workload.is_none() {
            return Err(format!("{source}: setup `{}` has no `workload` (only a `command` stack runs without one)", s.name));
        }
    }
    let (baseline, windows) = match &raw.baseline {
        Some(b) => baseline(b, source)?,
        None => (false, None),
    };
    let baseline_at = raw.baseline.as_ref().map(loc).unwrap_or_default();
    if windows.is_some() {
        if raw.hosts.is_some() {
            return Err(format!(
                "{source}:{baseline_at}: `baseline: windows` is not supported with `hosts:` yet (allowed: `baseline: true`, or an experiment without `hosts:`)"
            ));
        }
        for s in &setups {
            check_windows_setup(s, source, &baseline_at)?;
        }
    }
    if baseline && setups.iter().any(|s| matches!(s.stack, StackSpec::Command { .. })) {
        return Err(format!(
            "{source}:{}: `baseline: true` compares the workload's latencies; a `command` stack has none (allowed: baseline with raw or file-system stacks)",
            raw.baseline.as_ref().map(loc).unwrap_or_default()
        ));
    }
    for s in &setups {
        super::networked::check_setup(s, networked_hosts.as_ref(), source)?;
    }
    let exp = Experiment {
        name,
        text: text.to_string(),
        source: source.to_string(),
        workload,
        setups,
        monitor: monitor_spec,
        baseline,
        windows,
        hosts: networked_hosts,
    };
    // validate the workload for every setup now, not after disks were built
    for s in &exp.setups {
        // a networked power cut: the clients' slices of the disk hold their workloads
        if exp.hosts.is_some() && s.power_cut.is_some() && (exp.workload.is_some() || s.workload.is_some()) {
            exp.client_workload(s, "nbd://10.77.0.1:10809/", 0)?;
        }
        if exp.workload.is_some() || s.workload.is_some() {
            let w = exp.workload_for(s, std::path::Path::new("/dev/null"))?;
            if let Some(p) = &exp.windows {
                let n = w.duration.map_or(0, |d| p.count(d));
                if n < 2 {
                    return Err(format!(
                        "{source}:{baseline_at}: `baseline: windows`: setup `{}`: the workload's `duration` ({}) holds {n} whole {}; allowed: a duration of at least warmup + 2 x length ({}), as `ops` and `size` bounds end the run at a time not known in advance",
                        s.name,
                        w.duration.map_or("none".to_string(), super::units::format_duration),
                        if n == 1 { "window" } else { "windows" },
                        super::units::format_duration(p.warmup + 2 * p.length),
                    ));
                }
            }
            let content_target = s.faults.iter().any(|f| {
                f.deferred.is_some()
                    && (f.by_content.unwrap_or(s.stack.has_fs())
                        || matches!(f.deferred, Some(super::rule::yaml::Deferred::MostDuplicated | super::rule::yaml::Deferred::Unique)))
            });
            if content_target && s.disk.disk.block_size != 4096 {
                return Err(format!(
                    "{source}: setup `{}`: content targets need a 4KiB disk block size (content is hashed per 4 KiB block); this disk has {}",
                    s.name, s.disk.disk.block_size
                ));
            }
            if let super::workload::Interface::File { count, size, .. } = &w.interface {
                let disk_size = s.disk.size();
                if (*count as u64).checked_mul(*size).is_none_or(|total| total > disk_size) {
                    return Err(format!("{source}: setup `{}`: {count} files of {size} bytes do not fit on a {disk_size} byte disk", s.name));
                }
            }
        }
    }
    Ok(exp)
}

fn repeat(r: &Spanned<u32>, source: &str) -> Result<u32, String> {
    if r.value == 0 || r.value > 1000 {
        return Err(format!("{source}:{}: `repeat: {}` must be 1..1000", loc(r), r.value));
    }
    Ok(r.value)
}

fn disk(d: Option<&Spanned<RawDisk>>, base: Option<&DiskSpec>, source: &str) -> Result<DiskSpec, String> {
    let mut out = base
        .cloned()
        .unwrap_or_else(|| DiskSpec { disk: DiskConfig { size: Some(DEFAULT_EXPERIMENT_SIZE), ..DiskConfig::default() }, front: Default::default() });
    let Some(d) = d else { return Ok(out) };
    let at = loc(d);
    let v = &d.value;
    if let Some(s) = v.size {
        if s.0 < 64 << 20 {
            return Err(format!("{source}:{at}: disk `size: {}` is too small; allowed: 64MiB or more", s.0));
        }
        out.disk.size = Some(s.0);
    }
    if let Some(b) = v.block_size {
        out.disk.block_size = super::disk::check_block_size(b.0).map_err(|e| format!("{source}:{at}: {e}"))?;
    }
    if let Some(st) = &v.store {
        out.disk.store = st.parse::<StoreSpec>().map_err(|e| format!("{source}:{at}: {e}"))?;
        if matches!(out.disk.store, StoreSpec::Device(_)) {
            return Err(format!(
                "{source}:{at}: experiments use ram or file stores; a real device (destructive) is only served with `faultline serve --store device:PATH --destructive`"
            ));
        }
    }
    if let Some(l) = &v.latency {
        let at = loc(l);
        out.disk.latency = Some(match &l.value {
            WordOr::Map(m) => super::latency::validate(m.clone(), source)?,
            WordOr::Word(p) => {
                let dir = std::path::Path::new(source).parent().unwrap_or(std::path::Path::new(""));
                super::latency::parse_latency_file(&dir.join(p)).map_err(|e| format!("{source}:{at}: disk `latency`: {e}"))?
            }
        });
    }
    if let Some(p) = v.populate {
        out.disk.populate = Some(p);
    }
    if let Some(c) = v.write_cache {
        out.disk.write_cache = c;
    }
    if let Some(n) = v.write_cache_size {
        if out.disk.write_cache != crate::spec::disk::CacheMode::Volatile {
            return Err(format!("{source}:{at}: disk `write_cache_size` bounds the volatile cache; it needs `write_cache: volatile`"));
        }
        out.disk.write_cache_size = super::disk::check_write_cache_size(n.0).map_err(|e| format!("{source}:{at}: {e}"))?;
    }
    if let Some(n) = &v.nbd {
        let StoreSpec::Nbd(t) = &mut out.disk.store else {
            return Err(format!("{source}:{at}: disk `nbd:` settings need an NBD store (`store: nbd://HOST:PORT/EXPORT` or `nbd+unix:///EXPORT?socket=PATH`)"));
        };
        nbd_policy(&mut t.policy, n).map_err(|e| format!("{source}:{at}: disk `nbd:`: {e}"))?;
    }
    let f = &mut out.front;
    f.busy_poll = v.busy_poll.map_or(f.busy_poll, |b| b.0);
    f.rq_affinity = v.rq_affinity.unwrap_or(f.rq_affinity);
    f.cpu_latency = v.cpu_latency.unwrap_or(f.cpu_latency);
    f.ring = v.ring.unwrap_or(f.ring);
    f.ring_threads = v.ring_threads.unwrap_or(f.ring_threads);
    if out.size() % out.disk.block_size as u64 != 0 {
        return Err(format!("{source}:{at}: disk size {} is not a multiple of the block size {}", out.size(), out.disk.block_size));
    }
    Ok(out)
}

fn fs_kind(w: &str, at: &str, source: &str) -> Result<FsKind, String> {
    match w {
        "ext4" => Ok(FsKind::Ext4),
        "xfs" => Ok(FsKind::Xfs),
        "btrfs" => Ok(FsKind::Btrfs),
        o => Err(format!("{source}:{at}: unknown file system `{o}`; allowed: ext4, xfs, btrfs")),
    }
}

fn stack(s: &Spanned<WordOr<RawStack>>, source: &str) -> Result<StackSpec, String> {
    let at = loc(s);
    let r = match &s.value {
        WordOr::Word(w) => {
            return match w.as_str() {
                "raw" => Ok(StackSpec::Raw),
                "ext4" | "xfs" | "btrfs" => Ok(StackSpec::Fs { kind: fs_kind(w, &at, source)?, mkfs: vec![], mount: vec![] }),
                "btrfs-raid1" => Ok(StackSpec::BtrfsRaid1 { mkfs: vec![], mount: vec![] }),
                "dedup" | "dedup-btrfs" => Ok(StackSpec::Dedup { kind: FsKind::Btrfs, mkfs: vec![], mount: vec![], with_duperemove: false }),
                "dedup-xfs" => Ok(StackSpec::Dedup { kind: FsKind::Xfs, mkfs: vec![], mount: vec![], with_duperemove: false }),
                o => Err(format!(
                    "{source}:{at}: unknown stack `{o}`; allowed: {STACK_WORDS}, or a map {{fs, mkfs, mount, raid1, dedup, command, timeout, acks, check}}"
                )),
            };
        }
        WordOr::Map(m) => m,
    };
    let mkfs = r.mkfs.clone().unwrap_or_default();
    let mount = r.mount.clone().unwrap_or_default();
    let kind = r.fs.as_deref().map(|f| fs_kind(f, &at, source)).transpose()?;
    let with_duperemove = match r.dedupe_with.as_deref() {
        None | Some("blocks") => false,
        Some("duperemove") => true,
        Some(o) => return Err(format!("{source}:{at}: unknown `dedupe_with: {o}`; allowed: blocks, duperemove")),
    };
    if r.dedupe_with.is_some() && r.dedup != Some(true) {
        return Err(format!("{source}:{at}: `dedupe_with` needs `dedup: true`"));
    }
    if let Some(cmd) = &r.command {
        if r.raid1.is_some() || r.dedup.is_some() {
            return Err(format!(
                "{source}:{at}: a `command` stack runs on the raw device or on one file system (`fs`); raid1 and dedup are not available with it"
            ));
        }
        if cmd.trim().is_empty() {
            return Err(format!("{source}:{at}: `command` is empty"));
        }
        // a zero timeout would kill the command as it starts
        if r.timeout.is_some_and(|t| t.0.is_zero()) {
            return Err(format!("{source}:{at}: `timeout: 0s` kills the command at once; allowed: more than 0 (e.g. 10m), or leave it out"));
        }
        if kind.is_none() && (!mkfs.is_empty() || !mount.is_empty()) {
            return Err(format!("{source}:{at}: `mkfs`/`mount` options need `fs`"));
        }
        let base = match kind {
            Some(kind) => StackSpec::Fs { kind, mkfs, mount },
            None => StackSpec::Raw,
        };
        if r.check.as_ref().is_some_and(|c| c.trim().is_empty()) {
            return Err(format!("{source}:{at}: `check` is empty; allowed: a shell command run after a power cut (exit 0 = consistent)"));
        }
        let command = CommandSpec {
            command: Cmdline::Shell(cmd.clone()),
            timeout: r.timeout.map(|d| d.0),
            cwd: None,
            acks: r.acks.unwrap_or(false),
            check: r.check.clone().map(Cmdline::Shell),
        };
        return Ok(StackSpec::Command { base: Box::new(base), command });
    }
    if r.timeout.is_some() {
        return Err(format!("{source}:{at}: `timeout` applies to a `command` stack"));
    }
    if r.acks.is_some() || r.check.is_some() {
        return Err(format!("{source}:{at}: `acks` and `check` apply to a `command` stack (the application whose commits a power cut tests)"));
    }
    let Some(kind) = kind else {
        return Err(format!("{source}:{at}: a stack map needs `fs` (ext4, xfs, btrfs) or `command`"));
    };
    match (r.raid1 == Some(true), r.dedup == Some(true)) {
        (true, true) => Err(format!("{source}:{at}: choose `raid1` or `dedup`, not both")),
        (true, false) if kind != FsKind::Btrfs => Err(format!("{source}:{at}: `raid1` is built with btrfs (no md/device-mapper here); use `fs: btrfs`")),
        (true, false) => Ok(StackSpec::BtrfsRaid1 { mkfs, mount }),
        (false, true) if kind == FsKind::Ext4 => Err(format!("{source}:{at}: `dedup` needs reflinks: `fs: btrfs` or `fs: xfs`")),
        (false, true) => Ok(StackSpec::Dedup { kind, mkfs, mount, with_duperemove }),
        (false, false) => Ok(StackSpec::Fs { kind, mkfs, mount }),
    }
}

/// A setup's faults: the engine's (scheduled by the workload) and at most one power cut.
type SetupFaults = (Vec<FaultSpec>, Option<crate::spec::rule::yaml::PowerCutSpec>);

fn faults(list: Option<Vec<Spanned<RawRule>>>, d: &DiskSpec, st: &StackSpec, source: &str) -> Result<SetupFaults, String> {
    let geo = DiskGeometry { size: d.size(), block_size: d.disk.block_size };
    let mut out = Vec::new();
    let mut cut: Option<crate::spec::rule::yaml::PowerCutSpec> = None;
    for (i, r) in list.unwrap_or_default().into_iter().enumerate() {
        let at = loc(&r);
        let label = match r.value.name() {
            Some(n) => format!("fault #{} ({n})", i + 1),
            None => format!("fault #{}", i + 1),
        };
        if r.value.is_power_cut() {
            let mut c = crate::spec::rule::yaml::validate_power_cut(r.value, label.clone()).map_err(|e| format!("{source}:{at}: {label}: {e}"))?;
            c.at = format!("{source}:{at}");
            if d.disk.write_cache != crate::spec::disk::CacheMode::Volatile {
                return Err(format!(
                    "{source}:{at}: {label}: a power cut needs a disk with a volatile write cache: add `disk: {{write_cache: volatile}}` (this setup's disk has write_cache: {})",
                    d.disk.write_cache
                ));
            }
            if c.disk >= st.devices_needed() {
                return Err(format!(
                    "{source}:{at}: {label}: `disk: {}` does not exist; this stack has {} disk(s): 0..{}",
                    c.disk,
                    st.devices_needed(),
                    st.devices_needed() - 1
                ));
            }
            if matches!(st, StackSpec::Command { .. }) && matches!(c.trigger, crate::spec::rule::yaml::CutTrigger::AfterOps(_)) {
                return Err(format!(
                    "{source}:{at}: {label}: a `command` stack has no workload ops to count; allowed: {{at: DURATION}} or {{after_flushes: N}}"
                ));
            }
            if st.devices_needed() > 1 {
                return Err(format!(
                    "{source}:{at}: {label}: a power cut is supported on stacks of one disk (allowed: raw, ext4, xfs, btrfs, dedup, command on those)"
                ));
            }
            if let Some(first) = &cut {
                return Err(format!("{source}:{at}: {label}: a setup has at most one power cut ({} is the first); use `repeat:` for more cuts", first.label));
            }
            cut = Some(c);
            continue;
        }
        let f = validate_fault(r.value, geo, label.clone()).map_err(|e| format!("{source}:{at}: {label}: {e}"))?;
        if f.disk >= st.devices_needed() {
            return Err(format!(
                "{source}:{at}: {label}: `disk: {}` does not exist; this stack has {} disk(s): 0..{}",
                f.disk,
                st.devices_needed(),
                st.devices_needed() - 1
            ));
        }
        if f.by_content == Some(false) && st.has_fs() {
            return Err(format!(
                "{source}:{at}: {label}: `by: offset` needs device offsets, which a file system hides; use `by: content` (the default on file systems)"
            ));
        }
        out.push(f);
    }
    Ok((out, cut))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Huge numbers in an experiment: errors with file:line:col, never an overflow.
    #[test]
    fn huge_numbers_are_errors() {
        let max = u64::MAX;
        let cases = [
            (
                format!("name: x\nworkload: {{ops: 1}}\nfaults:\n  - {{type: error, target: {{block: {max}}}}}\n"),
                "t.yaml:4:5: fault #1: target `block: 18446744073709551615` lies beyond the end",
            ),
            (
                format!("name: x\nworkload: {{ops: 1}}\nfaults:\n  - {{type: error, op: read, target: {{file: f0, block: {max}}}}}\n"),
                "t.yaml:4:5: fault #1: `block: 18446744073709551615` (4 KiB blocks) is beyond any file",
            ),
            (
                "name: x\nstack: ext4\nworkload: {files: 4294967295, file_size: 16777215TiB, ops: 1}\n".to_string(),
                "file_size: 4294967295 files of 16777215TiB are more bytes than a u64 holds",
            ),
            (
                "name: x\nstack: ext4\nworkload: {files: 65536, file_size: 16TiB, ops: 1}\n".to_string(),
                "65536 files of 17592186044416 bytes do not fit on a 1073741824 byte disk",
            ),
        ];
        for (y, want) in cases {
            let e = parse_experiment(&y, "t.yaml").unwrap_err();
            assert!(e.contains(want), "for {y:?}\n got: {e}\nwant: {want}");
        }
    }

    /// A setup's faults parsed as the experiment parser does, on a disk with the given cache.
    fn cut_faults(list: &str, cache: crate::spec::disk::CacheMode, st: &StackSpec) -> Result<SetupFaults, String> {
        let raw: Vec<Spanned<RawRule>> = serde_saphyr::from_str(list).map_err(|e| e.to_string())?;
        let mut d = disk(None, None, "t.yaml").unwrap();
        d.disk.write_cache = cache;
        faults(Some(raw), &d, st, "t.yaml")
    }

    #[test]
    fn power_cuts_parse_with_their_schedule() {
        use crate::spec::disk::{CacheMode, SurvivalModel};
        use crate::spec::rule::yaml::CutTrigger;
        let ext4 = StackSpec::Fs { kind: FsKind::Ext4, mkfs: vec![], mount: vec![] };
        let one = |f: &str| cut_faults(&format!("- {f}\n"), CacheMode::Volatile, &ext4);
        let (rules, c) = one("{type: power-cut, model: keep-prefix, seed: 7, when: {after_ops: 300}}").unwrap();
        let c = c.unwrap();
        assert_eq!((c.model, c.seed, c.trigger, c.disk), (SurvivalModel::KeepPrefix, Some(7), CutTrigger::AfterOps(300), 0));
        assert!(rules.is_empty(), "a power cut is no engine rule");
        let c = one("{type: power-cut, when: {at: 2s}}").unwrap().1.unwrap();
        assert_eq!((c.model, c.seed, c.trigger), (SurvivalModel::LoseAll, None, CutTrigger::At(Duration::from_secs(2))));
        let c = one("{type: power-cut, model: torn, when: {after_flushes: 40}}").unwrap().1.unwrap();
        assert_eq!((c.model, c.trigger), (SurvivalModel::Torn, CutTrigger::AfterFlushes(40)));
        // bad input: file:line:col, what is wrong, what is allowed
        let e = cut_faults("- {type: power-cut, when: {at: 1s}}\n", CacheMode::None, &ext4).unwrap_err();
        assert_eq!(
            e,
            "t.yaml:1:3: fault #1: a power cut needs a disk with a volatile write cache: add `disk: {write_cache: volatile}` (this setup's disk has write_cache: none)"
        );
        let bad = [
            (
                "{type: power-cut, model: melt, when: {at: 1s}}",
                "t.yaml:1:3: fault #1: 'melt' is not a survival model setting; allowed: lose-all, keep-prefix, random-subset, torn, reorder",
            ),
            ("{type: power-cut}", "t.yaml:1:3: fault #1: a power cut needs `when`: {at: DURATION}, {after_ops: N} or {after_flushes: N}"),
            ("{type: power-cut, when: {at: 1s, after_ops: 3}}", "`when` of a power cut is exactly one of"),
            ("{type: power-cut, when: {every: 1MiB}}", "at most one power cut"),
            ("{type: power-cut, op: write, when: {at: 1s}}", "`op` is not a key of a power cut; allowed: type, name, model, seed, when, disk"),
            ("{type: error, when: {after_flushes: 3}, target: last_written_block}", "`after_flushes` places a power cut"),
        ];
        for (fault, want) in bad {
            let e = one(fault).unwrap_err();
            assert!(e.contains(want), "{fault}: {e}");
        }
        let e = cut_faults("- {type: power-cut, when: {at: 1s}}\n- {type: power-cut, when: {at: 2s}}\n", CacheMode::Volatile, &ext4).unwrap_err();
        assert!(e.starts_with("t.yaml:2:3: fault #2: a setup has at most one power cut (fault #1 is the first)"), "{e}");
        let cmd = StackSpec::Command {
            base: Box::new(ext4.clone()),
            command: CommandSpec { command: Cmdline::Shell("true".into()), timeout: None, cwd: None, acks: true, check: None },
        };
        let e = cut_faults("- {type: power-cut, when: {after_ops: 3}}\n", CacheMode::Volatile, &cmd).unwrap_err();
        assert!(e.contains("a `command` stack has no workload ops to count; allowed: {at: DURATION} or {after_flushes: N}"), "{e}");
        let e = cut_faults("- {type: power-cut, when: {at: 1s}}\n", CacheMode::Volatile, &StackSpec::BtrfsRaid1 { mkfs: vec![], mount: vec![] }).unwrap_err();
        assert!(e.contains("stacks of one disk"), "{e}");
        // a rules file has no power switch
        let geo = DiskGeometry { size: 1 << 20, block_size: 4096 };
        let e = crate::spec::rule::yaml::parse_rules("rules:\n  - {type: power-cut}\n", "r.yaml", geo).unwrap_err();
        assert!(e.starts_with("r.yaml:2:5: rule #1: `power-cut` is no rule of the fault engine"), "{e}");
        // through an experiment file: the place of the fault in the file
        let e = parse_experiment("name: x\nstack: ext4\nworkload: {size: 1MiB}\nfaults:\n  - {type: power-cut, when: {at: 1s}}\n", "x.yaml").unwrap_err();
        assert!(e.starts_with("x.yaml:5:5: fault #1: a power cut needs a disk with a volatile write cache"), "{e}");
    }

    #[test]
    fn baseline_takes_true_windows_or_a_window_map() {
        use crate::spec::windows::WindowPlan;
        let w = "workload: {size: 1MiB, duration: 20s}\n";
        let b =
            |line: &str| parse_experiment(&format!("name: x\n{line}\n{w}faults: [{{type: delay, delay: 10us}}]\n"), "t.yaml").map(|e| (e.baseline, e.windows));
        assert_eq!(b("baseline: true").unwrap(), (true, None));
        assert_eq!(b("baseline: false").unwrap(), (false, None));
        assert_eq!(b("baseline: windows").unwrap(), (false, Some(WindowPlan::default())));
        let p = b("baseline: {windows: {length: 2s, settle: 500ms, warmup: 3s}}").unwrap().1.unwrap();
        assert_eq!((p.length, p.settle, p.warmup), (Duration::from_secs(2), Duration::from_millis(500), Duration::from_secs(3)));
        for (line, want) in [
            ("baseline: sometimes", "t.yaml:2:11: baseline: unknown value `sometimes`; allowed: true (paired runs), false, windows"),
            ("baseline: {windows: {length: 1s, settle: 1s}}", "t.yaml:2:11: baseline: windows: `settle` must be shorter than `length`"),
            ("baseline: {windows: {length: 5ms}}", "`length` must be at least 10ms"),
            (
                "baseline: {windows: {size: 1s}}",
                "t.yaml:2:11: not a baseline setting; allowed: true (paired runs), false, windows, or {windows: {length: 5s, settle: 1s, warmup: 0s}}",
            ),
            (
                "baseline: {windows: {length: 12s}}",
                "the workload's `duration` (20s) holds 1 whole window; allowed: a duration of at least warmup + 2 x length (24s)",
            ),
        ] {
            let e = b(line).unwrap_err();
            assert!(e.contains(want), "{line}: {e}");
        }
        // what windows cannot go with
        for (yaml, want) in [
            ("workload: {size: 1MiB}\n", "holds 0 whole windows"),
            ("workload: {size: 1MiB, duration: 20s}\nfaults: [{type: delay, delay: 10us, window: {from: 1s}}]\n", "fault #1 has its own `window`"),
            ("workload: {size: 1MiB, duration: 20s}\nfaults: [{type: error, when: {at: 1s}, target: last_written_block}]\n", "placed by workload progress"),
            ("stack: {command: 'true'}\n", "a `command` stack has no workload latencies"),
        ] {
            let e = parse_experiment(&format!("name: x\nbaseline: windows\n{yaml}"), "t.yaml").unwrap_err();
            assert!(e.starts_with("t.yaml:2:11: `baseline: windows`") && e.contains(want), "{yaml}: {e}");
        }
    }

    #[test]
    fn command_stacks_take_acks_and_a_check() {
        let e = parse_experiment("name: x\nstack: {fs: ext4, command: 'app', acks: true, check: 'app-check'}\n", "t.yaml").unwrap();
        let StackSpec::Command { command, .. } = &e.setups[0].stack else { panic!("a command stack") };
        assert!(command.acks);
        assert_eq!(command.check, Some(Cmdline::Shell("app-check".into())));
        let e = parse_experiment("name: x\nstack: {fs: ext4, acks: true}\nworkload: {size: 1MiB}\n", "t.yaml").unwrap_err();
        assert!(e.starts_with("t.yaml:2:8: `acks` and `check` apply to a `command` stack"), "{e}");
        let e = parse_experiment("name: x\nstack: {command: 'app', check: ' '}\n", "t.yaml").unwrap_err();
        assert!(e.contains("`check` is empty"), "{e}");
    }

    #[test]
    fn command_timeout_of_zero_is_an_error() {
        let e = parse_experiment("name: x\nstack: {command: 'true', timeout: 0s}\n", "t.yaml").unwrap_err();
        assert!(e.starts_with("t.yaml:2:8: `timeout: 0s` kills the command at once; allowed: more than 0"), "{e}");
        assert!(parse_experiment("name: x\nstack: {command: 'true', timeout: 1s}\n", "t.yaml").is_ok());
    }

    #[test]
    fn busy_poll_defaults_and_turns_off() {
        let poll = |disk: &str| {
            let e = parse_experiment(&format!("name: x\n{disk}workload: {{size: 1MiB}}\n"), "t.yaml").unwrap();
            e.setups[0].disk.front.busy_poll
        };
        assert_eq!(poll(""), crate::spec::disk::DEFAULT_BUSY_POLL);
        assert_eq!(poll("disk: {busy_poll: off}\n"), Duration::ZERO);
        assert_eq!(poll("disk: {busy_poll: 0}\n"), Duration::ZERO);
        assert_eq!(poll("disk: {busy_poll: 20us}\n"), Duration::from_micros(20));
    }

    #[test]
    fn monitor_defaults_to_auto_and_takes_a_word_or_a_map() {
        let mon = |m: &str| parse_experiment(&format!("name: x\n{m}workload: {{size: 1MiB}}\n"), "t.yaml").map(|e| e.monitor);
        assert_eq!(mon("").unwrap(), MonitorSpec::default());
        assert_eq!(mon("").unwrap().mode, MonitorMode::Auto);
        assert_eq!(mon("monitor: off\n").unwrap().mode, MonitorMode::Off);
        assert_eq!(mon("monitor: on\n").unwrap().mode, MonitorMode::On);
        assert_eq!(mon("monitor: false\n").unwrap().mode, MonitorMode::Off);
        assert_eq!(mon("monitor: {enabled: off}\n").unwrap().mode, MonitorMode::Off);
        let m = mon("monitor: {interval: 250ms}\n").unwrap();
        assert_eq!((m.mode, m.interval), (MonitorMode::Auto, Duration::from_millis(250)));
        let e = mon("monitor: always\n").unwrap_err();
        assert!(e.contains("t.yaml:2") && e.contains("allowed: auto, on, off"), "{e}");
        assert!(mon("monitor: {interval: 1ms}\n").unwrap_err().contains("at least 10ms"));
        assert!(mon("monitor: {every: 1s}\n").is_err());
        assert_eq!(mon("").unwrap().layers, ["block", "journal"]);
        assert_eq!(mon("monitor: {layers: [block, driver, syscall]}\n").unwrap().layers, ["block", "driver", "syscall"]);
        let e = mon("monitor: {layers: [block, vfs]}\n").unwrap_err();
        assert!(e.contains("t.yaml:") && e.contains("`vfs`") && e.contains("allowed: block, fs, journal, driver, syscall"), "{e}");
        assert!(mon("monitor: {layers: [fs]}\n").unwrap_err().contains("must include `block`"));
        let m = mon("monitor: {extra: [{name: fsync, enter: \"ext4:ext4_sync_file_enter\", exit: \"ext4:ext4_sync_file_exit\", key: tid}]}\n").unwrap();
        assert_eq!(
            m.extra[0],
            ExtraPair { name: "fsync".into(), enter: "ext4:ext4_sync_file_enter".into(), exit: "ext4:ext4_sync_file_exit".into(), key: Some("tid".into()) }
        );
        let e = mon("monitor:\n  extra:\n    - {name: f, enter: ext4_sync_file_enter, exit: \"ext4:x\"}\n").unwrap_err();
        assert!(
            e.starts_with("t.yaml:") && !e.starts_with("t.yaml:0:") && e.contains("monitor: extra: enter `ext4_sync_file_enter`") && e.contains("SYS:NAME"),
            "{e}"
        );
        assert!(
            mon("monitor: {extra: [{name: a, enter: \"a:b\", exit: \"a:c\"}, {name: a, enter: \"a:b\", exit: \"a:c\"}]}\n")
                .unwrap_err()
                .contains("two pairs named")
        );
    }

    #[test]
    fn ring_defaults_to_auto_and_takes_on_off() {
        use crate::spec::disk::RingMode;
        let ring = |disk: &str| parse_experiment(&format!("name: x\n{disk}workload: {{size: 1MiB}}\n"), "t.yaml").map(|e| e.setups[0].disk.front.ring);
        assert_eq!(ring("").unwrap(), RingMode::Auto);
        assert_eq!(ring("disk: {ring: on}\n").unwrap(), RingMode::On);
        assert_eq!(ring("disk: {ring: off}\n").unwrap(), RingMode::Off);
        assert_eq!(ring("disk: {ring: auto}\n").unwrap(), RingMode::Auto);
        let e = ring("disk: {ring: fast}\n").unwrap_err();
        assert!(e.starts_with("t.yaml:2:") && e.contains("allowed: auto, on, off"), "{e}");
    }

    #[test]
    fn rq_affinity_defaults_to_auto_and_takes_numbers() {
        use crate::spec::disk::RqAffinity;
        let rqa = |disk: &str| parse_experiment(&format!("name: x\n{disk}workload: {{size: 1MiB}}\n"), "t.yaml").map(|e| e.setups[0].disk.front.rq_affinity);
        assert_eq!(rqa("").unwrap(), RqAffinity::Auto);
        assert_eq!(rqa("disk: {rq_affinity: 2}\n").unwrap(), RqAffinity::Two);
        assert_eq!(rqa("disk: {rq_affinity: keep}\n").unwrap(), RqAffinity::Keep);
        let e = rqa("disk: {rq_affinity: 5}\n").unwrap_err();
        assert!(e.starts_with("t.yaml:2:") && e.contains("allowed: auto, keep, 0, 1, 2"), "{e}");
    }

    #[test]
    fn cpu_latency_defaults_to_auto() {
        use crate::spec::disk::CpuLatency;
        let cl = |disk: &str| parse_experiment(&format!("name: x\n{disk}workload: {{size: 1MiB}}\n"), "t.yaml").map(|e| e.setups[0].disk.front.cpu_latency);
        assert_eq!(cl("").unwrap(), CpuLatency::Auto);
        assert_eq!(cl("disk: {cpu_latency: keep}\n").unwrap(), CpuLatency::Keep);
        assert_eq!(cl("disk: {cpu_latency: hold}\n").unwrap(), CpuLatency::Hold);
        let e = cl("disk: {cpu_latency: 0}\n").unwrap_err();
        assert!(e.starts_with("t.yaml:2:") && e.contains("allowed: auto, keep, hold"), "{e}");
    }

    /// `write_cache` and its bound; a bound without the cache, a bound below one block and an
    /// unknown mode are refused naming the file and line.
    #[test]
    fn disk_write_cache_keys() {
        use crate::spec::disk::CacheMode;
        let e = parse_experiment("name: x\ndisk: {write_cache: volatile, write_cache_size: 64MiB}\nworkload: {size: 1MiB}\n", "t.yaml").unwrap();
        let d = &e.setups[0].disk.disk;
        assert_eq!((d.write_cache, d.write_cache_size), (CacheMode::Volatile, 64 << 20));
        let e = parse_experiment("name: x\nworkload: {size: 1MiB}\n", "t.yaml").unwrap();
        assert_eq!((e.setups[0].disk.disk.write_cache, e.setups[0].disk.disk.write_cache_size), (CacheMode::None, 256 << 20));
        for (yaml, want) in [
            ("disk: {write_cache_size: 64MiB}", "needs `write_cache: volatile`"),
            ("disk: {write_cache: volatile, write_cache_size: 512}", "allowed: 4KiB or more"),
            ("disk: {write_cache: sometimes}", "volatile"),
        ] {
            let err = parse_experiment(&format!("name: x\n{yaml}\nworkload: {{size: 1MiB}}\n"), "t.yaml").err().unwrap();
            assert!(err.contains("t.yaml:2") && err.contains(want), "{yaml}: {err}");
        }
    }

    #[test]
    fn disk_latency_inline_and_populate() {
        let e = parse_experiment("name: x\ndisk: {latency: {read: 50us, channels: 2}, populate: false}\nworkload: {size: 1MiB}\n", "t.yaml").unwrap();
        let d = &e.setups[0].disk.disk;
        let m = d.latency.as_ref().unwrap();
        assert_eq!((m.channels, d.populate, d.populates()), (Some(2), Some(false), false));
        let e = parse_experiment("name: x\ndisk: {latency: {read: 50us}}\nworkload: {size: 1MiB}\n", "t.yaml").unwrap();
        assert!(e.setups[0].disk.disk.populates(), "a model populates by default");
        let e = parse_experiment("name: x\ndisk:\n  latency: {read: {distribution: gamma}}\nworkload: {size: 1MiB}\n", "t.yaml").unwrap_err();
        assert!(e.starts_with("t.yaml:3:") && e.contains("allowed: fixed"), "{e}");
        let e = parse_experiment("name: x\ndisk: {latency: no-such-model.yaml}\nworkload: {size: 1MiB}\n", "t.yaml").unwrap_err();
        assert!(e.starts_with("t.yaml:2:") && e.contains("cannot read latency file"), "{e}");
    }

    #[test]
    fn nbd_store_and_its_policy() {
        let y = "name: x\ndisk: {store: 'nbd://127.0.0.1:10900/e', nbd: {timeout: 2s, retries: 5, backoff: {initial: 2ms, max: 40ms}, connections: 2}}\nworkload: {size: 1MiB}\n";
        let e = parse_experiment(y, "t.yaml").unwrap();
        let StoreSpec::Nbd(t) = &e.setups[0].disk.disk.store else { panic!("not an NBD store") };
        assert_eq!((t.policy.timeout, t.policy.retries, t.policy.connections), (Duration::from_secs(2), 5, 2));
        assert_eq!((t.policy.backoff_initial, t.policy.backoff_max), (Duration::from_millis(2), Duration::from_millis(40)));
        // the policy reaches the disk server through the URI
        assert_eq!(e.setups[0].disk.disk.store.to_string().parse::<StoreSpec>().unwrap(), e.setups[0].disk.disk.store);
        let bad = parse_experiment("name: x\ndisk: {nbd: {retries: 1}}\nworkload: {size: 1MiB}\n", "t.yaml").unwrap_err();
        assert!(bad.contains("t.yaml:2:7: disk `nbd:` settings need an NBD store"), "{bad}");
        let bad = parse_experiment("name: x\ndisk: {store: 'nbd://h/', nbd: {retries: 5000}}\nworkload: {size: 1MiB}\n", "t.yaml").unwrap_err();
        assert!(bad.contains("allowed: 0..1000"), "{bad}");
        let bad = parse_experiment("name: x\ndisk: {store: 'nbd://h/', nbd: {tries: 5}}\nworkload: {size: 1MiB}\n", "t.yaml").unwrap_err();
        assert!(bad.contains("tries"), "{bad}");
    }
}
