//! filebench's personalities (`personality: fileserver | webserver | varmail`, docs/workload.md):
//! the file sets of `fileset` are created and `prealloc`% of their files written, then each
//! thread runs the personality's flowop sequence (filebench's workloads/*.f) in a loop with
//! ordinary buffered file syscalls until a bound. Every flowop type has its own latency
//! histogram; each read/write syscall also counts in `read`/`write` and the time series.
//!
//! Files are picked like filebench's `fileset_pick`: in rotation over the existing (or the
//! not existing) files of the set, skipping busy ones; a file is busy only while a thread
//! creates, opens, deletes, stats or (varmail's `replace`) replaces it, so several threads may
//! hold one file open.
//!
//! Content map: per file, the content id of each 4 KiB block (`Live`). File sizes and appends
//! are multiples of 4 KiB, so every write covers whole blocks. Writes to one file are
//! serialized by its `Live` lock (write + map update together), so the map says exactly what
//! the file holds; a write through a descriptor opened before the file was deleted (and maybe
//! re-created: `generation` differs) goes to the unlinked inode and is not mapped; a delete drops the
//! file's blocks. At the end the files that exist are returned as the run's `Maps`.

use super::content_map::ContentMap;
use super::entries::EntryOracle;
use super::fileset::{Layout, layout};
use super::maps::{Maps, Target};
use super::op::fill;
use super::runner::{IoError, WorkloadResult};
use super::stats::{IntervalAcc, OpAcc, cpu_time, flowop_summary, sampler, summary};
use super::{Progress, WriteEvent, WriteObserver};
use crate::content::stream::Stream;
use crate::spec::workload::config::{CONTENT_BLOCK, ErrorPolicy, Interface, Personality, PersonalitySpec, Workload};
use anyhow::{Context, Result, bail};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// filebench's flowop types used by the three personalities.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    CreateFile,
    WriteWholeFile,
    AppendFileRand,
    OpenFile,
    ReadWholeFile,
    CloseFile,
    DeleteFile,
    StatFile,
    Fsync,
    /// faultline's (not filebench's): `replace: true`'s atomic replace of the file open on the
    /// descriptor (a temp file written whole, fsynced, renamed over it); its latency is the
    /// rename's, the temp's create, writes and fsyncs count as theirs.
    RenameFile,
}

impl Kind {
    pub const ALL: [Kind; 10] = [
        Kind::CreateFile,
        Kind::WriteWholeFile,
        Kind::AppendFileRand,
        Kind::OpenFile,
        Kind::ReadWholeFile,
        Kind::CloseFile,
        Kind::DeleteFile,
        Kind::StatFile,
        Kind::Fsync,
        Kind::RenameFile,
    ];

    /// filebench's flowop name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::CreateFile => "createfile",
            Kind::WriteWholeFile => "writewholefile",
            Kind::AppendFileRand => "appendfilerand",
            Kind::OpenFile => "openfile",
            Kind::ReadWholeFile => "readwholefile",
            Kind::CloseFile => "closefile",
            Kind::DeleteFile => "deletefile",
            Kind::StatFile => "statfile",
            Kind::Fsync => "fsync",
            Kind::RenameFile => "renamefile",
        }
    }

    /// The flowops the study's R:W ratio counts: reads ...
    pub fn is_read(self) -> bool {
        self == Kind::ReadWholeFile
    }

    /// ... and writes.
    pub fn is_write(self) -> bool {
        matches!(self, Kind::WriteWholeFile | Kind::AppendFileRand)
    }
}

/// One step of a thread's loop: the flowop, its file set (index in `Layout::sets`) and its
/// descriptor slot (filebench's `fd=`; 0: none, the flowop picks a file itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flowop {
    pub kind: Kind,
    pub set: usize,
    pub fd: usize,
}

/// The flowop sequence of each thread, as in filebench's workloads/*.f; `replace` (varmail):
/// the rewrite of the message just read (its second appendfilerand + fsync) is a `renamefile`
/// (an atomic replace, `Worker::replace`).
pub fn flowops(p: Personality, replace: bool) -> Vec<Flowop> {
    use Kind::*;
    let f = |kind, fd| Flowop { kind, set: 0, fd };
    match p {
        Personality::Fileserver => vec![
            f(CreateFile, 1),
            f(WriteWholeFile, 1),
            f(CloseFile, 1),
            f(OpenFile, 1),
            f(AppendFileRand, 1),
            f(CloseFile, 1),
            f(OpenFile, 1),
            f(ReadWholeFile, 1),
            f(CloseFile, 1),
            f(DeleteFile, 0),
            f(StatFile, 0),
        ],
        Personality::Webserver => {
            let mut v = Vec::new();
            for _ in 0..10 {
                v.extend([f(OpenFile, 1), f(ReadWholeFile, 1), f(CloseFile, 1)]);
            }
            // appendlog: fd 2 on the one-file `logfiles` set, opened on first use, never closed
            v.push(Flowop { kind: AppendFileRand, set: 1, fd: 2 });
            v
        }
        Personality::Varmail => {
            let mut v = vec![f(DeleteFile, 0), f(CreateFile, 1), f(AppendFileRand, 1), f(Fsync, 1), f(CloseFile, 1), f(OpenFile, 1), f(ReadWholeFile, 1)];
            if replace {
                v.push(f(RenameFile, 1));
            } else {
                v.extend([f(AppendFileRand, 1), f(Fsync, 1)]);
            }
            v.extend([f(CloseFile, 1), f(OpenFile, 1), f(ReadWholeFile, 1), f(CloseFile, 1)]);
            v
        }
    }
}

/// The flowop types a sequence's results report: its own, and those a `renamefile` also
/// performs (the temp's create, whole-file write and fsync).
pub fn reported(seq: &[Flowop]) -> Vec<Kind> {
    let mut k: Vec<Kind> = seq.iter().map(|f| f.kind).collect();
    if k.contains(&Kind::RenameFile) {
        k.extend([Kind::CreateFile, Kind::WriteWholeFile, Kind::Fsync]);
    }
    k.sort_unstable();
    k.dedup();
    k
}

/// The temp file of `replace` beside `path`: its name with `.tmp` appended (file set names are
/// numbers, so it names no file of the set).
pub fn temp_name(path: &std::path::Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
}

/// An append's size: filebench's `appendfilerand` draws uniformly in [0, iosize); here
/// rounded to the nearest 4 KiB, which keeps the mean (iosize / 2) and whole-block writes.
pub fn append_size(rng: &mut SmallRng, max: u64) -> u64 {
    let u = rng.random_range(0..max.max(1));
    ((u as f64 / CONTENT_BLOCK as f64).round() as u64) * CONTENT_BLOCK
}

/// What the map knows of one file: the content id of each 4 KiB block (None: a failed
/// write, unknown), and the generation (bumped by each create, delete and replace, under this lock
/// and while the file is busy; `Shared::generation` mirrors it so an open need not wait for
/// the lock while a writer holds it).
#[derive(Default)]
struct Live {
    blocks: Vec<Option<u64>>,
    generation: u64,
}

impl Live {
    fn record(&mut self, first: u64, ids: &[u64], ok: bool) {
        let end = first as usize + ids.len();
        if self.blocks.len() < end {
            self.blocks.resize(end, None);
        }
        for (k, id) in ids.iter().enumerate() {
            self.blocks[first as usize + k] = ok.then_some(*id);
        }
    }
}

/// Which files exist and which are busy; the rotors of `pick`.
struct Picks {
    exists: Vec<bool>,
    busy: Vec<bool>,
    rotor_exists: Vec<usize>,
    rotor_free: Vec<usize>,
}

struct Shared<'a> {
    w: &'a Workload,
    p: &'a PersonalitySpec,
    dir: PathBuf,
    layout: Layout,
    live: Vec<Mutex<Live>>,
    generation: Vec<AtomicU64>,
    /// `replace`: per file, the versions its temp file had so far (the oracle's generations of
    /// the temp's path, slot `entries + i`).
    temp_generation: Vec<AtomicU64>,
    picks: Mutex<Picks>,
    stream: Stream,
    seed: u64,
    /// Content blocks handed to writes so far: write block n carries stream.id_at(n).
    write_blocks: AtomicU64,
    claimed_ops: AtomicU64,
    stop: AtomicBool,
    stopped_on_error: AtomicBool,
    observer: Option<&'a dyn WriteObserver>,
    progress: &'a Progress,
    start: Instant,
    intervals: Vec<Mutex<IntervalAcc>>,
    /// With a power cut planned: the durability oracle's record of entries and versions.
    oracle: Option<EntryOracle>,
}

impl Shared<'_> {
    /// filebench's fileset_pick: the next file of `set` at or after the rotor that exists
    /// (or does not), skipping busy ones; it is returned busy. None: no such file now.
    fn pick(&self, set: usize, exists: bool) -> Option<usize> {
        let s = &self.layout.sets[set];
        let mut p = self.picks.lock().unwrap();
        let rotor = if exists { p.rotor_exists[set] } else { p.rotor_free[set] };
        for k in 0..s.count {
            let i = s.first + (rotor + k) % s.count;
            if p.exists[i] == exists && !p.busy[i] {
                p.busy[i] = true;
                let next = (i - s.first + 1) % s.count;
                if exists {
                    p.rotor_exists[set] = next;
                } else {
                    p.rotor_free[set] = next;
                }
                return Some(i);
            }
        }
        None
    }

    /// `pick`, waiting while every candidate is busy (another thread is opening, creating or
    /// deleting it). filebench ends the run when a flowop finds no file; here the flowop is
    /// skipped (counted in `flowops_skipped`) after a second without one, or at the stop.
    fn pick_wait(&self, set: usize, exists: bool) -> Option<usize> {
        let t0 = Instant::now();
        let mut spins = 0u32;
        loop {
            if let Some(i) = self.pick(set, exists) {
                return Some(i);
            }
            if self.stopping() || t0.elapsed() >= Duration::from_secs(1) {
                return None;
            }
            spins += 1;
            if spins < 16 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }

    /// A create or delete of file `i` (busy): a new generation, no blocks.
    fn renew(&self, i: usize) -> u64 {
        let mut l = self.live[i].lock().unwrap();
        l.blocks.clear();
        l.generation += 1;
        self.generation[i].store(l.generation, Relaxed);
        l.generation
    }

    /// Make file `i` busy if it still is the file a descriptor opened (it exists, at
    /// `generation`), waiting while another thread holds it busy, as `pick_wait` does.
    fn claim(&self, i: usize, generation: u64) -> bool {
        let t0 = Instant::now();
        loop {
            {
                let mut p = self.picks.lock().unwrap();
                if !p.exists[i] || self.generation[i].load(Relaxed) != generation {
                    return false;
                }
                if !p.busy[i] {
                    p.busy[i] = true;
                    return true;
                }
            }
            if self.stopping() || t0.elapsed() >= Duration::from_secs(1) {
                return false;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    fn release(&self, i: usize, exists: bool) {
        let mut p = self.picks.lock().unwrap();
        p.busy[i] = false;
        p.exists[i] = exists;
    }

    fn path(&self, i: usize) -> PathBuf {
        self.dir.join(&self.layout.entries[i].path)
    }

    fn stopping(&self) -> bool {
        self.stop.load(Relaxed) || self.progress.stop.load(Relaxed) || self.w.duration.is_some_and(|d| self.start.elapsed() >= d)
    }

    /// The content ids of `n` bytes of new writes, into `ids`; returns the first block number.
    fn draw_ids(&self, n: u64, ids: &mut Vec<u64>) -> u64 {
        let per = n / CONTENT_BLOCK;
        let n0 = self.write_blocks.fetch_add(per, Relaxed);
        ids.clear();
        ids.extend((0..per).map(|k| self.stream.id_at(n0 + k)));
        n0
    }
}

/// An open descriptor of a thread: which file, the file's generation when opened, position.
struct Fd {
    file: File,
    entry: usize,
    generation: u64,
    pos: u64,
}

struct Worker<'s, 'a> {
    sh: &'s Shared<'a>,
    t: usize,
    rng: SmallRng,
    fds: [Option<Fd>; 3],
    flow: Vec<OpAcc>,
    read: OpAcc,
    write: OpAcc,
    failed: Vec<IoError>,
    skipped: u64,
    buf: IoBuf,
    ids: Vec<u64>,
    /// `baseline: windows`: the thread's reads, writes and flowops by window.
    win: Option<super::windows::WindowAcc>,
}

/// A thread's I/O buffer: page-aligned (mapped) under `direct`, as O_DIRECT needs; a plain
/// vector otherwise.
enum IoBuf {
    Plain(Vec<u8>),
    Aligned(super::direct::AlignedBuf),
}

impl IoBuf {
    fn new(len: usize, direct: bool) -> Result<IoBuf> {
        Ok(if direct { IoBuf::Aligned(super::direct::AlignedBuf::try_new(len)?) } else { IoBuf::Plain(vec![0u8; len]) })
    }
}

impl std::ops::Deref for IoBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            IoBuf::Plain(v) => v,
            IoBuf::Aligned(a) => a,
        }
    }
}

impl std::ops::DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            IoBuf::Plain(v) => v,
            IoBuf::Aligned(a) => a,
        }
    }
}

/// Open options with O_DIRECT under `direct` (file sizes, appends and offsets are whole 4 KiB
/// blocks, so every request is aligned as O_DIRECT asks).
fn options(direct: bool) -> OpenOptions {
    let mut o = OpenOptions::new();
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o
}

impl<'s, 'a> Worker<'s, 'a> {
    fn new(sh: &'s Shared<'a>, t: usize, buf: IoBuf) -> Worker<'s, 'a> {
        Worker {
            sh,
            t,
            rng: SmallRng::seed_from_u64(sh.w.seed.wrapping_add(0x5EED_0000).wrapping_add(t as u64)),
            fds: [None, None, None],
            flow: Kind::ALL.iter().map(|_| OpAcc::new()).collect(),
            read: OpAcc::new(),
            write: OpAcc::new(),
            failed: Vec::new(),
            skipped: 0,
            buf,
            ids: Vec::new(),
            win: super::windows::WindowAcc::new(sh.w.windows, super::windows::FLOWOPS + Kind::ALL.len()),
        }
    }

    fn flowop_done(&mut self, k: Kind, lat: Duration, bytes: u64) {
        self.flow[k as usize].record(lat.as_nanos() as u64, bytes);
        self.window_done(super::windows::FLOWOPS + k as usize, lat, bytes);
        self.sh.progress.ops.fetch_add(1, Relaxed);
    }

    /// `baseline: windows`: an op of `slot` that just ended after `lat`, into its window.
    fn window_done(&mut self, slot: usize, lat: Duration, bytes: u64) {
        if let Some(win) = &mut self.win {
            let end = self.sh.start.elapsed();
            win.record(slot, end.saturating_sub(lat), lat, bytes);
        }
    }

    /// One read or write syscall: the `read`/`write` summaries and the time series.
    fn io_done(&mut self, is_write: bool, lat: Duration, bytes: u64) {
        let ns = lat.as_nanos() as u64;
        self.window_done(if is_write { super::windows::WRITE } else { super::windows::READ }, lat, bytes);
        let mut iv = self.sh.intervals[self.t].lock().unwrap();
        if is_write {
            self.write.record(ns, bytes);
            iv.write.record(ns, bytes);
        } else {
            self.read.record(ns, bytes);
            iv.read.record(ns, bytes);
        }
        self.sh.progress.bytes.fetch_add(bytes, Relaxed);
    }

    fn fail(&mut self, op: &'static str, entry: Option<usize>, offset: u64, len: u64, e: &std::io::Error) {
        let sh = self.sh;
        sh.progress.errors.fetch_add(1, Relaxed);
        self.failed.push(IoError { op: op.into(), file: entry, offset, len, errno: e.raw_os_error().unwrap_or(libc::EIO) });
        if sh.w.on_error == ErrorPolicy::Stop {
            sh.stopped_on_error.store(true, Relaxed);
            sh.stop.store(true, Relaxed);
        }
    }

    fn run(&mut self, seq: &[Flowop]) {
        'outer: loop {
            for fo in seq {
                let sh = self.sh;
                if sh.stopping() {
                    break 'outer;
                }
                if sh.w.ops.is_some_and(|n| sh.claimed_ops.fetch_add(1, Relaxed) >= n) {
                    break 'outer;
                }
                self.exec(*fo);
            }
        }
        for fd in &mut self.fds {
            *fd = None;
        }
    }

    fn exec(&mut self, fo: Flowop) {
        match fo.kind {
            Kind::CreateFile => self.create(fo),
            Kind::OpenFile => {
                self.open(fo, true);
            }
            Kind::WriteWholeFile => self.write_whole(fo),
            Kind::AppendFileRand => self.append(fo),
            Kind::ReadWholeFile => self.read_whole(fo),
            Kind::CloseFile => match self.fds[fo.fd].take() {
                Some(fd) => {
                    let t0 = Instant::now();
                    drop(fd.file);
                    self.flowop_done(Kind::CloseFile, t0.elapsed(), 0);
                }
                None => self.skipped += 1,
            },
            Kind::DeleteFile => self.delete(fo),
            Kind::StatFile => self.stat(fo),
            Kind::RenameFile => self.replace(fo),
            Kind::Fsync => match &self.fds[fo.fd] {
                Some(fd) => {
                    let sh = self.sh;
                    let (entry, generation) = (fd.entry, fd.generation);
                    let snap = sh.oracle.as_ref().map(|o| o.file_sync_start(entry, generation));
                    let t0 = Instant::now();
                    let mut r = fd.file.sync_all();
                    if let (Ok(()), Some(o), Some(s)) = (&r, &sh.oracle, snap) {
                        o.file_synced(entry, generation, s);
                    }
                    if r.is_ok() && sh.p.fsync_dir {
                        // `fsync_dir`: the parent directory too (its entries can become durable)
                        let snap = sh.oracle.as_ref().map(|o| o.dir_sync_start());
                        let path = sh.path(entry);
                        r = File::open(path.parent().unwrap_or(sh.dir.as_path())).and_then(|d| d.sync_all());
                        if let (Ok(()), Some(o), Some(s)) = (&r, &sh.oracle, snap) {
                            o.dir_synced(entry, s);
                        }
                    }
                    let lat = t0.elapsed();
                    match r {
                        Ok(()) => self.flowop_done(Kind::Fsync, lat, 0),
                        Err(e) => self.fail("fsync", Some(entry), 0, 0, &e),
                    }
                }
                None => self.skipped += 1,
            },
        }
    }

    fn create(&mut self, fo: Flowop) {
        let sh = self.sh;
        self.fds[fo.fd] = None;
        let Some(i) = sh.pick_wait(fo.set, false) else {
            self.skipped += 1;
            return;
        };
        let path = sh.path(i);
        let t0 = Instant::now();
        let r = options(sh.w.o_direct()).read(true).write(true).create(true).truncate(true).open(&path);
        let lat = t0.elapsed();
        match r {
            Ok(file) => {
                let generation = sh.renew(i);
                if let Some(o) = &sh.oracle {
                    o.created(i, generation);
                }
                sh.release(i, true);
                self.fds[fo.fd] = Some(Fd { file, entry: i, generation, pos: 0 });
                self.flowop_done(Kind::CreateFile, lat, 0);
            }
            Err(e) => {
                sh.release(i, false);
                self.fail("create", Some(i), 0, 0, &e);
            }
        }
    }

    /// Open an existing file of the flowop's set on its descriptor; `timed`: an `openfile`
    /// flowop (else the implicit open of a flowop that found its descriptor closed, as
    /// filebench's flowoplib_filesetup does). Returns whether the descriptor is open.
    fn open(&mut self, fo: Flowop, timed: bool) -> bool {
        let sh = self.sh;
        self.fds[fo.fd] = None;
        let Some(i) = sh.pick_wait(fo.set, true) else {
            self.skipped += 1;
            return false;
        };
        let generation = sh.generation[i].load(Relaxed);
        let readonly = sh.layout.sets[fo.set].readonly;
        let path = sh.path(i);
        let t0 = Instant::now();
        let r = options(sh.w.o_direct()).read(true).write(!readonly).open(&path);
        let lat = t0.elapsed();
        sh.release(i, true);
        match r {
            Ok(file) => {
                self.fds[fo.fd] = Some(Fd { file, entry: i, generation, pos: 0 });
                if timed {
                    self.flowop_done(Kind::OpenFile, lat, 0);
                }
                true
            }
            Err(e) => {
                self.fail("open", Some(i), 0, 0, &e);
                false
            }
        }
    }

    fn ensure_open(&mut self, fo: Flowop) -> bool {
        self.fds[fo.fd].is_some() || self.open(fo, false)
    }

    /// Write `n` bytes (a multiple of 4 KiB) of new content on descriptor `slot`, at its
    /// position or (append) at the end of the file. The file's map lock is held across the
    /// write and the map update. Returns the syscall's latency, None on failure.
    fn write_chunk(&mut self, slot: usize, append: bool, n: u64) -> Option<Duration> {
        let sh = self.sh;
        let n0 = sh.draw_ids(n, &mut self.ids);
        fill(sh.seed, &self.ids, &mut self.buf[..n as usize]);
        let fd = self.fds[slot].as_mut().expect("an open descriptor");
        let mut live = sh.live[fd.entry].lock().unwrap();
        if append {
            // lseek(SEEK_END); a failed write may have left a partial block: start after it
            fd.pos = fd.file.metadata().map(|m| m.len()).unwrap_or(fd.pos).next_multiple_of(CONTENT_BLOCK);
        }
        let (entry, off) = (fd.entry, fd.pos);
        if let Some(obs) = sh.observer {
            obs.before_write(&WriteEvent {
                written_before: n0 * CONTENT_BLOCK,
                ops_before: sh.progress.ops.load(Relaxed),
                elapsed: sh.start.elapsed(),
                file: Some(entry),
                offset: off,
                ids: &self.ids,
            });
        }
        let t0 = Instant::now();
        let r = fd.file.write_all_at(&self.buf[..n as usize], off);
        let lat = t0.elapsed();
        // a descriptor of a file deleted (and maybe re-created) since it was opened writes to
        // the unlinked inode: nothing to map (the oracle keeps it: a delete that is not durable
        // may bring that inode back after a cut)
        if live.generation == fd.generation {
            live.record(off / CONTENT_BLOCK, &self.ids, r.is_ok());
        }
        if let Some(o) = &sh.oracle {
            o.wrote(entry, fd.generation, off / CONTENT_BLOCK, &self.ids, r.is_ok());
        }
        drop(live);
        fd.pos = off + n;
        match r {
            Ok(()) => {
                self.io_done(true, lat, n);
                Some(lat)
            }
            Err(e) => {
                self.fail("write", Some(entry), off, n, &e);
                None
            }
        }
    }

    fn write_whole(&mut self, fo: Flowop) {
        if !self.ensure_open(fo) {
            return;
        }
        let sh = self.sh;
        let fd = self.fds[fo.fd].as_ref().expect("open");
        let size = sh.layout.entries[fd.entry].size;
        // the latency is the write syscalls' (content generation is not the file system's time)
        let mut lat = Duration::ZERO;
        let mut done = 0;
        while done < size {
            let n = sh.p.iosize.min(size - done);
            match self.write_chunk(fo.fd, false, n) {
                Some(l) => lat += l,
                None => return,
            }
            done += n;
        }
        self.flowop_done(Kind::WriteWholeFile, lat, size);
    }

    fn append(&mut self, fo: Flowop) {
        if !self.ensure_open(fo) {
            return;
        }
        let n = append_size(&mut self.rng, self.sh.p.meanappendsize);
        if n == 0 {
            // filebench counts an empty append as an op with no I/O
            let t0 = Instant::now();
            self.flowop_done(Kind::AppendFileRand, t0.elapsed(), 0);
            return;
        }
        if let Some(lat) = self.write_chunk(fo.fd, true, n) {
            self.flowop_done(Kind::AppendFileRand, lat, n);
        }
    }

    fn read_whole(&mut self, fo: Flowop) {
        if !self.ensure_open(fo) {
            return;
        }
        let io = self.sh.p.iosize as usize;
        let mut buf = std::mem::replace(&mut self.buf, IoBuf::Plain(Vec::new()));
        let (mut off, mut lat) = (0u64, Duration::ZERO);
        let entry = self.fds[fo.fd].as_ref().expect("open").entry;
        let ok = loop {
            let t0 = Instant::now();
            let r = self.fds[fo.fd].as_ref().expect("open").file.read_at(&mut buf[..io], off);
            let l = t0.elapsed();
            lat += l;
            match r {
                Ok(0) => break true,
                Ok(k) => {
                    self.io_done(false, l, k as u64);
                    off += k as u64;
                }
                Err(e) => {
                    self.fail("read", Some(entry), off, io as u64, &e);
                    break false;
                }
            }
        };
        self.buf = buf;
        if ok {
            self.flowop_done(Kind::ReadWholeFile, lat, off);
        }
    }

    /// `replace: true`: rewrite the file open on descriptor `fo.fd` as applications replace a
    /// file atomically: new content of the file's size plus an append, written whole to a new
    /// temp file beside it, the temp fsynced, renamed over the file, and with `fsync_dir` the
    /// directory fsynced. The file stays busy throughout (no other thread deletes or replaces
    /// it meanwhile); one deleted or re-created since the descriptor opened it is skipped. The
    /// descriptor keeps the old file, which the sequence's next flowop closes.
    fn replace(&mut self, fo: Flowop) {
        let sh = self.sh;
        let Some((i, opened)) = self.fds[fo.fd].as_ref().map(|fd| (fd.entry, fd.generation)) else {
            self.skipped += 1;
            return;
        };
        if !sh.claim(i, opened) {
            self.skipped += 1;
            return;
        }
        self.replace_claimed(i);
        sh.release(i, true);
    }

    fn replace_claimed(&mut self, i: usize) {
        let sh = self.sh;
        // the temp's slot in the oracle: after the file set's
        let t = sh.layout.entries.len() + i;
        let (target, tmp) = (sh.path(i), temp_name(&sh.path(i)));
        let size = sh.live[i].lock().unwrap().blocks.len() as u64 * CONTENT_BLOCK + append_size(&mut self.rng, sh.p.meanappendsize);
        let t0 = Instant::now();
        // O_EXCL: a temp left by a replace whose clean-up failed is an error, not reused
        let r = options(sh.w.o_direct()).write(true).create_new(true).open(&tmp);
        let lat = t0.elapsed();
        let file = match r {
            Ok(f) => f,
            Err(e) => return self.fail("create", Some(i), 0, 0, &e),
        };
        let tg = sh.temp_generation[i].fetch_add(1, Relaxed) + 1;
        if let Some(o) = &sh.oracle {
            o.created(t, tg);
        }
        self.flowop_done(Kind::CreateFile, lat, 0);
        let mut blocks: Vec<Option<u64>> = Vec::with_capacity((size / CONTENT_BLOCK) as usize);
        let (mut off, mut wlat) = (0, Duration::ZERO);
        while off < size {
            let n = sh.p.iosize.min(size - off);
            let n0 = sh.draw_ids(n, &mut self.ids);
            fill(sh.seed, &self.ids, &mut self.buf[..n as usize]);
            if let Some(obs) = sh.observer {
                // the temp's writes are the file's (it becomes the file)
                obs.before_write(&WriteEvent {
                    written_before: n0 * CONTENT_BLOCK,
                    ops_before: sh.progress.ops.load(Relaxed),
                    elapsed: sh.start.elapsed(),
                    file: Some(i),
                    offset: off,
                    ids: &self.ids,
                });
            }
            let t0 = Instant::now();
            let r = file.write_all_at(&self.buf[..n as usize], off);
            let l = t0.elapsed();
            blocks.extend(self.ids.iter().map(|id| r.is_ok().then_some(*id)));
            if let Some(o) = &sh.oracle {
                o.wrote(t, tg, off / CONTENT_BLOCK, &self.ids, r.is_ok());
            }
            if let Err(e) = r {
                self.fail("write", Some(i), off, n, &e);
                return self.discard(t, &tmp);
            }
            self.io_done(true, l, n);
            wlat += l;
            off += n;
        }
        self.flowop_done(Kind::WriteWholeFile, wlat, size);
        let snap = sh.oracle.as_ref().map(|o| o.file_sync_start(t, tg));
        let t0 = Instant::now();
        let r = file.sync_all();
        let mut flat = t0.elapsed();
        drop(file);
        match (r, &sh.oracle, snap) {
            (Err(e), _, _) => {
                self.fail("fsync", Some(i), 0, 0, &e);
                return self.discard(t, &tmp);
            }
            (Ok(()), Some(o), Some(s)) => o.file_synced(t, tg, s),
            _ => {}
        }
        // under the file's map lock: a write through another thread's descriptor of the old
        // file is mapped before the rename or (a new generation) not at all
        let mut live = sh.live[i].lock().unwrap();
        let t0 = Instant::now();
        let r = std::fs::rename(&tmp, &target);
        let rlat = t0.elapsed();
        if let Err(e) = r {
            drop(live);
            self.fail("rename", Some(i), 0, 0, &e);
            return self.discard(t, &tmp);
        }
        live.blocks = blocks;
        live.generation += 1;
        sh.generation[i].store(live.generation, Relaxed);
        if let Some(o) = &sh.oracle {
            o.renamed(t, tg, i, live.generation);
        }
        drop(live);
        self.flowop_done(Kind::RenameFile, rlat, 0);
        if sh.p.fsync_dir {
            // the rename's entries (the file's and the temp's) become durable
            let snap = sh.oracle.as_ref().map(|o| o.dir_sync_start());
            let t0 = Instant::now();
            let r = File::open(target.parent().unwrap_or(sh.dir.as_path())).and_then(|d| d.sync_all());
            flat += t0.elapsed();
            match (r, &sh.oracle, snap) {
                (Err(e), _, _) => return self.fail("fsync", Some(i), 0, 0, &e),
                (Ok(()), Some(o), Some(s)) => o.dir_synced(i, s),
                _ => {}
            }
        }
        self.flowop_done(Kind::Fsync, flat, 0);
    }

    /// A replace that failed before its rename: remove the temp (the next replace of the file
    /// creates it anew).
    fn discard(&mut self, t: usize, tmp: &std::path::Path) {
        if std::fs::remove_file(tmp).is_ok()
            && let Some(o) = &self.sh.oracle
        {
            o.deleted(t);
        }
    }

    fn delete(&mut self, fo: Flowop) {
        let sh = self.sh;
        let Some(i) = sh.pick_wait(fo.set, true) else {
            self.skipped += 1;
            return;
        };
        let t0 = Instant::now();
        let r = std::fs::remove_file(sh.path(i));
        let lat = t0.elapsed();
        match r {
            Ok(()) => {
                if let Some(o) = &sh.oracle {
                    o.deleted(i);
                }
                sh.renew(i);
                sh.release(i, false);
                self.flowop_done(Kind::DeleteFile, lat, 0);
            }
            Err(e) => {
                sh.release(i, true);
                self.fail("delete", Some(i), 0, 0, &e);
            }
        }
    }

    fn stat(&mut self, fo: Flowop) {
        let sh = self.sh;
        let Some(i) = sh.pick_wait(fo.set, true) else {
            self.skipped += 1;
            return;
        };
        let t0 = Instant::now();
        let r = std::fs::metadata(sh.path(i));
        let lat = t0.elapsed();
        sh.release(i, true);
        match r {
            Ok(_) => self.flowop_done(Kind::StatFile, lat, 0),
            Err(e) => self.fail("stat", Some(i), 0, 0, &e),
        }
    }
}

/// Create the directories and write the preallocated files (before the timed phase, on a
/// few threads); failed writes are failed I/Os and leave their blocks unknown.
fn prealloc(sh: &Shared, failed: &Mutex<Vec<IoError>>) -> Result<()> {
    for s in &sh.layout.sets {
        let root = sh.dir.join(s.name);
        // a previous run's tree: start from an empty file set, as filebench does
        if root.exists() {
            std::fs::remove_dir_all(&root).with_context(|| format!("cannot remove {}", root.display()))?;
        }
    }
    for d in &sh.layout.dirs {
        let p = sh.dir.join(d);
        std::fs::create_dir_all(&p).with_context(|| format!("cannot create {}", p.display()))?;
    }
    let workers = sh.w.threads.clamp(1, 4) as usize;
    let chunk = (1u64 << 20).min(sh.p.iosize.max(CONTENT_BLOCK));
    std::thread::scope(|sc| -> Result<()> {
        let hs: Vec<_> = (0..workers)
            .map(|k| {
                sc.spawn(move || -> Result<()> {
                    let mut buf = IoBuf::new(chunk as usize, sh.w.o_direct())?;
                    let mut ids = Vec::new();
                    for (i, e) in sh.layout.entries.iter().enumerate().skip(k).step_by(workers) {
                        if !e.prealloc {
                            continue;
                        }
                        let p = sh.path(i);
                        let f = options(sh.w.o_direct())
                            .write(true)
                            .create(true)
                            .truncate(true)
                            .open(&p)
                            .map_err(|e| super::files::refused_direct(e, &p, sh.w.o_direct()))
                            .with_context(|| format!("cannot create {}", p.display()))?;
                        let generation = sh.renew(i);
                        if let Some(o) = &sh.oracle {
                            o.created(i, generation);
                        }
                        let mut live = sh.live[i].lock().unwrap();
                        let mut off = 0;
                        while off < e.size {
                            let n = chunk.min(e.size - off);
                            sh.draw_ids(n, &mut ids);
                            fill(sh.seed, &ids, &mut buf[..n as usize]);
                            let r = f.write_all_at(&buf[..n as usize], off);
                            live.record(off / CONTENT_BLOCK, &ids, r.is_ok());
                            if let Some(o) = &sh.oracle {
                                o.wrote(i, generation, off / CONTENT_BLOCK, &ids, r.is_ok());
                            }
                            if let Err(e) = r {
                                failed.lock().unwrap().push(IoError {
                                    op: "write".into(),
                                    file: Some(i),
                                    offset: off,
                                    len: n,
                                    errno: e.raw_os_error().unwrap_or(libc::EIO),
                                });
                            }
                            off += n;
                        }
                        drop(live);
                        sh.picks.lock().unwrap().exists[i] = true;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in hs {
            h.join().map_err(|_| anyhow::anyhow!("a prealloc thread panicked"))??;
        }
        Ok(())
    })?;
    // the timed phase starts with the file set on disk, not in dirty pages
    crate::sys::mount::syncfs(&sh.dir)?;
    // syncfs wrote back the file set and flushed the disk: entries and contents are durable
    if let Some(o) = &sh.oracle {
        o.synced_all();
    }
    Ok(())
}

/// Before a `direct` run: a file system that refuses O_DIRECT is an error now, not a failed
/// open per flowop; one that takes the open but serves it through the page cache (ext4
/// `data=journal`: STATX_DIOALIGN says 0) is said on stderr, since the run is then buffered
/// in all but name.
fn probe_direct(dir: &std::path::Path) -> Result<()> {
    let p = dir.join(".faultline-direct-probe");
    let r = options(true).read(true).write(true).create(true).truncate(true).open(&p);
    let _ = std::fs::remove_file(&p);
    let f = r.map_err(|e| super::files::refused_direct(e, &p, true)).with_context(|| format!("cannot create {}", p.display()))?;
    if super::files::dio_supported(&f) == Some(false) {
        eprintln!(
            "faultline: {} takes O_DIRECT but serves it through the page cache (the kernel reports no direct I/O alignment: ext4 data=journal does this); the run's I/O is buffered",
            dir.display()
        );
    }
    Ok(())
}

/// Run a personality workload (`workload::run` calls this when `spec.personality` is set).
/// `seed` is the content seed of the maps. `durability` (a power cut is planned, or `crash
/// explore` records): follow the files' entries and contents for the durability oracle
/// (`workload::entries`) with its `power_off` switch, handing the changes to its `entry_log`
/// if it has one; the returned maps carry the record.
pub fn run(
    w: &Workload,
    seed: u64,
    durability: Option<&super::maps::Durability>,
    observer: Option<&dyn WriteObserver>,
    progress: Option<&Progress>,
) -> Result<WorkloadResult> {
    let Some(p) = &w.personality else { bail!("not a personality workload") };
    let Interface::File { dir, .. } = &w.interface else { bail!("a personality runs on files (interface: file)") };
    let own = Progress::new();
    let progress = progress.unwrap_or(&own);
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create directory {}", dir.display()))?;
    let layout = layout(p, w.seed);
    let n = layout.entries.len();
    let mut sh = Shared {
        w,
        p,
        dir: dir.clone(),
        live: (0..n).map(|_| Mutex::new(Live::default())).collect(),
        generation: (0..n).map(|_| AtomicU64::new(0)).collect(),
        temp_generation: (0..n).map(|_| AtomicU64::new(0)).collect(),
        picks: Mutex::new(Picks {
            exists: vec![false; n],
            busy: vec![false; n],
            rotor_exists: vec![0; layout.sets.len()],
            rotor_free: vec![0; layout.sets.len()],
        }),
        layout,
        stream: w.stream(),
        seed,
        write_blocks: AtomicU64::new(0),
        claimed_ops: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        stopped_on_error: AtomicBool::new(false),
        observer,
        progress,
        start: Instant::now(),
        intervals: (0..w.threads).map(|_| Mutex::new(IntervalAcc::default())).collect(),
        oracle: None,
    };
    sh.oracle = durability.map(|d| {
        let mut names: Vec<PathBuf> = sh.layout.entries.iter().map(|e| e.path.clone()).collect();
        // `replace`: each file's temp is a path of its own (slot `entries + i`)
        if p.replace {
            names.extend(sh.layout.entries.iter().map(|e| temp_name(&e.path)));
        }
        let o = EntryOracle::new(names, d.power_off.clone());
        match &d.entry_log {
            Some(l) => o.with_log(l.clone()),
            None => o,
        }
    });
    if w.o_direct() {
        probe_direct(dir)?;
    }
    // every thread's buffer up front: a buffer that cannot be mapped fails the run here
    let bufs = (0..w.threads).map(|_| IoBuf::new(p.iosize.max(p.meanappendsize) as usize, w.o_direct())).collect::<Result<Vec<_>>>()?;
    let pre_failed = Mutex::new(Vec::new());
    prealloc(&sh, &pre_failed)?;
    sh.start = Instant::now();
    let sh = sh;
    let _ = progress.start.set(sh.start);
    let cpu0 = cpu_time();
    let seq = flowops(p.kind, p.replace);
    let kinds = reported(&seq);
    let done = AtomicBool::new(false);
    let (outs, timeseries, secs) = std::thread::scope(|sc| {
        let sampler = sc.spawn(|| sampler(&sh.intervals, sh.start, w.interval, &done));
        let hs: Vec<_> = bufs
            .into_iter()
            .enumerate()
            .map(|(t, buf)| {
                let (sh, seq) = (&sh, &seq);
                sc.spawn(move || {
                    let mut wk = Worker::new(sh, t, buf);
                    wk.run(seq);
                    (wk.flow, wk.read, wk.write, wk.failed, wk.skipped, wk.win)
                })
            })
            .collect();
        let outs: Vec<_> = hs.into_iter().map(|h| h.join()).collect();
        let secs = sh.start.elapsed().as_secs_f64();
        done.store(true, Relaxed);
        sampler.thread().unpark();
        let ts = sampler.join();
        (outs, ts, secs)
    });
    let cpu = cpu_time().saturating_sub(cpu0);
    let timeseries = timeseries.map_err(|_| anyhow::anyhow!("the sampler thread panicked"))?;
    let mut flow: Vec<OpAcc> = Kind::ALL.iter().map(|_| OpAcc::new()).collect();
    let (mut read, mut write) = (OpAcc::new(), OpAcc::new());
    let mut failed = pre_failed.into_inner().unwrap();
    let mut skipped_total = 0;
    let mut windows = super::windows::WindowAcc::new(w.windows, super::windows::FLOWOPS + Kind::ALL.len());
    for o in outs {
        let (f, r, wr, fl, skipped, win) = o.map_err(|_| anyhow::anyhow!("a workload thread panicked"))?;
        if let (Some(all), Some(mine)) = (windows.as_mut(), win) {
            all.merge(mine);
        }
        for (a, b) in flow.iter_mut().zip(&f) {
            a.h.add(&b.h).unwrap();
            a.bytes += b.bytes;
        }
        read.h.add(&r.h).unwrap();
        read.bytes += r.bytes;
        write.h.add(&wr.h).unwrap();
        write.bytes += wr.bytes;
        failed.extend(fl);
        skipped_total += skipped;
    }
    failed.sort_by_key(|f| (f.file, f.offset));
    let mut errors = BTreeMap::new();
    for f in &failed {
        *errors.entry(format!("{}:{}", f.op, crate::spec::rule::errno_name(f.errno))).or_insert(0) += 1;
    }
    let mut flowops_out = BTreeMap::new();
    for k in &kinds {
        let a = &flow[*k as usize];
        flowops_out.insert(k.name().to_string(), flowop_summary(&a.h, a.bytes, secs));
    }
    let mut sh = sh;
    let durability = sh.oracle.take().map(super::maps::Durability::of_entries);
    let maps = final_maps(&sh, durability);
    let named: Vec<(usize, &str)> = kinds.iter().map(|k| (super::windows::FLOWOPS + *k as usize, k.name())).collect();
    let windows = windows.map(|a| a.summaries(secs, w.duration, &named)).unwrap_or_default();
    Ok(WorkloadResult {
        windows,
        nbd_client: None,
        nbd_client_intervals: vec![],
        seconds: secs,
        read: summary(&read.h, read.bytes, secs),
        write: summary(&write.h, write.bytes, secs),
        errors,
        failed_ios: failed,
        retries: 0,
        retry_seconds: 0.0,
        stopped_on_error: sh.stopped_on_error.load(Relaxed),
        cpu_seconds: cpu.as_secs_f64(),
        timeseries,
        flowops: flowops_out,
        flowops_skipped: skipped_total,
        maps: Some(maps),
    })
}

/// The maps of the files that exist at the end, named by their path below the directory.
fn final_maps(sh: &Shared, durability: Option<super::maps::Durability>) -> Maps {
    let picks = sh.picks.lock().unwrap();
    let mut names = Vec::new();
    let mut maps = Vec::new();
    for (i, e) in sh.layout.entries.iter().enumerate() {
        if !picks.exists[i] {
            continue;
        }
        let live = sh.live[i].lock().unwrap();
        let m = ContentMap::new(live.blocks.len() as u64, CONTENT_BLOCK as u32, sh.seed);
        for (b, id) in live.blocks.iter().enumerate() {
            if let Some(id) = id {
                m.set(b as u64, *id);
            }
        }
        names.push(e.path.display().to_string());
        maps.push(m);
    }
    Maps { target: Target::File { dir: sh.dir.clone(), names }, seed: sh.seed, maps, durability }
}

/// The R:W ratio of flowops the study quotes: reads (readwholefile) per write (writewholefile
/// + appendfilerand), from a result's `flowops`.
pub fn read_write_ratio(flowops: &BTreeMap<String, super::stats::FlowopSummary>) -> f64 {
    let get = |k: Kind| flowops.get(k.name()).map(|s| s.ops).unwrap_or(0) as f64;
    let r = get(Kind::ReadWholeFile);
    let w = get(Kind::WriteWholeFile) + get(Kind::AppendFileRand);
    if w == 0.0 { f64::INFINITY } else { r / w }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The R:W mix of one loop of each personality, as the study states it.
    #[test]
    fn flowop_sequences_give_the_filebench_mix() {
        let mix = |p| {
            let s = flowops(p, false);
            (s.iter().filter(|f| f.kind.is_read()).count(), s.iter().filter(|f| f.kind.is_write()).count())
        };
        assert_eq!(mix(Personality::Fileserver), (1, 2));
        assert_eq!(mix(Personality::Webserver), (10, 1));
        assert_eq!(mix(Personality::Varmail), (2, 2));
        // varmail is fsync-heavy: one fsync per append
        let v = flowops(Personality::Varmail, false);
        assert_eq!(v.iter().filter(|f| f.kind == Kind::Fsync).count(), 2);
        // over N loops the counts scale (no flowop is conditional on the iteration)
        let n = 1000;
        let f = flowops(Personality::Fileserver, false);
        let ops: Vec<Kind> = (0..n).flat_map(|_| f.iter().map(|x| x.kind)).collect();
        assert_eq!(ops.iter().filter(|k| **k == Kind::CreateFile).count(), n);
        assert_eq!(ops.iter().filter(|k| **k == Kind::DeleteFile).count(), n);
        assert_eq!(ops.len(), 11 * n);
        // varmail's replace: the rewrite's append + fsync become one renamefile, which also
        // writes (the whole temp) and fsyncs: the reported mix stays 1:1
        let r = flowops(Personality::Varmail, true);
        assert_eq!(r.len(), v.len() - 1);
        assert_eq!(r.iter().filter(|f| f.kind == Kind::RenameFile).count(), 1);
        let k = reported(&r);
        assert!(k.contains(&Kind::WriteWholeFile) && k.contains(&Kind::Fsync) && k.contains(&Kind::RenameFile), "{k:?}");
        assert!(!reported(&v).contains(&Kind::RenameFile));
    }

    #[test]
    fn append_sizes_keep_filebench_mean() {
        let mut rng = SmallRng::seed_from_u64(1);
        let n = 200_000;
        let xs: Vec<u64> = (0..n).map(|_| append_size(&mut rng, 16 << 10)).collect();
        assert!(xs.iter().all(|x| x % CONTENT_BLOCK == 0 && *x <= 16 << 10));
        let mean = xs.iter().sum::<u64>() as f64 / n as f64;
        // filebench: uniform in [0, 16 KiB): mean 8 KiB
        assert!((mean / 8192.0 - 1.0).abs() < 0.01, "{mean}");
    }
}
