//! The FUSE wire format as the ring front end needs it (include/uapi/linux/fuse.h, 7.42). fuser
//! keeps its own copy private, so the few structs the ring path reads and writes are here: the
//! request and reply headers, the per-op headers of the ops a one-file disk gets, and the ring
//! entry layout of FUSE over io_uring. All little-endian, `repr(C)`, read and written unaligned.

use std::time::{SystemTime, UNIX_EPOCH};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

// opcodes the ring path answers (others get ENOSYS)
pub const LOOKUP: u32 = 1;
pub const GETATTR: u32 = 3;
pub const SETATTR: u32 = 4;
pub const OPEN: u32 = 14;
pub const READ: u32 = 15;
pub const WRITE: u32 = 16;
pub const STATFS: u32 = 17;
pub const RELEASE: u32 = 18;
pub const FSYNC: u32 = 20;
pub const FLUSH: u32 = 25;
pub const OPENDIR: u32 = 27;
pub const READDIR: u32 = 28;
pub const RELEASEDIR: u32 = 29;
pub const FSYNCDIR: u32 = 30;
pub const FALLOCATE: u32 = 43;

/// `FATTR_SIZE` in `fuse_setattr_in.valid`.
pub const FATTR_SIZE: u32 = 1 << 3;
/// `FOPEN_DIRECT_IO` in `fuse_open_out.open_flags`.
pub const FOPEN_DIRECT_IO: u32 = 1 << 0;

// io_uring commands on /dev/fuse (enum fuse_uring_cmd)
pub const CMD_REGISTER: u32 = 1;
pub const CMD_COMMIT_AND_FETCH: u32 = 2;

/// `struct fuse_in_header`: the request header, in the ring entry's `in_out`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct InHeader {
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    pub total_extlen: u16,
    pub padding: u16,
}

/// `struct fuse_out_header`: the reply header, written over `in_out`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct OutHeader {
    pub len: u32,
    pub error: i32,
    pub unique: u64,
}

/// `struct fuse_read_in` (READ, READDIR).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct ReadIn {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub read_flags: u32,
    pub lock_owner: u64,
    pub flags: u32,
    pub padding: u32,
}

/// `struct fuse_write_in` (WRITE; the data is the payload).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct WriteIn {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub write_flags: u32,
    pub lock_owner: u64,
    pub flags: u32,
    pub padding: u32,
}

/// `struct fuse_write_out`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct WriteOut {
    pub size: u32,
    pub padding: u32,
}

/// `struct fuse_fallocate_in`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct FallocateIn {
    pub fh: u64,
    pub offset: u64,
    pub length: u64,
    pub mode: u32,
    pub padding: u32,
}

/// `struct fuse_setattr_in` (only `valid` and `size` are looked at).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct SetattrIn {
    pub valid: u32,
    pub padding: u32,
    pub fh: u64,
    pub size: u64,
    pub rest: [u64; 8],
}

/// `struct fuse_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
    pub flags: u32,
}

/// `struct fuse_attr_out` (GETATTR, SETATTR).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct AttrOut {
    pub attr_valid: u64,
    pub attr_valid_nsec: u32,
    pub dummy: u32,
    pub attr: Attr,
}

/// `struct fuse_entry_out` (LOOKUP).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct EntryOut {
    pub nodeid: u64,
    pub generation: u64,
    pub entry_valid: u64,
    pub attr_valid: u64,
    pub entry_valid_nsec: u32,
    pub attr_valid_nsec: u32,
    pub attr: Attr,
}

/// `struct fuse_open_out` (OPEN, OPENDIR).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct OpenOut {
    pub fh: u64,
    pub open_flags: u32,
    pub backing_id: i32,
}

/// `struct fuse_kstatfs` inside `fuse_statfs_out`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct StatfsOut {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
    pub padding: u32,
    pub spare: [u32; 6],
}

/// `struct fuse_dirent` without its name (name follows, padded to 8 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct DirentHead {
    pub ino: u64,
    pub off: u64,
    pub namelen: u32,
    pub typ: u32,
}

/// `struct fuse_uring_ent_in_out`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct EntInOut {
    pub flags: u64,
    /// the request's `unique`: what COMMIT_AND_FETCH names
    pub commit_id: u64,
    /// bytes of the payload buffer used (request args in, reply args out)
    pub payload_sz: u32,
    pub padding: u32,
    pub reserved: u64,
}

/// `struct fuse_uring_req_header`: one ring entry's header buffer.
#[repr(C, align(64))]
pub struct RingHeader {
    /// `fuse_in_header` of the request, `fuse_out_header` of the reply
    pub in_out: [u8; 128],
    /// the request's first argument (its per-op header)
    pub op_in: [u8; 128],
    pub ent: EntInOut,
}

/// `struct fuse_uring_cmd_req`, the 80-byte command area of the SQE128 (first 24 bytes).
pub fn cmd_req(commit_id: u64, qid: u16) -> [u8; 80] {
    let mut c = [0u8; 80];
    c[8..16].copy_from_slice(&commit_id.to_le_bytes());
    c[16..18].copy_from_slice(&qid.to_le_bytes());
    c
}

/// Read a wire struct from the start of `b` (short input reads as zero-filled).
pub fn get<T: FromBytes + IntoBytes + Default>(b: &[u8]) -> T {
    let mut v = T::default();
    let n = b.len().min(size_of::<T>());
    v.as_mut_bytes()[..n].copy_from_slice(&b[..n]);
    v
}

/// Write a wire struct to the start of `b`; returns its size. `b` must be large enough.
pub fn put<T: IntoBytes + Immutable>(b: &mut [u8], v: &T) -> usize {
    let n = size_of::<T>();
    assert!(b.len() >= n, "reply buffer too small");
    b[..n].copy_from_slice(v.as_bytes());
    n
}

fn split(t: SystemTime) -> (u64, u32) {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    (d.as_secs(), d.subsec_nanos())
}

/// fuser's attributes (the classic path's, `fuse::attr`) in wire form: both paths answer alike.
pub fn attr_from(a: &fuser::FileAttr) -> Attr {
    let (atime, atimensec) = split(a.atime);
    let (mtime, mtimensec) = split(a.mtime);
    let (ctime, ctimensec) = split(a.ctime);
    let kind = match a.kind {
        fuser::FileType::Directory => libc::S_IFDIR,
        _ => libc::S_IFREG,
    };
    Attr {
        ino: a.ino.0,
        size: a.size,
        blocks: a.blocks,
        atime,
        mtime,
        ctime,
        atimensec,
        mtimensec,
        ctimensec,
        mode: kind | a.perm as u32,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize,
        flags: a.flags,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sizes the kernel expects (fuse.h); a wrong one would misread every request.
    #[test]
    fn wire_sizes_match_the_kernel() {
        assert_eq!(size_of::<InHeader>(), 40);
        assert_eq!(size_of::<OutHeader>(), 16);
        assert_eq!(size_of::<ReadIn>(), 40);
        assert_eq!(size_of::<WriteIn>(), 40);
        assert_eq!(size_of::<WriteOut>(), 8);
        assert_eq!(size_of::<FallocateIn>(), 32);
        assert_eq!(size_of::<SetattrIn>(), 88);
        assert_eq!(size_of::<Attr>(), 88);
        assert_eq!(size_of::<AttrOut>(), 104);
        assert_eq!(size_of::<EntryOut>(), 128);
        assert_eq!(size_of::<OpenOut>(), 16);
        assert_eq!(size_of::<StatfsOut>(), 80);
        assert_eq!(size_of::<DirentHead>(), 24);
        assert_eq!(size_of::<EntInOut>(), 32);
        assert_eq!(std::mem::offset_of!(RingHeader, ent), 256);
    }

    #[test]
    fn cmd_req_layout() {
        let c = cmd_req(0x0102030405060708, 3);
        assert_eq!(&c[..8], &[0; 8]);
        assert_eq!(u64::from_le_bytes(c[8..16].try_into().unwrap()), 0x0102030405060708);
        assert_eq!(u16::from_le_bytes(c[16..18].try_into().unwrap()), 3);
    }
}
