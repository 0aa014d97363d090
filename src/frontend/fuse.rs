//! The disk as one FUSE file, `<mountpoint>/disk`, for the loop driver to attach in direct-I/O
//! mode. Only plumbing: every byte goes through `Disk`, which owns the fault logic.

use super::delay::Delayer;
use super::poll::{InFlight, Poller};
use crate::disk::{Disk, Outcome};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, LockOwner,
    OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request, WriteFlags,
};
use std::cell::RefCell;
use std::ffi::OsStr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

pub const FILE_NAME: &str = "disk";
const ROOT: INodeNo = INodeNo(1);
const FILE: INodeNo = INodeNo(2);
const TTL: Duration = Duration::from_secs(3600);
pub const MAX_WRITE: u32 = 1 << 20;

pub struct DiskFs {
    disk: Arc<Disk>,
    delayer: Delayer,
    poller: Arc<Poller>,
    created: SystemTime,
}

thread_local! {
    /// Per-thread read buffer: no allocation per read on the hot path.
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl DiskFs {
    pub fn new(disk: Arc<Disk>, poller: Arc<Poller>) -> DiskFs {
        DiskFs { disk, delayer: Delayer::new(), poller, created: SystemTime::now() }
    }

    fn attr(&self, ino: INodeNo) -> FileAttr {
        let (kind, perm, size, nlink) =
            if ino == ROOT { (FileType::Directory, 0o755, 0, 2) } else { (FileType::RegularFile, 0o600, self.disk.size(), 1) };
        FileAttr {
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
        }
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
                        disk.engine.log.delay_lateness.record(at.elapsed());
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
        // (without it QD32 halves, FUSE-NOTES.md).
        let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO);
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_background(256);
        let _ = config.set_congestion_threshold(192);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent == ROOT && name == FILE_NAME {
            reply.entry(&TTL, &self.attr(FILE), Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match ino {
            ROOT | FILE => reply.attr(&TTL, &self.attr(ino)),
            _ => reply.error(Errno::ENOENT),
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
        reply.attr(&TTL, &self.attr(ino));
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
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
            let o = self.disk.read(offset, buf);
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
        // the disk may acknowledge before the bytes are in (RAM store, `Disk::write_then`)
        self.disk.write_then(offset, data, |o| {
            self.complete(o, flight, move |e| match e {
                None => reply.written(n),
                Some(e) => reply.error(Errno::from_i32(e)),
            })
        });
        self.poller.idle();
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        // close(2)-time flush, not a device cache flush (that arrives as fsync)
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let flight = self.poller.arrived();
        let o = self.disk.flush();
        self.complete(o, flight, empty(reply));
    }

    fn fallocate(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, offset: u64, length: u64, mode: i32, reply: ReplyEmpty) {
        // the loop driver sends discard as PUNCH_HOLE|KEEP_SIZE and write-zeroes as ZERO_RANGE
        if mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) == 0 {
            // plain preallocation: the disk is fully allocated already
            return reply.ok();
        }
        let flight = self.poller.arrived();
        let o = self.disk.discard(offset, length);
        self.complete(o, flight, empty(reply));
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        if ino != ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [(ROOT, FileType::Directory, "."), (ROOT, FileType::Directory, ".."), (FILE, FileType::RegularFile, FILE_NAME)];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }
}
