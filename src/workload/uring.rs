//! The io_uring engine: per thread a ring holding up to `iodepth` I/Os, on buffers registered
//! with the ring (fixed reads/writes; plain ones if registration is refused). Failed I/Os are
//! retried synchronously with pread/pwrite (`Worker::retry`).

use super::config::CONTENT_BLOCK;
use super::direct::AlignedBuf;
use super::op::{Op, Worker, io_result};
use anyhow::{Context, Result};
use io_uring::{IoUring, opcode, types};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::time::Instant;

pub fn run_thread(wk: &mut Worker, files: &[File]) -> Result<()> {
    let qd = wk.sh.w.iodepth as usize;
    let bs = wk.sh.w.block_size as usize;
    let per = bs / CONTENT_BLOCK as usize;
    let mut ring = IoUring::new(qd.next_power_of_two() as u32).context("cannot set up an io_uring")?;
    let mut bufs = AlignedBuf::new(qd * bs);
    let iov: Vec<libc::iovec> = (0..qd).map(|s| libc::iovec { iov_base: unsafe { bufs.as_mut_ptr().add(s * bs) } as *mut _, iov_len: bs }).collect();
    // SAFETY: the buffers outlive the ring (dropped after it, below) and are not moved
    let fixed = unsafe { ring.submitter().register_buffers(&iov) }.is_ok();
    let mut ids = vec![0u64; qd * per];
    let mut ops: Vec<Option<Op>> = (0..qd).map(|_| None).collect();
    let mut free: Vec<usize> = (0..qd).rev().collect();
    let mut inflight = 0usize;
    let mut exhausted = false;
    let mut done: Vec<(usize, i32)> = Vec::with_capacity(qd);
    loop {
        // fill the queue
        while !exhausted && inflight < qd {
            if let Some(d) = wk.rate_wait() {
                if inflight > 0 {
                    // wait for completions rather than sleep with I/O in flight
                    let ts = types::Timespec::from(d);
                    let args = types::SubmitArgs::new().timespec(&ts);
                    let _ = ring.submitter().submit_with_args(1, &args);
                    break;
                }
            }
            let s = free.pop().unwrap();
            let buf = &mut bufs[s * bs..(s + 1) * bs];
            let Some(op) = wk.next_op(buf, &mut ids[s * per..(s + 1) * per]) else {
                free.push(s);
                exhausted = true;
                break;
            };
            let fd = types::Fd(files[op.slot].as_raw_fd());
            let p = buf.as_mut_ptr();
            let e = match (op.is_write, fixed) {
                (true, true) => opcode::WriteFixed::new(fd, p, bs as u32, s as u16).offset(op.offset).build(),
                (true, false) => opcode::Write::new(fd, p, bs as u32).offset(op.offset).build(),
                (false, true) => opcode::ReadFixed::new(fd, p, bs as u32, s as u16).offset(op.offset).build(),
                (false, false) => opcode::Read::new(fd, p, bs as u32).offset(op.offset).build(),
            };
            // SAFETY: the buffer stays valid and untouched until its completion is reaped
            unsafe { ring.submission().push(&e.user_data(s as u64)) }.expect("ring has room for iodepth entries");
            ops[s] = Some(op);
            inflight += 1;
        }
        if inflight == 0 {
            if exhausted {
                break;
            }
            continue;
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) => return Err(e).context("io_uring_enter"),
        }
        done.clear();
        done.extend(ring.completion().map(|c| (c.user_data() as usize, c.result())));
        let now = Instant::now();
        for &(s, res) in &done {
            let op = ops[s].take().expect("completion for an issued slot");
            inflight -= 1;
            let f = &files[op.slot];
            let buf = &mut bufs[s * bs..(s + 1) * bs];
            let first = io_result(res, op.len);
            let retried = first.is_err();
            let res = if retried {
                let mut io = || if op.is_write { f.write_all_at(buf, op.offset) } else { f.read_exact_at(buf, op.offset) };
                wk.retry(first, &mut io)
            } else {
                first
            };
            let lat = if retried { op.t0.elapsed() } else { now - op.t0 };
            if wk.complete(&op, &ids[s * per..(s + 1) * per], res, lat) {
                super::engine::sync_file(wk, f, op.slot, op.file);
            }
            free.push(s);
        }
    }
    drop(ring);
    drop(bufs);
    Ok(())
}
