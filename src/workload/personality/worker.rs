//! One personality thread: its descriptors, accumulators and the flowops it executes.

use super::flowop::{Flowop, Kind, append_size};
use super::shared::Shared;
use crate::spec::workload::config::{CONTENT_BLOCK, ErrorPolicy};
use crate::workload::WriteEvent;
use crate::workload::op::fill;
use crate::workload::runner::IoError;
use crate::workload::stats::OpAcc;
use anyhow::Result;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// An open descriptor of a thread: which file, the file's generation when opened, position.
pub(super) struct Fd {
    pub(super) file: File,
    pub(super) entry: usize,
    pub(super) generation: u64,
    pub(super) pos: u64,
}

pub(super) struct Worker<'s, 'a> {
    pub(super) sh: &'s Shared<'a>,
    pub(super) t: usize,
    pub(super) rng: SmallRng,
    pub(super) fds: [Option<Fd>; 3],
    pub(super) flow: Vec<OpAcc>,
    pub(super) read: OpAcc,
    pub(super) write: OpAcc,
    pub(super) failed: Vec<IoError>,
    pub(super) skipped: u64,
    pub(super) buf: IoBuf,
    pub(super) ids: Vec<u64>,
    /// `baseline: windows`: the thread's reads, writes and flowops by window.
    pub(super) win: Option<crate::workload::windows::WindowAcc>,
}

/// A thread's I/O buffer: page-aligned (mapped) under `direct`, as O_DIRECT needs; a plain
/// vector otherwise.
pub(super) enum IoBuf {
    Plain(Vec<u8>),
    Aligned(crate::workload::direct::AlignedBuf),
}

impl IoBuf {
    pub(super) fn new(len: usize, direct: bool) -> Result<IoBuf> {
        Ok(if direct { IoBuf::Aligned(crate::workload::direct::AlignedBuf::try_new(len)?) } else { IoBuf::Plain(vec![0u8; len]) })
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
pub(super) fn options(direct: bool) -> OpenOptions {
    let mut o = OpenOptions::new();
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o
}

impl<'s, 'a> Worker<'s, 'a> {
    pub(super) fn new(sh: &'s Shared<'a>, t: usize, buf: IoBuf) -> Worker<'s, 'a> {
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
            win: crate::workload::windows::WindowAcc::new(sh.w.windows, crate::workload::windows::FLOWOPS + Kind::ALL.len()),
        }
    }

    pub(super) fn flowop_done(&mut self, k: Kind, lat: Duration, bytes: u64) {
        self.flow[k as usize].record(lat.as_nanos() as u64, bytes);
        self.window_done(crate::workload::windows::FLOWOPS + k as usize, lat, bytes);
        self.sh.progress.ops.fetch_add(1, Relaxed);
    }

    /// `baseline: windows`: an op of `slot` that just ended after `lat`, into its window.
    pub(super) fn window_done(&mut self, slot: usize, lat: Duration, bytes: u64) {
        if let Some(win) = &mut self.win {
            let end = self.sh.start.elapsed();
            win.record(slot, end.saturating_sub(lat), lat, bytes);
        }
    }

    /// One read or write syscall: the `read`/`write` summaries and the time series.
    pub(super) fn io_done(&mut self, is_write: bool, lat: Duration, bytes: u64) {
        let ns = lat.as_nanos() as u64;
        self.window_done(if is_write { crate::workload::windows::WRITE } else { crate::workload::windows::READ }, lat, bytes);
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

    pub(super) fn fail(&mut self, op: &'static str, entry: Option<usize>, offset: u64, len: u64, e: &std::io::Error) {
        let sh = self.sh;
        sh.progress.errors.fetch_add(1, Relaxed);
        self.failed.push(IoError { op: op.into(), file: entry, offset, len, errno: e.raw_os_error().unwrap_or(libc::EIO) });
        if sh.w.on_error == ErrorPolicy::Stop {
            sh.stopped_on_error.store(true, Relaxed);
            sh.stop.store(true, Relaxed);
        }
    }

    pub(super) fn run(&mut self, seq: &[Flowop]) {
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

    pub(super) fn exec(&mut self, fo: Flowop) {
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

    pub(super) fn create(&mut self, fo: Flowop) {
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
    pub(super) fn open(&mut self, fo: Flowop, timed: bool) -> bool {
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

    pub(super) fn ensure_open(&mut self, fo: Flowop) -> bool {
        self.fds[fo.fd].is_some() || self.open(fo, false)
    }

    /// Write `n` bytes (a multiple of 4 KiB) of new content on descriptor `slot`, at its
    /// position or (append) at the end of the file. The file's map lock is held across the
    /// write and the map update. Returns the syscall's latency, None on failure.
    pub(super) fn write_chunk(&mut self, slot: usize, append: bool, n: u64) -> Option<Duration> {
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

    pub(super) fn write_whole(&mut self, fo: Flowop) {
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

    pub(super) fn append(&mut self, fo: Flowop) {
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

    pub(super) fn read_whole(&mut self, fo: Flowop) {
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

    pub(super) fn delete(&mut self, fo: Flowop) {
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

    pub(super) fn stat(&mut self, fo: Flowop) {
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
