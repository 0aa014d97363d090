//! Faults scheduled by workload progress. The workload calls `before_write` from its issuing
//! threads just before each write; a trigger that is due (bytes written, ops, time) marks its
//! fault pending, and a pending fault is resolved against the write at hand (its last block,
//! a unique content in it, block N of file F) and armed in the engine before the write is
//! issued, so write-side faults hit it and read-side faults hit it later. Faults whose target
//! needs no write (a fixed offset, the most duplicated content) are armed by a ticker thread.
//! The fast path is three relaxed atomic loads per write.

use super::disks::DiskServer;
use crate::content::{block_hash, fill_block, stream::Stream};
use crate::fault::{Rule, Target};
use crate::spec::rule::yaml::{Deferred, FaultSpec, Trigger};
use crate::workload::{WriteEvent, WriteObserver};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Called with (file, offset, content id) for each block the workload wrote.
pub type WrittenVisitor<'a> = &'a mut dyn FnMut(Option<usize>, u64, u64);

const CBLOCK: u64 = 4096;

/// One armed firing, for the results.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Firing {
    pub fault: String,
    pub rule_id: u64,
    pub disk: usize,
    pub target: String,
    /// Seconds since the workload started.
    pub t_s: f64,
}

struct Slot {
    spec: FaultSpec,
    /// Next `every` threshold in written bytes; next deadline for at / after_ops.
    next_bytes: u64,
    fired: u64,
    /// Waiting for a write to resolve against.
    pending: u64,
    done: bool,
}

struct State {
    slots: Vec<Slot>,
    targeted: HashSet<u64>,
    firings: Vec<Firing>,
    notes: Vec<String>,
}

pub struct Scheduler {
    disks: Vec<Arc<DiskServer>>,
    stream: Stream,
    seed: u64,
    by_content_default: bool,
    start: Instant,
    state: Mutex<State>,
    /// Fast-path gates: the smallest pending byte threshold, and "something is pending".
    due_bytes: AtomicU64,
    due_ops: AtomicU64,
    due_us: AtomicU64,
    any_pending: AtomicBool,
    /// The last write seen (file + 1 or 0, offset of its last 4 KiB block, its content id);
    /// three relaxed stores, not one atomic triple: "last" under concurrency is approximate anyway.
    last_file: AtomicU64,
    last_off: AtomicU64,
    last_id: AtomicU64,
}

impl Scheduler {
    /// `faults` are the setup's faults that are not armed statically (see `split`).
    pub fn new(disks: Vec<Arc<DiskServer>>, faults: Vec<FaultSpec>, stream: Stream, seed: u64, on_fs: bool) -> Arc<Scheduler> {
        let slots: Vec<Slot> = faults
            .into_iter()
            .map(|spec| {
                let (next, pending) = match &spec.trigger {
                    Trigger::Every { bytes, .. } => (*bytes, 0),
                    Trigger::Start => (u64::MAX, 1),
                    _ => (u64::MAX, 0),
                };
                Slot { spec, next_bytes: next, fired: 0, pending, done: false }
            })
            .collect();
        let s = Arc::new(Scheduler {
            disks,
            stream,
            seed,
            by_content_default: on_fs,
            start: Instant::now(),
            state: Mutex::new(State { slots, targeted: HashSet::new(), firings: Vec::new(), notes: Vec::new() }),
            last_file: AtomicU64::new(0),
            last_off: AtomicU64::new(0),
            last_id: AtomicU64::new(u64::MAX),
            due_bytes: AtomicU64::new(u64::MAX),
            due_ops: AtomicU64::new(u64::MAX),
            due_us: AtomicU64::new(u64::MAX),
            any_pending: AtomicBool::new(false),
        });
        {
            let mut st = s.state.lock().unwrap();
            s.refresh_gates(&st);
            // targets that need no write (most duplicated content, fixed offsets) arm now
            s.resolve_without_write(&mut st);
        }
        s
    }

    fn elapsed_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    fn refresh_gates(&self, st: &State) {
        let mut bytes = u64::MAX;
        let mut ops = u64::MAX;
        let mut us = u64::MAX;
        let mut pending = false;
        for s in st.slots.iter().filter(|s| !s.done) {
            pending |= s.pending > 0;
            match s.spec.trigger {
                Trigger::Every { .. } => bytes = bytes.min(s.next_bytes),
                Trigger::AfterOps(n) if s.fired == 0 => ops = ops.min(n),
                Trigger::At(t) if s.fired == 0 => us = us.min(t.as_micros() as u64),
                _ => {}
            }
        }
        self.due_bytes.store(bytes, Relaxed);
        self.due_ops.store(ops, Relaxed);
        self.due_us.store(us, Relaxed);
        self.any_pending.store(pending, Relaxed);
    }

    /// Time and op triggers also fire without writes (a read-only workload, a command stack):
    /// call this every few ms with the workload's op count.
    pub fn tick(&self, ops: u64) {
        if ops >= self.due_ops.load(Relaxed) || self.elapsed_us() >= self.due_us.load(Relaxed) {
            let mut st = self.state.lock().unwrap();
            self.fire_due(&mut st, None, ops);
            self.resolve_without_write(&mut st);
            self.refresh_gates(&st);
        }
    }

    /// Mark due triggers pending (with `written` bytes so far when a write is at hand).
    fn fire_due(&self, st: &mut State, written: Option<(u64, u64)>, ops: u64) {
        let now = self.elapsed_us();
        for s in st.slots.iter_mut().filter(|s| !s.done) {
            match s.spec.trigger {
                Trigger::Every { bytes, count } => {
                    if let Some((before, len)) = written {
                        // the write that completes an interval carries its last block
                        while before + len >= s.next_bytes && !s.done {
                            s.pending += 1;
                            s.fired += 1;
                            // a huge `every` must not wrap around and fire at once again
                            s.next_bytes = s.next_bytes.saturating_add(bytes);
                            if count.is_some_and(|c| s.fired >= c) {
                                s.next_bytes = u64::MAX;
                                break;
                            }
                        }
                    }
                }
                Trigger::AfterOps(n) if s.fired == 0 && ops >= n => {
                    s.pending += 1;
                    s.fired += 1;
                }
                Trigger::At(t) if s.fired == 0 && now >= t.as_micros() as u64 => {
                    s.pending += 1;
                    s.fired += 1;
                }
                _ => {}
            }
        }
    }

    /// Arm pending faults that need no write to resolve against.
    fn resolve_without_write(&self, st: &mut State) {
        for i in 0..st.slots.len() {
            let s = &st.slots[i];
            if s.pending == 0 || s.done {
                continue;
            }
            let target = match &s.spec.deferred {
                None => Some((s.spec.rule.target.clone(), "as written".to_string())),
                Some(Deferred::MostDuplicated) => {
                    let id = self.stream.most_duplicated();
                    if st.targeted.contains(&id) && !s.spec.allow_repeat {
                        let label = s.spec.label.clone();
                        st.notes.push(format!("{label}: the most duplicated content was already targeted; not armed again (allow_repeat: true to do so)"));
                        st.slots[i].pending = 0;
                        continue;
                    }
                    st.targeted.insert(id);
                    Some((self.content_target(id), format!("most duplicated content (id {id}, {} copies per cycle)", self.stream.copies_of(id))))
                }
                _ => None,
            };
            if let Some((t, what)) = target {
                st.slots[i].pending -= 1;
                self.arm(st, i, t, what);
            }
        }
    }

    fn content_target(&self, id: u64) -> Target {
        let mut b = vec![0u8; CBLOCK as usize];
        fill_block(id, self.seed, &mut b);
        Target::Content { hash: block_hash(&b) }
    }

    fn arm(&self, st: &mut State, i: usize, target: Target, what: String) {
        let s = &st.slots[i];
        let mut rule: Rule = s.spec.rule.clone();
        rule.target = target;
        let n = s.fired.max(1);
        rule.name = Some(match &rule.name {
            Some(nm) => format!("{nm}#{n}"),
            None => format!("{}#{n}", s.spec.label),
        });
        let disk = s.spec.disk;
        let label = s.spec.label.clone();
        match self.disks[disk].arm(vec![rule]) {
            Ok(armed) => {
                for id in armed {
                    st.firings.push(Firing { fault: label.clone(), rule_id: id, disk, target: what.clone(), t_s: self.elapsed_us() as f64 / 1e6 });
                }
            }
            Err(e) => st.notes.push(format!("{label}: could not arm: {e:#}")),
        }
        let s = &mut st.slots[i];
        if matches!(s.spec.trigger, Trigger::Start | Trigger::AfterOps(_) | Trigger::At(_) | Trigger::AfterWorkload) && s.pending == 0 {
            s.done = true;
        }
    }

    /// Resolve pending faults against this write.
    fn resolve_with_write(&self, st: &mut State, ev: &WriteEvent) {
        let by_content_default = self.by_content_default;
        for i in 0..st.slots.len() {
            while st.slots[i].pending > 0 && !st.slots[i].done {
                let s = &st.slots[i];
                let by_content = s.spec.by_content.unwrap_or(by_content_default);
                let pick: Option<(usize, String)> = match &s.spec.deferred {
                    Some(Deferred::LastWritten) => {
                        // the last block, or with content targets the last one not yet targeted
                        (0..ev.ids.len())
                            .rev()
                            .find(|&k| !by_content || s.spec.allow_repeat || !st.targeted.contains(&ev.ids[k]))
                            .map(|k| (k, "last written block".to_string()))
                    }
                    Some(Deferred::Unique) => (0..ev.ids.len())
                        .find(|&k| self.stream.copies_of(ev.ids[k]) == 1 && (s.spec.allow_repeat || !st.targeted.contains(&ev.ids[k])))
                        .map(|k| (k, "a unique content".to_string())),
                    Some(Deferred::FileBlock { file, block }) => {
                        if ev.file == Some(*file) {
                            let first = ev.offset / CBLOCK;
                            (*block >= first && *block < first + ev.ids.len() as u64).then(|| ((*block - first) as usize, format!("f{file} block {block}")))
                        } else {
                            None
                        }
                    }
                    _ => None,
                };
                let Some((k, what)) = pick else { break };
                let id = ev.ids[k];
                let off = ev.offset + k as u64 * CBLOCK;
                let (target, what) = if by_content || ev.file.is_some() {
                    st.targeted.insert(id);
                    (self.content_target(id), format!("{what}: content id {id}"))
                } else {
                    (Target::Range { start: off, end: off + CBLOCK }, format!("{what}: device offset {off}"))
                };
                st.slots[i].pending -= 1;
                self.arm(st, i, target, what);
            }
        }
    }

    /// After the workload (and dedup): arm the faults at rest. `written` lists (file, offset,
    /// id) of what the workload wrote, for unique / file-block targets.
    pub fn after_workload(&self, written: &dyn Fn(WrittenVisitor<'_>)) {
        let mut st = self.state.lock().unwrap();
        let idx: Vec<usize> = (0..st.slots.len()).filter(|&i| st.slots[i].spec.trigger == Trigger::AfterWorkload).collect();
        if idx.is_empty() {
            return;
        }
        // how often each content was written, and where
        let mut count: HashMap<u64, (u64, Option<usize>, u64)> = HashMap::new();
        written(&mut |file, off, id| {
            let e = count.entry(id).or_insert((0, file, off));
            e.0 += 1;
        });
        for i in idx {
            let s = &st.slots[i];
            let by_content = s.spec.by_content.unwrap_or(self.by_content_default);
            let pick: Option<(u64, Option<usize>, u64, String)> = match &s.spec.deferred {
                None => None,
                Some(Deferred::MostDuplicated) => {
                    // the content written most often (not just most frequent in the profile)
                    count
                        .iter()
                        .max_by_key(|(id, (n, ..))| (*n, std::cmp::Reverse(**id)))
                        .map(|(id, (n, f, o))| (*id, *f, *o, format!("most duplicated content (id {id}, written {n} times)")))
                }
                Some(Deferred::Unique) => {
                    let mut c: Vec<_> = count.iter().filter(|(id, (n, ..))| *n == 1 && (s.spec.allow_repeat || !st.targeted.contains(id))).collect();
                    c.sort_by_key(|(id, _)| **id);
                    c.first().map(|(id, (_, f, o))| (**id, *f, *o, format!("a unique content (id {id}, written once)")))
                }
                Some(Deferred::LastWritten) => {
                    let id = self.last_id.load(Relaxed);
                    let f = self.last_file.load(Relaxed).checked_sub(1).map(|f| f as usize);
                    (id != u64::MAX).then(|| (id, f, self.last_off.load(Relaxed), "last written block".to_string()))
                }
                Some(Deferred::FileBlock { file, block }) => {
                    let mut hit = None;
                    written(&mut |f, off, id| {
                        if f == Some(*file) && block.checked_mul(CBLOCK) == Some(off) {
                            hit = Some((id, f, off, format!("f{file} block {block}")));
                        }
                    });
                    hit
                }
            };
            let label = s.spec.label.clone();
            let (target, what) = match (&s.spec.deferred, pick) {
                (None, _) => (s.spec.rule.target.clone(), "as written".to_string()),
                (Some(_), None) => {
                    st.notes.push(format!("{label}: no written block matches its target; not armed"));
                    continue;
                }
                (Some(_), Some((id, f, off, what))) => {
                    if by_content || f.is_some() {
                        st.targeted.insert(id);
                        (self.content_target(id), format!("{what}: content id {id}"))
                    } else {
                        (Target::Range { start: off, end: off + CBLOCK }, format!("{what}: device offset {off}"))
                    }
                }
            };
            st.slots[i].pending = 0;
            st.slots[i].fired += 1;
            self.arm(&mut st, i, target, what);
            st.slots[i].done = true;
        }
    }

    /// What was armed, and notes on faults that could not be.
    pub fn finish(&self) -> (Vec<Firing>, Vec<String>) {
        let st = self.state.lock().unwrap();
        let mut notes = st.notes.clone();
        for s in &st.slots {
            if s.pending > 0 && !s.done {
                notes.push(format!("{}: triggered {} time(s) but no write matched its target; {} firing(s) not armed", s.spec.label, s.fired, s.pending));
            } else if s.fired == 0 && !matches!(s.spec.trigger, Trigger::Start | Trigger::AfterWorkload) {
                notes.push(format!("{}: its trigger never came due during the workload", s.spec.label));
            }
        }
        (st.firings.clone(), notes)
    }
}

impl WriteObserver for Scheduler {
    fn before_write(&self, ev: &WriteEvent) {
        let len = ev.ids.len() as u64 * CBLOCK;
        let due = ev.written_before + len >= self.due_bytes.load(Relaxed)
            || ev.ops_before >= self.due_ops.load(Relaxed)
            || ev.elapsed.as_micros() as u64 >= self.due_us.load(Relaxed)
            || self.any_pending.load(Relaxed);
        if let Some(id) = ev.ids.last() {
            self.last_file.store(ev.file.map(|f| f as u64 + 1).unwrap_or(0), Relaxed);
            self.last_off.store(ev.offset + (ev.ids.len() as u64 - 1) * CBLOCK, Relaxed);
            self.last_id.store(*id, Relaxed);
        }
        if !due {
            return;
        }
        let mut st = self.state.lock().unwrap();
        self.fire_due(&mut st, Some((ev.written_before, len)), ev.ops_before);
        self.resolve_without_write(&mut st);
        self.resolve_with_write(&mut st, ev);
        self.refresh_gates(&st);
    }
}

/// How often the ticker looks at the op count while an op trigger waits.
const OPS_TICK: Duration = Duration::from_millis(2);
/// The longest the ticker sleeps at once, so it sees `stop` soon.
const TICK_MAX: Duration = Duration::from_millis(20);

impl Scheduler {
    /// How long the ticker may sleep before its next `tick`: every `OPS_TICK` while an op
    /// trigger waits, until the next time trigger otherwise; None when neither is left (byte
    /// triggers fire from writes, and a trigger once fired never waits again).
    fn tick_wait(&self) -> Option<Duration> {
        if self.due_ops.load(Relaxed) != u64::MAX {
            return Some(OPS_TICK);
        }
        let due = self.due_us.load(Relaxed);
        (due != u64::MAX).then(|| Duration::from_micros(due.saturating_sub(self.elapsed_us())).min(TICK_MAX))
    }
}

/// Ticker thread for time / op triggers; stops when `stop` is set or none is left to wait for
/// (a workload with only byte triggers gets no wake-ups).
pub fn spawn_ticker(s: Arc<Scheduler>, ops: impl Fn() -> u64 + Send + 'static, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Relaxed) {
            s.tick(ops());
            match s.tick_wait() {
                Some(d) => std::thread::sleep(d),
                None => return,
            }
        }
    })
}

/// Split a setup's faults: (armed before the workload as they are, scheduled).
pub fn split(faults: &[FaultSpec]) -> (Vec<FaultSpec>, Vec<FaultSpec>) {
    faults.iter().cloned().partition(|f| f.trigger == Trigger::Start && f.deferred.is_none())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::content::profile::Profile;
    use crate::spec::rule::check::DiskGeometry;
    use crate::spec::rule::yaml::parse_rules;

    fn scheduler(trigger: Trigger) -> Arc<Scheduler> {
        let geo = DiskGeometry { size: 1 << 30, block_size: 4096 };
        let rule = parse_rules("rules:\n  - {type: error, op: write, target: {block: 5}}\n", "test", geo).unwrap().remove(0);
        let spec =
            FaultSpec { rule, deferred: Some(Deferred::LastWritten), trigger, by_content: Some(false), disk: 0, allow_repeat: false, label: "rule #1".into() };
        Scheduler::new(Vec::new(), vec![spec], Stream::new(&Profile::none(), 1), 1, false)
    }

    /// The ticker wakes only for what it can fire: every OPS_TICK while an op trigger waits,
    /// until a time trigger (at most TICK_MAX at once), and never for byte triggers or once
    /// its trigger has fired.
    #[test]
    fn ticker_sleeps_until_what_it_can_fire() {
        assert_eq!(scheduler(Trigger::Every { bytes: 1 << 20, count: None }).tick_wait(), None);
        let ops = scheduler(Trigger::AfterOps(10));
        assert_eq!(ops.tick_wait(), Some(OPS_TICK));
        ops.tick(10);
        assert_eq!(ops.tick_wait(), None, "fired: nothing left to wait for");
        assert_eq!(scheduler(Trigger::At(Duration::from_secs(60))).tick_wait(), Some(TICK_MAX));
        let soon = scheduler(Trigger::At(Duration::from_millis(5)));
        assert!(soon.tick_wait().is_some_and(|d| d <= Duration::from_millis(5)));
        std::thread::sleep(Duration::from_millis(6));
        assert_eq!(soon.tick_wait(), Some(Duration::ZERO), "due: tick now");
        soon.tick(0);
        assert_eq!(soon.tick_wait(), None, "fired: nothing left to wait for");
    }
}
