//! The store crash states are served from: a read-only base (a RAM store holding a prefix of
//! the log, advanced epoch by epoch) under a sparse overlay of 4 KiB blocks holding the
//! state's own writes and whatever the check and the mount write. Switching states clears the
//! overlay and moves the base: no state costs a copy of the disk.
//!
//! The base only moves while the device is idle (between states: nothing mounted, nothing in
//! flight), so requests never see it change under them.

use super::states::{Keep, Plan, TORN_SECTOR};
use crate::disk::Store;
use crate::disk::logwrites::{Kind, Log};
use crate::disk::store::RamStore;
use anyhow::{Context, Result};
use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex, RwLock};

const BLK: u64 = 4096;

pub struct Overlay {
    base: RamStore,
    /// Entries of the log applied to the base.
    base_at: Mutex<usize>,
    top: RwLock<HashMap<u64, Box<[u8]>>>,
    size: u64,
}

/// The `Store` the disk is built over (the explorer keeps another handle to switch states).
pub struct OverlayStore(pub Arc<Overlay>);

impl Overlay {
    pub fn new(size: u64) -> Result<Arc<Overlay>> {
        Ok(Arc::new(Overlay { base: RamStore::new(size)?, base_at: Mutex::new(0), top: RwLock::new(HashMap::new()), size }))
    }

    /// Bytes held by the overlay now.
    pub fn overlay_bytes(&self) -> u64 {
        self.top.read().unwrap().len() as u64 * BLK
    }

    fn apply_entry(&self, log: &Log, i: usize, buf: &mut Vec<u8>, to_base: bool) -> Result<()> {
        let e = &log.entries[i];
        match e.kind {
            Kind::Write { .. } => {
                buf.resize(e.len as usize, 0);
                log.data(e, 0, buf)?;
            }
            Kind::Discard => {
                buf.clear();
                buf.resize(e.len as usize, 0);
            }
            _ => return Ok(()),
        }
        let end = (e.off + e.len).min(self.size);
        if e.off >= end {
            return Ok(());
        }
        let data = &buf[..(end - e.off) as usize];
        if to_base { self.base.write(e.off, data) } else { self.write_top(e.off, data) }.with_context(|| format!("log entry {i}"))
    }

    /// Serve state `p`: the base moved to `p.base_end` entries (rebuilt from an empty disk when
    /// it is past them), the overlay emptied and given the state's own writes.
    pub fn switch(&self, log: &Log, p: &Plan) -> Result<()> {
        let mut at = self.base_at.lock().unwrap();
        let mut buf = Vec::new();
        if *at > p.base_end {
            self.base.discard(0, self.size)?;
            *at = 0;
        }
        for i in *at..p.base_end {
            self.apply_entry(log, i, &mut buf, true)?;
        }
        *at = p.base_end;
        self.top.write().unwrap().clear();
        for k in &p.keep {
            match k {
                Keep::Whole(i) => self.apply_entry(log, *i, &mut buf, false)?,
                Keep::Sectors(i, mask) => {
                    let e = &log.entries[*i];
                    buf.resize(e.len as usize, 0);
                    log.data(e, 0, &mut buf)?;
                    for (s, keep) in mask.iter().enumerate() {
                        let at = s as u64 * TORN_SECTOR;
                        let n = TORN_SECTOR.min(e.len - at);
                        if *keep && e.off + at + n <= self.size {
                            self.write_top(e.off + at, &buf[at as usize..(at + n) as usize])?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn write_top(&self, off: u64, data: &[u8]) -> io::Result<()> {
        let mut top = self.top.write().unwrap();
        let mut done = 0usize;
        while done < data.len() {
            let pos = off + done as u64;
            let (b, inb) = (pos / BLK, (pos % BLK) as usize);
            let n = (BLK as usize - inb).min(data.len() - done);
            let blk = match top.get_mut(&b) {
                Some(x) => x,
                None => {
                    let mut fresh = vec![0u8; BLK as usize].into_boxed_slice();
                    if n < BLK as usize {
                        self.base.read(b * BLK, &mut fresh)?;
                    }
                    top.entry(b).or_insert(fresh)
                }
            };
            blk[inb..inb + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
        Ok(())
    }
}

impl Store for OverlayStore {
    fn read(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let top = self.0.top.read().unwrap();
        if top.is_empty() {
            return self.0.base.read(off, buf);
        }
        let mut done = 0usize;
        while done < buf.len() {
            let pos = off + done as u64;
            let (b, inb) = (pos / BLK, (pos % BLK) as usize);
            let n = (BLK as usize - inb).min(buf.len() - done);
            match top.get(&b) {
                Some(x) => buf[done..done + n].copy_from_slice(&x[inb..inb + n]),
                None => self.0.base.read(pos, &mut buf[done..done + n])?,
            }
            done += n;
        }
        Ok(())
    }
    fn write(&self, off: u64, data: &[u8]) -> io::Result<()> {
        if off.checked_add(data.len() as u64).is_none_or(|e| e > self.0.size) {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        self.0.write_top(off, data)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn discard(&self, off: u64, len: u64) -> io::Result<()> {
        // zeroes in the overlay: the base stays as the state left it
        let zero = vec![0u8; BLK as usize];
        let mut at = off;
        while at < off + len {
            let n = (BLK - at % BLK).min(off + len - at);
            self.write(at, &zero[..n as usize])?;
            at += n;
        }
        Ok(())
    }
    fn size(&self) -> u64 {
        self.0.size
    }
    fn describe(&self) -> String {
        "crash state (RAM base + overlay)".into()
    }
    fn update(&self, off: u64, len: usize, f: &mut dyn FnMut(&mut [u8]) -> bool) -> io::Result<bool> {
        let mut b = vec![0u8; len];
        self.read(off, &mut b)?;
        let changed = f(&mut b);
        if changed {
            self.write(off, &b)?;
        }
        Ok(changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crash::states::{StateId, Variant, epochs, plan};
    use crate::disk::logwrites::LogWriter;

    #[test]
    fn states_materialize_as_the_log_says() {
        let p = std::env::temp_dir().join(format!("fl-overlay-{}", std::process::id()));
        let mut w = LogWriter::create(&p, 512).unwrap();
        w.write(0, &[1u8; 4096], 0).unwrap();
        w.flush().unwrap();
        w.write(0, &[2u8; 1024], 0).unwrap();
        w.write(8192, &[3u8; 4096], 0).unwrap();
        w.flush().unwrap();
        w.finish().unwrap();
        let log = Log::open(&p).unwrap();
        let eps = epochs(&log);
        assert_eq!(eps.len(), 2);
        let o = Overlay::new(1 << 20).unwrap();
        let s = OverlayStore(o.clone());
        let read = |off: u64| {
            let mut b = [0u8; 4096];
            s.read(off, &mut b).unwrap();
            b
        };
        o.switch(&log, &plan(&log, &eps, StateId { epoch: 1, variant: Variant::Boundary }, 0).unwrap()).unwrap();
        assert_eq!(read(0)[..1024], [2u8; 1024]);
        assert_eq!(read(0)[1024..], [1u8; 3072]);
        assert_eq!(read(8192), [3u8; 4096]);
        // back to an earlier state: the base is rebuilt
        o.switch(&log, &plan(&log, &eps, StateId { epoch: 0, variant: Variant::Boundary }, 0).unwrap()).unwrap();
        assert_eq!(read(0), [1u8; 4096]);
        assert_eq!(read(8192), [0u8; 4096]);
        // torn variants keep 512 B sectors of epoch 1's writes over epoch 0
        for k in 0..8 {
            let pl = plan(&log, &eps, StateId { epoch: 1, variant: Variant::Torn(k) }, 7).unwrap();
            o.switch(&log, &pl).unwrap();
            let b = read(0);
            for s in 0..8 {
                let v = b[s * 512];
                assert!(b[s * 512..(s + 1) * 512].iter().all(|&x| x == v));
                assert!(v == 1 || (v == 2 && s < 2), "sector {s} holds {v}");
            }
            // the same id gives the same state
            let again = plan(&log, &eps, StateId { epoch: 1, variant: Variant::Torn(k) }, 7).unwrap();
            assert_eq!(again.keep, pl.keep);
        }
        std::fs::remove_file(&p).unwrap();
    }
}
