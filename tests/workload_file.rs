//! The file interface on ext4 on a faultline disk: write, verify ok after a remount from the
//! saved maps; then a bit-flip rule aimed at one written block's content is reported as exactly
//! that file/block corrupted; a truncated file is short and a deleted one missing.

mod common;
use common::*;
use faultline::content::{block_hash, fill_block, hash_hex};
use faultline::verify::{BadBlock, verify};
use faultline::workload::{Interface, IoEngine, Maps, SyncMode, Workload, run};
use std::path::Path;
use std::process::Command;

/// An ext4 mount that is unmounted when dropped, even if the test fails.
struct Mount {
    dir: tempfile::TempDir,
    dev: std::path::PathBuf,
    mounted: bool,
}

impl Mount {
    fn new(dev: &Path) -> Mount {
        let ok = Command::new("mkfs.ext4").args(["-q", "-F"]).arg(dev).status().unwrap().success();
        assert!(ok, "mkfs.ext4 failed");
        let mut m = Mount { dir: tempfile::tempdir().unwrap(), dev: dev.to_path_buf(), mounted: false };
        m.mount();
        m
    }
    fn mount(&mut self) {
        assert!(Command::new("mount").args(["-t", "ext4"]).arg(&self.dev).arg(self.dir.path()).status().unwrap().success());
        self.mounted = true;
    }
    fn umount(&mut self) {
        if self.mounted {
            assert!(Command::new("umount").arg(self.dir.path()).status().unwrap().success());
            self.mounted = false;
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
        }
    }
}

#[test]
fn file_interface_on_ext4_verifies_and_locates_a_flipped_block() {
    for (engine, sync) in [(IoEngine::IoUring, SyncMode::Direct), (IoEngine::Psync, SyncMode::Fsync(8))] {
        let s = Serve::start("128MiB", "rules: []\n");
        let mut m = Mount::new(&s.dev);
        let mut w = Workload::new(Interface::File { dir: m.dir.path().join("data"), count: 4, size: 1 << 20 });
        w.threads = 2;
        w.engine = engine;
        w.iodepth = 4;
        w.sync = sync;
        w.pattern = faultline::workload::pattern::Pattern::Uniform;
        w.block_size = 8192;
        w.size = Some(6 << 20);
        w.seed = 3;
        let maps = Maps::new(&w).unwrap();
        let r = run(&w, &maps, None, None).unwrap();
        assert!(r.failed_ios.is_empty(), "{:?}", r.failed_ios);
        assert_eq!(r.write.ops, (6 << 20) / 8192);
        let saved = tempfile::tempdir().unwrap();
        maps.save(saved.path()).unwrap();
        // remount: verification reads what the disk holds, from the saved maps
        m.umount();
        m.mount();
        let maps = Maps::load(saved.path()).unwrap();
        let rep = verify(&maps).unwrap();
        assert_eq!(rep.files.len(), 4);
        assert!(rep.is_clean() && rep.counts.checked == maps.written_blocks() && rep.counts.checked > 500, "{engine:?} {sync:?}: {rep:?}");
        // flip a bit in every read of the content of file 2, block 7 (profile none: unique)
        let (blk, id) = maps.maps[2].written().nth(7).unwrap();
        let mut bytes = vec![0u8; 4096];
        fill_block(id, maps.seed, &mut bytes);
        s.add(&format!("rules:\n  - {{type: bitflip, op: read, target: {{hash: \"{}\"}}}}\n", hash_hex(block_hash(&bytes))));
        let rep = verify(&maps).unwrap();
        let bad: Vec<(usize, &BadBlock)> = rep.files.iter().flat_map(|f| f.bad.iter().map(move |b| (f.index, b))).collect();
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(matches!(bad[0], (2, BadBlock::Corrupted { block, expected_id, holds: None, .. }) if *block == blk && *expected_id == id), "{bad:?}");
        assert_eq!((rep.counts.corrupted, rep.counts.ok + 1), (1, rep.counts.checked));
        assert_eq!(rep.files[2].read_mode, "direct");
        s.clear();
        // a truncated file is short past its end, a deleted one missing
        let f1 = maps.file_path(1).unwrap();
        std::fs::OpenOptions::new().write(true).open(&f1).unwrap().set_len(256 << 10).unwrap();
        std::fs::remove_file(maps.file_path(3).unwrap()).unwrap();
        let rep = verify(&maps).unwrap();
        let beyond = maps.maps[1].written().filter(|(b, _)| *b >= 64).count() as u64;
        assert_eq!(rep.files[1].counts.short, beyond);
        assert_eq!(rep.files[3].counts.missing, maps.maps[3].written().count() as u64);
        assert_eq!(rep.files[3].read_mode, "missing");
        assert_eq!(rep.counts.ok + rep.counts.short + rep.counts.missing, rep.counts.checked);
        m.umount();
        drop(m);
        s.stop();
    }
}
