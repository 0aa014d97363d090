//! Rules files (YAML; JSON is YAML too). Every key is documented in docs/rules.md.
//!
//! Parsing is two steps: serde-saphyr reads a flat raw struct (unknown keys and bad units are
//! rejected with line/column), then `validate` checks which keys belong to which `type` and
//! builds `fault::Rule`s. Every error names the source, line, column, the rule and what is allowed.

use super::check::{
    DiskGeometry, beyond_end, burst_period, check_burst_length, check_corrupt, check_delay, check_interval, check_pattern_ratio, check_rule, check_window,
    errno_out_of_range,
};
use crate::content::parse_hash;
use crate::spec::rule::{Action, DelayDist, ERRNOS, Fill, FlipAt, Hold, Op, OpSet, Pattern, Rule, Target, Window};
use crate::spec::units::{Dur, Ratio, Size, parse_size};
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_saphyr::Spanned;
use std::fmt;
use std::marker::PhantomData;

pub const TYPES: &str = "bitflip, corrupt, error, delay, lost-write, torn-write, misdirected-write, rot";
pub const OPS: &str = "read, write, flush, discard, any";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RulesFile {
    rules: Vec<Spanned<RawRule>>,
}

/// Either a scalar word or a map: `target: any` / `target: {offset: 0, length: 4KiB}`.
#[derive(Clone)]
pub(crate) enum WordOr<M> {
    Word(String),
    Map(M),
}

impl<'de, M: Deserialize<'de>> Deserialize<'de> for WordOr<M> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<M>(PhantomData<M>);
        impl<'de, M: Deserialize<'de>> Visitor<'de> for V<M> {
            type Value = WordOr<M>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a word or a map")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(WordOr::Word(s.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<Self::Value, A::Error> {
                M::deserialize(de::value::MapAccessDeserializer::new(m)).map(WordOr::Map)
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// `op: read` or `op: [read, write]`.
#[derive(Deserialize, Clone)]
#[serde(untagged, expecting = "not an op or a list of ops; allowed: read, write, flush, discard (or trim), any, or a list of them")]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// A number or a word (errno 5 / errno EIO; shift -4096 / shift -4KiB).
#[derive(Deserialize, Clone)]
#[serde(untagged, expecting = "not a number or a word; allowed: a number or a name, e.g. `errno: EIO` or `errno: 5`, `shift: -8KiB`")]
enum NumOrWord {
    Num(i64),
    Word(String),
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    offset: Option<Size>,
    length: Option<Size>,
    block: Option<u64>,
    count: Option<u64>,
    hash: Option<String>,
    /// experiments only: block N of file F, resolved by the workload
    file: Option<String>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDelay {
    pub(crate) distribution: String,
    pub(crate) min: Option<Dur>,
    pub(crate) max: Option<Dur>,
    pub(crate) mean: Option<Dur>,
    pub(crate) stddev: Option<Dur>,
    pub(crate) median: Option<Dur>,
    pub(crate) sigma: Option<f64>,
    pub(crate) scale: Option<Dur>,
    pub(crate) shape: Option<f64>,
}

/// `pattern: random` (a word: the published defaults) or `pattern: {burst: {ratio, length}}`.
#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct RawPattern {
    random: Option<RawRandom>,
    burst: Option<RawBurst>,
    interval: Option<RawInterval>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct RawRandom {
    ratio: Option<Ratio>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct RawBurst {
    ratio: Option<Ratio>,
    length: Option<u64>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct RawInterval {
    every: Option<u64>,
}

/// `window: {from, to}` of rules, host faults and network faults.
#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawWindow {
    from: Option<Dur>,
    to: Option<Dur>,
}

/// A window from its YAML: `from` defaults to the start, `to` to never; `to` after `from`.
pub(crate) fn parse_window(w: RawWindow) -> Result<Window, String> {
    let w = Window { from: w.from.map(|d| d.0).unwrap_or_default(), to: w.to.map(|d| d.0) };
    check_window(&w)?;
    Ok(w)
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct RawAfter {
    requests: Option<u64>,
    bytes: Option<Size>,
}

/// Experiments only: when the workload's progress arms the rule.
#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct RawWhen {
    every: Option<Size>,
    after_ops: Option<u64>,
    at: Option<Dur>,
    /// How many times an `every` trigger fires at most.
    count: Option<u64>,
    after_workload: Option<bool>,
    /// Power cuts only: after the disk completed this many flushes.
    after_flushes: Option<u64>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRule {
    name: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    op: Option<OneOrMany>,
    target: Option<WordOr<RawTarget>>,
    times: Option<u64>,
    probability: Option<Ratio>,
    pattern: Option<WordOr<RawPattern>>,
    seed: Option<u64>,
    window: Option<RawWindow>,
    after: Option<RawAfter>,
    // bitflip / rot
    byte: Option<u32>,
    bit: Option<u8>,
    random: Option<bool>,
    // corrupt
    offset: Option<Size>,
    length: Option<Size>,
    fill: Option<String>,
    // error
    errno: Option<NumOrWord>,
    // delay
    delay: Option<WordOr<RawDelay>>,
    hold: Option<String>,
    // torn-write
    keep: Option<Size>,
    // misdirected-write
    shift: Option<NumOrWord>,
    // power-cut (experiments only)
    model: Option<String>,
    // experiments only (faultline run): schedule, how a workload target is matched, which disk
    when: Option<RawWhen>,
    by: Option<String>,
    disk: Option<usize>,
    allow_repeat: Option<bool>,
}

impl RawRule {
    pub(crate) fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// `type: power-cut`: not an engine rule but the disk's power (`validate_power_cut`).
    pub(crate) fn is_power_cut(&self) -> bool {
        self.kind.as_deref() == Some("power-cut")
    }

    /// Type-specific keys present in this rule.
    fn param_keys(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        let mut k = |present: bool, name: &'static str| {
            if present {
                v.push(name)
            }
        };
        k(self.byte.is_some(), "byte");
        k(self.bit.is_some(), "bit");
        k(self.random.is_some(), "random");
        k(self.offset.is_some(), "offset");
        k(self.length.is_some(), "length");
        k(self.fill.is_some(), "fill");
        k(self.errno.is_some(), "errno");
        k(self.delay.is_some(), "delay");
        k(self.hold.is_some(), "hold");
        k(self.keep.is_some(), "keep");
        k(self.shift.is_some(), "shift");
        v
    }
}

/// Parse a rules document. `source` names it in errors (a file path, or "control socket").
pub fn parse_rules(text: &str, source: &str, geo: DiskGeometry) -> Result<Vec<Rule>, String> {
    // rule files may hold 100,000s of rules: lift the parser's node budget accordingly
    let mut budget = serde_saphyr::Budget::default();
    budget.max_nodes = 50_000_000;
    budget.max_events = 100_000_000;
    budget.max_total_scalar_bytes = 1 << 30;
    let mut opts = serde_saphyr::Options::default();
    opts.budget = Some(budget);
    let file: RulesFile = serde_saphyr::from_str_with_options(text, opts).map_err(|e| crate::spec::yaml_error(source, &e))?;
    let mut out = Vec::with_capacity(file.rules.len());
    for (i, r) in file.rules.into_iter().enumerate() {
        let loc = &r.referenced;
        let label = match &r.value.name {
            Some(n) => format!("rule #{} ({n})", i + 1),
            None => format!("rule #{}", i + 1),
        };
        let rule = no_experiment_keys(&r.value)
            .and_then(|()| validate(r.value, geo))
            .map_err(|e| format!("{source}:{}:{}: {label}: {e}", loc.line(), loc.column()))?;
        out.push(rule);
    }
    Ok(out)
}

pub fn parse_rules_file(path: &std::path::Path, geo: DiskGeometry) -> Result<Vec<Rule>, String> {
    let text = crate::spec::read_text(path, "rules file")?;
    parse_rules(&text, &path.display().to_string(), geo)
}

/// Keys that only make sense inside an experiment, where a workload runs.
fn no_experiment_keys(r: &RawRule) -> Result<(), String> {
    let used = [("when", r.when.is_some()), ("by", r.by.is_some()), ("disk", r.disk.is_some()), ("allow_repeat", r.allow_repeat.is_some())];
    if let Some((k, _)) = used.iter().find(|(_, u)| *u) {
        return Err(format!("`{k}` belongs to experiment files (faultline run), where a workload drives the schedule; a rules file arms every rule at once"));
    }
    if let Some(WordOr::Word(w)) = &r.target
        && DEFERRED_WORDS.contains(&w.as_str())
    {
        return Err(format!("target `{w}` is resolved by a workload and works only in experiment files (faultline run)"));
    }
    if let Some(WordOr::Map(t)) = &r.target
        && t.file.is_some()
    {
        return Err("target `{file, block}` is resolved by a workload and works only in experiment files (faultline run)".into());
    }
    Ok(())
}

const DEFERRED_WORDS: [&str; 3] = ["last_written_block", "most_duplicated", "unique"];

/// A target the workload resolves when the fault is armed (experiments only).
#[derive(Clone, Debug, PartialEq)]
pub enum Deferred {
    /// The last 4 KiB block of the write that fires the trigger (armed before it is issued).
    LastWritten,
    /// The content written most often.
    MostDuplicated,
    /// A content written exactly once.
    Unique,
    /// Block N (4 KiB) of file F of the file interface (`f3` or `3`).
    FileBlock { file: usize, block: u64 },
}

#[derive(Clone, Debug, PartialEq)]
pub enum Trigger {
    /// At the start of the workload (the default; `rot` defaults to AfterWorkload).
    Start,
    /// Each time this many more bytes have been written (at most `count` times).
    Every {
        bytes: u64,
        count: Option<u64>,
    },
    AfterOps(u64),
    At(std::time::Duration),
    /// After the workload (and deduplication), before verification: faults at rest.
    AfterWorkload,
}

/// One fault of an experiment: an engine rule plus when to arm it and how to resolve its target.
#[derive(Clone, Debug)]
pub struct FaultSpec {
    pub rule: Rule,
    pub deferred: Option<Deferred>,
    pub trigger: Trigger,
    /// Resolve workload targets by content hash (true) or device offset (false); None: by
    /// offset on a raw device, by content through a file system (where offsets are unknown).
    pub by_content: Option<bool>,
    /// Which disk of the setup (raid1 has two).
    pub disk: usize,
    pub allow_repeat: bool,
    /// "rule #N (name)" for messages.
    pub label: String,
}

/// Validate one fault of an experiment file (`line:col` are added by the caller).
pub(crate) fn validate_fault(mut r: RawRule, geo: DiskGeometry, label: String) -> Result<FaultSpec, String> {
    let deferred = match &r.target {
        Some(WordOr::Word(w)) => match w.as_str() {
            "last_written_block" => Some(Deferred::LastWritten),
            "most_duplicated" => Some(Deferred::MostDuplicated),
            "unique" => Some(Deferred::Unique),
            "any" => None,
            other => {
                return Err(format!(
                    "unknown target `{other}`; allowed: any, last_written_block, most_duplicated, unique, {{file, block}}, {{offset, length}}, {{block, count}}, {{hash}}"
                ));
            }
        },
        Some(WordOr::Map(t)) if t.file.is_some() => {
            if t.offset.is_some() || t.length.is_some() || t.count.is_some() || t.hash.is_some() {
                return Err("a file target is `{file: F, block: N}` (block N, 4 KiB, of the workload's file F); no other keys".into());
            }
            let f = t.file.as_deref().unwrap();
            let file =
                f.trim_start_matches('f').parse::<usize>().map_err(|_| format!("file `{f}` is not a workload file; allowed: f0, f1, ... (or 0, 1, ...)"))?;
            let block = t.block.unwrap_or(0);
            if block.checked_mul(4096).is_none() {
                return Err(format!("`block: {block}` (4 KiB blocks) is beyond any file; allowed: up to {}", u64::MAX / 4096 - 1));
            }
            Some(Deferred::FileBlock { file, block })
        }
        _ => None,
    };
    let when = r.when.take();
    let by = r.by.take();
    let disk = r.disk.take().unwrap_or(0);
    let allow_repeat = r.allow_repeat.take().unwrap_or(false);
    let is_rot = r.kind.as_deref() == Some("rot");
    let by_content = match by.as_deref() {
        None => None,
        Some("content") => Some(true),
        Some("offset") => Some(false),
        Some(o) => return Err(format!("unknown `by: {o}`; allowed: offset, content")),
    };
    if by_content.is_some() && deferred.is_none() {
        return Err("`by` says how a workload target is matched; it needs target last_written_block, most_duplicated, unique or {file, block}".into());
    }
    if by_content == Some(false) && matches!(deferred, Some(Deferred::MostDuplicated | Deferred::Unique)) {
        return Err("most_duplicated and unique name a content, not an offset; leave out `by` (or `by: content`)".into());
    }
    if deferred.is_some() {
        r.target = None;
    }
    let mut rule = if deferred.is_some() && is_rot {
        // rot needs a target; the placeholder is replaced when the fault is armed
        r.target = Some(WordOr::Map(RawTarget { offset: None, length: None, block: Some(0), count: None, hash: None, file: None }));
        validate(r, geo)?
    } else {
        validate(r, geo)?
    };
    if deferred.is_some() {
        rule.target = Target::Any;
        // the workload's target may be armed as a content target, which flush and discard
        // never match (they carry no data) and which `check_rule` refuses with them
        if !is_rot {
            rule.ops = OpSet::of(&rule.ops.ops().into_iter().filter(|o| matches!(o, Op::Read | Op::Write)).collect::<Vec<_>>());
            if rule.ops == OpSet::NONE {
                return Err("a workload target names a block's data; flush and discard carry none. Use `op: read` and/or `op: write`".into());
            }
        }
    }
    let trigger = match when {
        None if is_rot => Trigger::AfterWorkload,
        None => Trigger::Start,
        Some(w) => {
            if w.after_flushes.is_some() {
                return Err("`after_flushes` places a power cut (`type: power-cut`); other faults use every, after_ops, at or after_workload".into());
            }
            let n = [w.every.is_some(), w.after_ops.is_some(), w.at.is_some(), w.after_workload == Some(true)].iter().filter(|x| **x).count();
            if n != 1 {
                return Err("`when` is exactly one of {every: SIZE (written), count: N}, {after_ops: N}, {at: DURATION}, {after_workload: true}".into());
            }
            if w.count.is_some() && w.every.is_none() {
                return Err("`count` limits an `every` trigger; use it with `every`".into());
            }
            if let Some(e) = w.every {
                if e.0 == 0 {
                    return Err("`every: 0` would fire without end; give a size such as 1GiB".into());
                }
                Trigger::Every { bytes: e.0, count: w.count }
            } else if let Some(n) = w.after_ops {
                Trigger::AfterOps(n)
            } else if let Some(t) = w.at {
                Trigger::At(t.0)
            } else {
                Trigger::AfterWorkload
            }
        }
    };
    if deferred == Some(Deferred::LastWritten) && matches!(trigger, Trigger::Start | Trigger::AfterWorkload) && !is_rot {
        return Err("target last_written_block needs a `when` trigger ({every: SIZE}, {after_ops: N} or {at: DURATION}) that says which write".into());
    }
    if matches!(trigger, Trigger::Every { .. }) && deferred.is_none() {
        return Err("an `every` trigger arms a fresh rule each time: give it a workload target (last_written_block, most_duplicated, unique) so each firing hits a new block".into());
    }
    Ok(FaultSpec { rule, deferred, trigger, by_content, disk, allow_repeat, label })
}

/// When a power cut comes, counted from the start of the workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CutTrigger {
    At(std::time::Duration),
    AfterOps(u64),
    /// After the disk completed this many flushes since the workload started.
    AfterFlushes(u64),
}

/// `{type: power-cut, model, seed, when, disk}` of an experiment (docs/crash.md).
#[derive(Clone, Debug, PartialEq)]
pub struct PowerCutSpec {
    pub model: crate::spec::disk::SurvivalModel,
    /// None: drawn per repetition (and recorded).
    pub seed: Option<u64>,
    pub trigger: CutTrigger,
    pub disk: usize,
    pub label: String,
    /// Where it is written (`FILE:LINE:COL`), for errors found after parsing; set by the
    /// experiment's parser.
    pub at: String,
}

const CUT_KEYS: &str = "type, name, model, seed, when, disk";
const CUT_WHEN: &str = "{at: DURATION}, {after_ops: N} or {after_flushes: N}";

/// Validate a `type: power-cut` fault of an experiment (`line:col` are added by the caller).
pub(crate) fn validate_power_cut(r: RawRule, label: String) -> Result<PowerCutSpec, String> {
    let others = [
        ("op", r.op.is_some()),
        ("target", r.target.is_some()),
        ("times", r.times.is_some()),
        ("probability", r.probability.is_some()),
        ("pattern", r.pattern.is_some()),
        ("window", r.window.is_some()),
        ("after", r.after.is_some()),
        ("by", r.by.is_some()),
        ("allow_repeat", r.allow_repeat.is_some()),
    ];
    if let Some((k, _)) = others.iter().find(|(_, p)| *p) {
        return Err(format!("`{k}` is not a key of a power cut; allowed: {CUT_KEYS}"));
    }
    if let Some(k) = r.param_keys().first() {
        return Err(format!("`{k}` is not a key of a power cut; allowed: {CUT_KEYS}"));
    }
    let model = match r.model.as_deref() {
        None => crate::spec::disk::SurvivalModel::LoseAll,
        Some(m) => m.parse::<crate::spec::disk::SurvivalModel>()?,
    };
    let Some(w) = r.when else { return Err(format!("a power cut needs `when`: {CUT_WHEN}")) };
    if w.every.is_some() || w.count.is_some() {
        return Err(format!(
            "a repetition has at most one power cut (the run checks and verifies after it): `every` is not allowed; use {CUT_WHEN}, and `repeat:` for more cuts"
        ));
    }
    if w.after_workload.is_some() {
        return Err(format!("a power cut after the workload cuts nothing unflushed; use {CUT_WHEN}"));
    }
    let set: Vec<CutTrigger> = [w.at.map(|t| CutTrigger::At(t.0)), w.after_ops.map(CutTrigger::AfterOps), w.after_flushes.map(CutTrigger::AfterFlushes)]
        .into_iter()
        .flatten()
        .collect();
    let [trigger] = set[..] else { return Err(format!("`when` of a power cut is exactly one of {CUT_WHEN}")) };
    Ok(PowerCutSpec { model, seed: r.seed, trigger, disk: r.disk.unwrap_or(0), label, at: String::new() })
}

fn allowed_params(kind: &str) -> &'static [&'static str] {
    match kind {
        "bitflip" | "rot" => &["byte", "bit", "random"],
        "corrupt" => &["offset", "length", "fill"],
        "error" => &["errno"],
        "delay" => &["delay", "hold"],
        "lost-write" => &[],
        "torn-write" => &["keep"],
        "misdirected-write" => &["shift"],
        _ => &[],
    }
}

fn validate(r: RawRule, geo: DiskGeometry) -> Result<Rule, String> {
    let bs = geo.block_size as u64;
    let kind = r.kind.as_deref().ok_or_else(|| format!("missing `type`; allowed: {TYPES}"))?;
    if kind == "power-cut" {
        return Err(
            "`power-cut` is no rule of the fault engine: cut a disk's power with `faultline fault power-cut`, or in an experiment's `faults:` (docs/crash.md)"
                .into(),
        );
    }
    if r.model.is_some() {
        return Err("`model` belongs to `type: power-cut` (experiments)".into());
    }
    if !TYPES.split(", ").any(|t| t == kind) {
        return Err(format!("unknown type `{kind}`; allowed: {TYPES}"));
    }
    let allowed = allowed_params(kind);
    for k in r.param_keys() {
        if !allowed.contains(&k) {
            let list = if allowed.is_empty() { "none".to_string() } else { allowed.join(", ") };
            return Err(format!("key `{k}` does not apply to type {kind}; its keys: {list}"));
        }
    }

    let flip_at = || -> Result<FlipAt, String> {
        if r.random == Some(true) {
            if r.byte.is_some() || r.bit.is_some() {
                return Err("`random: true` draws byte and bit; do not also give `byte`/`bit`".into());
            }
            return Ok(FlipAt { byte: None, bit: None });
        }
        Ok(FlipAt { byte: Some(r.byte.unwrap_or(0)), bit: Some(r.bit.unwrap_or(0)) })
    };

    let action = match kind {
        "bitflip" => Action::Bitflip { at: flip_at()? },
        "rot" => Action::Rot { at: flip_at()? },
        "corrupt" => {
            let offset = r.offset.map(|s| s.0).unwrap_or(0);
            let length = r.length.map(|s| s.0);
            // before the casts to the rule's u32 fields: a YAML number may not fit them
            check_corrupt(offset, length, bs)?;
            let fill = match r.fill.as_deref().unwrap_or("random") {
                "random" => Fill::Random,
                "zero" | "zeroes" | "zeros" => Fill::Zero,
                other => return Err(format!("unknown fill `{other}`; allowed: random, zero")),
            };
            Action::Corrupt { offset: offset as u32, length: length.map(|l| l as u32), fill }
        }
        "error" => Action::Error { errno: parse_errno(r.errno.as_ref())? },
        "delay" => Action::Delay {
            delay: match r.delay {
                // the published default of a slow-I/O pattern
                None if r.pattern.is_some() => DelayDist::Fixed(DEFAULT_PATTERN_DELAY),
                d => parse_delay(d.ok_or("type delay needs `delay` (e.g. `delay: 100us` or `delay: {distribution: lognormal, median: 1ms, sigma: 0.5}`)")?)?,
            },
            hold: match r.hold.as_deref() {
                None | Some("path") => Hold::Path,
                Some("device") => Hold::Device,
                Some(other) => {
                    return Err(format!(
                        "unknown hold `{other}`; allowed: path (the default: nothing waits behind the delay), device (the delayed request holds its channel of the device)"
                    ));
                }
            },
        },
        "lost-write" => Action::LostWrite,
        "torn-write" => {
            let keep = r.keep.ok_or("type torn-write needs `keep` (bytes of each write that reach the disk, e.g. `keep: 2KiB`)")?.0;
            Action::TornWrite { keep }
        }
        "misdirected-write" => {
            let shift = match r.shift.ok_or("type misdirected-write needs `shift` (signed bytes, e.g. `shift: 1MiB` or `shift: -8KiB`)")? {
                NumOrWord::Num(n) => n,
                NumOrWord::Word(w) => {
                    let (neg, t) = w.trim().strip_prefix('-').map(|t| (true, t)).unwrap_or((false, w.trim()));
                    let v = i64::try_from(parse_size(t)?).map_err(|_| format!("`shift: {w}` is too large; allowed: at most {} bytes either way", i64::MAX))?;
                    if neg { -v } else { v }
                }
            };
            Action::MisdirectedWrite { shift }
        }
        _ => unreachable!(),
    };

    // ops
    let write_only = matches!(kind, "lost-write" | "torn-write" | "misdirected-write");
    let ops = match &r.op {
        None if kind == "rot" => OpSet::NONE,
        None if write_only => OpSet::of(&[Op::Write]),
        None if matches!(kind, "bitflip" | "corrupt") => OpSet::of(&[Op::Read, Op::Write]),
        None => OpSet::of(&Op::ALL),
        Some(_) if kind == "rot" => return Err("type rot corrupts data at rest when armed; it takes no `op`".into()),
        Some(o) => {
            let words: Vec<&str> = match o {
                OneOrMany::One(s) => vec![s.as_str()],
                OneOrMany::Many(v) => v.iter().map(|s| s.as_str()).collect(),
            };
            let mut ops = Vec::new();
            for w in words {
                match w {
                    "any" => ops.extend(Op::ALL),
                    "trim" => ops.push(Op::Discard),
                    _ => ops.push(Op::ALL.into_iter().find(|o| o.name() == w).ok_or_else(|| format!("unknown op `{w}`; allowed: {OPS}"))?),
                }
            }
            OpSet::of(&ops)
        }
    };

    // target
    let target = match r.target {
        None => Target::Any,
        Some(WordOr::Word(w)) if w == "any" => Target::Any,
        Some(WordOr::Word(w)) => return Err(format!("unknown target `{w}`; allowed: any, {{offset, length}}, {{block, count}}, {{hash}}")),
        Some(WordOr::Map(t)) => parse_target(t, geo)?,
    };

    let window = r.window.map(parse_window).transpose()?;
    let pattern = r.pattern.map(parse_pattern).transpose()?;
    let (after_requests, after_bytes) = r.after.map(|a| (a.requests.unwrap_or(0), a.bytes.map(|b| b.0).unwrap_or(0))).unwrap_or((0, 0));
    let rule = Rule {
        name: r.name,
        action,
        ops,
        target,
        times: r.times,
        probability: r.probability.map(|p| p.0),
        pattern,
        seed: r.seed.unwrap_or(0),
        window,
        after_requests,
        after_bytes,
    };
    check_rule(&rule, geo)?;
    Ok(rule)
}

/// The delay of `{type: delay, pattern: ...}` without a `delay` key (the published default).
pub const DEFAULT_PATTERN_DELAY: std::time::Duration = std::time::Duration::from_micros(10);

const PATTERNS: &str = "random, burst, interval, {random: {ratio}}, {burst: {ratio, length}}, {interval: {every}}";

fn parse_pattern(p: WordOr<RawPattern>) -> Result<Pattern, String> {
    let p = match p {
        WordOr::Word(w) => match w.as_str() {
            "random" => RawPattern { random: Some(RawRandom { ratio: None }), burst: None, interval: None },
            "burst" => RawPattern { random: None, burst: Some(RawBurst { ratio: None, length: None }), interval: None },
            "interval" => RawPattern { random: None, burst: None, interval: Some(RawInterval { every: None }) },
            other => return Err(format!("unknown pattern `{other}`; allowed: {PATTERNS}")),
        },
        WordOr::Map(m) => m,
    };
    let ratio = |r: Option<Ratio>, default: f64| {
        let x = r.map(|r| r.0).unwrap_or(default);
        check_pattern_ratio(x).map(|()| x)
    };
    match (p.random, p.burst, p.interval) {
        (Some(r), None, None) => Ok(Pattern::Random { ratio: ratio(r.ratio, Pattern::DEFAULT_RANDOM_RATIO)? }),
        (None, Some(b), None) => {
            let ratio = ratio(b.ratio, Pattern::DEFAULT_BURST_RATIO)?;
            let length = b.length.unwrap_or(Pattern::DEFAULT_BURST_LENGTH);
            check_burst_length(length)?;
            Ok(Pattern::Burst { ratio, length, period: burst_period(ratio, length)? })
        }
        (None, None, Some(i)) => {
            let every = i.every.unwrap_or(Pattern::DEFAULT_INTERVAL);
            check_interval(every).map(|()| Pattern::Interval { every })
        }
        _ => Err(format!("a pattern is exactly one of {PATTERNS}")),
    }
}

fn parse_errno(e: Option<&NumOrWord>) -> Result<i32, String> {
    let names = || ERRNOS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ");
    match e {
        None => Ok(libc::EIO),
        Some(NumOrWord::Num(n)) if (1..4096).contains(n) => Ok(*n as i32),
        Some(NumOrWord::Num(n)) => Err(errno_out_of_range(*n)),
        Some(NumOrWord::Word(w)) => {
            ERRNOS.iter().find(|(n, _)| n.eq_ignore_ascii_case(w)).map(|(_, v)| *v).ok_or_else(|| format!("unknown errno `{w}`; allowed: {}", names()))
        }
    }
}

/// A delay as a rule's `delay:` value, given as YAML text (`1ms` or `{distribution: ...}`):
/// the network relay's delays take the same forms (docs/net.md). `source` names the text in
/// errors (e.g. `--delay-dist`).
pub fn parse_delay_yaml(text: &str, source: &str) -> Result<DelayDist, String> {
    let d: WordOr<RawDelay> = serde_saphyr::from_str(text).map_err(|e| crate::spec::yaml_error(source, &e))?;
    parse_delay(d).map_err(|e| format!("{source}: {e}"))
}

pub(crate) fn parse_delay(d: WordOr<RawDelay>) -> Result<DelayDist, String> {
    let raw = match d {
        WordOr::Word(w) => return crate::spec::units::parse_duration(&w).map(DelayDist::Fixed),
        WordOr::Map(m) => m,
    };
    let need = |v: Option<Dur>, k: &str| v.map(|d| d.0).ok_or_else(|| format!("distribution {} needs `{k}`", raw.distribution));
    let num = |v: Option<f64>, k: &str| v.ok_or_else(|| format!("distribution {} needs `{k}`", raw.distribution));
    let dist = match raw.distribution.as_str() {
        "fixed" => DelayDist::Fixed(need(raw.mean.or(raw.min), "mean")?),
        "uniform" => DelayDist::Uniform { min: need(raw.min, "min")?, max: need(raw.max, "max")? },
        "normal" => DelayDist::Normal { mean: need(raw.mean, "mean")?, stddev: need(raw.stddev, "stddev")? },
        "lognormal" => DelayDist::Lognormal { median: need(raw.median, "median")?, sigma: num(raw.sigma, "sigma")? },
        "pareto" => DelayDist::Pareto { scale: need(raw.scale, "scale")?, shape: num(raw.shape, "shape")? },
        other => return Err(format!("unknown distribution `{other}`; allowed: fixed, uniform, normal, lognormal, pareto")),
    };
    check_delay(&dist)?;
    Ok(dist)
}

fn parse_target(t: RawTarget, geo: DiskGeometry) -> Result<Target, String> {
    let bs = geo.block_size as u64;
    let byte_form = t.offset.is_some() || t.length.is_some();
    let block_form = t.block.is_some() || t.count.is_some();
    let forms = [byte_form, block_form, t.hash.is_some()].iter().filter(|x| **x).count();
    if forms != 1 {
        return Err("a target is exactly one of {offset, length} (bytes), {block, count} (disk blocks) or {hash} (XXH3-128 of a block)".into());
    }
    if let Some(h) = t.hash {
        return Ok(Target::Content { hash: parse_hash(&h)? });
    }
    let beyond = |what: String| beyond_end(&what, geo);
    let (start, len) = if byte_form {
        (t.offset.map(|s| s.0).unwrap_or(0), t.length.map(|s| s.0).unwrap_or(bs))
    } else {
        let (b, n) = (t.block.unwrap_or(0), t.count.unwrap_or(1));
        let start = b.checked_mul(bs).ok_or_else(|| beyond(format!("`block: {b}`")))?;
        (start, n.checked_mul(bs).ok_or_else(|| beyond(format!("`count: {n}` (blocks)")))?)
    };
    let end = start.checked_add(len).ok_or_else(|| beyond(format!("[{start}, {start} + {len})")))?;
    Ok(Target::Range { start, end })
}

#[cfg(test)]
mod tests {
    use super::super::check::check_rules;
    use super::*;
    const GEO: DiskGeometry = DiskGeometry { size: 1 << 30, block_size: 4096 };

    fn one(y: &str) -> Result<Rule, String> {
        parse_rules(y, "t.yaml", GEO).map(|mut v| v.remove(0))
    }

    #[test]
    fn full_rules() {
        let v = parse_rules(
            "rules:\n  - {type: bitflip, op: write, target: {block: 10, count: 2}, times: 1}\n  - type: error\n    errno: ENOSPC\n    op: [read]\n    probability: 10%\n    seed: 3\n  - {type: delay, delay: {distribution: uniform, min: 10us, max: 20us}, window: {from: 1s, to: 2s}}\n  - {type: misdirected-write, shift: -8KiB, after: {requests: 5}}\n",
            "t.yaml",
            GEO,
        )
        .unwrap();
        assert_eq!(v.len(), 4);
        assert_eq!(v[0].target, Target::Range { start: 40960, end: 49152 });
        assert_eq!(v[1].action, Action::Error { errno: libc::ENOSPC });
        assert_eq!(v[1].probability, Some(0.1));
        assert_eq!(v[3].action, Action::MisdirectedWrite { shift: -8192 });
        assert_eq!(v[3].after_requests, 5);
    }

    #[test]
    fn errors_name_line_and_allowed() {
        let e = one("rules:\n  - type: bitflip\n    errno: EIO\n").unwrap_err();
        assert!(e.starts_with("t.yaml:2:") && e.contains("`errno` does not apply to type bitflip") && e.contains("byte, bit, random"), "{e}");
        let e = one("rules:\n  - {type: explode}\n").unwrap_err();
        assert!(e.contains("unknown type `explode`") && e.contains("lost-write"), "{e}");
        let e = one("rules:\n  - {type: error, colour: red}\n").unwrap_err();
        assert!(e.contains("colour") && e.contains("t.yaml"), "{e}");
        let e = one("rules:\n  - {type: delay, delay: 10 fortnights}\n").unwrap_err();
        assert!(e.contains("fortnights"), "{e}");
        let e = one("rules:\n  - {type: error, target: {offset: 2GiB}}\n").unwrap_err();
        assert!(e.contains("beyond the end"), "{e}");
        let e = one("rules:\n  - {type: error, errno: EWHAT}\n").unwrap_err();
        assert!(e.contains("ENOSPC"), "{e}");
        let e = one("rules: [ {type: error\n").unwrap_err();
        assert!(e.starts_with("t.yaml:1:10: unclosed"), "{e}");
        let e = one("rules:\n  - {type: error, when: {at: 1s}}\n").unwrap_err();
        assert!(e.contains("`when` belongs to experiment files"), "{e}");
        let e = one("rules:\n  - {type: bitflip, target: most_duplicated}\n").unwrap_err();
        assert!(e.contains("resolved by a workload"), "{e}");
    }

    #[test]
    fn patterns() {
        let r = one("rules:\n  - {type: delay, delay: 10us, pattern: {random: {ratio: 10%}}, seed: 4}\n").unwrap();
        assert_eq!((r.pattern, r.seed), (Some(Pattern::Random { ratio: 0.1 }), 4));
        let r = one("rules:\n  - {type: delay, delay: 1ms, pattern: {burst: {ratio: 1%, length: 1000}}}\n").unwrap();
        assert_eq!(r.pattern, Some(Pattern::Burst { ratio: 0.01, length: 1000, period: 100_000 }));
        let r = one("rules:\n  - {type: error, op: read, pattern: {interval: {every: 100}}, times: 3}\n").unwrap();
        assert_eq!((r.pattern, r.times), (Some(Pattern::Interval { every: 100 }), Some(3)));
        // the short forms: published defaults, and 10 us for a delay without `delay`
        let r = one("rules:\n  - {type: delay, pattern: random}\n").unwrap();
        assert_eq!(
            (r.pattern, r.action),
            (Some(Pattern::Random { ratio: 0.1 }), Action::Delay { delay: DelayDist::Fixed(DEFAULT_PATTERN_DELAY), hold: Hold::Path })
        );
        assert_eq!(one("rules:\n  - {type: delay, pattern: burst}\n").unwrap().pattern, Some(Pattern::Burst { ratio: 0.01, length: 1000, period: 100_000 }));
        assert_eq!(one("rules:\n  - {type: bitflip, pattern: {interval: {}}}\n").unwrap().pattern, Some(Pattern::Interval { every: 100 }));
        // a rule without a pattern serializes as before and round-trips with one
        let r = one("rules:\n  - {type: delay, delay: 10us, hold: device, pattern: random}\n").unwrap();
        assert_eq!(r.action, Action::Delay { delay: DelayDist::Fixed(DEFAULT_PATTERN_DELAY), hold: Hold::Device });
        let e = one("rules:\n  - {type: delay, delay: 10us, hold: queue}\n").unwrap_err();
        assert!(e.contains(":2:") && e.contains("unknown hold `queue`; allowed: path") && e.contains("device"), "{e}");
        let e = one("rules:\n  - {type: error, hold: device}\n").unwrap_err();
        assert!(e.contains("key `hold` does not apply to type error"), "{e}");
        let r = one("rules:\n  - {type: delay, pattern: {burst: {ratio: 2%, length: 10}}}\n").unwrap();
        let back: Rule = serde_json::from_value(serde_json::to_value(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        assert!(!serde_json::to_string(&Rule::new(Action::LostWrite, &[Op::Write], Target::Any)).unwrap().contains("pattern"));
    }

    #[test]
    fn pattern_errors() {
        let e = one("rules:\n  - {type: error}\n  - {type: delay, probability: 5%, pattern: random}\n").unwrap_err();
        assert!(e.starts_with("t.yaml:3:") && e.contains("rule #2") && e.contains("`probability` and `pattern`"), "{e}");
        let e = one("rules:\n  - {type: delay, pattern: {random: {ratio: 0}}}\n").unwrap_err();
        assert!(e.starts_with("t.yaml:2:") && e.contains("allowed: (0, 1]"), "{e}");
        let e = one("rules:\n  - {type: delay, pattern: {random: {ratio: 150%}}}\n").unwrap_err();
        assert!(e.starts_with("t.yaml:2:") && e.contains("out of range"), "{e}");
        let e = one("rules:\n  - {type: delay, pattern: {burst: {length: 0}}}\n").unwrap_err();
        assert!(e.contains("allowed: 1 or more"), "{e}");
        let e = one("rules:\n  - {type: delay, pattern: {interval: {every: 0}}}\n").unwrap_err();
        assert!(e.contains("allowed: 1 or more"), "{e}");
        let e = one("rules:\n  - {type: delay, pattern: {burst: {ratio: 30%, length: 1}}}\n").unwrap_err();
        assert!(e.contains("more than 1% off") && e.contains("`length: 3`"), "{e}");
        let e = one("rules:\n  - {type: delay, pattern: {burst: {ratio: 0.0000000000000000001, length: 1000}}}\n").unwrap_err();
        assert!(e.contains("beyond 2^64"), "{e}");
        let e = one("rules:\n  - {type: delay, pattern: sometimes}\n").unwrap_err();
        assert!(e.contains("unknown pattern `sometimes`") && e.contains("burst"), "{e}");
        let e = one("rules:\n  - {type: delay, pattern: {random: {}, interval: {}}}\n").unwrap_err();
        assert!(e.contains("exactly one of"), "{e}");
        let e = one("rules:\n  - type: delay\n    pattern:\n      random: {every: 3}\n").unwrap_err();
        assert!(e.starts_with("t.yaml:4:") && e.contains("every"), "{e}");
        let e = one("rules:\n  - {type: rot, target: {block: 1}, pattern: random}\n").unwrap_err();
        assert!(e.contains("type rot"), "{e}");
        let e = one("rules:\n  - {type: delay}\n").unwrap_err();
        assert!(e.contains("needs `delay`"), "{e}");
        // the parser's own rendering, `error: line 1 column 1` over `<input>`
        let e = parse_delay_yaml("{distribution: lognormal", "--delay-dist").unwrap_err();
        assert!(e.starts_with("--delay-dist:1:") && !e.contains("<input>") && !e.contains("error:"), "{e}");
        let e = parse_delay_yaml("{distribution: gamma}", "--delay-dist").unwrap_err();
        assert!(e.starts_with("--delay-dist: unknown distribution `gamma`; allowed: fixed"), "{e}");
        // an empty op list matched nothing, silently
        let e = one("rules:\n  - {type: error}\n  - {type: error, op: []}\n").unwrap_err();
        assert!(e.starts_with("t.yaml:3:") && e.contains("`op: []` names no operation") && e.contains("allowed: read, write"), "{e}");
    }

    /// Numbers at the ends of their types: an error naming the key, never an overflow (which
    /// panics in a debug build and wraps into a wrong rule in a release build).
    #[test]
    fn huge_numbers_are_errors() {
        let max = u64::MAX;
        let cases = [
            (format!("{{type: error, target: {{offset: {max}, length: 4096}}}}"), "beyond the end"),
            (format!("{{type: error, target: {{offset: 4096, length: {max}}}}}"), "beyond the end"),
            ("{type: error, target: {offset: 16777215TiB, length: 1TiB}}".to_string(), "beyond the end"),
            (format!("{{type: error, target: {{block: {max}}}}}"), "`block: 18446744073709551615` lies beyond the end"),
            (format!("{{type: error, target: {{block: 1, count: {max}}}}}"), "`count: 18446744073709551615` (blocks) lies beyond the end"),
            (format!("{{type: error, target: {{block: {}, count: 2}}}}", (1u64 << 30) / 4096 - 1), "beyond the end"),
            (format!("{{type: corrupt, offset: 1, length: {max}}}"), "offset + length within one block"),
            ("{type: misdirected-write, shift: 8388608TiB}".to_string(), "`shift: 8388608TiB` is too large"),
            ("{type: misdirected-write, shift: -8388608TiB}".to_string(), "is too large"),
            ("{type: misdirected-write, shift: 16777216TiB}".to_string(), "too large"),
        ];
        for (rule, want) in cases {
            let e = one(&format!("rules:\n  - {rule}\n")).unwrap_err();
            assert!(e.starts_with("t.yaml:2:") && e.contains(want), "{rule}\n got: {e}\nwant: {want}");
        }
        // the largest valid ones still parse
        let r = one(&format!("rules:\n  - {{type: error, target: {{block: {}, count: 1}}}}\n", (1u64 << 30) / 4096 - 1)).unwrap();
        assert_eq!(r.target, Target::Range { start: (1 << 30) - 4096, end: 1 << 30 });
        let r = one("rules:\n  - {type: misdirected-write, shift: -8388607TiB}\n").unwrap();
        assert_eq!(r.action, Action::MisdirectedWrite { shift: -(8388607i64 << 40) });
        let e = fault(&format!("{{type: bitflip, op: read, target: {{file: f0, block: {max}}}}}")).unwrap_err();
        assert!(e.contains("beyond any file"), "{e}");
    }

    /// Rules armed as JSON (`arm`, a run, an agent) skip the YAML: `check_rule` refuses what
    /// the YAML path refuses, with its message, and `check_rules` names the rule.
    #[test]
    fn typed_rules_are_checked_like_yaml_ones() {
        use std::time::Duration;
        let us = Duration::from_micros;
        let delay = |d| Rule::new(Action::Delay { delay: d, hold: Hold::Path }, &[Op::Read], Target::Any);
        let bad = [
            (delay(DelayDist::Uniform { min: us(2), max: us(1) }), "uniform delay: `max` must be >= `min`"),
            (delay(DelayDist::Pareto { scale: us(1), shape: 0.0 }), "`shape: 0` must be a positive number"),
            (delay(DelayDist::Pareto { scale: us(0), shape: 1.0 }), "`scale` must be > 0"),
            (delay(DelayDist::Lognormal { median: us(1), sigma: f64::NAN }), "`sigma: NaN` must be a positive number"),
            (delay(DelayDist::Lognormal { median: us(0), sigma: 1.0 }), "`median` must be > 0"),
            (Rule::new(Action::Error { errno: 0 }, &[Op::Read], Target::Any), "errno 0 is out of range"),
            (Rule::new(Action::Error { errno: libc::EIO }, &[], Target::Any), "`op: []` names no operation"),
            (Rule::new(Action::Bitflip { at: FlipAt { byte: Some(4096), bit: Some(0) } }, &[Op::Read], Target::Any), "`byte: 4096` is outside the block"),
            (Rule::new(Action::Bitflip { at: FlipAt::default() }, &[Op::Flush], Target::Any), "allowed ops: read, write"),
            (Rule::new(Action::Corrupt { offset: 4000, length: Some(100), fill: Fill::Zero }, &[Op::Read], Target::Any), "`length: 100` must be 1..96"),
            (Rule::new(Action::MisdirectedWrite { shift: 100 }, &[Op::Write], Target::Any), "non-zero multiple of the block size"),
            (Rule::new(Action::LostWrite, &[Op::Read], Target::Any), "applies to writes only"),
            (Rule::new(Action::Rot { at: FlipAt::default() }, &[], Target::Any), "type rot needs a `target`"),
            (Rule::new(Action::Rot { at: FlipAt::default() }, &[Op::Read], Target::Range { start: 0, end: 4096 }), "takes no `op`"),
            (Rule::new(Action::LostWrite, &[Op::Write], Target::Range { start: 8192, end: 4096 }), "ends before it starts"),
            (Rule::new(Action::LostWrite, &[Op::Write], Target::Range { start: 0, end: (1 << 30) + 1 }), "beyond the end of the disk"),
            (Rule::new(Action::Error { errno: 5 }, &[Op::Flush], Target::Content { hash: 1 }), "flush and discard carry none"),
        ];
        for (r, want) in bad {
            let e = check_rules(&[Rule::new(Action::LostWrite, &[Op::Write], Target::Any), r.clone()], GEO).unwrap_err();
            assert!(e.starts_with("rule #2: ") && e.contains(want), "{r:?}\n got: {e}\nwant: {want}");
        }
        let mut r = delay(DelayDist::Fixed(us(1)));
        for (p, want) in [
            (Pattern::Burst { ratio: 0.5, length: 2, period: 0 }, "`period: 0` does not follow"),
            (Pattern::Burst { ratio: 0.5, length: 0, period: 0 }, "`length: 0` is no run"),
            (Pattern::Random { ratio: 1.5 }, "`ratio: 1.5` never selects"),
            (Pattern::Interval { every: 0 }, "`every: 0` is no interval"),
        ] {
            r.pattern = Some(p);
            let e = check_rule(&r, GEO).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
        r.pattern = None;
        r.times = Some(0);
        assert!(check_rule(&r, GEO).unwrap_err().contains("`times: 0`"));
        r.times = None;
        r.probability = Some(2.0);
        assert!(check_rule(&r, GEO).unwrap_err().contains("`probability: 2` is out of range"));
        r.probability = None;
        r.window = Some(Window { from: us(5), to: Some(us(5)) });
        assert!(check_rule(&r, GEO).unwrap_err().contains("window `to` must be later"));
        // every rule the YAML path builds passes (it runs the same check), and is named by name
        for r in parse_rules(
            "rules:\n  - {type: delay, delay: {distribution: pareto, scale: 1us, shape: 1.5}, pattern: burst}\n  - {type: rot, target: {block: 1}}\n",
            "t",
            GEO,
        )
        .unwrap()
        {
            check_rule(&r, GEO).unwrap();
        }
        let mut named = delay(DelayDist::Uniform { min: us(2), max: us(1) });
        named.name = Some("slow".into());
        assert!(check_rules(&[named], GEO).unwrap_err().starts_with("rule #1 (slow): uniform delay"));
    }

    fn fault(y: &str) -> Result<FaultSpec, String> {
        let r: RawRule = serde_saphyr::from_str(y).map_err(|e| e.to_string())?;
        validate_fault(r, GEO, "rule #1".into())
    }

    #[test]
    fn experiment_faults() {
        let f = fault("{type: bitflip, op: write, target: last_written_block, when: {every: 256MiB, count: 4}, times: 1}").unwrap();
        assert_eq!(f.deferred, Some(Deferred::LastWritten));
        assert_eq!(f.trigger, Trigger::Every { bytes: 256 << 20, count: Some(4) });
        assert_eq!(f.rule.target, Target::Any);
        let f = fault("{type: rot, target: most_duplicated}").unwrap();
        assert_eq!((f.deferred, f.trigger), (Some(Deferred::MostDuplicated), Trigger::AfterWorkload));
        let f = fault("{type: error, op: read, target: {file: f3, block: 2}, by: content}").unwrap();
        assert_eq!(f.deferred, Some(Deferred::FileBlock { file: 3, block: 2 }));
        assert_eq!(f.by_content, Some(true));
        let f = fault("{type: error, op: read, target: {block: 7}, disk: 1}").unwrap();
        assert_eq!((f.disk, f.trigger, f.deferred), (1, Trigger::Start, None));
        assert!(fault("{type: bitflip, target: last_written_block}").unwrap_err().contains("needs a `when`"));
        assert!(fault("{type: bitflip, target: {block: 1}, when: {every: 1GiB}}").unwrap_err().contains("workload target"));
        assert!(fault("{type: bitflip, target: unique, by: offset}").unwrap_err().contains("name a content"));
        assert!(fault("{type: bitflip, target: last_written_block, when: {every: 1GiB, at: 2s}}").unwrap_err().contains("exactly one of"));
        assert!(fault("{type: bitflip, target: everything}").unwrap_err().contains("allowed: any, last_written_block"));
        // a workload target may be armed as a content target: flush and discard are dropped
        let f = fault("{type: error, target: unique, when: {after_ops: 3}}").unwrap();
        assert_eq!(f.rule.ops, OpSet::of(&[Op::Read, Op::Write]));
        assert!(fault("{type: delay, delay: 1ms, op: flush, target: most_duplicated}").unwrap_err().contains("flush and discard carry none"));
    }
}
