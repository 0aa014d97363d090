//! The schema of `results.json` (documented field by field in docs/results.md).
//! Everything a report shows is derived from these values; the aggregate is computed in
//! exactly one place, `Aggregate::from(&[Repetition])`.
//!
//! One rule decides where a schema type is defined: by whoever computes the value. A value
//! stored as its producer computed it (the workload's op and flowop statistics, the monitor's
//! results, the latency model's figures, the NBD client's counters, host fault records) is
//! embedded in that producer's own type, serialized as it is, and re-exported below under its
//! schema name; nothing is copied field by field, so a field added at the source reaches
//! results.json without a second edit. The types defined here are the values report/ computes
//! itself: the per-repetition records `collect` reshapes from what a run measured (integrity
//! from the verifier's findings, samples, injected faults, rule counts), the aggregate, the
//! slowdown rows and the study's figures (report/study.rs, whose probe types the namespace
//! prober and the agents both fill).
//!
//! Structs below the top level are `#[serde(default)]`: a field added later within schema 1
//! must not make older results.json files unreadable.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

// Values embedded as their producers compute them (see the module doc).
pub use crate::disk::latency::LatencyStats;
pub use crate::fault::log::LatenessSummary;
pub use crate::host::HostFaultRecord;
pub use crate::monitor::MonitorResults;
pub use crate::nbd::client::{CounterSnapshot, IntervalCounts};
/// One flowop type of a personality repetition: the workload's own per-flowop summary.
pub use crate::workload::FlowopSummary as FlowopStats;
/// Per-op statistics of a repetition (reads or writes): the workload's own summary.
pub use crate::workload::LatencySummary as OpStats;
/// One window of a `baseline: windows` run: the workload's own per-window summary.
pub use crate::workload::windows::WindowSummary as WindowStats;

/// The schema version this build writes and reads.
pub const SCHEMA: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    pub schema: u32,
    pub faultline_version: String,
    pub name: String,
    pub started_unix: u64,
    /// The experiment file as it was read (echoed, not interpreted).
    #[serde(default)]
    pub experiment: serde_json::Value,
    pub setups: Vec<SetupResult>,
    /// Repetitions that failed (the stack did not build, a tool exited with an error...): the
    /// run went on with the next setup; a setup none of whose repetitions finished is not in
    /// `setups`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<FailedRun>,
}

/// One repetition that ended in an error instead of a result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailedRun {
    pub setup: String,
    /// 1-based.
    pub repetition: u32,
    /// The unarmed run of a `baseline: true` pair.
    #[serde(default)]
    pub baseline: bool,
    /// The error with its causes, outermost first.
    pub error: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SetupResult {
    pub name: String,
    /// raw, ext4, xfs, btrfs, btrfs-raid1, dedup-btrfs, command
    pub stack: String,
    pub description: String,
    pub repetitions: Vec<Repetition>,
    pub aggregate: Aggregate,
    /// `baseline: true`: the runs without faults, `baseline[k]` paired with `repetitions[k]`
    /// (it ran just before it). Empty otherwise.
    pub baseline: Vec<Repetition>,
    /// Setups made by `matrix:`: [axis, entry name] per axis, in the file's order.
    pub axes: Vec<(String, String)>,
    /// Slowdown of the injected runs against their baselines, per source, op and metric
    /// (computed from the repetitions, docs/results.md); empty without baselines.
    pub slowdown: Vec<super::slowdown::SlowdownRow>,
    /// How `slowdown` was paired: `runs` (`baseline: true`: baseline run k with injected run
    /// k), `windows` (`baseline: windows`: unarmed and armed windows of each run, pair by
    /// pair), or empty (no slowdown).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub slowdown_method: String,
    /// `baseline: windows`: the window layout every repetition used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_plan: Option<crate::spec::windows::WindowPlan>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Repetition {
    pub index: u32,
    pub seconds: f64,
    pub read: OpStats,
    pub write: OpStats,
    pub timeseries: Vec<Sample>,
    pub faults: Vec<InjectedFault>,
    pub rules: Vec<RuleCount>,
    /// "op:ERRNO" -> number of failed I/Os, e.g. "write:EIO" -> 3
    pub io_errors: BTreeMap<String, u64>,
    pub failed_ios: u64,
    pub retries: u64,
    pub integrity: Integrity,
    /// Free text worth keeping: btrfs device stats, dmesg lines, warnings.
    pub notes: Vec<String>,
    /// The BPF monitor's per-layer figures for the drive phase (docs/monitor.md); None when
    /// it was off or unavailable (the notes say why) and in files written before it existed.
    pub monitor: Option<MonitorResults>,
    /// Personality workloads: per flowop type (filebench's names: createfile, writewholefile,
    /// appendfilerand, openfile, readwholefile, closefile, deletefile, statfile, fsync; and
    /// faultline's renamefile with varmail's `replace`).
    pub flowops: BTreeMap<String, FlowopStats>,
    /// Personality workloads: flowops that found no file to work on (see docs/workload.md).
    pub flowops_skipped: u64,
    /// Disks with a latency model (docs/latency.md): its service and channel-wait times over
    /// the repetition, and how late replies went out versus their due time.
    pub latency_model: Vec<DiskLatencyModel>,
    /// Host faults on the disk servers (docs/host.md): when each was applied and reverted, and
    /// what it did.
    pub host_faults: Vec<HostFaultRecord>,
    /// CPU time (user + system, s) during the drive phase: of the run's own process (the
    /// workload's threads) and of the processes serving its disks.
    pub drive_cpu_s: Option<DriveCpu>,
    /// NBD clients (docs/nbd.md): the disks' `nbd://` stores over the repetition, summed, or
    /// an `interface: nbd` workload's client; None without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nbd_client: Option<NbdClient>,
    /// Position of this run in the experiment's order (1-based; baselines count too).
    pub sequence: u32,
    /// A baseline run: the setup with no fault armed.
    pub baseline: bool,
    /// Networked experiments (`hosts:`): per-client series, probes, fault windows and their
    /// figures (docs/results.md).
    /// Results written before this key was named `networked` called it `study`.
    #[serde(default, skip_serializing_if = "Option::is_none", alias = "study")]
    pub networked: Option<Box<super::networked::NetworkedRun>>,
    /// A power cut during the repetition and what the crash + check phase found
    /// (docs/crash.md, docs/results.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crash: Option<Box<CrashRecord>>,
    /// `baseline: windows`: the run's whole windows, each with the ops wholly inside its
    /// measured span (docs/results.md); the slowdown pairs them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<WindowStats>,
    /// `baseline: windows`: how the windows met the disks' fault clocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_clock: Option<WindowClock>,
}

/// Where a `baseline: windows` run's windows sat on the disks' fault clocks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WindowClock {
    /// The workload's start on the fault clock (s): the armed windows' rules are that much
    /// later on the disk than in the workload's time.
    pub offset_s: f64,
    /// Uncertainty of that offset (s): the round trip of the fault clock's restart.
    pub uncertainty_s: f64,
    /// When the windows' rules were armed, in the workload's time (s): before the first
    /// armed window, or the repetition fails.
    pub armed_at_s: f64,
    /// Rules armed (one per fault and armed stretch).
    pub rules: u32,
}

/// One power cut inside `faultline run` and what survived it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CrashRecord {
    /// The fault's label ("fault #2 (cut)").
    pub fault: String,
    pub model: Option<crate::disk::cache::SurvivalModel>,
    pub seed: u64,
    /// Its trigger as written: "at 2s", "after 5000 ops", "after 40 flushes".
    pub trigger: String,
    /// Whether the trigger came due before the workload ended (else nothing was cut).
    pub fired: bool,
    /// Seconds from the start of the workload to the cut.
    pub t_s: f64,
    /// What the disk's cache did (kept, lost, torn of the unflushed writes).
    pub cut: Option<crate::disk::cache::CutReport>,
    /// The file system's own check after the journal replay; None on a raw device.
    pub check: Option<FsCheck>,
    /// The mount after the cut (journal replay): "ok" or why it failed.
    pub mount: Option<String>,
    /// The durability oracle's counts (the workload's blocks), None for a command stack. In a
    /// networked experiment the sum over the clients (`clients` has each one's).
    pub oracle: Option<crate::verify::crash::OracleReport>,
    /// A networked experiment's cut: each client's slice of the target's disk, the I/Os it saw
    /// fail, and the oracle over its own blocks (`oracle` is their sum).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub clients: Vec<ClientOracle>,
    /// The application's own check (`check:` of a command stack).
    pub app_check: Option<AppCheck>,
    /// Lines in FAULTLINE_ACKS when the power went (`acks: true`), and the file.
    pub acks: Option<u64>,
    pub acks_file: Option<String>,
    /// Seconds the crash + check phase took (unmount, power-on, check, mounts, oracle).
    pub phase_s: f64,
}

/// One client's part of a networked experiment's power cut.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClientOracle {
    /// The client host.
    pub host: String,
    /// Its slice of the target's disk: the first byte and the bytes its workload addressed
    /// (no other client wrote there).
    pub offset: u64,
    pub length: u64,
    /// The I/Os that failed for it (EIO once the disk lost power).
    pub failed_ios: u64,
    /// The oracle over the blocks it wrote (failures name the disk's blocks).
    pub oracle: crate::verify::crash::OracleReport,
}

/// A file-system check (`e2fsck -fn`, `xfs_repair -n`, `btrfs check --readonly`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FsCheck {
    pub command: String,
    pub exit_code: Option<i32>,
    /// "clean" (exit 0) or "errors".
    pub verdict: String,
    /// The last lines of its output (stdout and stderr).
    pub output_tail: String,
}

/// The application's check after a cut.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AppCheck {
    pub command: String,
    pub exit_code: Option<i32>,
    /// "consistent" (exit 0) or "inconsistent".
    pub verdict: String,
    pub stdout_tail: String,
    pub stderr_tail: String,
    /// The numbers of the JSON object on its last stdout line ({"acked": 1200, "lost": 10}).
    pub figures: BTreeMap<String, f64>,
}

impl CrashRecord {
    /// What broke a promise: durable-lost and garbage blocks, lost files, a check that found
    /// errors, a mount that failed, an application check that failed or counts `lost`.
    pub fn failures(&self) -> u64 {
        let oracle = self.oracle.as_ref().map_or(0, |o| o.counts.failures());
        let check = self.check.as_ref().is_some_and(|c| c.verdict != "clean") as u64;
        let mount = self.mount.as_ref().is_some_and(|m| m != "ok") as u64;
        let app = self.app_check.as_ref().map_or(0, |a| {
            let lost = a.figures.get("lost").copied().unwrap_or(0.0).max(0.0) as u64;
            lost.max((a.verdict != "consistent") as u64)
        });
        oracle + check + mount + app
    }
}

/// One disk's latency-model figures in a repetition.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DiskLatencyModel {
    pub disk: u32,
    #[serde(flatten)]
    pub stats: LatencyStats,
    /// Late replies (the model's and delay rules'): how late after their due time.
    pub reply_lateness: Option<LatenessSummary>,
    /// Held delays (`hold: device`, docs/rules.md), if a request held the device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<crate::disk::latency::HoldStats>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DriveCpu {
    pub workload: f64,
    pub disks: f64,
}

/// NBD client counters of a repetition: totals, and per interval of the workload.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NbdClient {
    #[serde(flatten)]
    pub totals: CounterSnapshot,
    #[serde(default)]
    pub intervals: Vec<IntervalCounts>,
}

impl Repetition {
    /// Personality repetitions: whole-file reads per write flowop (writewholefile +
    /// appendfilerand), the R:W ratio of the study; None without write flowops.
    pub fn flowop_read_write_ratio(&self) -> Option<f64> {
        let ratio = crate::workload::personality::read_write_ratio(&self.flowops);
        ratio.is_finite().then_some(ratio)
    }
}

/// One point of the per-interval time series; `t_s` is the end of the interval since the
/// workload started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Sample {
    pub t_s: f64,
    pub read_iops: f64,
    pub read_mib_s: f64,
    pub read_mean_us: f64,
    pub read_p99_us: f64,
    pub write_iops: f64,
    pub write_mib_s: f64,
    pub write_mean_us: f64,
    pub write_p99_us: f64,
    pub cpu_pct: f64,
    pub rss_mib: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct InjectedFault {
    /// Seconds since the workload started (same clock as `Sample::t_s`).
    pub t_s: f64,
    pub rule_id: u64,
    pub rule: String,
    pub action: String,
    pub op: String,
    pub offset: u64,
    pub len: u64,
    /// Blocks the fault touched (0 when the action has no block granularity, e.g. a delay).
    pub blocks: u64,
    /// Which disk of the setup (btrfs raid1 has two).
    pub disk: u32,
    /// Blocks of the rule's own target this injection hit for the first time. An error fails
    /// a whole request (`blocks` counts all of it) but only the targeted blocks are faulty, and
    /// a block that fails again on a retry is still one fault. None: not computed (older files).
    pub new_target_blocks: Option<u64>,
}

impl InjectedFault {
    /// What this fault counts for in `faults_injected`: the targeted blocks it hit first, else
    /// its blocks, or 1 when it has none (a delay without block granularity).
    pub fn weight(&self) -> u64 {
        match self.new_target_blocks {
            Some(n) => n,
            None if self.blocks == 0 => 1,
            None => self.blocks,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RuleCount {
    pub id: u64,
    pub name: String,
    pub action: String,
    pub op: String,
    pub fired: u64,
    pub blocks: u64,
    /// Matches (requests, or blocks for content rules) that passed op + target + window + after.
    pub matched: u64,
    /// fired / matched (0 when nothing matched).
    pub realized_ratio: f64,
    /// The rule's pattern (`random 10%`, `burst 1000 in 100000`, `interval every 100`); empty: none.
    pub pattern: String,
    /// Pattern rules: runs of consecutive fired matches started, and the lengths of the
    /// completed ones.
    pub runs: u64,
    pub run_length_mean: f64,
    pub run_length_min: u64,
    pub run_length_max: u64,
}

/// The verifier's findings as results.json counts them (`collect::integrity`): a misdirected
/// block is counted apart from other corruption (`verify::Counts` counts it in both), and the
/// bad blocks of every file are in one list with their file's name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Integrity {
    pub blocks_checked: u64,
    pub ok: u64,
    pub corrupted: u64,
    pub misdirected: u64,
    pub unreadable: u64,
    pub short: u64,
    pub missing: u64,
    pub bad: Vec<BadBlock>,
    pub files_hit: Vec<FileHit>,
}

impl Integrity {
    /// Wrong data returned without an error.
    pub fn silent(&self) -> u64 {
        self.corrupted + self.misdirected
    }
    /// Bad blocks the reader was told about (error, short read, missing file).
    pub fn detected(&self) -> u64 {
        self.unreadable + self.short + self.missing
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BadBlock {
    /// None on a raw device.
    pub file: Option<String>,
    /// Byte offset in the file (or device).
    pub offset: u64,
    /// corrupted | misdirected | unreadable | short | missing
    pub kind: String,
    pub errno: Option<String>,
    pub expected_id: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FileHit {
    pub file: String,
    pub bad_blocks: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MeanSd {
    pub mean: f64,
    /// Sample standard deviation (n - 1); 0 with fewer than two values.
    pub sd: f64,
}

impl MeanSd {
    pub fn of(xs: &[f64]) -> MeanSd {
        let n = xs.len();
        if n == 0 {
            return MeanSd::default();
        }
        let mean = xs.iter().sum::<f64>() / n as f64;
        let sd = if n < 2 { 0.0 } else { (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt() };
        MeanSd { mean, sd }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Aggregate {
    pub repetitions: u32,
    pub write_mib_s: MeanSd,
    pub read_mib_s: MeanSd,
    pub write_p99_us: MeanSd,
    pub faults_injected: MeanSd,
    pub failures: MeanSd,
    pub silent: MeanSd,
    pub detected: MeanSd,
    pub app_errors: MeanSd,
}

/// The per-repetition counts the study's tables are made of (definitions: docs/results.md).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counts {
    pub faults_injected: u64,
    pub silent: u64,
    pub detected: u64,
    pub failures: u64,
    pub app_errors: u64,
}

impl Repetition {
    pub fn counts(&self) -> Counts {
        // what a power cut broke counts as silent: nothing reported it to the workload
        let silent = self.integrity.silent() + self.crash.as_ref().map_or(0, |c| c.failures());
        let detected = self.integrity.detected();
        Counts {
            faults_injected: self.faults.iter().map(InjectedFault::weight).sum(),
            silent,
            detected,
            failures: silent + detected,
            app_errors: self.failed_ios,
        }
    }
}

impl From<&[Repetition]> for Aggregate {
    fn from(reps: &[Repetition]) -> Aggregate {
        let of = |f: &dyn Fn(&Repetition) -> f64| MeanSd::of(&reps.iter().map(f).collect::<Vec<_>>());
        Aggregate {
            repetitions: reps.len() as u32,
            write_mib_s: of(&|r| r.write.mib_s),
            read_mib_s: of(&|r| r.read.mib_s),
            write_p99_us: of(&|r| r.write.p99_us),
            faults_injected: of(&|r| r.counts().faults_injected as f64),
            failures: of(&|r| r.counts().failures as f64),
            silent: of(&|r| r.counts().silent as f64),
            detected: of(&|r| r.counts().detected as f64),
            app_errors: of(&|r| r.counts().app_errors as f64),
        }
    }
}

impl SetupResult {
    /// Recompute `aggregate` from the repetitions.
    pub fn aggregate_now(&mut self) {
        self.aggregate = Aggregate::from(self.repetitions.as_slice());
        self.slowdown = super::slowdown::rows(&self.baseline, &self.repetitions);
        self.slowdown_method = super::slowdown::method(&self.baseline, &self.repetitions).unwrap_or_default().to_string();
    }

    /// Whether the setup has a slowdown: paired runs or paired windows.
    pub fn paired(&self) -> bool {
        super::slowdown::method(&self.baseline, &self.repetitions).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_sd_known_values() {
        // 2,4,4,4,5,5,7,9: mean 5, sample variance 32/7
        let m = MeanSd::of(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!(m.mean, 5.0);
        assert!((m.sd - (32.0f64 / 7.0).sqrt()).abs() < 1e-12);
        assert_eq!(MeanSd::of(&[3.0]), MeanSd { mean: 3.0, sd: 0.0 });
        assert_eq!(MeanSd::of(&[]), MeanSd { mean: 0.0, sd: 0.0 });
    }

    #[test]
    fn fault_weight_falls_back_to_one() {
        let f = |blocks| InjectedFault { blocks, ..Default::default() };
        let r = Repetition { faults: vec![f(0), f(3), f(0)], ..Default::default() };
        assert_eq!(r.counts().faults_injected, 5);
    }
}
