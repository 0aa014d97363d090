//! The dm-log-writes log format (the kernel's drivers/md/dm-log-writes.c, read by xfstests'
//! `src/log-writes/replay-log`): a write log a crash explorer replays to any point.
//!
//! ```text
//! byte 0                 super block, padded to one log sector:
//!                          le64 magic 0x6a736677736872, le64 version 1, le64 nr_entries, le32 sectorsize
//! byte sectorsize        entry 0: one sector of header (le64 sector, le64 nr_sectors, le64 flags,
//!                          le64 data_len, then the MARK's name, zero padded), then for a write
//!                          nr_sectors * sectorsize bytes of data (none for FLUSH, MARK, DISCARD)
//! ...                    entry 1, ...
//! ```
//!
//! `sector` and `nr_sectors` count log sectors (`sectorsize` bytes, the device's logical block
//! size in the kernel), not 512 B units. A FLUSH entry comes after every write that completed
//! before the flush was sent. The kernel logs a write or discard only when a later flush
//! completes, a FUA write when it completes and a mark when it is sent, so those two can come
//! before writes that completed earlier (docs/crash.md); faultline's recorder logs each write at
//! completion. replay-log refuses a header whose byte 32 is not zero unless its flags are
//! exactly MARK, so every other header is zero padded.

use anyhow::{Context, Result, bail};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

pub const MAGIC: u64 = 0x6a736677736872;
pub const VERSION: u64 = 1;
pub const FLUSH: u64 = 1 << 0;
pub const FUA: u64 = 1 << 1;
pub const DISCARD: u64 = 1 << 2;
pub const MARK: u64 = 1 << 3;
pub const METADATA: u64 = 1 << 4;
/// Size of an entry's fixed header fields.
const HEADER: usize = 32;

/// Appends entries to a log file; `finish` (or drop) writes the entry count into the super
/// block. The count is also written every `SYNC_EVERY` entries, so a log whose writer was
/// killed still reads up to about there.
pub struct LogWriter {
    out: BufWriter<File>,
    path: PathBuf,
    sectorsize: u32,
    entries: u64,
    finished: bool,
}

const SYNC_EVERY: u64 = 4096;

impl LogWriter {
    /// A new log at `path` (created or truncated) with log sectors of `sectorsize` bytes (a
    /// power of two, 512 to 64 KiB).
    pub fn create(path: &Path, sectorsize: u32) -> Result<LogWriter> {
        if !sectorsize.is_power_of_two() || !(512..=65536).contains(&sectorsize) {
            bail!("log sector size {sectorsize}: must be a power of two from 512 to 65536");
        }
        let f = File::create(path).with_context(|| format!("cannot create the write log {}", path.display()))?;
        let mut w = LogWriter { out: BufWriter::with_capacity(1 << 20, f), path: path.to_owned(), sectorsize, entries: 0, finished: false };
        w.out.write_all(&w.super_block())?;
        Ok(w)
    }

    pub fn sectorsize(&self) -> u32 {
        self.sectorsize
    }
    pub fn entries(&self) -> u64 {
        self.entries
    }
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn super_block(&self) -> Vec<u8> {
        let mut b = vec![0u8; self.sectorsize as usize];
        b[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&VERSION.to_le_bytes());
        b[16..24].copy_from_slice(&self.entries.to_le_bytes());
        b[24..28].copy_from_slice(&self.sectorsize.to_le_bytes());
        b
    }

    fn header(&mut self, sector: u64, nr_sectors: u64, flags: u64, data: &[u8]) -> Result<()> {
        let ss = self.sectorsize as usize;
        if data.len() > ss - HEADER {
            bail!("a mark's name is {} bytes; at most {} fit in a log sector", data.len(), ss - HEADER);
        }
        let mut h = vec![0u8; ss];
        h[0..8].copy_from_slice(&sector.to_le_bytes());
        h[8..16].copy_from_slice(&nr_sectors.to_le_bytes());
        h[16..24].copy_from_slice(&flags.to_le_bytes());
        h[24..32].copy_from_slice(&(data.len() as u64).to_le_bytes());
        h[HEADER..HEADER + data.len()].copy_from_slice(data);
        self.out.write_all(&h)?;
        self.entries += 1;
        if self.entries.is_multiple_of(SYNC_EVERY) {
            self.write_count()?;
        }
        Ok(())
    }

    /// A write of `data` at byte `off` (both whole log sectors), with FUA if `flags` says so.
    pub fn write(&mut self, off: u64, data: &[u8], flags: u64) -> Result<()> {
        let ss = self.sectorsize as u64;
        if !off.is_multiple_of(ss) || !(data.len() as u64).is_multiple_of(ss) || data.is_empty() {
            bail!("a logged write must cover whole {ss} B sectors (offset {off}, {} bytes)", data.len());
        }
        self.header(off / ss, data.len() as u64 / ss, flags & (FUA | METADATA | FLUSH), &[])?;
        self.out.write_all(data)?;
        Ok(())
    }

    /// A completed flush (no data).
    pub fn flush(&mut self) -> Result<()> {
        self.header(0, 0, FLUSH, &[])
    }

    /// A discard of [off, off+len) (whole log sectors; the log holds no data for it).
    pub fn discard(&mut self, off: u64, len: u64) -> Result<()> {
        let ss = self.sectorsize as u64;
        if !off.is_multiple_of(ss) || !len.is_multiple_of(ss) || len == 0 {
            bail!("a logged discard must cover whole {ss} B sectors (offset {off}, {len} bytes)");
        }
        self.header(off / ss, len / ss, DISCARD, &[])
    }

    /// A named mark (replay-log's `--end-mark NAME`).
    pub fn mark(&mut self, name: &str) -> Result<()> {
        if name.is_empty() || name.contains('\0') {
            bail!("mark name {name:?}: must be non-empty, without NUL bytes");
        }
        self.header(0, 0, MARK, name.as_bytes())
    }

    fn write_count(&mut self) -> Result<()> {
        self.out.flush()?;
        self.out.get_ref().write_all_at(&self.entries.to_le_bytes(), 16)?;
        Ok(())
    }

    /// Write out everything and the final entry count.
    pub fn finish(mut self) -> Result<u64> {
        self.finish_inner()?;
        Ok(self.entries)
    }

    fn finish_inner(&mut self) -> Result<()> {
        if !self.finished {
            self.finished = true;
            self.write_count()?;
            self.out.get_ref().sync_all()?;
        }
        Ok(())
    }
}

impl Drop for LogWriter {
    fn drop(&mut self) {
        let _ = self.finish_inner();
    }
}

/// What one entry does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Data at `data_at` (byte offset in the log file).
    Write {
        data_at: u64,
    },
    Discard,
    Flush,
    Mark(String),
}

/// One log entry (offsets in bytes of the logged device).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub index: u64,
    pub off: u64,
    pub len: u64,
    pub flags: u64,
    pub kind: Kind,
}

impl Entry {
    pub fn fua(&self) -> bool {
        self.flags & FUA != 0
    }
    /// A write that also carried a preflush (the kernel logs REQ_PREFLUSH writes as FLUSH
    /// with data): everything completed before it is durable.
    pub fn preflush(&self) -> bool {
        self.flags & FLUSH != 0 && matches!(self.kind, Kind::Write { .. })
    }
}

/// A log opened for reading: the entries' headers in memory, the data read on demand.
pub struct Log {
    file: File,
    pub path: PathBuf,
    pub sectorsize: u32,
    pub entries: Vec<Entry>,
}

impl Log {
    /// Read every entry header of the log at `path` (the super block's count of them).
    pub fn open(path: &Path) -> Result<Log> {
        let file = File::open(path).with_context(|| format!("cannot open the write log {}", path.display()))?;
        let size = file.metadata()?.len();
        let bad = |what: String| anyhow::anyhow!("{}: not a dm-log-writes log: {what}", path.display());
        let mut sb = [0u8; 28];
        file.read_exact_at(&mut sb, 0).map_err(|_| bad(format!("{size} bytes, shorter than a super block")))?;
        let le64 = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        if le64(&sb, 0) != MAGIC {
            return Err(bad(format!("magic {:#x}, expected {MAGIC:#x}", le64(&sb, 0))));
        }
        if le64(&sb, 8) != VERSION {
            return Err(bad(format!("version {}, expected {VERSION}", le64(&sb, 8))));
        }
        let n = le64(&sb, 16);
        let ss = u32::from_le_bytes(sb[24..28].try_into().unwrap());
        if !ss.is_power_of_two() || !(512..=65536).contains(&ss) {
            return Err(bad(format!("sector size {ss}")));
        }
        let ssz = ss as u64;
        let mut entries = Vec::with_capacity(n.min(1 << 20) as usize);
        let mut pos = ssz;
        let mut h = vec![0u8; ss as usize];
        for i in 0..n {
            if pos + ssz > size {
                return Err(bad(format!("the super block counts {n} entries, the file ends in entry {i} (byte {pos})")));
            }
            file.read_exact_at(&mut h, pos)?;
            let (sector, nr, flags, dlen) = (le64(&h, 0), le64(&h, 8), le64(&h, 16), le64(&h, 24));
            if flags == 0 && nr == 0 {
                return Err(bad(format!("entry {i} (byte {pos}) is all zeroes")));
            }
            pos += ssz;
            let (off, len) = (sector * ssz, nr * ssz);
            let kind = if flags & MARK != 0 {
                let d = dlen.min(ssz - HEADER as u64) as usize;
                Kind::Mark(String::from_utf8_lossy(&h[HEADER..HEADER + d]).into_owned())
            } else if flags & DISCARD != 0 {
                Kind::Discard
            } else if nr > 0 {
                let at = pos;
                pos += len;
                if pos > size {
                    return Err(bad(format!("entry {i}'s data ends past the end of the file")));
                }
                Kind::Write { data_at: at }
            } else if flags & FLUSH != 0 {
                Kind::Flush
            } else {
                return Err(bad(format!("entry {i} (byte {}): flags {flags:#x} with no sectors", pos - ssz)));
            };
            entries.push(Entry { index: i, off, len, flags, kind });
        }
        Ok(Log { file, path: path.to_owned(), sectorsize: ss, entries })
    }

    /// Read `buf.len()` bytes of entry `e`'s data starting `skip` bytes into it.
    pub fn data(&self, e: &Entry, skip: u64, buf: &mut [u8]) -> Result<()> {
        let Kind::Write { data_at } = e.kind else { bail!("entry {} has no data", e.index) };
        if skip + buf.len() as u64 > e.len {
            bail!("entry {}: {} bytes at {skip} are past its {} bytes", e.index, buf.len(), e.len);
        }
        self.file.read_exact_at(buf, data_at + skip)?;
        Ok(())
    }

    /// The index of the first MARK entry named `name`.
    pub fn find_mark(&self, name: &str) -> Option<usize> {
        self.entries.iter().position(|e| matches!(&e.kind, Kind::Mark(m) if m == name))
    }

    /// The device size the log needs: the end of its furthest write or discard.
    pub fn extent(&self) -> u64 {
        self.entries.iter().map(|e| e.off + e.len).max().unwrap_or(0)
    }
}

/// Apply entries `[0, upto)` of `log` onto `out` at their offsets (a discard writes zeroes):
/// the device as it was after entry `upto - 1` completed, what replay-log --limit `upto`
/// produces with --discard on a device that zeroes discarded ranges.
pub fn replay_into(log: &Log, upto: usize, out: &File) -> Result<()> {
    let mut buf = Vec::new();
    for e in &log.entries[..upto.min(log.entries.len())] {
        match e.kind {
            Kind::Write { .. } => {
                buf.resize(e.len as usize, 0);
                log.data(e, 0, &mut buf)?;
                out.write_all_at(&buf, e.off)?;
            }
            Kind::Discard => {
                buf.clear();
                buf.resize(e.len as usize, 0);
                out.write_all_at(&buf, e.off)?;
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("fl-logwrites-{}-{name}", std::process::id()))
    }

    #[test]
    fn roundtrip_every_kind() {
        let p = tmp("rt");
        let mut w = LogWriter::create(&p, 512).unwrap();
        w.write(4096, &[7u8; 1024], 0).unwrap();
        w.flush().unwrap();
        w.mark("start").unwrap();
        w.write(0, &[9u8; 512], FUA).unwrap();
        w.discard(8192, 4096).unwrap();
        assert_eq!(w.finish().unwrap(), 5);
        let l = Log::open(&p).unwrap();
        assert_eq!(l.sectorsize, 512);
        let k: Vec<_> = l.entries.iter().map(|e| (e.off, e.len, e.flags, e.kind.clone())).collect();
        assert_eq!(k[0].0, 4096);
        assert_eq!(k[0].1, 1024);
        assert!(matches!(k[1].3, Kind::Flush));
        assert_eq!(k[2].3, Kind::Mark("start".into()));
        assert_eq!(k[3].2, FUA);
        assert_eq!((k[4].0, k[4].1, k[4].3.clone()), (8192, 4096, Kind::Discard));
        let mut b = [0u8; 1024];
        l.data(&l.entries[0], 0, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 7));
        assert_eq!(l.find_mark("start"), Some(2));
        assert_eq!(l.extent(), 12288);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn refuses_what_is_not_a_log() {
        let p = tmp("bad");
        std::fs::write(&p, vec![1u8; 4096]).unwrap();
        let e = format!("{:#}", Log::open(&p).err().unwrap());
        assert!(e.contains("not a dm-log-writes log") && e.contains("magic"), "{e}");
        // a count larger than the entries present
        let mut w = LogWriter::create(&p, 512).unwrap();
        w.flush().unwrap();
        w.finish().unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(&5u64.to_le_bytes(), 16).unwrap();
        let e = format!("{:#}", Log::open(&p).err().unwrap());
        assert!(e.contains("counts 5 entries"), "{e}");
        assert!(LogWriter::create(&p, 1000).is_err());
        std::fs::remove_file(&p).unwrap();
    }
}
