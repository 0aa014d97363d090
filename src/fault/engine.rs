//! The matching engine. Every request the disk executes asks `plan` what to do with it.
//!
//! Rule sets are immutable snapshots swapped atomically (`ArcSwap`), so matching takes no lock.
//! Per rule: offset rules live in an interval index (O(log n) per request), content rules in a
//! hash map keyed by XXH3-128 (O(1) per block), and blocks are hashed only when a content rule
//! exists for that op. Firing conditions (times, probability, window, after) use atomics.

use super::index::IntervalIndex;
use super::log::{FaultLog, LogEntry, runs};
use super::pattern::{RunCounters, RunStats, unit};
use crate::content::{block_hash, seeded_hash};
use crate::spec::rule::{Action, DelayDist, Fill, FlipAt, Hold, Op, OpSet, Rule, RuleId, Target};
use arc_swap::ArcSwap;
use rand::SeedableRng;
use rand_distr::Distribution;
use serde::Serialize;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A rule as armed in the engine, with its live counters.
pub struct ArmedRule {
    pub id: RuleId,
    pub rule: Rule,
    /// Requests (offset/any rules) or blocks (content rules) that matched op + target.
    pub matched: AtomicU64,
    /// Times the action was applied.
    pub fired: AtomicU64,
    /// Device blocks affected by those firings.
    pub blocks: AtomicU64,
    /// Runs of consecutive fired matches (rules with a `pattern`).
    pub runs: RunCounters,
}

impl ArmedRule {
    /// The rule with a snapshot of its counters.
    pub fn status(&self) -> RuleStatus {
        let (matched, fired) = (self.matched.load(Relaxed), self.fired.load(Relaxed));
        RuleStatus {
            id: self.id,
            rule: self.rule.clone(),
            matched,
            fired,
            blocks: self.blocks.load(Relaxed),
            realized_ratio: (matched > 0).then(|| fired as f64 / matched as f64),
            runs: self.rule.pattern.map(|_| self.runs.stats()),
        }
    }
}

#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct RuleStatus {
    pub id: RuleId,
    #[serde(flatten)]
    pub rule: Rule,
    pub matched: u64,
    pub fired: u64,
    pub blocks: u64,
    /// fired / matched (None before the first match).
    #[serde(default)]
    pub realized_ratio: Option<f64>,
    /// Runs of consecutive fired matches, for rules with a `pattern`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<RunStats>,
}

/// One rule's realized firing, as `fault stats` reports it.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct RuleRealized {
    pub id: RuleId,
    #[serde(default)]
    pub name: Option<String>,
    pub action: String,
    /// The pattern (`random 10%`, `burst 1000 in 100000`, `interval every 100`), if any.
    #[serde(default)]
    pub pattern: Option<String>,
    /// The share of matches the pattern (or `probability`) asks for; 1 when neither is given.
    pub ratio: f64,
    pub matched: u64,
    pub fired: u64,
    #[serde(default)]
    pub realized_ratio: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<RunStats>,
}

impl From<&RuleStatus> for RuleRealized {
    fn from(r: &RuleStatus) -> Self {
        RuleRealized {
            id: r.id,
            name: r.rule.name.clone(),
            action: r.rule.action.name().into(),
            pattern: r.rule.pattern.map(|p| p.to_string()),
            ratio: r.rule.pattern.map(|p| p.ratio()).or(r.rule.probability).unwrap_or(1.0),
            matched: r.matched,
            fired: r.fired,
            realized_ratio: r.realized_ratio,
            runs: r.runs.clone(),
        }
    }
}

/// An edit of request bytes; `pos` is relative to the start of the request buffer.
#[derive(Clone, Debug, PartialEq)]
pub enum Edit {
    Flip { pos: usize, bit: u8 },
    Fill { pos: usize, len: usize, fill: Fill, seed: u64 },
}

impl Edit {
    pub fn apply(&self, buf: &mut [u8]) {
        match *self {
            Edit::Flip { pos, bit } => {
                if let Some(b) = buf.get_mut(pos) {
                    *b ^= 1 << bit;
                }
            }
            Edit::Fill { pos, len, fill, seed } => {
                let end = (pos + len).min(buf.len());
                if pos >= end {
                    return;
                }
                match fill {
                    Fill::Zero => buf[pos..end].fill(0),
                    Fill::Random => crate::content::fill_block(seed, 0x636f7272, &mut buf[pos..end]),
                }
            }
        }
    }
}

/// How a write is stored.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub enum StoreMode {
    #[default]
    Normal,
    /// Lost write: acknowledged, nothing stored.
    Skip,
    /// Torn write: only the first n bytes stored.
    Prefix(u64),
    /// Misdirected write: stored at this device offset instead.
    Redirect(u64),
}

/// What the disk must do with one request.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    pub errno: Option<i32>,
    /// A delay on the path (`hold: path`): the reply is late, nothing waits for it.
    pub delay: Option<Duration>,
    /// A delay held in the device (`hold: device`): the latency layer books it on the
    /// request's channel (disk::latency).
    pub held: Option<Duration>,
    pub edits: Vec<Edit>,
    pub store: StoreMode,
}

impl Plan {
    pub fn is_clean(&self) -> bool {
        self.errno.is_none() && self.delay.is_none() && self.held.is_none() && self.edits.is_empty() && self.store == StoreMode::Normal
    }
}

/// Identity hasher: content keys are already uniform 128-bit hashes.
#[derive(Default)]
struct IdHasher(u64);
impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, b: &[u8]) {
        for c in b.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.0 ^= u64::from_le_bytes(w);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}
type ContentMap = HashMap<u128, Vec<Arc<ArmedRule>>, BuildHasherDefault<IdHasher>>;

/// Bits each content rule's hash sets in its filter word (`RuleSet::content_filter`).
const FILTER_BITS: u64 = 5;

#[derive(Default)]
struct RuleSet {
    all: Vec<Arc<ArmedRule>>,
    any: Vec<Arc<ArmedRule>>,
    ranges: Option<IntervalIndex<Arc<ArmedRule>>>,
    content: ContentMap,
    /// A blocked Bloom filter over the content rules' hashes (their high 64 bits): each hash
    /// sets `FILTER_BITS` bits in one 64-bit word, and a block whose bits are not all set skips
    /// the map lookup, which with many rules misses the cache (two dependent misses). ~32 bits
    /// per rule: ~0.03% of non-matching blocks get through (BENCHMARKS.md), one word read each.
    content_filter: Vec<u64>,
    any_ops: OpSet,
    range_ops: OpSet,
    content_ops: OpSet,
    /// Ops with a content rule that fails, drops, tears or moves the request: for these the
    /// whole request's matches must be known before anything is stored.
    content_reshaping_ops: OpSet,
    /// Ops with a content rule that delays: the reply waits for content matching.
    content_delay_ops: OpSet,
}

impl RuleSet {
    fn build(all: Vec<Arc<ArmedRule>>) -> RuleSet {
        let mut s = RuleSet::default();
        let mut ranges = Vec::new();
        for r in &all {
            if matches!(r.rule.action, Action::Rot { .. }) {
                continue; // applied once at arm time, never matched against requests
            }
            match r.rule.target {
                Target::Any => {
                    s.any_ops = s.any_ops.union(r.rule.ops);
                    s.any.push(r.clone());
                }
                Target::Range { start, end } => {
                    s.range_ops = s.range_ops.union(r.rule.ops);
                    ranges.push((start, end, r.clone()));
                }
                Target::Content { hash } => {
                    s.content_ops = s.content_ops.union(r.rule.ops);
                    if !matches!(r.rule.action, Action::Bitflip { .. } | Action::Corrupt { .. } | Action::Delay { .. }) {
                        s.content_reshaping_ops = s.content_reshaping_ops.union(r.rule.ops);
                    }
                    if matches!(r.rule.action, Action::Delay { .. }) {
                        s.content_delay_ops = s.content_delay_ops.union(r.rule.ops);
                    }
                    s.content.entry(hash).or_default().push(r.clone());
                }
            }
        }
        if !ranges.is_empty() {
            s.ranges = Some(IntervalIndex::build(ranges));
        }
        if !s.content.is_empty() {
            // ~32 bits per hash, at most 2 MiB (L2-sized)
            let bits = (s.content.len() * 32).next_power_of_two().clamp(64, 1 << 24);
            s.content_filter = vec![0; bits / 64];
            for h in s.content.keys() {
                let (w, m) = s.filter_slot(*h);
                s.content_filter[w] |= m;
            }
        }
        s.all = all;
        s
    }

    /// The filter word of hash `h` and the bits it sets there. The map keys on the low 64 bits
    /// of the hash; the filter uses the high ones: the word from the lowest of them, the bits
    /// from five 6-bit fields in bits 34-63 (at most 2^18 words: no overlap).
    #[inline]
    fn filter_slot(&self, h: u128) -> (usize, u64) {
        let hi = (h >> 64) as u64;
        let word = hi as usize & (self.content_filter.len() - 1);
        let mask = (0..FILTER_BITS).fold(0u64, |m, i| m | 1 << ((hi >> (34 + 6 * i)) & 63));
        (word, mask)
    }

    #[inline]
    fn prefetch_filter(&self, h: u128) {
        #[cfg(target_arch = "x86_64")]
        if !self.content_filter.is_empty() {
            let w = &self.content_filter[self.filter_slot(h).0];
            // SAFETY: a prefetch hint on a valid address; it never faults
            unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(w as *const u64 as *const i8) };
        }
    }

    /// The content rules for block hash `h`, if any.
    #[inline]
    fn content_rules(&self, h: u128) -> Option<&Vec<Arc<ArmedRule>>> {
        if self.content_filter.is_empty() {
            return None;
        }
        let (w, m) = self.filter_slot(h);
        if self.content_filter[w] & m != m {
            return None;
        }
        self.content.get(&h)
    }
}

pub struct Engine {
    /// The rules requests are matched against: the armed set, or an empty one while paused.
    set: ArcSwap<RuleSet>,
    /// Serializes edits; holds the armed set while paused (`pause`), where edits then go.
    edit: Mutex<Option<Arc<RuleSet>>>,
    next_id: AtomicU64,
    start: Instant,
    /// µs after `start` at which the current epoch began (see `reset_epoch`).
    epoch_us: AtomicU64,
    requests: AtomicU64,
    bytes: AtomicU64,
    block_size: u64,
    pub log: FaultLog,
}

/// Device-wide counters.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct EngineStats {
    pub uptime_us: u64,
    pub requests: u64,
    pub bytes: u64,
    /// Armed rules (matched or, while `paused`, set aside).
    pub rules: usize,
    #[serde(default)]
    pub paused: bool,
    pub faults_logged: u64,
    pub log_dropped: u64,
    /// Delayed replies: how late after their deadline they went out.
    pub delay_lateness: super::log::LatenessSummary,
    /// Per rule: asked and realized firing ratio, runs.
    #[serde(default)]
    pub rule_firing: Vec<RuleRealized>,
}

impl Engine {
    pub fn new(block_size: u32) -> Engine {
        Engine {
            set: ArcSwap::from_pointee(RuleSet::default()),
            edit: Mutex::new(None),
            next_id: AtomicU64::new(1),
            start: Instant::now(),
            epoch_us: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            block_size: block_size as u64,
            log: FaultLog::new(super::log::DEFAULT_LOG_CAP),
        }
    }

    /// µs since the epoch began (the disk's start, or the last `reset_epoch`).
    pub fn elapsed_us(&self) -> u64 {
        (self.start.elapsed().as_micros() as u64).saturating_sub(self.epoch_us.load(Relaxed))
    }

    /// Start a new epoch: windows, `after` counts and log times measure from now plus `lead`
    /// (until then the clock reads 0). An experiment calls this when its workload starts, so
    /// mkfs and mount do not count; with a start agreed ahead on another host (agents), the
    /// rules go in before it and the clock starts at it.
    pub fn reset_epoch(&self, lead: std::time::Duration) {
        self.epoch_us.store((self.start.elapsed() + lead).as_micros() as u64, Relaxed);
        self.requests.store(0, Relaxed);
        self.bytes.store(0, Relaxed);
    }

    /// Arm rules (one snapshot rebuild for the whole batch). Returns the armed rules so the
    /// caller can apply at-rest actions (`rot`).
    pub fn add(&self, rules: Vec<Rule>) -> Vec<Arc<ArmedRule>> {
        let mut paused = self.edit.lock().unwrap();
        let new: Vec<Arc<ArmedRule>> = rules
            .into_iter()
            .map(|rule| {
                Arc::new(ArmedRule {
                    id: self.next_id.fetch_add(1, Relaxed),
                    rule,
                    matched: AtomicU64::new(0),
                    fired: AtomicU64::new(0),
                    blocks: AtomicU64::new(0),
                    runs: RunCounters::default(),
                })
            })
            .collect();
        let mut all = self.armed(&paused).all.clone();
        all.extend(new.iter().cloned());
        self.publish(&mut paused, RuleSet::build(all));
        new
    }

    /// The armed rules (set aside while paused).
    fn armed(&self, paused: &Option<Arc<RuleSet>>) -> Arc<RuleSet> {
        paused.clone().unwrap_or_else(|| self.set.load_full())
    }

    /// Make `set` the armed rules: live, or set aside while paused.
    fn publish(&self, paused: &mut Option<Arc<RuleSet>>, set: RuleSet) {
        match paused {
            Some(p) => *p = Arc::new(set),
            None => self.set.store(Arc::new(set)),
        }
    }

    /// Stop matching any rule until `resume`, keeping the armed rules and their counters (rules
    /// armed, removed or cleared meanwhile change the set that resumes). Requests then take the
    /// path of a disk without rules. Returns how many rules are set aside; None if already paused.
    pub fn pause(&self) -> Option<usize> {
        let mut paused = self.edit.lock().unwrap();
        if paused.is_some() {
            return None;
        }
        let set = self.set.swap(Arc::new(RuleSet::default()));
        let n = set.all.len();
        *paused = Some(set);
        Some(n)
    }

    /// Match the armed rules again. Returns how many; None if not paused.
    pub fn resume(&self) -> Option<usize> {
        let set = self.edit.lock().unwrap().take()?;
        let n = set.all.len();
        self.set.store(set);
        Some(n)
    }

    /// Disarm rules by id; returns how many were removed.
    pub fn remove(&self, ids: &[RuleId]) -> usize {
        let mut paused = self.edit.lock().unwrap();
        let cur = self.armed(&paused);
        let all: Vec<_> = cur.all.iter().filter(|r| !ids.contains(&r.id)).cloned().collect();
        let n = cur.all.len() - all.len();
        self.publish(&mut paused, RuleSet::build(all));
        n
    }

    pub fn clear(&self) -> usize {
        let mut paused = self.edit.lock().unwrap();
        let n = self.armed(&paused).all.len();
        self.publish(&mut paused, RuleSet::default());
        n
    }

    /// The armed rules, paused or not.
    pub fn list(&self) -> Vec<RuleStatus> {
        let armed = self.armed(&self.edit.lock().unwrap());
        armed.all.iter().map(|r| r.status()).collect()
    }

    pub fn stats(&self) -> EngineStats {
        let (armed, paused) = {
            let g = self.edit.lock().unwrap();
            (self.armed(&g), g.is_some())
        };
        EngineStats {
            uptime_us: self.elapsed_us(),
            requests: self.requests.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            rules: armed.all.len(),
            paused,
            faults_logged: self.log.total(),
            log_dropped: self.log.dropped(),
            delay_lateness: self.log.delay_lateness.summary(),
            rule_firing: armed
                .all
                .iter()
                .filter(|r| r.rule.pattern.is_some() || r.rule.probability.is_some())
                .map(|r| RuleRealized::from(&r.status()))
                .collect(),
        }
    }

    /// Decide what happens to one request. `data` is the request's bytes: the write payload, or
    /// for reads the bytes just read from the store (content rules look at them).
    pub fn plan(&self, op: Op, offset: u64, len: u64, data: Option<&[u8]>) -> Plan {
        let mut p = self.begin(op, offset, len);
        if let Some(data) = data {
            p.match_data(data);
        }
        p.plan
    }

    /// Start planning one request: counts it and applies the rules that need no content (any
    /// request, offset ranges). Content matching follows with `match_data` or `match_hashes`.
    pub fn begin(&self, op: Op, offset: u64, len: u64) -> Planning<'_> {
        let req_idx = self.requests.fetch_add(1, Relaxed);
        let bytes_before = self.bytes.fetch_add(len, Relaxed);
        let set = self.set.load();
        let mut plan = Plan::default();
        let (any, range) = (set.any_ops.has(op), set.range_ops.has(op));
        let ctx = Ctx { engine: self, op, offset, len, now_us: std::cell::OnceCell::new(), req_idx, bytes_before };
        if any {
            for r in &set.any {
                if ctx.fires(r) {
                    ctx.apply(r, &mut plan, offset, offset + len);
                }
            }
        }
        if range && let Some(idx) = &set.ranges {
            idx.query(offset, offset + len.max(1), |s, e, r| {
                if ctx.fires(r) {
                    ctx.apply(r, &mut plan, s.max(offset), e.min(offset + len));
                }
            });
        }
        Planning { set, ctx, plan }
    }
}

/// A request half planned (`Engine::begin`): the content rules are still to match.
pub struct Planning<'a> {
    set: arc_swap::Guard<Arc<RuleSet>>,
    ctx: Ctx<'a>,
    pub plan: Plan,
}

impl Planning<'_> {
    /// Content rules exist for this op: its blocks must be hashed.
    pub fn wants_content(&self) -> bool {
        self.set.content_ops.has(self.ctx.op)
    }

    /// Content matches can only edit bytes or delay the reply, so the data may be stored before
    /// they are known and edited in place after (`match_hashes`).
    pub fn content_edits_only(&self) -> bool {
        !self.set.content_reshaping_ops.has(self.ctx.op)
    }

    /// The reply (error, delay) is decided: nothing content matching can find would change it.
    pub fn reply_known(&self) -> bool {
        !self.wants_content() || !(self.set.content_reshaping_ops.has(self.ctx.op) || self.set.content_delay_ops.has(self.ctx.op))
    }

    /// The request's fully covered, block-aligned blocks: (byte offset of the first one inside
    /// the request, how many). Only these are hashed.
    pub fn hashed_blocks(&self) -> (usize, usize) {
        let bs = self.ctx.engine.block_size;
        let first = self.ctx.offset.div_ceil(bs) * bs;
        let start = (first - self.ctx.offset) as usize;
        (start, (self.ctx.len as usize).saturating_sub(start) / bs as usize)
    }

    /// Hash each fully covered, block-aligned chunk of `data` and look it up.
    pub fn match_data(&mut self, data: &[u8]) {
        if !self.wants_content() {
            return;
        }
        let bs = self.ctx.engine.block_size as usize;
        let (start, blocks) = self.hashed_blocks();
        // Hash a batch first, prefetching each hash's filter word, then look them up: the filter
        // is cold after every request's copies, and the batch's hashing hides those misses.
        const BATCH: usize = 64;
        let mut hashes = [0u128; BATCH];
        for b0 in (0..blocks).step_by(BATCH) {
            let n = BATCH.min(blocks - b0);
            for (i, h) in hashes[..n].iter_mut().enumerate() {
                let pos = start + (b0 + i) * bs;
                *h = block_hash(&data[pos..pos + bs]);
                self.set.prefetch_filter(*h);
            }
            self.lookup(start + b0 * bs, &hashes[..n]);
        }
    }

    /// Look up hashes the caller computed, one per block of `hashed_blocks`, in order.
    pub fn match_hashes(&mut self, hashes: &[u128]) {
        if !self.wants_content() {
            return;
        }
        for h in hashes {
            self.set.prefetch_filter(*h);
        }
        let start = self.hashed_blocks().0;
        self.lookup(start, hashes);
    }

    /// Apply the content rules of consecutive blocks, the first at byte `at` of the request.
    fn lookup(&mut self, at: usize, hashes: &[u128]) {
        let bs = self.ctx.engine.block_size;
        for (i, h) in hashes.iter().enumerate() {
            if let Some(rules) = self.set.content_rules(*h) {
                let boff = self.ctx.offset + at as u64 + i as u64 * bs;
                for r in rules {
                    if self.ctx.fires(r) {
                        self.ctx.apply(r, &mut self.plan, boff, boff + bs);
                    }
                }
            }
        }
    }
}

/// One request being planned.
struct Ctx<'a> {
    engine: &'a Engine,
    op: Op,
    offset: u64,
    len: u64,
    /// µs since the epoch, read when first needed (a window to check, a fault to log): most
    /// requests that rules exist for match none and never read the clock.
    now_us: std::cell::OnceCell<u64>,
    req_idx: u64,
    bytes_before: u64,
}

impl Ctx<'_> {
    fn now(&self) -> u64 {
        *self.now_us.get_or_init(|| self.engine.elapsed_us())
    }

    /// Op + conditions; counts the match and claims a firing.
    fn fires(&self, r: &ArmedRule) -> bool {
        let rule = &r.rule;
        if !rule.ops.has(self.op) {
            return false;
        }
        if let Some(w) = rule.window {
            let t = self.now();
            if t < w.from.as_micros() as u64 || w.to.is_some_and(|to| t >= to.as_micros() as u64) {
                return false;
            }
        }
        if self.req_idx < rule.after_requests || self.bytes_before < rule.after_bytes {
            return false;
        }
        let n = r.matched.fetch_add(1, Relaxed);
        if let Some(p) = rule.probability
            && unit(rule.seed, n) >= p
        {
            return false;
        }
        if let Some(p) = &rule.pattern
            && !super::pattern::selects(p, rule.seed, n)
        {
            return false;
        }
        let fired = match rule.times {
            Some(t) => r.fired.fetch_update(Relaxed, Relaxed, |f| (f < t).then_some(f + 1)).is_ok(),
            None => {
                r.fired.fetch_add(1, Relaxed);
                true
            }
        };
        if fired && let Some(p) = &rule.pattern {
            r.runs.fired(p, rule.seed, n);
        }
        fired
    }

    /// Apply a fired rule to the plan. [s, e) is the matched device range within the request.
    fn apply(&self, r: &ArmedRule, plan: &mut Plan, s: u64, e: u64) {
        let bs = self.engine.block_size;
        let (req_s, req_e) = (self.offset, self.offset + self.len);
        let whole = runs(block_span(req_s, req_e, bs));
        let (blocks, detail) = match &r.rule.action {
            Action::Bitflip { at } | Action::Rot { at } => {
                let mut flipped = Vec::new();
                let mut details = Vec::new();
                for b in block_span(s, e, bs) {
                    let (byte, bit) = flip_position(at, r.rule.seed, b, r.fired.load(Relaxed), bs);
                    let dev = b * bs + byte as u64;
                    if dev >= req_s && dev < req_e {
                        plan.edits.push(Edit::Flip { pos: (dev - req_s) as usize, bit });
                        flipped.push(b);
                        details.push(format!("{byte}:{bit}"));
                    }
                }
                (runs(flipped), format!("byte:bit {}", details.join(",")))
            }
            Action::Corrupt { offset, length, fill } => {
                let mut hit = Vec::new();
                for b in block_span(s, e, bs) {
                    let bs0 = (b * bs).max(req_s);
                    let from = b * bs + *offset as u64;
                    let to = (b * bs + *offset as u64 + length.map(|l| l as u64).unwrap_or(bs)).min((b + 1) * bs);
                    let (from, to) = (from.max(bs0), to.min(req_e));
                    if from < to {
                        plan.edits.push(Edit::Fill { pos: (from - req_s) as usize, len: (to - from) as usize, fill: *fill, seed: r.rule.seed ^ b });
                        hit.push(b);
                    }
                }
                (runs(hit), format!("{fill:?} bytes {offset}..{}", length.map(|l| (offset + l).to_string()).unwrap_or("end".into())).to_lowercase())
            }
            Action::Error { errno } => {
                plan.errno.get_or_insert(*errno);
                (whole, crate::spec::rule::errno_name(*errno))
            }
            Action::Delay { delay, hold } => {
                let d = sample_delay(delay, r.rule.seed, r.fired.load(Relaxed));
                let slot = match hold {
                    Hold::Path => &mut plan.delay,
                    Hold::Device => &mut plan.held,
                };
                *slot = Some(slot.map_or(d, |p| p.max(d)));
                let held = if hold.is_path() { "" } else { " held" };
                (whole, format!("{}{held}", crate::spec::units::format_duration(d)))
            }
            Action::LostWrite => {
                plan.store = StoreMode::Skip;
                (whole, "not stored".into())
            }
            Action::TornWrite { keep } => {
                let keep = (*keep).min(self.len);
                plan.store = StoreMode::Prefix(keep);
                (whole, format!("stored first {keep} bytes"))
            }
            Action::MisdirectedWrite { shift } => {
                let to = self.offset.wrapping_add_signed(*shift);
                plan.store = StoreMode::Redirect(to);
                (whole, format!("stored at {to}"))
            }
        };
        let nblocks: u64 = blocks.iter().map(|b| b[1]).sum();
        r.blocks.fetch_add(nblocks, Relaxed);
        self.engine.log.push(LogEntry {
            seq: 0,
            t_us: self.now(),
            rule: r.id,
            action: r.rule.action.name().into(),
            op: Some(self.op),
            offset: self.offset,
            len: self.len,
            blocks,
            detail,
        });
    }
}

/// Device blocks touched by [s, e).
pub fn block_span(s: u64, e: u64, bs: u64) -> std::ops::Range<u64> {
    if e <= s { s / bs..s / bs } else { s / bs..e.div_ceil(bs) }
}

/// (byte, bit) inside a block for a flip; random positions are drawn from (seed, block, n).
pub fn flip_position(at: &FlipAt, seed: u64, block: u64, n: u64, bs: u64) -> (u32, u8) {
    let h = seeded_hash(seed, &[block.to_le_bytes(), n.to_le_bytes()].concat());
    let byte = at.byte.unwrap_or((h % bs) as u32).min(bs as u32 - 1);
    let bit = at.bit.unwrap_or(((h >> 32) % 8) as u8);
    (byte, bit)
}

pub fn sample_delay(d: &DelayDist, seed: u64, n: u64) -> Duration {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    // This runs on the request path, so it cannot panic whatever the rule says: the rule
    // validation (`spec::rule::check`) refuses bad parameters, and one that got past it anyway gives
    // the distribution's central value (uniform bounds in either order are one range).
    let secs = match *d {
        DelayDist::Fixed(d) => return d,
        DelayDist::Uniform { min, max } => {
            let (lo, hi) = (min.min(max).as_secs_f64(), min.max(max).as_secs_f64());
            rand_distr::Uniform::new_inclusive(lo, hi).map_or(lo, |u| u.sample(&mut rng))
        }
        DelayDist::Normal { mean, stddev } => {
            let mean = mean.as_secs_f64();
            rand_distr::Normal::new(mean, stddev.as_secs_f64()).map_or(mean, |n| n.sample(&mut rng))
        }
        DelayDist::Lognormal { median, sigma } => {
            let median = median.as_secs_f64();
            rand_distr::LogNormal::new(median.ln(), sigma).map_or(median, |l| l.sample(&mut rng))
        }
        DelayDist::Pareto { scale, shape } => {
            let scale = scale.as_secs_f64();
            rand_distr::Pareto::new(scale, shape).map_or(scale, |p| p.sample(&mut rng))
        }
    };
    // cap at one minute so a heavy tail cannot hang a request forever (NaN: no delay)
    Duration::try_from_secs_f64(secs.clamp(0.0, 60.0)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::rule::Window;

    fn eng() -> Engine {
        Engine::new(4096)
    }

    /// Parameters the validation refuses still give a delay, never a panic (this runs on the
    /// request path): swapped uniform bounds are one range, parameters rand_distr refuses give
    /// the central value.
    #[test]
    fn bad_delay_distributions_do_not_panic() {
        let us = Duration::from_micros;
        for n in 0..200 {
            let d = sample_delay(&DelayDist::Uniform { min: us(900), max: us(100) }, 7, n);
            assert!((us(100)..=us(900)).contains(&d), "{d:?}");
        }
        assert_eq!(sample_delay(&DelayDist::Pareto { scale: us(50), shape: -1.0 }, 7, 1), us(50));
        assert_eq!(sample_delay(&DelayDist::Pareto { scale: us(50), shape: 0.0 }, 7, 1), us(50));
        assert_eq!(sample_delay(&DelayDist::Pareto { scale: us(0), shape: 2.0 }, 7, 1), us(0));
        assert_eq!(sample_delay(&DelayDist::Lognormal { median: us(30), sigma: f64::NAN }, 7, 1), us(30));
        // rand_distr takes a negative sigma (as its absolute value): a delay, no panic
        assert!(sample_delay(&DelayDist::Lognormal { median: us(30), sigma: -2.0 }, 7, 1) <= Duration::from_secs(60));
        assert!(sample_delay(&DelayDist::Pareto { scale: us(50), shape: 1e-300 }, 7, 1) <= Duration::from_secs(60));
    }

    #[test]
    fn no_rules_is_clean() {
        let e = eng();
        assert!(e.plan(Op::Write, 0, 4096, Some(&[0; 4096])).is_clean());
        assert_eq!(e.stats().requests, 1);
    }

    #[test]
    fn range_bitflip_only_in_range() {
        let e = eng();
        e.add(vec![Rule::new(Action::Bitflip { at: FlipAt::default() }, &[Op::Write], Target::Range { start: 8192, end: 12288 })]);
        let p = e.plan(Op::Write, 0, 16384, None);
        assert_eq!(p.edits, vec![Edit::Flip { pos: 8192, bit: 0 }]);
        assert!(e.plan(Op::Read, 0, 16384, None).is_clean());
        assert!(e.plan(Op::Write, 12288, 4096, None).is_clean());
    }

    #[test]
    fn pause_sets_rules_aside_and_resume_restores_them() {
        let e = eng();
        let range = |start| Rule::new(Action::Error { errno: libc::EIO }, &[Op::Read], Target::Range { start, end: start + 4096 });
        e.add(vec![range(0)]);
        assert!(e.plan(Op::Read, 0, 4096, None).errno.is_some());
        assert_eq!(e.pause(), Some(1));
        assert_eq!(e.pause(), None);
        assert!(e.plan(Op::Read, 0, 4096, None).is_clean());
        assert!(e.stats().paused);
        // edits while paused go to the set that resumes, and are not matched before it does
        e.add(vec![range(8192)]);
        assert!(e.plan(Op::Read, 8192, 4096, None).is_clean());
        assert_eq!(e.list().len(), 2);
        assert_eq!(e.list()[0].matched, 1, "paused requests are not counted against the rules");
        assert_eq!(e.resume(), Some(2));
        assert_eq!(e.resume(), None);
        assert!(e.plan(Op::Read, 0, 4096, None).errno.is_some());
        assert!(e.plan(Op::Read, 8192, 4096, None).errno.is_some());
        // clear while paused leaves nothing to resume
        e.pause();
        assert_eq!(e.clear(), 2);
        assert_eq!(e.resume(), Some(0));
        assert!(e.plan(Op::Read, 0, 4096, None).is_clean());
    }

    #[test]
    fn transient_fires_exactly_times() {
        let e = eng();
        let mut r = Rule::new(Action::Error { errno: libc::EIO }, &[Op::Read], Target::Any);
        r.times = Some(3);
        e.add(vec![r]);
        let n = (0..10).filter(|_| e.plan(Op::Read, 0, 4096, None).errno.is_some()).count();
        assert_eq!(n, 3);
        assert_eq!(e.list()[0].fired, 3);
        assert_eq!(e.list()[0].matched, 10);
    }

    #[test]
    fn content_rule_hits_matching_block_only() {
        let e = eng();
        let mut data = vec![0u8; 3 * 4096];
        crate::content::fill_block(1, 0, &mut data[0..4096]);
        crate::content::fill_block(2, 0, &mut data[4096..8192]);
        crate::content::fill_block(1, 0, &mut data[8192..]);
        let h = block_hash(&data[0..4096]);
        e.add(vec![Rule::new(Action::Bitflip { at: FlipAt { byte: Some(5), bit: Some(3) } }, &[Op::Write], Target::Content { hash: h })]);
        let p = e.plan(Op::Write, 4096, data.len() as u64, Some(&data));
        assert_eq!(p.edits, vec![Edit::Flip { pos: 5, bit: 3 }, Edit::Flip { pos: 8192 + 5, bit: 3 }]);
        let log = e.log.since(0, 10);
        assert_eq!(log.len(), 2);
        assert_eq!(log[1].blocks, vec![[3, 1]]);
    }

    #[test]
    fn probability_is_seeded_and_bounded() {
        let e = eng();
        let mut r = Rule::new(Action::Error { errno: libc::EIO }, &[Op::Read], Target::Any);
        r.probability = Some(0.25);
        r.seed = 9;
        e.add(vec![r]);
        let n = (0..40_000).filter(|_| e.plan(Op::Read, 0, 512, None).errno.is_some()).count();
        // 40k Bernoulli(0.25): sd = 87; 5 sd bounds
        assert!((9_565..=10_435).contains(&n), "{n}");
    }

    #[test]
    fn patterns_fire_and_report_runs() {
        use crate::spec::rule::Pattern;
        let e = eng();
        let mut burst = Rule::new(Action::Error { errno: libc::EIO }, &[Op::Read], Target::Any);
        burst.pattern = Some(Pattern::Burst { ratio: 0.1, length: 5, period: 50 });
        let mut every = Rule::new(Action::Delay { delay: DelayDist::Fixed(Duration::from_micros(10)), hold: Hold::Path }, &[Op::Read], Target::Any);
        every.pattern = Some(Pattern::Interval { every: 4 });
        every.times = Some(10);
        e.add(vec![burst, every]);
        let errs: Vec<bool> = (0..1000).map(|_| e.plan(Op::Read, 0, 4096, None).errno.is_some()).collect();
        assert_eq!(errs.iter().filter(|x| **x).count(), 100);
        let l = e.list();
        assert_eq!((l[0].matched, l[0].fired, l[0].realized_ratio), (1000, 100, Some(0.1)));
        let runs = l[0].runs.clone().unwrap();
        assert_eq!((runs.runs, runs.completed, runs.length_min, runs.length_max, runs.length_mean), (20, 20, 5, 5, 5.0));
        // `times` caps the pattern's firings
        assert_eq!((l[1].matched, l[1].fired), (1000, 10));
        let st = e.stats().rule_firing;
        assert_eq!(st.len(), 2);
        assert_eq!((st[0].ratio, st[0].pattern.as_deref()), (0.1, Some("burst 5 in 50")));
        assert_eq!(st[1].ratio, 0.25);
    }

    #[test]
    fn window_and_after() {
        let e = eng();
        let mut r = Rule::new(Action::Error { errno: libc::EIO }, &[Op::Write], Target::Any);
        r.after_requests = 5;
        let mut w = Rule::new(Action::Error { errno: libc::EIO }, &[Op::Read], Target::Any);
        w.window = Some(Window { from: Duration::from_secs(3600), to: None });
        e.add(vec![r, w]);
        let fired: Vec<bool> = (0..7).map(|_| e.plan(Op::Write, 0, 512, None).errno.is_some()).collect();
        assert_eq!(fired, vec![false, false, false, false, false, true, true]);
        assert!(e.plan(Op::Read, 0, 512, None).is_clean());
    }

    /// An epoch that starts ahead: its clock reads 0 until then, so a rule armed now with a
    /// window from 0 fires at once and one from the epoch's first second does not.
    #[test]
    fn an_epoch_started_ahead_reads_zero_until_it_begins() {
        let e = eng();
        e.reset_epoch(Duration::from_millis(300));
        assert_eq!(e.elapsed_us(), 0);
        let mut now = Rule::new(Action::Error { errno: libc::EIO }, &[Op::Read], Target::Any);
        now.window = Some(Window { from: Duration::ZERO, to: Some(Duration::from_secs(1)) });
        let mut later = Rule::new(Action::Error { errno: libc::EIO }, &[Op::Write], Target::Any);
        later.window = Some(Window { from: Duration::from_millis(1), to: None });
        e.add(vec![now, later]);
        assert_eq!(e.plan(Op::Read, 0, 512, None).errno, Some(libc::EIO));
        assert!(e.plan(Op::Write, 0, 512, None).is_clean());
        std::thread::sleep(Duration::from_millis(320));
        assert!(e.elapsed_us() > 0);
        assert_eq!(e.plan(Op::Write, 0, 512, None).errno, Some(libc::EIO));
    }

    #[test]
    fn many_rules_and_remove() {
        let e = eng();
        let rules: Vec<Rule> = (0..100_000u64)
            .map(|i| {
                if i % 2 == 0 {
                    Rule::new(Action::Error { errno: libc::EIO }, &[Op::Read], Target::Range { start: (1 << 40) + i * 4096, end: (1 << 40) + i * 4096 + 4096 })
                } else {
                    Rule::new(Action::Error { errno: libc::EIO }, &[Op::Read], Target::Content { hash: i as u128 * 7919 })
                }
            })
            .collect();
        let armed = e.add(rules);
        assert!(e.plan(Op::Read, 0, 65536, Some(&vec![1u8; 65536])).is_clean());
        assert_eq!(e.plan(Op::Read, (1 << 40) + 4096 * 10, 4096, None).errno, Some(libc::EIO));
        assert_eq!(e.remove(&[armed[10].id]), 1);
        assert!(e.plan(Op::Read, (1 << 40) + 4096 * 10, 4096, None).is_clean());
    }

    /// Every armed hash passes the content filter, and few others do: with the bench's 50k
    /// content rules, random block hashes reach the map less than 0.2% of the time.
    #[test]
    fn content_filter_has_no_false_negatives_and_few_false_positives() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut hash = || {
            let mut w = || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            (u128::from(w()) << 64) | u128::from(w())
        };
        let armed: Vec<u128> = (0..50_000).map(|_| hash()).collect();
        let e = eng();
        e.add(armed.iter().map(|&hash| Rule::new(Action::Bitflip { at: FlipAt::default() }, &[Op::Write], Target::Content { hash })).collect());
        let set = e.set.load();
        assert!(armed.iter().all(|h| set.content_rules(*h).is_some()));
        let (tries, mut passed) = (200_000, 0);
        for _ in 0..tries {
            let (w, m) = set.filter_slot(hash());
            passed += usize::from(set.content_filter[w] & m == m);
        }
        assert!(passed * 500 < tries, "{passed} of {tries} random hashes passed the filter");
    }

    #[test]
    fn delay_distributions_are_sane() {
        let d = DelayDist::Lognormal { median: Duration::from_micros(100), sigma: 0.5 };
        let mut v: Vec<Duration> = (0..2001).map(|n| sample_delay(&d, 1, n)).collect();
        v.sort();
        let med = v[1000].as_micros() as i64;
        assert!((85..=115).contains(&med), "{med}");
    }
}
