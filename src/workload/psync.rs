//! The psync engine: one pread/pwrite at a time per thread.

use super::config::CONTENT_BLOCK;
use super::direct::AlignedBuf;
use super::op::Worker;
use std::fs::File;
use std::os::unix::fs::FileExt;

pub fn run_thread(wk: &mut Worker, files: &[File]) {
    let bs = wk.sh.w.block_size as usize;
    let mut buf = AlignedBuf::new(bs);
    let mut ids = vec![0u64; bs / CONTENT_BLOCK as usize];
    while let Some(op) = wk.next_op(&mut buf, &mut ids) {
        let f = &files[op.slot];
        let io = |buf: &mut [u8]| if op.is_write { f.write_all_at(buf, op.offset) } else { f.read_exact_at(buf, op.offset) };
        let first = io(&mut buf);
        let res = if first.is_err() { wk.retry(first, || io(&mut buf)) } else { first };
        if wk.complete(&op, &ids, res, op.t0.elapsed()) {
            super::engine::sync_file(wk, f, op.slot, op.file);
        }
    }
}
