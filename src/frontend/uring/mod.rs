//! FUSE over io_uring: the disk's requests arrive as io_uring completions instead of reads of
//! /dev/fuse, and each reply goes back together with the fetch of the next request in one
//! `COMMIT_AND_FETCH` command (kernel 6.14+, fs/fuse/dev_uring.c). No Rust crate implements
//! it, so the protocol is here; fuser still mounts, answers INIT and handles the few messages
//! that never take the ring (FORGET, INTERRUPT), and serves everything if the ring is off.
//!
//! The kernel keeps one queue per possible CPU and puts a request on the queue of the CPU
//! that issued it; the ring takes over only when every queue has an entry registered. By
//! default (`ring_threads` 0) each queue has its own ring and thread, pinned to the queue's
//! CPU as libfuse does, and while requests come one at a time one thread drives all rings
//! and busy-polls them (`shared.rs`). `ring_threads` n gives n threads, each with its own ring
//! and every n-th queue, busy-polling on their own (1: one thread sees every request); the
//! busy poll stays one spinner per process (`poll.rs`). Each entry owns a header buffer and a
//! 1 MiB payload buffer (max_write); READ data is produced straight into the payload the
//! kernel copies from, WRITE data is consumed from it: no copy of our own on either path.
//!
//! Differences from the classic path, by construction of the protocol:
//! - A reply is a commit of the entry, which also refills its payload with the next request,
//!   so a write is acknowledged once its data is copied into the store (the classic path may
//!   acknowledge as soon as the RAM store's locks are held, `Disk::write_then`); content
//!   hashing runs on the way in, from the payload while it is hot (hashing the stored copy
//!   after the reply read it back from memory, BENCHMARKS.md), and edits on the stored copy
//!   after the reply, under the same locks (`Disk::write_then_copied`).
//! - A delayed request holds its entry until its reply (64 per queue); more delayed requests
//!   than that wait in the kernel's queue, like requests on a device with that queue depth.

pub mod abi;
mod shared;

use super::fuse::{self, NodeAttrs};
use super::guard;
use super::poll::{InFlight, Poller};
use crate::disk::store::Lent;
use crate::disk::{Disk, Outcome};
use crate::sys::timer::Timed;
use abi::RingHeader;
use anyhow::{Context, Result, bail};
use io_uring::{IoUring, cqueue, opcode, squeue, types};
use shared::Shared;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Entries (requests in flight to the daemon) per queue: the loop device's default queue depth
/// is 128 over all CPUs.
const ENTRIES_PER_QUEUE: usize = 64;
/// Payload buffer per entry: the kernel requires max(max_write, max_pages * 4 KiB); both are
/// 1 MiB here (fs.fuse.max_pages_limit = 256).
const PAYLOAD: usize = fuse::MAX_WRITE as usize;
/// user_data of the eventfd read that wakes the ring to stop.
const WAKE: u64 = u64::MAX;
/// user_data of a poll, on this ring, of another ring's completion queue (`shared.rs`): this
/// value minus the other ring's index. Entries' user_data (their index) stays far below.
const WATCH: u64 = u64::MAX - 1;
/// user_data from here up is one of the above, not an entry's index.
const TAGS: u64 = WATCH - u16::MAX as u64;
/// How long registration waits for the kernel to finish INIT (the REGISTER command answers
/// EAGAIN until then).
const INIT_WAIT: Duration = Duration::from_secs(5);
/// A delayed reply's last stretch is spun: a timed wait in io_uring_enter overshoots more than
/// the delay thread's futex wait, so this spin is longer than the delay thread's (BENCHMARKS.md).
const DELAY_SPIN: Duration = Duration::from_micros(100);

pub use crate::spec::disk::RingMode;

const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";
/// The lock around `PARAM`: one path for the whole machine, like the setting it guards (not
/// under the run directory, which FAULTLINE_RUN_DIR moves per process).
const SWITCH_LOCK: &str = "/run/faultline/fuse-uring.lock";

/// `FAULTLINE_RING=off` makes this machine look like one whose kernel lacks FUSE over io_uring:
/// `auto` serves over /dev/fuse and `on` fails, each saying why. It exists to run everything
/// over the classic path on a kernel that has the ring (the test suite's second pass).
pub const ENV: &str = "FAULTLINE_RING";

/// Why FUSE over io_uring cannot be had here, known before trying: turned off by `ENV`, or a
/// kernel without it. `None` does not promise that it works (registration may still fail).
/// A value of `ENV` other than `off`, `auto` or empty is an error: a typo must not silently
/// leave the ring on.
pub fn unavailable() -> Result<Option<String>> {
    match std::env::var(ENV).as_deref() {
        Ok("off") => return Ok(Some(format!("turned off by {ENV}=off"))),
        Ok("auto" | "") | Err(std::env::VarError::NotPresent) => {}
        Ok(v) => bail!("{ENV}={v} is not understood; allowed: off, auto (or unset)"),
        Err(e) => bail!("{ENV}: {e}"),
    }
    if !std::path::Path::new(PARAM).exists() {
        return Ok(Some(format!("this kernel has no FUSE over io_uring ({PARAM} is missing; it needs Linux 6.14+ built with CONFIG_FUSE_IO_URING)")));
    }
    Ok(None)
}

/// The kernel's switch for FUSE over io_uring, on for as long as this guard lives. It is a
/// global module parameter, off by default; the kernel reads it when it sends INIT and when a
/// ring command arrives, but a connection whose INIT asked for io_uring keeps it after the
/// switch goes back off. So it is turned on for one mount's INIT and registration only, under
/// a lock shared by all faultline processes, and put back as it was.
pub struct Switch {
    _lock: std::fs::File,
    restore: bool,
}

impl Switch {
    pub fn on() -> Result<Switch> {
        if let Some(why) = unavailable()? {
            bail!(why);
        }
        let path = std::path::Path::new(SWITCH_LOCK);
        let dir = path.parent().expect("the lock path has a directory");
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let lock =
            std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(path).with_context(|| format!("cannot open {}", path.display()))?;
        // SAFETY: a valid fd; blocks until other faultline processes have put the switch back
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            bail!("cannot lock {}: {}", path.display(), std::io::Error::last_os_error());
        }
        let was = std::fs::read_to_string(PARAM).with_context(|| format!("cannot read {PARAM}"))?;
        let restore = was.trim() != "Y";
        if restore {
            std::fs::write(PARAM, "Y").with_context(|| format!("cannot turn on FUSE over io_uring in {PARAM}"))?;
        }
        Ok(Switch { _lock: lock, restore })
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        if self.restore
            && let Err(e) = std::fs::write(PARAM, "N")
        {
            eprintln!("faultline: cannot turn {PARAM} back off: {e}");
        }
    }
}

/// Possible CPUs: the kernel's number of ring queues.
fn possible_cpus() -> Result<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible").context("cannot read /sys/devices/system/cpu/possible")?;
    let mut n = 0;
    for part in s.trim().split(',') {
        // "0-3" or "5": the highest CPU number counts
        let last = part.rsplit('-').next().unwrap_or(part);
        n = n.max(last.parse::<usize>()? + 1);
    }
    if n == 0 || n > u16::MAX as usize {
        bail!("cannot count the possible CPUs from '{}'", s.trim());
    }
    Ok(n)
}

/// One ring entry: a slot for one request at a time.
struct Slot {
    qid: u16,
    header: Box<RingHeader>,
    /// anonymous, on 4 KiB pages (`mem::map` uses huge pages from 2 MiB): untouched pages
    /// cost no memory, a 4 KiB request touches one
    payload: crate::mem::Mapping,
    iov: Box<[libc::iovec; 2]>,
    /// the kernel holds this entry's command (registered, or committed and fetching)
    live: bool,
}

/// A delayed reply, kept as a `Timed<Late>` (due at its `at`). The ring thread keeps its own
/// timers: handing replies back from the delay thread (eventfd, task work, a wake-up of this
/// thread) would add several times a short delay's length (BENCHMARKS.md).
struct Late {
    slot: usize,
    unique: u64,
    errno: Option<i32>,
    len: u32,
    _flight: InFlight,
}

type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

/// What the ring thread is given to serve, once the mount exists.
struct Start {
    disk: Arc<Disk>,
    fuse_fd: OwnedFd,
    poller: Arc<Poller>,
    attrs: NodeAttrs,
}

/// One ring thread: its ring serves some of the kernel's queues.
struct Worker {
    start: mpsc::Sender<Start>,
    done: mpsc::Receiver<Result<()>>,
    thread: std::thread::JoinHandle<()>,
    /// each thread waits on its own eventfd read: one poke wakes one reader
    wake: Arc<OwnedFd>,
}

/// Ring threads whose rings and buffers exist, not yet registered with a FUSE connection.
/// Made before the mount, so that INIT asks for io_uring only when the ring can be had.
/// Dropped unserved, their channels close and the threads end (dropping their rings).
pub struct Prepared {
    workers: Vec<Worker>,
    stop: Arc<AtomicBool>,
    shared: Option<Arc<Shared>>,
}

/// The rings serving a disk.
pub struct RingServer {
    threads: Vec<(std::thread::JoinHandle<()>, Arc<OwnedFd>)>,
    stop: Arc<AtomicBool>,
    shared: Option<Arc<Shared>>,
}

/// Which queues ring thread `t` of `threads` serves: every `threads`-th from `t`, so with one
/// thread per queue thread `t` serves the queue of CPU `t`.
fn queues_of(t: usize, threads: usize, queues: usize) -> Vec<u16> {
    (t..queues).step_by(threads).map(|q| q as u16).collect()
}

fn eventfd() -> Result<OwnedFd> {
    // SAFETY: eventfd takes no pointers; the result is checked
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        bail!("eventfd: {}", std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn poke(fd: RawFd) {
    let one = 1u64;
    // SAFETY: writes the 8 bytes of `one`, alive across the call, to our eventfd
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

impl Prepared {
    /// Start `threads` ring threads (0: one per queue, i.e. per possible CPU; at most that)
    /// and let each set up its ring and buffers. With one thread per queue, thread `t` is
    /// pinned to CPU `t`, whose requests its queue receives.
    pub fn new(threads: usize) -> Result<Prepared> {
        let queues = possible_cpus()?;
        let threads = if threads == 0 { queues } else { threads.min(queues) };
        let stop = Arc::new(AtomicBool::new(false));
        let wakes = (0..threads).map(|_| eventfd().map(Arc::new)).collect::<Result<Vec<_>>>()?;
        // one ring per queue: served together (`shared.rs`)
        let shared = (threads == queues && threads > 1).then(|| Arc::new(Shared::new(wakes.clone())));
        let mut me = Prepared { workers: Vec::with_capacity(threads), stop, shared: shared.clone() };
        for (t, wake) in wakes.into_iter().enumerate() {
            let (start_tx, start_rx) = mpsc::channel();
            let (done_tx, done_rx) = mpsc::channel();
            let (w, s) = (wake.clone(), me.stop.clone());
            let qids = queues_of(t, threads, queues);
            let sh = shared.as_ref().map(|sh| (sh.clone(), t));
            let thread = std::thread::Builder::new()
                .name(if threads == 1 { "faultline-ring".into() } else { format!("faultline-ring{t}") })
                .spawn(move || ring_thread(qids, sh, start_rx, done_tx, w, s))
                .context("cannot start a ring thread")?;
            me.workers.push(Worker { start: start_tx, done: done_rx, thread, wake });
        }
        for w in &me.workers {
            match w.done.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => bail!("a ring thread ended while setting up"),
            }
        }
        Ok(me)
    }

    /// Register every entry with the mounted connection (after its INIT) and serve.
    pub fn serve(self, disk: Arc<Disk>, fuse_fd: OwnedFd, poller: Arc<Poller>, attrs: NodeAttrs) -> Result<RingServer> {
        let mut sent = Vec::with_capacity(self.workers.len());
        for w in &self.workers {
            let fd = fuse_fd.try_clone().context("cannot dup the /dev/fuse fd for a ring thread")?;
            sent.push(w.start.send(Start { disk: disk.clone(), fuse_fd: fd, poller: poller.clone(), attrs: attrs.clone() }).is_ok());
        }
        drop(fuse_fd);
        let mut result = Ok(());
        for (w, sent) in self.workers.iter().zip(sent) {
            let r = if sent {
                w.done.recv().unwrap_or_else(|_| Err(anyhow::anyhow!("a ring thread ended while registering")))
            } else {
                Err(anyhow::anyhow!("a ring thread ended before registering"))
            };
            if result.is_ok() {
                result = r;
            }
        }
        let server = RingServer { threads: self.workers.into_iter().map(|w| (w.thread, w.wake)).collect(), stop: self.stop, shared: self.shared };
        result.map(|()| server)
    }
}

impl RingServer {
    /// End the ring threads. Call after unmounting (the kernel has then ended every entry);
    /// earlier, requests could be stranded on entries nobody serves.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for (_, wake) in &self.threads {
            poke(wake.as_raw_fd());
        }
        if let Some(sh) = &self.shared {
            sh.unpark();
        }
        for (t, _) in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for RingServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn ring_thread(
    qids: Vec<u16>,
    shared: Option<(Arc<Shared>, usize)>,
    start: mpsc::Receiver<Start>,
    done: mpsc::Sender<Result<()>>,
    wake: Arc<OwnedFd>,
    stop: Arc<AtomicBool>,
) {
    // a per-queue ring's owner runs on its queue's CPU, where the kernel queues its requests
    if let Some((_, cpu)) = &shared {
        let cpu = *cpu;
        let mut set = nix::sched::CpuSet::new();
        // a CPU that cannot be pinned to (offline, outside our cpuset) leaves the thread free
        if set.set(cpu).is_ok() {
            let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
        }
    }
    let setup = || -> Result<(Ring, Vec<Slot>)> {
        let n = qids.len() * ENTRIES_PER_QUEUE;
        // every entry's command, the wake read, and a poll of each other ring (`shared.rs`)
        let sq = (n + 1 + possible_cpus()?).next_power_of_two() as u32;
        // COOP_TASKRUN: no IPI per new request while this thread runs (it enters the kernel
        // soon anyway; asleep, it is still woken); SINGLE_ISSUER: only this thread submits,
        // not for per-queue rings, which several threads serve (`shared.rs`). Older kernels:
        // plain ring.
        let mut b = IoUring::<squeue::Entry128, cqueue::Entry>::builder();
        b.setup_coop_taskrun();
        if shared.is_none() {
            b.setup_single_issuer();
        }
        let ring = b
            .build(sq)
            .or_else(|_| IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(sq))
            .context("cannot create an io_uring with 128-byte entries (io_uring disabled, or a kernel before 5.19)")?;
        let mut slots = Vec::with_capacity(n);
        for &q in &qids {
            for _ in 0..ENTRIES_PER_QUEUE {
                let mut header = Box::new(RingHeader { in_out: [0; 128], op_in: [0; 128], ent: Default::default() });
                let mut payload = crate::mem::Mapping::new(PAYLOAD).with_context(|| format!("cannot map a {PAYLOAD}-byte ring buffer"))?;
                let iov = Box::new([
                    libc::iovec { iov_base: (&mut *header as *mut RingHeader).cast(), iov_len: size_of::<RingHeader>() },
                    libc::iovec { iov_base: payload.as_mut_ptr().cast(), iov_len: PAYLOAD },
                ]);
                slots.push(Slot { qid: q, header, payload, iov, live: false });
            }
        }
        Ok((ring, slots))
    };
    let (mut ring, mut slots) = match setup() {
        Ok(x) => {
            let _ = done.send(Ok(()));
            x
        }
        Err(e) => {
            let _ = done.send(Err(e));
            return;
        }
    };
    let Ok(Start { disk, fuse_fd, poller, attrs }) = start.recv() else { return };
    let early = match register(&mut ring, &mut slots, fuse_fd.as_raw_fd(), &qids) {
        Ok(early) => {
            let _ = done.send(Ok(()));
            early
        }
        Err(e) => {
            let _ = done.send(Err(e));
            return;
        }
    };
    let server = Server { disk, poller, attrs, fuse_fd: fuse_fd.as_raw_fd(), late: BinaryHeap::new(), seq: 0, commits: Vec::new() };
    // the default 50 µs timer slack would make every timed wait for a delayed reply late
    // SAFETY: PR_SET_TIMERSLACK takes a value, no pointer; it affects this thread only
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64) };
    let station = Station::new(ring, slots, server, early, wake);
    let station = match shared {
        Some((shared, t)) => shared.own(t, station, &stop),
        None => {
            let mut st = station;
            st.run(true, &stop);
            st
        }
    };
    station.close();
    drop(fuse_fd);
}

/// The 128-byte command SQE for one entry: REGISTER carries the entry's two buffers
/// (iovec array in `addr`, count in `len`), COMMIT_AND_FETCH names the request it answers.
fn ring_cmd(fuse_fd: RawFd, op: u32, commit_id: u64, qid: u16, iov: Option<*const libc::iovec>, idx: usize) -> squeue::Entry128 {
    let mut b = opcode::UringCmd80::new(types::Fd(fuse_fd), op).cmd(abi::cmd_req(commit_id, qid));
    if let Some(iov) = iov {
        b = b.addr(Some(iov as u64));
    }
    let e = b.build().user_data(idx as u64);
    if op != abi::CMD_REGISTER {
        return e;
    }
    // the io-uring crate has no setter for a URING_CMD's `len` (struct io_uring_sqe: u32 at
    // byte 24); Entry128 is the repr(C) 128-byte SQE
    const _: () = assert!(size_of::<squeue::Entry128>() == 128);
    // SAFETY: Entry128 is repr(C), 128 bytes (checked above) of integer fields: plain bytes
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(e) };
    raw[24..28].copy_from_slice(&2u32.to_le_bytes());
    // SAFETY: any 128 bytes are a valid Entry128 (integer fields); these are an SQE with one
    // more field set
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

/// Register all entries; retry while the kernel is still processing INIT. Returns any
/// completions that are already requests (the ring goes live with the last queue's first
/// entry, and a request may arrive at once).
fn register(ring: &mut Ring, slots: &mut [Slot], fuse_fd: RawFd, qids: &[u16]) -> Result<Vec<(u64, i32)>> {
    let until = Instant::now() + INIT_WAIT;
    let mut early = Vec::new();
    let mut todo: Vec<usize> = (0..slots.len()).collect();
    let mut failed: Option<i32> = None;
    while !todo.is_empty() {
        for &i in &todo {
            let e = ring_cmd(fuse_fd, abi::CMD_REGISTER, 0, slots[i].qid, Some(slots[i].iov.as_ptr()), i);
            // SAFETY: the entry's buffers live in `slots` for the ring's lifetime
            unsafe { ring.submission().push(&e).expect("ring sized for every entry") };
            slots[i].live = true;
        }
        ring.submit().context("cannot submit ring registrations")?;
        let mut again = Vec::new();
        for c in ring.completion() {
            let (i, res) = (c.user_data() as usize, c.result());
            if res >= 0 {
                early.push((i as u64, res));
            } else if res == -libc::EAGAIN {
                slots[i].live = false;
                again.push(i);
            } else {
                slots[i].live = false;
                failed.get_or_insert(-res);
            }
        }
        todo = again;
        if !todo.is_empty() {
            if Instant::now() > until {
                bail!("the FUSE connection did not finish INIT within {INIT_WAIT:?} (ring registration kept answering EAGAIN)");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    // the ring serves only once every queue has an entry
    let covered = qids.iter().all(|&q| slots.iter().any(|s| s.live && s.qid == q));
    match failed {
        Some(e) if !covered => bail!("the kernel refused FUSE over io_uring: {}", std::io::Error::from_raw_os_error(e)),
        Some(e) => eprintln!("faultline: some ring entries were refused ({}); serving with the rest", std::io::Error::from_raw_os_error(e)),
        None => {}
    }
    Ok(early)
}

/// The reply to the request in an entry: the out header, the used payload length, and the
/// COMMIT_AND_FETCH that sends it and asks for the entry's next request.
fn commit_sqe(fuse_fd: RawFd, header: &mut RingHeader, qid: u16, idx: usize, unique: u64, errno: Option<i32>, len: u32) -> squeue::Entry128 {
    let len = if errno.is_some() { 0 } else { len };
    let out = abi::OutHeader { len: (size_of::<abi::OutHeader>() as u32) + len, error: errno.map_or(0, |e| -e), unique };
    abi::put(&mut header.in_out, &out);
    header.ent.payload_sz = len;
    ring_cmd(fuse_fd, abi::CMD_COMMIT_AND_FETCH, unique, qid, None, idx)
}

/// What a request's handler decided.
enum Reply {
    /// reply now: an error, or success with this many payload bytes
    Now(Option<i32>, u32),
    /// the reply is due later (`Server::late`)
    Later,
    /// the reply is already submitted
    Sent,
}

/// What serving a ring needs besides the ring itself: the disk, and the replies it owes.
struct Server {
    disk: Arc<Disk>,
    poller: Arc<Poller>,
    attrs: NodeAttrs,
    fuse_fd: RawFd,
    /// delayed replies, earliest first
    late: BinaryHeap<Reverse<Timed<Late>>>,
    seq: u64,
    commits: Vec<squeue::Entry128>,
}

/// One ring with its entries and what it owes: all a thread needs to serve it, so that one
/// thread can serve another's ring (`shared.rs`).
struct Station {
    ring: Ring,
    slots: Vec<Slot>,
    server: Server,
    /// completions taken from the ring, not yet served
    cqes: Vec<(u64, i32)>,
    /// entries the kernel still holds: serving ends when the unmount has given all back
    live: usize,
    wake: Arc<OwnedFd>,
    /// the other rings whose completion queue this ring has a poll on (`watch`)
    watching: Vec<bool>,
    /// the eventfd read is queued; only the ring's own thread queues it (`rearm`): a request
    /// belongs to the thread that submitted it, and its completion would need that thread
    wake_armed: bool,
    /// the eventfd read stays queued when serving ends, and a late poke completes it into
    /// this buffer, possibly after the ring is gone: it is never freed (8 bytes)
    wake_buf: &'static mut u64,
}

// SAFETY: the raw pointers a station holds (the entries' iovecs, the ring's mappings) point
// into buffers it owns, which move with it; one thread at a time uses it (`&mut`, a mutex)
unsafe impl Send for Station {}

impl Station {
    fn new(ring: Ring, slots: Vec<Slot>, server: Server, early: Vec<(u64, i32)>, wake: Arc<OwnedFd>) -> Station {
        let live = slots.iter().filter(|s| s.live).count();
        let mut st = Station { ring, slots, server, cqes: early, live, wake, watching: Vec::new(), wake_armed: false, wake_buf: Box::leak(Box::new(0u64)) };
        st.rearm();
        st
    }

    /// Queue the eventfd read that wakes this ring's own thread, if it is not queued. Only
    /// that thread calls this.
    fn rearm(&mut self) {
        if self.wake_armed {
            return;
        }
        self.wake_armed = true;
        let buf: *mut u64 = &mut *self.wake_buf;
        let e: squeue::Entry128 = opcode::Read::new(types::Fd(self.wake.as_raw_fd()), buf.cast(), 8).build().user_data(WAKE).into();
        // SAFETY: the buffer is leaked: it outlives the read
        unsafe { self.ring.submission().push(&e).expect("ring has room for the wake read") };
    }

    /// Requests among the completions taken; those taken in one sweep came in together
    /// (poll.rs: not serial).
    fn requests(&self) -> usize {
        self.cqes.iter().filter(|(ud, res)| *ud < TAGS && *res >= 0).count()
    }

    /// Serve the completions taken, part of a sweep of `batch` requests.
    fn serve(&mut self, batch: usize) {
        let mut cqes = std::mem::take(&mut self.cqes);
        for (ud, res) in cqes.drain(..) {
            if ud == WAKE {
                self.wake_armed = false;
                continue;
            }
            if ud >= TAGS {
                if let Some(w) = self.watching.get_mut((WATCH - ud) as usize) {
                    *w = false;
                }
                continue;
            }
            let i = ud as usize;
            if res < 0 {
                // ENOTCONN / ECANCELED: the connection is gone or the entry torn down
                if std::mem::replace(&mut self.slots[i].live, false) {
                    self.live -= 1;
                }
                continue;
            }
            self.server.request(&mut self.ring, &mut self.slots[i], i, batch);
        }
        self.cqes = cqes;
    }

    /// Make the delayed replies that are due, and queue every reply made so far on the ring.
    fn due(&mut self) {
        let now = Instant::now();
        while self.server.late.peek().is_some_and(|Reverse(l)| l.at <= now) {
            let Reverse(l) = self.server.late.pop().unwrap();
            self.server.disk.engine().log.delay_lateness.record(l.at.elapsed());
            let l = l.item;
            self.server.commit(&mut self.slots[l.slot], l.slot, l.unique, l.errno, l.len);
        }
        let mut sq = self.ring.submission();
        for e in self.server.commits.drain(..) {
            // SAFETY: commit SQEs carry no pointers (the entries' buffers were registered)
            unsafe { sq.push(&e).expect("one commit per entry fits") };
        }
    }

    /// Poll, on this ring, ring `o`'s completion queue (fd `fd`), if no such poll is queued:
    /// a completion there then wakes this ring's wait.
    fn watch(&mut self, o: usize, fd: RawFd) {
        if self.watching.len() <= o {
            self.watching.resize(o + 1, false);
        }
        if std::mem::replace(&mut self.watching[o], true) {
            return;
        }
        let e: squeue::Entry128 = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32).build().user_data(WATCH - o as u64).into();
        // SAFETY: a poll carries no buffer
        unsafe { self.ring.submission().push(&e).expect("ring has room for a poll per ring") };
    }

    fn fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }

    /// Take the ring's completions.
    fn take(&mut self) {
        self.cqes.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
    }

    fn pending(&mut self) -> bool {
        !self.ring.completion().is_empty()
    }

    fn finished(&self) -> bool {
        self.live == 0
    }

    /// Submit what is queued and wait: for a delayed reply due soon (spinning), until shortly
    /// before a later one, or for a request (busy-polling first if `spin` and poll.rs allows)
    /// but at most `bound`. False when the ring failed and serving must end. Only the ring's
    /// own thread waits on it.
    fn wait(&mut self, spin: bool, bound: Option<Duration>) -> bool {
        self.rearm();
        let Station { ring, server, .. } = self;
        let r = match server.late.peek().map(|Reverse(l)| l.at) {
            // a delayed reply is due soon: spin to its deadline, yielding (the yield is the
            // kernel entry that runs task work, so new requests still come in meanwhile)
            Some(at) if at.saturating_duration_since(Instant::now()) <= DELAY_SPIN => ring.submit().inspect(|_| {
                while ring.completion().is_empty() && Instant::now() < at {
                    // SAFETY: a plain syscall without arguments
                    unsafe { libc::sched_yield() };
                }
            }),
            // later: sleep until shortly before it, or until a request comes
            Some(at) => {
                let ts = types::Timespec::from(at.saturating_duration_since(Instant::now()).saturating_sub(DELAY_SPIN));
                ring.submitter().submit_with_args(1, &types::SubmitArgs::new().timespec(&ts))
            }
            // at queue depth 1, poll for the next request instead of sleeping (poll.rs)
            None if spin && server.poller.may_spin() => ring.submit().and_then(|_| {
                server.poller.idle_until(|| !ring.completion().is_empty());
                if ring.completion().is_empty() { ring.submit_and_wait(1) } else { Ok(0) }
            }),
            None => match bound {
                Some(b) => ring.submitter().submit_with_args(1, &types::SubmitArgs::new().timespec(&types::Timespec::from(b))),
                None => ring.submit_and_wait(1),
            },
        };
        ring_ok(r)
    }

    /// Submit what is queued without waiting; false as `wait`.
    fn submit(&mut self) -> bool {
        ring_ok(self.ring.submit())
    }

    /// Serve this ring alone until stopped or unmounted.
    fn run(&mut self, spin: bool, stop: &AtomicBool) {
        loop {
            let batch = self.requests();
            self.serve(batch);
            if stop.load(Ordering::Acquire) || self.finished() {
                return;
            }
            self.due();
            if !self.wait(spin, None) {
                return;
            }
            self.take();
        }
    }

    /// Close the ring. The kernel writes a request into an entry's buffers as long as it holds
    /// the entry's command: if an entry was never given back (stopped before the unmount ended
    /// them), its buffers stay mapped rather than free memory the kernel may still write.
    fn close(self) {
        let all_back = !self.slots.iter().any(|s| s.live);
        drop(self.ring);
        if !all_back {
            std::mem::forget(self.slots);
        }
    }
}

/// Whether a submit or wait leaves the ring usable (interruptions and timeouts do).
fn ring_ok(r: std::io::Result<usize>) -> bool {
    match r {
        Ok(_) => true,
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EBUSY) | Some(libc::EAGAIN) | Some(libc::ETIME)) => true,
        Err(e) => {
            eprintln!("faultline: ring: {e}");
            false
        }
    }
}

impl Server {
    /// Queue the reply to the request in `slot` (and the fetch of its next request).
    fn commit(&mut self, slot: &mut Slot, idx: usize, unique: u64, errno: Option<i32>, len: u32) {
        self.commits.push(commit_sqe(self.fuse_fd, &mut slot.header, slot.qid, idx, unique, errno, len));
    }

    fn request(&mut self, ring: &mut Ring, slot: &mut Slot, idx: usize, batch: usize) {
        let h: abi::InHeader = abi::get(&slot.header.in_out);
        let flight = self.poller.arrived_among(batch);
        let reply = self.handle(ring, &h, slot, idx, flight);
        if let Reply::Now(errno, len) = reply {
            self.commit(slot, idx, h.unique, errno, len);
        }
    }

    /// Answer one request: the same answers as the classic path (`fuse.rs`).
    fn handle(&mut self, ring: &mut Ring, h: &abi::InHeader, slot: &mut Slot, idx: usize, flight: InFlight) -> Reply {
        let in_len = (slot.header.ent.payload_sz as usize).min(PAYLOAD);
        let op_in = slot.header.op_in;
        let Slot { qid, header, payload, .. } = slot;
        let qid = *qid;
        let payload = &mut payload[..];
        let ok = |n: usize| Reply::Now(None, n as u32);
        let err = |e: i32| Reply::Now(Some(e), 0);
        match h.opcode {
            abi::READ => {
                let r: abi::ReadIn = abi::get(&op_in);
                let len = (r.size as u64).min(self.disk.size().saturating_sub(r.offset)).min(PAYLOAD as u64) as usize;
                let o = guard::guarded("read", r.offset, len as u64, || self.disk.read(r.offset, &mut payload[..len]));
                self.finish(o, len as u32, h.unique, idx, flight)
            }
            abi::WRITE => {
                let w: abi::WriteIn = abi::get(&op_in);
                let n = in_len.min(w.size as usize);
                let (fuse_fd, unique) = (self.fuse_fd, h.unique);
                let mut out = None;
                let mut sent = false;
                // the payload is lent to the store and comes back with the acknowledgement, which
                // the RAM store gives once the bytes are stored (and hashed on the way in): the
                // reply can go out there, and its commit refills this payload with the next
                // request while the store still edits, under locks that hold off later requests
                let disk = &self.disk;
                let r = guard::caught(|| {
                    disk.write_then_copied(w.offset, Lent::new(&mut *payload, n), |o, buf| {
                        if o.errno.is_none() && o.delay.is_none_or(|d| d.is_zero()) {
                            let len = abi::put(buf, &abi::WriteOut { size: n as u32, padding: 0 });
                            let e = commit_sqe(fuse_fd, header, qid, idx, unique, None, len as u32);
                            // SAFETY: the commit's buffers are the entry's, registered for the ring's
                            // lifetime; the payload is not touched again until its next request
                            unsafe { ring.submission().push(&e) }.expect("one commit per entry fits");
                            // an interrupted submit leaves it queued for the loop's next submit
                            let _ = ring.submit();
                            sent = true;
                        }
                        out = Some(o);
                    })
                });
                if let Err(m) = &r {
                    // answered already if the reply went out before the panic
                    guard::report("write", w.offset, n as u64, m, if sent { "after its reply" } else { "answered with EIO" });
                    out = Some(guard::eio());
                }
                let o = out.expect("write_then always acknowledges");
                if sent {
                    drop(flight);
                    return Reply::Sent;
                }
                let len = abi::put(payload, &abi::WriteOut { size: n as u32, padding: 0 });
                self.finish(o, len as u32, h.unique, idx, flight)
            }
            abi::FSYNC => {
                let o = guard::guarded("flush", 0, 0, || self.disk.flush());
                self.finish(o, 0, h.unique, idx, flight)
            }
            abi::FALLOCATE => {
                let f: abi::FallocateIn = abi::get(&op_in);
                if !fuse::fallocate_discards(f.mode as i32) {
                    return ok(0);
                }
                let o = guard::guarded("discard", f.offset, f.length, || self.disk.discard(f.offset, f.length));
                self.finish(o, 0, h.unique, idx, flight)
            }
            abi::LOOKUP => {
                let name = payload[..in_len].split(|&b| b == 0).next().unwrap_or(&[]);
                match self.attrs.lookup(h.nodeid, name) {
                    Some(a) => {
                        let ttl = fuse::TTL.as_secs();
                        let e =
                            abi::EntryOut { nodeid: a.ino.0, generation: 0, entry_valid: ttl, attr_valid: ttl, attr: abi::attr_from(&a), ..Default::default() };
                        ok(abi::put(payload, &e))
                    }
                    None => err(libc::ENOENT),
                }
            }
            abi::GETATTR => self.attr_reply(h.nodeid, payload),
            abi::SETATTR => {
                let s: abi::SetattrIn = abi::get(&op_in);
                if s.valid & abi::FATTR_SIZE != 0 && s.size != self.disk.size() {
                    return err(libc::EPERM);
                }
                self.attr_reply(h.nodeid, payload)
            }
            abi::OPEN | abi::OPENDIR => match self.attrs.open_flags(h.nodeid, h.opcode == abi::OPENDIR) {
                Ok(flags) => ok(abi::put(payload, &abi::OpenOut { fh: 0, open_flags: flags, backing_id: 0 })),
                Err(e) => err(e),
            },
            abi::READDIR => {
                let r: abi::ReadIn = abi::get(&op_in);
                if h.nodeid != fuse::ROOT.0 {
                    return err(libc::ENOTDIR);
                }
                let mut at = 0;
                let max = (r.size as usize).min(PAYLOAD);
                for (i, (ino, kind, name)) in fuse::root_entries().iter().enumerate().skip(r.offset as usize) {
                    let rec = (size_of::<abi::DirentHead>() + name.len()).next_multiple_of(8);
                    if at + rec > max {
                        break;
                    }
                    let typ = if *kind == fuser::FileType::Directory { libc::DT_DIR } else { libc::DT_REG } as u32;
                    abi::put(&mut payload[at..], &abi::DirentHead { ino: ino.0, off: (i + 1) as u64, namelen: name.len() as u32, typ });
                    let n0 = at + size_of::<abi::DirentHead>();
                    payload[n0..n0 + name.len()].copy_from_slice(name.as_bytes());
                    payload[n0 + name.len()..at + rec].fill(0);
                    at += rec;
                }
                ok(at)
            }
            abi::STATFS => {
                // what fuser answers by default on the classic path
                ok(abi::put(payload, &abi::StatfsOut { bsize: 512, namelen: 255, ..Default::default() }))
            }
            abi::FLUSH | abi::RELEASE | abi::RELEASEDIR | abi::FSYNCDIR => ok(0),
            _ => err(libc::ENOSYS),
        }
    }

    fn attr_reply(&self, ino: u64, payload: &mut [u8]) -> Reply {
        match self.attrs.attr(fuser::INodeNo(ino)) {
            Some(a) => {
                let out = abi::AttrOut { attr_valid: fuse::TTL.as_secs(), attr: abi::attr_from(&a), ..Default::default() };
                Reply::Now(None, abi::put(payload, &out) as u32)
            }
            None => Reply::Now(Some(libc::ENOENT), 0),
        }
    }

    /// Reply now, or at the delay's deadline (the entry waits with its data).
    fn finish(&mut self, o: Outcome, len: u32, unique: u64, idx: usize, flight: InFlight) -> Reply {
        match o.delay {
            Some(d) if !d.is_zero() => {
                self.seq += 1;
                self.late.push(Reverse(Timed {
                    at: Instant::now() + d,
                    seq: self.seq,
                    item: Late { slot: idx, unique, errno: o.errno, len, _flight: flight },
                }));
                Reply::Later
            }
            _ => {
                drop(flight);
                Reply::Now(o.errno, len)
            }
        }
    }
}
