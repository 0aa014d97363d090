//! An NBD client, written from the protocol document: fixed-newstyle handshake with OPT_GO
//! (EXPORT_NAME for servers that do not know it), simple replies only (the client never asks
//! for structured replies, so every server must answer simply), compact headers, requests up
//! to 32 MiB (larger ones are split).
//!
//! Several requests are in flight at once: callers on different threads share a small pool of
//! connections (several only when the server says CAN_MULTI_CONN); on each connection one
//! waiting caller at a time reads replies and hands them to the other waiters by cookie. A request without a reply
//! within the policy's `timeout` kills its connection (the other requests on it fail too and
//! are re-sent by their callers on a fresh one); failed and timed-out requests are retried
//! `retries` times with exponential backoff. `Counters` say what that cost.

use super::sock::Sock;
use super::{self as p};
use crate::spec::nbd::{NbdEndpoint, NbdTarget};
use std::collections::HashMap;
use std::io::{self, IoSlice, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Largest request sent (the reference server refuses more than 32 MiB).
const MAX_REQUEST: u64 = 32 << 20;

/// What the client did, since it was made (all counters only grow).
#[derive(Default)]
pub struct Counters {
    pub requests: AtomicU64,
    /// Attempts after the first, over all requests.
    pub retries: AtomicU64,
    /// Attempts that got no reply within the timeout.
    pub timeouts: AtomicU64,
    /// Attempts the server answered with an error.
    pub remote_errors: AtomicU64,
    /// Attempts whose connection broke (or could not be made).
    pub connection_errors: AtomicU64,
    /// Connections made after the first ones.
    pub reconnects: AtomicU64,
    /// Requests that failed after all retries.
    pub failed: AtomicU64,
    /// Time spent on requests beyond their first attempt (timeouts waited out, backoff, retries).
    pub retry_ns: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CounterSnapshot {
    pub requests: u64,
    pub retries: u64,
    pub timeouts: u64,
    pub remote_errors: u64,
    pub connection_errors: u64,
    pub reconnects: u64,
    pub failed: u64,
    pub retry_ns: u64,
}

impl Counters {
    pub fn snapshot(&self) -> CounterSnapshot {
        CounterSnapshot {
            requests: self.requests.load(Relaxed),
            retries: self.retries.load(Relaxed),
            timeouts: self.timeouts.load(Relaxed),
            remote_errors: self.remote_errors.load(Relaxed),
            connection_errors: self.connection_errors.load(Relaxed),
            reconnects: self.reconnects.load(Relaxed),
            failed: self.failed.load(Relaxed),
            retry_ns: self.retry_ns.load(Relaxed),
        }
    }
}

impl CounterSnapshot {
    /// What happened between `earlier` and this snapshot.
    pub fn since(&self, earlier: &CounterSnapshot) -> CounterSnapshot {
        CounterSnapshot {
            requests: self.requests - earlier.requests,
            retries: self.retries - earlier.retries,
            timeouts: self.timeouts - earlier.timeouts,
            remote_errors: self.remote_errors - earlier.remote_errors,
            connection_errors: self.connection_errors - earlier.connection_errors,
            reconnects: self.reconnects - earlier.reconnects,
            failed: self.failed - earlier.failed,
            retry_ns: self.retry_ns - earlier.retry_ns,
        }
    }
}

/// What a client did over one interval (`sample_intervals`).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct IntervalCounts {
    /// End of the interval, seconds since the start.
    pub t: f64,
    #[serde(flatten)]
    pub counts: CounterSnapshot,
}

/// Read `read()` every `interval` from `start` until `done`, and return what changed per
/// interval (a final shorter one included when something happened in it). `read` returns the
/// counters (summed over clients), None when there are none to read.
pub fn sample_intervals(start: Instant, interval: Duration, done: &AtomicBool, read: impl Fn() -> Option<CounterSnapshot>) -> Vec<IntervalCounts> {
    let mut out = Vec::new();
    let Some(mut last) = read() else { return out };
    let mut k = 1u32;
    loop {
        let due = interval * k;
        let finished = loop {
            if done.load(Relaxed) {
                break true;
            }
            let now = start.elapsed();
            if now >= due {
                break false;
            }
            std::thread::sleep((due - now).min(Duration::from_millis(20)));
        };
        let Some(now) = read() else { return out };
        let d = now.since(&last);
        if !finished || d != CounterSnapshot::default() {
            out.push(IntervalCounts { t: start.elapsed().as_secs_f64(), counts: d });
        }
        last = now;
        if finished {
            return out;
        }
        k += 1;
    }
}

/// Why one attempt failed.
enum Fail {
    /// The server's error reply (host errno).
    Remote(i32),
    /// No reply in time.
    Timeout,
    /// The connection broke or could not be made.
    Lost(io::Error),
}

fn lost(e: &io::Error) -> Fail {
    Fail::Lost(io::Error::new(e.kind(), e.to_string()))
}

/// A caller waiting for its reply.
struct Waiter {
    /// Bytes of data that follow a successful reply (reads).
    read_len: usize,
    done: Mutex<Option<Result<Vec<u8>, Fail>>>,
    cv: Condvar,
}

impl Waiter {
    fn finish(&self, r: Result<Vec<u8>, Fail>) {
        *self.done.lock().unwrap() = Some(r);
        self.cv.notify_one();
    }
}

/// Bytes received ahead of their use: a recv takes what is there (a 4 KiB read's header and
/// data, or several replies), larger data goes straight to its destination.
const RX_BUF: usize = 64 << 10;

/// The receiving side of a connection, held by the one caller reading for all (`Conn::lead`).
struct Rx {
    sock: Sock,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

/// How a receive ended short of its bytes.
enum RxErr {
    /// The reading caller's deadline passed.
    Deadline,
    Io(io::Error),
}

impl Rx {
    fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// Wait until the socket is readable, at most until `deadline`.
    fn wait(fd: RawFd, deadline: Instant) -> Result<(), RxErr> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(RxErr::Deadline);
        }
        let ts = libc::timespec { tv_sec: left.as_secs() as libc::time_t, tv_nsec: left.subsec_nanos() as libc::c_long };
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd and a valid timespec, both live for the call; no signal mask.
        let n = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
        match n {
            0 => Err(RxErr::Deadline),
            n if n > 0 => Ok(()),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted { Ok(()) } else { Err(RxErr::Io(e)) }
            }
        }
    }

    /// One receive into `dst` once the socket is readable: bytes received (0 at EOF).
    fn recv(fd: RawFd, dst: &mut [u8], deadline: Instant) -> Result<usize, RxErr> {
        loop {
            Self::wait(fd, deadline)?;
            // SAFETY: dst is a valid writable buffer of dst.len() bytes for the call.
            let n = unsafe { libc::recv(fd, dst.as_mut_ptr().cast(), dst.len(), libc::MSG_DONTWAIT) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => {}
                _ => return Err(RxErr::Io(e)),
            }
        }
    }

    /// Fill `dst` exactly: from the buffer, then from the socket (large rests straight into
    /// `dst`, small ones through the buffer so a recv also takes what follows).
    fn read_exact(&mut self, dst: &mut [u8], deadline: Instant) -> Result<(), RxErr> {
        let mut got = 0;
        while got < dst.len() {
            if self.start < self.end {
                let n = (self.end - self.start).min(dst.len() - got);
                dst[got..got + n].copy_from_slice(&self.buf[self.start..self.start + n]);
                self.start += n;
                got += n;
                continue;
            }
            self.start = 0;
            self.end = 0;
            let want = dst.len() - got;
            let n = if want >= RX_BUF / 2 {
                Self::recv(self.fd(), &mut dst[got..], deadline)?
            } else {
                let n = Self::recv(self.fd(), &mut self.buf[..], deadline)?;
                self.end = n;
                n
            };
            if n == 0 {
                return Err(RxErr::Io(io::Error::new(io::ErrorKind::UnexpectedEof, "the server closed the connection")));
            }
            if want >= RX_BUF / 2 {
                got += n;
            }
        }
        Ok(())
    }
}

/// One connection in transmission phase.
///
/// No reader thread: a caller waiting for its reply reads replies for everyone on the
/// connection (one at a time, `rx`), handing others' to their waiters by cookie, until its own
/// arrives; then it wakes a waiter to read next. A caller with its request alone on the
/// connection thus sleeps in the socket and is woken by its reply, with no thread between.
struct Conn {
    w: Mutex<Sock>,
    /// The same socket, to shut down without waiting for a writer stuck on a stalled server.
    ctl: Sock,
    rx: Mutex<Rx>,
    pending: Mutex<HashMap<u64, Arc<Waiter>>>,
    dead: AtomicBool,
}

impl Conn {
    /// End the connection: the reading caller sees EOF and fails every waiter.
    fn kill(&self) {
        self.dead.store(true, Relaxed);
        self.ctl.shutdown();
    }

    /// The connection broke: close it and fail every waiter with `err`.
    fn fail_all(&self, err: &io::Error) {
        self.kill();
        let left: Vec<_> = self.pending.lock().unwrap().drain().collect();
        for (_, w) in left {
            w.finish(Err(lost(err)));
        }
    }

    /// Read replies (holding `rx`) until the one for `cookie` arrives (its data into `mine`) or
    /// `deadline` passes. Other callers' replies go to their waiters.
    fn lead(&self, rx: &mut Rx, cookie: u64, mut mine: Option<&mut [u8]>, deadline: Instant) -> Result<(), Fail> {
        loop {
            let mut h = [0u8; 16];
            // Some(result): our own reply; None: another's, handed to its waiter
            let r = rx.read_exact(&mut h, deadline).and_then(|()| {
                let magic = be32(&h);
                if magic != p::SIMPLE_REPLY_MAGIC {
                    return Err(RxErr::Io(proto_err(format!("reply magic {magic:#x} (expected simple replies)"))));
                }
                let error = be32(&h[4..]);
                let c = be64(&h[8..]);
                let Some(w) = self.pending.lock().unwrap().remove(&c) else {
                    return Err(RxErr::Io(proto_err(format!("reply to unknown cookie {c}"))));
                };
                if c == cookie {
                    if error != 0 {
                        return Ok(Some(Err(Fail::Remote(p::host_errno(error)))));
                    }
                    if let Some(b) = mine.as_deref_mut() {
                        rx.read_exact(b, deadline)?;
                    }
                    return Ok(Some(Ok(())));
                }
                if error != 0 {
                    w.finish(Err(Fail::Remote(p::host_errno(error))));
                    return Ok(None);
                }
                let mut data = vec![0u8; w.read_len];
                if let Err(e) = rx.read_exact(&mut data, deadline) {
                    // the stream is out of step: this waiter fails with the connection
                    self.pending.lock().unwrap().insert(c, w);
                    return Err(e);
                }
                w.finish(Ok(data));
                Ok(None)
            });
            match r {
                Ok(Some(r)) => return r,
                Ok(None) => {}
                Err(RxErr::Deadline) => {
                    // own request late: the stream may be mid-reply, so start afresh (the others
                    // in flight fail with the connection and are re-sent by their callers)
                    self.pending.lock().unwrap().remove(&cookie);
                    self.fail_all(&io::Error::new(io::ErrorKind::TimedOut, "an earlier request on the connection timed out"));
                    return Err(Fail::Timeout);
                }
                Err(RxErr::Io(e)) => {
                    self.fail_all(&e);
                    return Err(lost(&e));
                }
            }
        }
    }

    /// Wake one waiter to read next, if any are left (call after releasing `rx`).
    fn hand_off(&self) {
        let next = self.pending.lock().unwrap().values().next().cloned();
        if let Some(w) = next {
            let _g = w.done.lock().unwrap();
            w.cv.notify_one();
        }
    }

    /// Wait for the reply to `cookie` (sent; its waiter `w` is pending), reading replies when
    /// no one else is, until `deadline`.
    fn wait_reply(&self, w: &Waiter, cookie: u64, mut read: Option<&mut [u8]>, deadline: Instant) -> Result<(), Fail> {
        let mut g = w.done.lock().unwrap();
        loop {
            if let Some(r) = g.take() {
                // handed over by the reader (not ours: `lead` returns directly for its own)
                return r.map(|d| {
                    if let Some(b) = read {
                        b.copy_from_slice(&d);
                    }
                });
            }
            // try to read while holding our waiter's lock: whoever releases `rx` takes this
            // lock before waking us, so that wake-up cannot be missed
            if let Ok(mut rx) = self.rx.try_lock() {
                drop(g);
                let r = self.lead(&mut rx, cookie, read.as_deref_mut(), deadline);
                drop(rx);
                self.hand_off();
                return r;
            }
            let now = Instant::now();
            if now >= deadline {
                drop(g);
                if self.pending.lock().unwrap().remove(&cookie).is_none() {
                    // answered just now, between our check and the removal
                    g = w.done.lock().unwrap();
                    continue;
                }
                // the stream is out of step with this request: start afresh (the others fail
                // now rather than wait for a reader that may not come)
                self.fail_all(&io::Error::new(io::ErrorKind::TimedOut, "an earlier request on the connection timed out"));
                return Err(Fail::Timeout);
            }
            g = w.cv.wait_timeout(g, deadline - now).unwrap().0;
        }
    }
}

/// What the handshake learned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Export {
    pub size: u64,
    pub flags: u16,
}

/// A client of one export.
pub struct Client {
    pub target: NbdTarget,
    pub export: Export,
    slots: Vec<Mutex<Option<Arc<Conn>>>>,
    /// Requests in flight per slot: a request takes the first idle connection, so a client
    /// with one request at a time stays on one connection (a server polling that connection
    /// for the next request then finds it there); when none is idle, round robin.
    busy: Vec<AtomicUsize>,
    next_slot: AtomicUsize,
    cookie: AtomicU64,
    /// Shared: a caller may sample them while the client works (`workload::Progress::nbd`).
    pub counters: Arc<Counters>,
}

fn proto_err(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}
fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().unwrap())
}

fn dial(t: &NbdTarget) -> io::Result<Sock> {
    let to = t.policy.timeout;
    match &t.endpoint {
        NbdEndpoint::Tcp { host, port } => {
            let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{host}: no address"));
            for a in (host.as_str(), *port).to_socket_addrs()? {
                match TcpStream::connect_timeout(&a, to) {
                    Ok(s) => {
                        s.set_nodelay(true)?;
                        return Ok(Sock::Tcp(s));
                    }
                    Err(e) => last = e,
                }
            }
            Err(last)
        }
        NbdEndpoint::Unix(p) => UnixStream::connect(p).map(Sock::Unix),
    }
}

/// Send one option (fixed newstyle).
fn send_opt(s: &mut Sock, opt: u32, data: &[u8]) -> io::Result<()> {
    let mut v = Vec::with_capacity(16 + data.len());
    v.extend_from_slice(&p::IHAVEOPT.to_be_bytes());
    v.extend_from_slice(&opt.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    s.write_all(&v)
}

/// Read one option reply: (type, data).
fn read_opt_reply(s: &mut Sock, opt: u32) -> io::Result<(u32, Vec<u8>)> {
    let mut h = [0u8; 20];
    s.read_exact(&mut h)?;
    if be64(&h) != p::OPT_REPLY_MAGIC || be32(&h[8..]) != opt {
        return Err(proto_err(format!("bad option reply (magic {:#x}, option {})", be64(&h), be32(&h[8..]))));
    }
    let len = be32(&h[16..]);
    if len > 1 << 20 {
        return Err(proto_err(format!("option reply of {len} bytes")));
    }
    let mut d = vec![0u8; len as usize];
    s.read_exact(&mut d)?;
    Ok((be32(&h[12..]), d))
}

/// Handshake up to transmission: OPT_GO, or EXPORT_NAME where the server is not fixed-newstyle
/// or does not know OPT_GO.
fn handshake(s: &mut Sock, export: &str) -> io::Result<Export> {
    let mut h = [0u8; 18];
    s.read_exact(&mut h[..16])?;
    if be64(&h) != p::NBDMAGIC {
        return Err(proto_err(format!("not an NBD server (magic {:#x})", be64(&h))));
    }
    if be64(&h[8..]) == p::CLISERV_MAGIC {
        return Err(proto_err("the server speaks the old-style handshake, which is not supported".into()));
    }
    if be64(&h[8..]) != p::IHAVEOPT {
        return Err(proto_err(format!("unknown handshake magic {:#x}", be64(&h[8..]))));
    }
    s.read_exact(&mut h[16..18])?;
    let sflags = be16(&h[16..]);
    let fixed = sflags & p::FLAG_FIXED_NEWSTYLE != 0;
    let no_zeroes = sflags & p::FLAG_NO_ZEROES != 0;
    let cflags = if fixed { p::FLAG_C_FIXED_NEWSTYLE } else { 0 } | if no_zeroes { p::FLAG_C_NO_ZEROES } else { 0 };
    s.write_all(&cflags.to_be_bytes())?;
    let name = export.as_bytes();
    if fixed {
        let mut d = Vec::with_capacity(6 + name.len());
        d.extend_from_slice(&(name.len() as u32).to_be_bytes());
        d.extend_from_slice(name);
        d.extend_from_slice(&0u16.to_be_bytes());
        send_opt(s, p::OPT_GO, &d)?;
        let mut got = None;
        loop {
            let (typ, d) = read_opt_reply(s, p::OPT_GO)?;
            match typ {
                p::REP_INFO if d.len() >= 12 && be16(&d) == p::INFO_EXPORT => got = Some(Export { size: be64(&d[2..]), flags: be16(&d[10..]) }),
                p::REP_INFO => {}
                p::REP_ACK => return got.ok_or_else(|| proto_err("OPT_GO acknowledged without the export's size".into())),
                p::REP_ERR_UNSUP => break,
                t if t & (1 << 31) != 0 => {
                    let msg = String::from_utf8_lossy(&d);
                    let what = match t {
                        p::REP_ERR_UNKNOWN => "no such export",
                        p::REP_ERR_POLICY => "refused by policy",
                        p::REP_ERR_TOO_BIG => "too big",
                        _ => "error",
                    };
                    return Err(io::Error::new(io::ErrorKind::NotFound, format!("export `{export}`: {what} ({t:#x}) {msg}")));
                }
                t => return Err(proto_err(format!("unexpected OPT_GO reply type {t}"))),
            }
        }
    }
    send_opt(s, p::OPT_EXPORT_NAME, name)?;
    let mut r = [0u8; 10 + 124];
    let n = if no_zeroes { 10 } else { 134 };
    s.read_exact(&mut r[..n]).map_err(|e| io::Error::new(e.kind(), format!("export `{export}` refused (EXPORT_NAME): {e}")))?;
    Ok(Export { size: be64(&r), flags: be16(&r[8..]) })
}

fn errno_err(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

impl Client {
    /// Connect (one connection; the others of the pool open on first use).
    pub fn connect(target: &NbdTarget) -> io::Result<Client> {
        let (conn, export) = Self::open(target)?;
        let n = if export.flags & p::FLAG_CAN_MULTI_CONN != 0 { target.policy.connections.max(1) } else { 1 };
        let slots: Vec<_> = (0..n).map(|_| Mutex::new(None)).collect();
        *slots[0].lock().unwrap() = Some(conn);
        let busy = (0..n).map(|_| AtomicUsize::new(0)).collect();
        Ok(Client { target: target.clone(), export, slots, busy, next_slot: AtomicUsize::new(0), cookie: AtomicU64::new(1), counters: Arc::default() })
    }

    fn open(target: &NbdTarget) -> io::Result<(Arc<Conn>, Export)> {
        let mut s = dial(target).map_err(|e| io::Error::new(e.kind(), format!("cannot connect to {target}: {e}")))?;
        s.set_read_timeout(Some(target.policy.timeout))?;
        let export = handshake(&mut s, &target.export).map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{target}: no handshake reply within {:?} (does the server take another client?)", target.policy.timeout),
            ),
            k => io::Error::new(k, format!("{target}: {e}")),
        })?;
        s.set_read_timeout(None)?;
        let r = s.try_clone()?;
        let ctl = s.try_clone()?;
        let rx = Mutex::new(Rx { sock: r, buf: vec![0u8; RX_BUF].into_boxed_slice(), start: 0, end: 0 });
        let conn = Arc::new(Conn { w: Mutex::new(s), ctl, rx, pending: Mutex::new(HashMap::new()), dead: AtomicBool::new(false) });
        Ok((conn, export))
    }

    pub fn size(&self) -> u64 {
        self.export.size
    }
    pub fn read_only(&self) -> bool {
        self.export.flags & p::FLAG_READ_ONLY != 0
    }
    pub fn has(&self, flag: u16) -> bool {
        self.export.flags & flag != 0
    }
    /// Connections in the pool (1 unless the server allows several).
    pub fn pool_size(&self) -> usize {
        self.slots.len()
    }

    /// A live connection of `slot`, reconnecting if it died.
    fn conn(&self, slot: usize) -> io::Result<Arc<Conn>> {
        let mut g = self.slots[slot].lock().unwrap();
        if let Some(c) = &*g
            && !c.dead.load(Relaxed)
        {
            return Ok(c.clone());
        }
        // a dead connection stays in its slot until a new one is open, so a reconnect that
        // takes several attempts (a target restarting) still counts as one
        let had = g.is_some();
        if let Some(old) = &*g {
            old.kill();
        }
        let (c, export) = Self::open(&self.target)?;
        if export.size != self.export.size {
            c.kill();
            return Err(proto_err(format!("{}: the export's size changed from {} to {} bytes", self.target, self.export.size, export.size)));
        }
        if had {
            self.counters.reconnects.fetch_add(1, Relaxed);
        }
        *g = Some(c.clone());
        Ok(c)
    }

    /// One attempt of `req` (its cookie is set here): send, wait for the reply until the timeout.
    fn attempt(&self, slot: usize, mut req: p::Request, data: Option<&[u8]>, read: Option<&mut [u8]>) -> Result<(), Fail> {
        let c = self.conn(slot).map_err(Fail::Lost)?;
        let cookie = self.cookie.fetch_add(1, Relaxed);
        let w = Arc::new(Waiter { read_len: read.as_ref().map_or(0, |b| b.len()), done: Mutex::new(None), cv: Condvar::new() });
        c.pending.lock().unwrap().insert(cookie, w.clone());
        req.cookie = cookie;
        let hdr = req.encode(false);
        let sent = {
            let mut s = c.w.lock().unwrap();
            let mut bufs = [IoSlice::new(&hdr), IoSlice::new(data.unwrap_or(&[]))];
            let mut bufs = &mut bufs[..];
            let mut r = Ok(());
            while !bufs.is_empty() {
                match s.write_vectored(bufs) {
                    Ok(0) => {
                        r = Err(io::Error::new(io::ErrorKind::WriteZero, "connection closed"));
                        break;
                    }
                    Ok(n) => IoSlice::advance_slices(&mut bufs, n),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        r = Err(e);
                        break;
                    }
                }
            }
            r
        };
        if let Err(e) = sent {
            c.pending.lock().unwrap().remove(&cookie);
            // others may be waiting for a reader that will not come: fail them now
            c.fail_all(&e);
            return Err(Fail::Lost(e));
        }
        let deadline = Instant::now() + self.target.policy.timeout;
        c.wait_reply(&w, cookie, read, deadline)
    }

    /// A request with the retry policy. `read`: the buffer the reply's data goes into.
    fn request(&self, cmd: u16, flags: u16, off: u64, len: u64, data: Option<&[u8]>, mut read: Option<&mut [u8]>) -> io::Result<()> {
        self.counters.requests.fetch_add(1, Relaxed);
        let n = self.slots.len();
        let slot = match self.busy.iter().position(|b| b.compare_exchange(0, 1, Relaxed, Relaxed).is_ok()) {
            Some(i) => i,
            None => {
                let i = self.next_slot.fetch_add(1, Relaxed) % n;
                self.busy[i].fetch_add(1, Relaxed);
                i
            }
        };
        // counted out on every way out of the request
        struct Busy<'a>(&'a AtomicUsize);
        impl Drop for Busy<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Relaxed);
            }
        }
        let _busy = Busy(&self.busy[slot]);
        let pol = self.target.policy;
        let t0 = Instant::now();
        let mut first_failed = None;
        let mut attempt = 0u32;
        loop {
            let req = p::Request { flags, cmd, cookie: 0, offset: off, length: len };
            let r = self.attempt(slot, req, data, read.as_deref_mut());
            let f = match r {
                Ok(()) => {
                    if let Some(t) = first_failed {
                        self.counters.retry_ns.fetch_add(Instant::now().duration_since(t).as_nanos() as u64, Relaxed);
                    }
                    return Ok(());
                }
                Err(f) => f,
            };
            // the time a failed first attempt cost (a timeout waited out) counts as retry time
            first_failed.get_or_insert(t0);
            let e = match f {
                Fail::Remote(errno) => {
                    self.counters.remote_errors.fetch_add(1, Relaxed);
                    errno_err(errno)
                }
                Fail::Timeout => {
                    self.counters.timeouts.fetch_add(1, Relaxed);
                    io::Error::new(io::ErrorKind::TimedOut, format!("{}: no reply within {:?}", p::cmd_name(cmd), pol.timeout))
                }
                Fail::Lost(e) => {
                    self.counters.connection_errors.fetch_add(1, Relaxed);
                    e
                }
            };
            if attempt >= pol.retries {
                self.counters.failed.fetch_add(1, Relaxed);
                self.counters.retry_ns.fetch_add(Instant::now().duration_since(t0).as_nanos() as u64, Relaxed);
                // the disk answers with an errno: the server's, else EIO
                return Err(if e.raw_os_error().is_some() { e } else { errno_err(libc::EIO) });
            }
            std::thread::sleep(pol.backoff(attempt));
            attempt += 1;
            self.counters.retries.fetch_add(1, Relaxed);
        }
    }

    fn check(&self, off: u64, len: u64) -> io::Result<()> {
        if off.checked_add(len).is_none_or(|e| e > self.export.size) {
            return Err(errno_err(libc::EINVAL));
        }
        Ok(())
    }

    pub fn read(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check(off, buf.len() as u64)?;
        for (i, c) in buf.chunks_mut(MAX_REQUEST as usize).enumerate() {
            let o = off + i as u64 * MAX_REQUEST;
            self.request(p::CMD_READ, 0, o, c.len() as u64, None, Some(c))?;
        }
        Ok(())
    }

    /// Write; `fua`: durable before the reply (where the server supports FUA, else a flush
    /// follows).
    pub fn write(&self, off: u64, data: &[u8], fua: bool) -> io::Result<()> {
        self.check(off, data.len() as u64)?;
        if self.read_only() {
            return Err(errno_err(libc::EPERM));
        }
        let flags = if fua && self.has(p::FLAG_SEND_FUA) { p::CMD_FLAG_FUA } else { 0 };
        for (i, c) in data.chunks(MAX_REQUEST as usize).enumerate() {
            let o = off + i as u64 * MAX_REQUEST;
            self.request(p::CMD_WRITE, flags, o, c.len() as u64, Some(c), None)?;
        }
        if fua && flags == 0 {
            self.flush()?;
        }
        Ok(())
    }

    /// Flush (a no-op where the server does not take FLUSH: it has no cache to flush).
    pub fn flush(&self) -> io::Result<()> {
        if !self.has(p::FLAG_SEND_FLUSH) {
            return Ok(());
        }
        self.request(p::CMD_FLUSH, 0, 0, 0, None, None)
    }

    /// Trim: the server may forget the range (reads afterwards are unspecified). A no-op where
    /// the server does not take TRIM.
    pub fn trim(&self, off: u64, len: u64) -> io::Result<()> {
        self.check(off, len)?;
        if !self.has(p::FLAG_SEND_TRIM) {
            return Ok(());
        }
        for o in (off..off + len).step_by(MAX_REQUEST as usize) {
            self.request(p::CMD_TRIM, 0, o, (off + len - o).min(MAX_REQUEST), None, None)?;
        }
        Ok(())
    }

    /// Zero the range: WRITE_ZEROES (holes allowed) where the server takes it, else writes of
    /// zeroes.
    pub fn write_zeroes(&self, off: u64, len: u64) -> io::Result<()> {
        self.check(off, len)?;
        if self.read_only() {
            return Err(errno_err(libc::EPERM));
        }
        if self.has(p::FLAG_SEND_WRITE_ZEROES) {
            for o in (off..off + len).step_by(MAX_REQUEST as usize) {
                self.request(p::CMD_WRITE_ZEROES, 0, o, (off + len - o).min(MAX_REQUEST), None, None)?;
            }
            return Ok(());
        }
        let zero = vec![0u8; len.min(1 << 20) as usize];
        for o in (off..off + len).step_by(zero.len()) {
            let n = (off + len - o).min(zero.len() as u64) as usize;
            self.write(o, &zero[..n], false)?;
        }
        Ok(())
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        for s in &self.slots {
            if let Some(c) = s.lock().unwrap().take() {
                // polite disconnect, then close
                let hdr = p::Request { flags: 0, cmd: p::CMD_DISC, cookie: 0, offset: 0, length: 0 }.encode(false);
                if !c.dead.load(Relaxed) {
                    let _ = c.w.lock().unwrap().write_all(&hdr);
                }
                c.kill();
            }
        }
    }
}
