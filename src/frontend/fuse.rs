//! The disk as one FUSE file, `<mountpoint>/disk`, for the loop driver to attach in direct-I/O
//! mode. Only plumbing: every byte goes through `Disk`, which owns the fault logic.

use super::delay::Delayer;
use super::guard;
use super::poll::{InFlight, Poller};
use crate::disk::{Disk, Outcome};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request, WriteFlags,
};
use std::cell::RefCell;
use std::ffi::OsStr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

pub const FILE_NAME: &str = "disk";
pub(super) const ROOT: INodeNo = INodeNo(1);
const FILE: INodeNo = INodeNo(2);
pub(super) const TTL: Duration = Duration::from_secs(3600);
pub const MAX_WRITE: u32 = 1 << 20;
/// Asynchronous (background) requests the kernel keeps in flight on the connection (the loop
/// device's direct I/O are all background requests): over io_uring, and on the classic path.
const RING_MAX_BACKGROUND: u16 = 12;
const CLASSIC_MAX_BACKGROUND: u16 = 256;

pub struct DiskFs {
    disk: Arc<Disk>,
    attrs: NodeAttrs,
    delayer: Delayer,
    poller: Arc<Poller>,
    /// ask the kernel for FUSE over io_uring in INIT (`uring`: a ring is ready to register)
    ask_uring: bool,
}

/// The one-file tree's metadata, answered alike by the classic path and the ring (`uring`).
#[derive(Clone)]
pub struct NodeAttrs {
    disk: Arc<Disk>,
    created: SystemTime,
}

impl NodeAttrs {
    pub fn new(disk: Arc<Disk>) -> NodeAttrs {
        NodeAttrs { disk, created: SystemTime::now() }
    }

    pub fn attr(&self, ino: INodeNo) -> Option<FileAttr> {
        let (kind, perm, size, nlink) = match ino {
            ROOT => (FileType::Directory, 0o755, 0, 2),
            FILE => (FileType::RegularFile, 0o600, self.disk.size(), 1),
            _ => return None,
        };
        Some(FileAttr {
            ino,
            size,
            blocks: size / 512,
            atime: self.created,
            mtime: self.created,
            ctime: self.created,
            crtime: self.created,
            kind,
            perm,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: self.disk.block_size(),
            flags: 0,
        })
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> Option<FileAttr> {
        (parent == ROOT.0 && name == FILE_NAME.as_bytes()).then(|| self.attr(FILE)).flatten()
    }

    /// FOPEN flags for an open of `ino`, or the errno.
    pub fn open_flags(&self, ino: u64, dir: bool) -> Result<u32, i32> {
        match (INodeNo(ino), dir) {
            (FILE, false) => Ok(FopenFlags::FOPEN_DIRECT_IO.bits()),
            (ROOT, true) => Ok(0),
            (ROOT, false) => Err(libc::EISDIR),
            (FILE, true) => Err(libc::ENOTDIR),
            _ => Err(libc::ENOENT),
        }
    }
}

/// The root directory's entries: (inode, type, name).
pub(super) fn root_entries() -> [(INodeNo, FileType, &'static str); 3] {
    [(ROOT, FileType::Directory, "."), (ROOT, FileType::Directory, ".."), (FILE, FileType::RegularFile, FILE_NAME)]
}

/// Whether a fallocate mode frees or zeroes a range (the loop driver sends discard as
/// PUNCH_HOLE|KEEP_SIZE and write-zeroes as ZERO_RANGE); plain preallocation is a no-op, the
/// disk is fully allocated already.
pub(super) fn fallocate_discards(mode: i32) -> bool {
    mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0
}

thread_local! {
    /// Per-thread read buffer: no allocation per read on the hot path.
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl DiskFs {
    pub fn new(disk: Arc<Disk>, attrs: NodeAttrs, poller: Arc<Poller>, ask_uring: bool) -> DiskFs {
        DiskFs { disk, attrs, delayer: Delayer::new(), poller, ask_uring }
    }

    /// Reply now, or later from the delay thread; `flight` ends with the reply.
    fn complete(&self, o: Outcome, flight: InFlight, reply: impl FnOnce(Option<i32>) + Send + 'static) {
        match o.delay {
            Some(d) if !d.is_zero() => {
                let errno = o.errno;
                let disk = self.disk.clone();
                let at = Instant::now() + d;
                self.delayer.at(
                    at,
                    Box::new(move || {
                        disk.engine().log.delay_lateness.record(at.elapsed());
                        reply(errno);
                        drop(flight);
                    }),
                );
            }
            _ => {
                reply(o.errno);
                drop(flight);
            }
        }
    }
}

fn empty(reply: ReplyEmpty) -> impl FnOnce(Option<i32>) + Send {
    move |e| match e {
        None => reply.ok(),
        Some(e) => reply.error(Errno::from_i32(e)),
    }
}

impl Filesystem for DiskFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // ASYNC_DIO lets the kernel keep several direct-I/O requests of one file in flight
        // (without it a deep queue gains little, ../shared/docs/FUSE-NOTES.md).
        let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO);
        let _ = config.set_max_write(MAX_WRITE);
        // Over io_uring, the kernel's own background limit (12, congestion at 9), as libfuse
        // leaves it: with more async requests allowed the loop worker drains its list and
        // sleeps, and each submission wakes it under the loop's lock; held at 12 it stays busy
        // (BENCHMARKS.md, "Background limit over io_uring"). The classic path keeps its measured 256.
        let bg = if self.ask_uring { RING_MAX_BACKGROUND } else { CLASSIC_MAX_BACKGROUND };
        let _ = config.set_max_background(bg);
        let _ = config.set_congestion_threshold(bg * 3 / 4);
        if self.ask_uring {
            // with it, the kernel holds new requests until the ring is registered (uring.rs),
            // and keeps the ring usable after the module switch goes back off
            let _ = config.add_capabilities(InitFlags::FUSE_OVER_IO_URING);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.attrs.lookup(parent.0, name.as_encoded_bytes()) {
            Some(a) => reply.entry(&TTL, &a, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attrs.attr(ino) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // the disk has a fixed size
        if size.is_some_and(|s| s != self.disk.size()) {
            return reply.error(Errno::EPERM);
        }
        match self.attrs.attr(ino) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.attrs.open_flags(ino.0, false) {
            Ok(f) => reply.opened(FileHandle(0), FopenFlags::from_bits_retain(f)),
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let flight = self.poller.arrived();
        let len = (size as u64).min(self.disk.size().saturating_sub(offset)) as usize;
        READ_BUF.with_borrow_mut(|buf| {
            // grow only: shrinking and regrowing would zero-fill on every size change
            if buf.len() < len {
                buf.resize(len, 0);
            }
            let buf = &mut buf[..len];
            let o = guard::guarded("read", offset, len as u64, || self.disk.read(offset, buf));
            match (o.errno, o.delay) {
                (Some(e), None) => reply.error(Errno::from_i32(e)),
                (None, None) => reply.data(buf),
                _ => {
                    let data = buf.to_vec();
                    self.complete(o, flight, move |e| match e {
                        None => reply.data(&data),
                        Some(e) => reply.error(Errno::from_i32(e)),
                    })
                }
            }
        });
        self.poller.idle();
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let n = data.len() as u32;
        let flight = self.poller.arrived();
        let mut owed = Some((reply, flight));
        // the disk may acknowledge before the bytes are in (RAM store, `Disk::write_then`)
        let r = guard::caught(|| {
            self.disk.write_then(offset, data, |o| {
                let (reply, flight) = owed.take().expect("one acknowledgement");
                self.complete(o, flight, move |e| match e {
                    None => reply.written(n),
                    Some(e) => reply.error(Errno::from_i32(e)),
                })
            })
        });
        if let Err(m) = r {
            // answered already if the panic came after the acknowledgement
            let then = if owed.is_some() { "answered with EIO" } else { "after its acknowledgement" };
            guard::report("write", offset, n as u64, &m, then);
            if let Some((reply, flight)) = owed.take() {
                reply.error(Errno::EIO);
                drop(flight);
            }
        }
        self.poller.idle();
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        // close(2)-time flush, not a device cache flush (that arrives as fsync)
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let flight = self.poller.arrived();
        let o = guard::guarded("flush", 0, 0, || self.disk.flush());
        self.complete(o, flight, empty(reply));
    }

    fn fallocate(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, offset: u64, length: u64, mode: i32, reply: ReplyEmpty) {
        if !fallocate_discards(mode) {
            return reply.ok();
        }
        let flight = self.poller.arrived();
        let o = guard::guarded("discard", offset, length, || self.disk.discard(offset, length));
        self.complete(o, flight, empty(reply));
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        if ino != ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        for (i, (ino, kind, name)) in root_entries().iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }
}
