//! varmail's `replace: true`: the atomic replace of a file (temp written whole, fsynced,
//! renamed over the file, directory fsynced), and the claim of a file a descriptor opened.

use super::flowop::{Flowop, Kind, append_size};
use super::shared::Shared;
use super::worker::{Worker, options};
use crate::spec::workload::config::CONTENT_BLOCK;
use crate::workload::WriteEvent;
use crate::workload::op::fill;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// The temp file of `replace` beside `path`: its name with `.tmp` appended (file set names are
/// numbers, so it names no file of the set).
pub fn temp_name(path: &std::path::Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
}

impl Shared<'_> {
    /// Make file `i` busy if it still is the file a descriptor opened (it exists, at
    /// `generation`), waiting while another thread holds it busy, as `pick_wait` does.
    pub(super) fn claim(&self, i: usize, generation: u64) -> bool {
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
}

impl Worker<'_, '_> {
    /// `replace: true`: rewrite the file open on descriptor `fo.fd` as applications replace a
    /// file atomically: new content of the file's size plus an append, written whole to a new
    /// temp file beside it, the temp fsynced, renamed over the file, and with `fsync_dir` the
    /// directory fsynced. The file stays busy throughout (no other thread deletes or replaces
    /// it meanwhile); one deleted or re-created since the descriptor opened it is skipped. The
    /// descriptor keeps the old file, which the sequence's next flowop closes.
    pub(super) fn replace(&mut self, fo: Flowop) {
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

    pub(super) fn replace_claimed(&mut self, i: usize) {
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
    pub(super) fn discard(&mut self, t: usize, tmp: &std::path::Path) {
        if std::fs::remove_file(tmp).is_ok()
            && let Some(o) = &self.sh.oracle
        {
            o.deleted(t);
        }
    }
}
