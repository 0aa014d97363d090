//! A validated fault rule: what to do (action), to which requests (ops + target), and when
//! (persistence, probability, window, progress trigger). Built by `yaml` from rules files and experiments, or sent typed (JSON) to the control
//! socket; `check` is the one check every rule passes before it is armed.

pub mod check;
pub mod yaml;

use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

pub type RuleId = u64;

/// Request kinds the front end delivers to the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Read,
    Write,
    Flush,
    Discard,
}

impl Op {
    pub const ALL: [Op; 4] = [Op::Read, Op::Write, Op::Flush, Op::Discard];
    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Discard => "discard",
        }
    }
    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A small set of ops (bit mask).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct OpSet(u8);

impl OpSet {
    pub const NONE: OpSet = OpSet(0);
    pub fn of(ops: &[Op]) -> OpSet {
        OpSet(ops.iter().fold(0, |m, o| m | o.bit()))
    }
    #[inline]
    pub fn has(self, op: Op) -> bool {
        self.0 & op.bit() != 0
    }
    pub fn union(self, o: OpSet) -> OpSet {
        OpSet(self.0 | o.0)
    }
    pub fn ops(self) -> Vec<Op> {
        Op::ALL.into_iter().filter(|o| self.has(*o)).collect()
    }
}

impl Serialize for OpSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.ops().serialize(s)
    }
}

impl<'de> Deserialize<'de> for OpSet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<OpSet, D::Error> {
        Ok(OpSet::of(&Vec::<Op>::deserialize(d)?))
    }
}

/// Which requests a rule looks at.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// Every request.
    Any,
    /// Requests overlapping the device byte range [start, end).
    Range { start: u64, end: u64 },
    /// Block-size chunks whose XXH3-128 equals this hash.
    Content {
        #[serde(serialize_with = "ser_hash", deserialize_with = "de_hash")]
        hash: u128,
    },
}

fn de_hash<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u128, D::Error> {
    crate::content::parse_hash(&String::deserialize(d)?).map_err(serde::de::Error::custom)
}

fn ser_hash<S: serde::Serializer>(h: &u128, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&crate::content::hash_hex(*h))
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fill {
    Zero,
    Random,
}

/// Where in a block a bit flip lands. `None` = drawn at random (seeded) per flip.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlipAt {
    pub byte: Option<u32>,
    pub bit: Option<u8>,
}

impl Default for FlipAt {
    /// The study's default: lowest bit of the first byte.
    fn default() -> Self {
        FlipAt { byte: Some(0), bit: Some(0) }
    }
}

/// How long a delayed request waits.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DelayDist {
    Fixed(Duration),
    Uniform {
        min: Duration,
        max: Duration,
    },
    Normal {
        mean: Duration,
        stddev: Duration,
    },
    /// Log-normal with the given median and sigma (of the underlying normal).
    Lognormal {
        median: Duration,
        sigma: f64,
    },
    Pareto {
        scale: Duration,
        shape: f64,
    },
}

/// What a delayed request holds while it waits (docs/rules.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Hold {
    /// Nothing: the reply is late, the device goes on serving others (slowness on the path).
    #[default]
    Path,
    /// Its channel of the device: requests behind it wait (slowness in the device, as a driver
    /// that busy-waits).
    Device,
}

impl Hold {
    pub fn is_path(&self) -> bool {
        *self == Hold::Path
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "type")]
pub enum Action {
    /// Flip one bit of each matched block (write: the stored copy; read: the returned buffer).
    Bitflip { at: FlipAt },
    /// Overwrite `length` bytes at `offset` inside each matched block.
    Corrupt { offset: u32, length: Option<u32>, fill: Fill },
    /// Fail the whole request with this errno.
    Error { errno: i32 },
    /// Complete the whole request late; `hold` says whether the device is held meanwhile.
    Delay {
        delay: DelayDist,
        #[serde(default, skip_serializing_if = "Hold::is_path")]
        hold: Hold,
    },
    /// Acknowledge the write, store nothing.
    LostWrite,
    /// Acknowledge the write, store only its first `keep` bytes.
    TornWrite { keep: u64 },
    /// Acknowledge the write, store it `shift` bytes away.
    MisdirectedWrite { shift: i64 },
    /// Corrupt data at rest when the rule is armed (not matched against requests).
    Rot { at: FlipAt },
}

impl Action {
    pub fn name(&self) -> &'static str {
        match self {
            Action::Bitflip { .. } => "bitflip",
            Action::Corrupt { .. } => "corrupt",
            Action::Error { .. } => "error",
            Action::Delay { .. } => "delay",
            Action::LostWrite => "lost-write",
            Action::TornWrite { .. } => "torn-write",
            Action::MisdirectedWrite { .. } => "misdirected-write",
            Action::Rot { .. } => "rot",
        }
    }
}

/// Which of a rule's matching requests it acts on, decided from (seed, match index) alone:
/// the index counts the rule's matches (requests, or blocks for content rules) in arrival order
/// from 0. Pure in (seed, index), so firings are reproducible and need no lock.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pattern {
    /// Each match independently with probability `ratio`.
    Random { ratio: f64 },
    /// Runs of `length` consecutive matches: one run per period of `period` matches
    /// (`length / ratio`, rounded), at a seeded position inside each period.
    Burst { ratio: f64, length: u64, period: u64 },
    /// Every `every`-th match (indexes every-1, 2*every-1, ...).
    Interval { every: u64 },
}

impl Pattern {
    /// The published defaults (`pattern: random`, `pattern: burst`, `pattern: interval`).
    pub const DEFAULT_RANDOM_RATIO: f64 = 0.10;
    pub const DEFAULT_BURST_RATIO: f64 = 0.01;
    pub const DEFAULT_BURST_LENGTH: u64 = 1000;
    pub const DEFAULT_INTERVAL: u64 = 100;

    /// The share of matches this pattern selects.
    pub fn ratio(&self) -> f64 {
        match *self {
            Pattern::Random { ratio } => ratio,
            Pattern::Burst { length, period, .. } => length as f64 / period as f64,
            Pattern::Interval { every } => 1.0 / every as f64,
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Pattern::Random { ratio } => write!(f, "random {}%", ratio * 100.0),
            Pattern::Burst { length, period, .. } => write!(f, "burst {length} in {period}"),
            Pattern::Interval { every } => write!(f, "interval every {every}"),
        }
    }
}

/// Active time window, measured from the disk's start.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Window {
    pub from: Duration,
    pub to: Option<Duration>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rule {
    pub name: Option<String>,
    #[serde(flatten)]
    pub action: Action,
    pub ops: OpSet,
    pub target: Target,
    /// Fire at most this many times (transient); None = every match (persistent).
    pub times: Option<u64>,
    /// Fire on a match with this probability.
    pub probability: Option<f64>,
    /// Fire on the matches this pattern selects (never together with `probability`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<Pattern>,
    pub seed: u64,
    pub window: Option<Window>,
    /// Only after the device has seen this many requests / bytes.
    pub after_requests: u64,
    pub after_bytes: u64,
}

impl Rule {
    /// A rule with every condition at its default (persistent, always, any time).
    pub fn new(action: Action, ops: &[Op], target: Target) -> Rule {
        Rule {
            name: None,
            action,
            ops: OpSet::of(ops),
            target,
            times: None,
            probability: None,
            pattern: None,
            seed: 0,
            window: None,
            after_requests: 0,
            after_bytes: 0,
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {:?}", self.action.name(), self.ops.ops())?;
        match &self.target {
            Target::Any => write!(f, " any"),
            Target::Range { start, end } => write!(f, " bytes [{start}, {end})"),
            Target::Content { hash } => write!(f, " content {}", crate::content::hash_hex(*hash)),
        }
    }
}

/// errno names the front end can carry (FUSE passes any errno; the loop device reduces
/// most of them to EIO for block I/O, see docs/rules.md).
pub const ERRNOS: &[(&str, i32)] = &[
    ("EIO", libc::EIO),
    ("ENOSPC", libc::ENOSPC),
    ("EROFS", libc::EROFS),
    ("ETIMEDOUT", libc::ETIMEDOUT),
    ("ENODATA", libc::ENODATA),
    ("EILSEQ", libc::EILSEQ),
    ("ENOLINK", libc::ENOLINK),
    ("EREMOTEIO", libc::EREMOTEIO),
    ("EAGAIN", libc::EAGAIN),
    ("EBUSY", libc::EBUSY),
];

pub fn errno_name(e: i32) -> String {
    ERRNOS.iter().find(|(_, v)| *v == e).map(|(n, _)| n.to_string()).unwrap_or_else(|| format!("errno {e}"))
}
