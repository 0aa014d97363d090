//! The non-RAM stores through the whole path: `--store file:PATH` and `--store device:PATH
//! --destructive` (a loop device over a plain image here). Written blocks land at their offset
//! in the backing file or device, read back, and a discard (blkdiscard on the served device)
//! makes them read as zeroes on both sides.

mod common;
use common::*;
use std::process::Command;

/// Write blocks 0..16, read them back, discard blocks 4..8; `backing` is the file that ends
/// up holding the bytes (the store file, or the image under the device).
fn write_read_discard(s: &Serve, backing: &std::path::Path) {
    let d = s.open();
    write_blocks(&d, 0, 16, 11, |b| b + 1);
    for b in 0..16 {
        assert_eq!(read_block(&d, b).unwrap(), expected(b + 1, 11), "block {b} read back wrong");
    }
    drop(d);
    let st = Command::new("blkdiscard").args(["-o", &(4 * BS).to_string(), "-l", &(4 * BS).to_string()]).arg(&s.dev).status().unwrap();
    assert!(st.success(), "blkdiscard on {} failed", s.dev.display());
    let d = s.open();
    for b in 0..16 {
        let want = if (4..8).contains(&b) { vec![0u8; BS as usize] } else { expected(b + 1, 11) };
        assert_eq!(read_block(&d, b).unwrap(), want, "block {b} after the discard of 4..8");
    }
    drop(d);
    // the bytes are in the backing store, at their offsets (read past any cache: O_DIRECT)
    let f = faultline::workload::direct::DirectDev::open(backing).unwrap();
    for b in [0u64, 3, 5, 15] {
        let want = if (4..8).contains(&b) { vec![0u8; BS as usize] } else { expected(b + 1, 11) };
        assert_eq!(read_block(&f, b).unwrap(), want, "backing {} block {b}", backing.display());
    }
}

#[test]
fn file_store_holds_the_data_and_punches_holes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("disk.img");
    let s = Serve::start_args(&["--size", "64MiB", "--store", &format!("file:{}", path.display())], "rules: []\n");
    write_read_discard(&s, &path);
    s.stop();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 64 << 20, "the store file keeps its size");
}

#[test]
fn device_store_holds_the_data_and_discards() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("dev.img");
    std::fs::write(&img, vec![0u8; 64 << 20]).unwrap();
    let loopdev = LoopDev::attach(&img);
    let dev = loopdev.0.clone();
    let s = Serve::start_args(&["--store", &format!("device:{dev}"), "--destructive"], "rules: []\n");
    write_read_discard(&s, std::path::Path::new(&dev));
    s.stop();
    drop(loopdev);
}
