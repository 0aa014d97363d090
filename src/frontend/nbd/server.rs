//! NBD sessions: the accept loop, the fixed-newstyle handshake, and transmission.
//!
//! One thread per connection reads requests and executes them inline (no hand-off: a request
//! costs no thread wake-up). Replies collect in the connection's output buffer and go out in
//! one write when the thread would otherwise wait for input, so a client with many requests in
//! flight gets many replies per system call. A reply the fault engine delays is handed to the
//! shared delay thread and written later under the connection's write lock; requests behind it
//! are not held up (replies are matched by cookie, order is free).

use crate::disk::{Disk, Outcome};
use crate::frontend::delay::Delayer;
use crate::nbd::sock::Sock;
use crate::nbd::{self as p, Request, ServerCounters, Sink, Style};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The export's name; "" (the default export) is accepted as well.
pub const EXPORT_NAME: &str = "faultline";
/// Largest read or write payload a request may carry (advertised in NBD_INFO_BLOCK_SIZE; the
/// document's portable maximum). A larger write is a hard disconnect, a larger read an error.
pub const MAX_PAYLOAD: u64 = 32 << 20;
/// Connections served at once; more are closed at accept, with a note on stderr.
pub const MAX_CONNECTIONS: usize = 128;
/// Time a client has for each step of the handshake, and the number of options it may send.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_OPTIONS: usize = 1024;
/// Largest option data read; longer options get NBD_REP_ERR_TOO_BIG and the connection ends
/// (names are at most 4 KiB by the document).
const MAX_OPTION_LEN: u32 = 64 << 10;
/// Input and output buffer sizes per connection (allocated zeroed: pages appear when used).
const IN_BUF: usize = 1 << 20;
const OUT_BUF: usize = 2 << 20;
/// Busy polling: after its replies are out, a connection whose requests come soon after each
/// other polls for the next ones this long before sleeping (`FAULTLINE_NBD_BUSY_POLL_US`
/// overrides; 0: never). A sleep and its wake-up cost more than the gap between a client's
/// reply and its next request, and a client that sends to a sleeping server pays for the
/// wake-up.
const SPIN: Duration = Duration::from_micros(50);
/// The request rate below which polling stops: a connection polls again only after a wait for
/// its next request shorter than this. The wait measured while sleeping includes our own
/// wake-up, so this is well above `SPIN`: a gate at `SPIN` itself stays shut once a slow
/// wake-up has shut it.
const SPIN_GAP: Duration = Duration::from_millis(1);
/// Whether polling pays is found by trying, per connection: requests are counted in epochs of
/// `EPOCH` in the current mode; after every `MAINS` epochs one epoch of `PROBE` requests runs
/// in the other mode, which is kept when its time per request is under 90% of the epoch just
/// before it. Polling costs CPU a client on the same machine may need
/// (our own client disk's chain on 2 CPUs): there not polling wins, across machines polling.
/// An epoch in which most polls gave the CPU away (`SPIN_GIVEN`) ends polling whatever its
/// time: the wall time of such an epoch hides the CPU the polls took from others.
const EPOCH: u32 = 256;
const PROBE: u32 = 128;
const MAINS: u32 = 16;
/// A poll stops (and the thread sleeps for the request) once this many of its yields gave
/// the CPU to another thread: the CPU is wanted, by the client it waits for or by another
/// tenant, so polling only takes turns with them (each turn a context switch).
const SPIN_GIVEN: u64 = 2;

/// The per-connection trial of polling against sleeping (see `EPOCH`).
struct Tuner {
    poll: bool,
    probing: bool,
    n: u32,
    t0: Instant,
    mains: u32,
    last_main: Duration,
    /// Polls of the current epoch that stopped because the CPU was wanted (`SPIN_GIVEN`).
    given: u32,
}

impl Tuner {
    fn new() -> Tuner {
        Tuner { poll: true, probing: false, n: 0, t0: Instant::now(), mains: 0, last_main: Duration::ZERO, given: 0 }
    }
    /// Whether the connection polls now.
    fn polls(&self) -> bool {
        self.poll != self.probing
    }
    /// A request arrived at `now`; `steady`: the request rate keeps the gate open, so the
    /// time between requests is the client's round trip (else the epoch starts over).
    fn tick(&mut self, now: Instant, steady: bool) {
        if !steady {
            self.n = 0;
            self.given = 0;
            self.t0 = now;
            return;
        }
        self.n += 1;
        if self.n < if self.probing { PROBE } else { EPOCH } {
            return;
        }
        let per = now.duration_since(self.t0) / self.n;
        // polls that mostly handed the CPU over: polling lost, whatever the time says
        let crowded = self.polls() && self.given * 2 >= self.n;
        if self.probing {
            if crowded {
                self.poll = false;
            } else if per.as_nanos() * 10 < self.last_main.as_nanos() * 9 {
                self.poll = !self.poll;
            }
            self.probing = false;
        } else if crowded {
            self.poll = false;
            self.mains = 0;
        } else {
            self.last_main = per;
            self.mains += 1;
            if self.mains >= MAINS {
                self.mains = 0;
                self.probing = true;
            }
        }
        self.n = 0;
        self.given = 0;
        self.t0 = now;
    }
}

/// Involuntary context switches of the calling thread so far (a `sched_yield` that let
/// another thread run counts one).
fn switches_given() -> u64 {
    // SAFETY: an all-zero rusage is valid; getrusage only writes into it
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a live rusage for the call to fill
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    ru.ru_nivcsw as u64
}

/// One spinning connection at a time, process-wide: on a small machine two spinners take the
/// CPUs from the clients they wait for.
static SPINNING: AtomicBool = AtomicBool::new(false);

fn spin_budget() -> Duration {
    static B: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *B.get_or_init(|| std::env::var("FAULTLINE_NBD_BUSY_POLL_US").ok().and_then(|v| v.parse().ok()).map(Duration::from_micros).unwrap_or(SPIN))
}

/// An open connection: a clone of its socket and its thread.
type OpenConn = (Sock, Option<std::thread::JoinHandle<()>>);

/// What every connection shares.
pub(super) struct Shared {
    pub disk: Arc<Disk>,
    pub delayer: Delayer,
    pub stop: AtomicBool,
    /// Open connections: a clone of each socket (to end it at teardown) and its thread.
    pub conns: Mutex<HashMap<u64, OpenConn>>,
    next_id: AtomicU64,
    /// When the last "refused" note was printed (one per second at most).
    refused_note: Mutex<Option<Instant>>,
    pub refused: AtomicU64,
    /// Connections in transmission and requests in flight (the server's own; `stats` shows them).
    pub counters: Arc<ServerCounters>,
}

impl Shared {
    pub fn new(disk: Arc<Disk>) -> Shared {
        Shared {
            delayer: Delayer::new(),
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            refused_note: Mutex::new(None),
            refused: AtomicU64::new(0),
            counters: Arc::default(),
            disk,
        }
    }

    /// Take a new connection: serve it on its own thread, or close it when the limit is reached.
    pub fn admit(self: &Arc<Self>, sock: Sock, peer: String) {
        if let Sock::Tcp(s) = &sock {
            // replies leave in batches already; Nagle would only hold the last one back
            let _ = s.set_nodelay(true);
        }
        let mut conns = self.conns.lock().unwrap();
        if conns.len() >= MAX_CONNECTIONS || self.stop.load(Ordering::Relaxed) {
            drop(conns);
            self.refused.fetch_add(1, Ordering::Relaxed);
            let mut last = self.refused_note.lock().unwrap();
            if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                *last = Some(Instant::now());
                eprintln!("faultline: nbd: refused a connection from {peer}: {MAX_CONNECTIONS} connections are open (the limit)");
            }
            sock.shutdown();
            return;
        }
        let Ok(clone) = sock.try_clone() else { return };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let me = self.clone();
        let spawned = std::thread::Builder::new().name("faultline-nbd".into()).stack_size(256 << 10).spawn(move || {
            let r = session(&me, sock);
            if let Err(e) = r
                && !me.stop.load(Ordering::Relaxed)
            {
                eprintln!("faultline: nbd: connection from {peer} closed: {e}");
            }
            me.conns.lock().unwrap().remove(&id);
        });
        match spawned {
            Ok(h) => {
                conns.insert(id, (clone, Some(h)));
            }
            Err(e) => eprintln!("faultline: nbd: cannot start a connection thread: {e}"),
        }
    }

    /// End every connection and wait for their threads.
    pub fn close_all(&self) {
        let handles: Vec<_> = self
            .conns
            .lock()
            .unwrap()
            .values_mut()
            .map(|(s, h)| {
                s.shutdown();
                h.take()
            })
            .collect();
        for h in handles.into_iter().flatten() {
            let _ = h.join();
        }
    }
}

/// A protocol violation or I/O failure that ends the connection.
type Res<T> = Result<T, String>;

fn io_err(what: &str) -> impl Fn(io::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

fn session(sh: &Shared, sock: Sock) -> Res<()> {
    sock.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(io_err("socket"))?;
    let Some(style) = handshake(sh, &sock)? else { return Ok(()) };
    sock.set_read_timeout(None).map_err(io_err("socket"))?;
    sh.counters.connections.fetch_add(1, Ordering::Relaxed);
    // counted out on every way out of the session below
    struct Open<'a>(&'a ServerCounters);
    impl Drop for Open<'_> {
        fn drop(&mut self) {
            self.0.connections.fetch_sub(1, Ordering::Relaxed);
        }
    }
    let _open = Open(&sh.counters);
    let writer = Arc::new(Mutex::new(sock.try_clone().map_err(io_err("socket"))?));
    let mut c = Conn {
        sh,
        rd: sock,
        inb: vec![0; IN_BUF],
        start: 0,
        end: 0,
        out: Out { buf: vec![0; OUT_BUF], len: 0 },
        writer,
        style,
        big: Vec::new(),
        spin: false,
        in_request: false,
        tune: Tuner::new(),
        t0: Instant::now(),
        delayed: false,
    };
    let r = c.serve();
    // the client sees the end now, even while a delayed reply still holds the writer
    c.rd.shutdown();
    r
}

fn read_exact(mut s: &Sock, b: &mut [u8], what: &str) -> Res<()> {
    s.read_exact(b).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => format!("{what}: the client closed the connection"),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!("{what}: no data for {}s", HANDSHAKE_TIMEOUT.as_secs()),
        _ => format!("{what}: {e}"),
    })
}

fn send(mut s: &Sock, b: &[u8]) -> Res<()> {
    s.write_all(b).map_err(io_err("send"))
}

fn transmission_flags(style: Style) -> u16 {
    let mut f = p::FLAG_HAS_FLAGS
        | p::FLAG_SEND_FLUSH
        | p::FLAG_SEND_FUA
        | p::FLAG_SEND_TRIM
        | p::FLAG_SEND_WRITE_ZEROES
        | p::FLAG_CAN_MULTI_CONN
        | p::FLAG_SEND_CACHE
        | p::FLAG_SEND_FAST_ZERO;
    if style != Style::Simple {
        f |= p::FLAG_SEND_DF;
    }
    f
}

fn known_export(name: &[u8]) -> bool {
    name.is_empty() || name == EXPORT_NAME.as_bytes()
}

/// Fixed newstyle negotiation. `Some(style)`: transmission starts; `None`: the client ended
/// the session cleanly (NBD_OPT_ABORT, or after NBD_OPT_LIST/INFO only).
fn handshake(sh: &Shared, s: &Sock) -> Res<Option<Style>> {
    let mut g = Vec::with_capacity(18);
    g.put(&p::NBDMAGIC.to_be_bytes());
    g.put(&p::IHAVEOPT.to_be_bytes());
    g.put(&(p::FLAG_FIXED_NEWSTYLE | p::FLAG_NO_ZEROES).to_be_bytes());
    send(s, &g)?;
    let mut cf = [0u8; 4];
    read_exact(s, &mut cf, "client flags")?;
    let cflags = u32::from_be_bytes(cf);
    if cflags & !(p::FLAG_C_FIXED_NEWSTYLE | p::FLAG_C_NO_ZEROES) != 0 {
        return Err(format!("unknown client flags {cflags:#x}"));
    }
    let no_zeroes = cflags & p::FLAG_C_NO_ZEROES != 0;
    let mut style = Style::Simple;
    let size = sh.disk.size();
    let bs = sh.disk.block_size();
    for _ in 0..MAX_OPTIONS {
        let mut h = [0u8; 16];
        match read_exact(s, &mut h, "option") {
            Ok(()) => {}
            // a client may hang up between options (nbdinfo --list does after NBD_OPT_LIST)
            Err(e) if e.ends_with("closed the connection") => return Ok(None),
            Err(e) => return Err(e),
        }
        let magic = u64::from_be_bytes(h[..8].try_into().unwrap());
        if magic != p::IHAVEOPT {
            return Err(format!("bad option magic {magic:#x}"));
        }
        let opt = u32::from_be_bytes(h[8..12].try_into().unwrap());
        let len = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let mut r = Vec::new();
        if len > MAX_OPTION_LEN {
            // the data cannot be skipped cheaply: say why, then end the session
            p::option_reply(&mut r, opt, p::REP_ERR_TOO_BIG, format!("option data of {len} bytes (limit {MAX_OPTION_LEN})").as_bytes());
            let _ = send(s, &r);
            return Err(format!("option {opt} with {len} bytes of data"));
        }
        let mut data = vec![0u8; len as usize];
        read_exact(s, &mut data, "option data")?;
        let invalid = |r: &mut Vec<u8>, why: &str| p::option_reply(r, opt, p::REP_ERR_INVALID, why.as_bytes());
        match opt {
            p::OPT_EXPORT_NAME => {
                if style == Style::Extended {
                    return Err("NBD_OPT_EXPORT_NAME after extended headers".into());
                }
                if !known_export(&data) {
                    // this option cannot fail: the document says to end the session
                    return Err(format!("unknown export {:?}", String::from_utf8_lossy(&data)));
                }
                r.put(&size.to_be_bytes());
                r.put(&transmission_flags(style).to_be_bytes());
                if !no_zeroes {
                    r.put(&[0u8; 124]);
                }
                send(s, &r)?;
                return Ok(Some(style));
            }
            p::OPT_ABORT => {
                p::option_reply(&mut r, opt, p::REP_ACK, &[]);
                let _ = send(s, &r);
                return Ok(None);
            }
            p::OPT_LIST if !data.is_empty() => invalid(&mut r, "NBD_OPT_LIST takes no data"),
            p::OPT_LIST => {
                let mut d = Vec::new();
                d.put(&(EXPORT_NAME.len() as u32).to_be_bytes());
                d.put(EXPORT_NAME.as_bytes());
                d.put(b"faultline faulty disk");
                p::option_reply(&mut r, opt, p::REP_SERVER, &d);
                p::option_reply(&mut r, opt, p::REP_ACK, &[]);
            }
            p::OPT_STARTTLS => p::option_reply(&mut r, opt, p::REP_ERR_POLICY, b"faultline serves NBD without TLS"),
            p::OPT_INFO | p::OPT_GO => {
                // name length, name, count of info requests, the requests
                let parsed = (|| {
                    let nl = u32::from_be_bytes(data.get(..4)?.try_into().ok()?) as usize;
                    let name = data.get(4..4usize.checked_add(nl)?)?;
                    let rest = &data[4 + nl..];
                    let n = u16::from_be_bytes(rest.get(..2)?.try_into().ok()?) as usize;
                    let reqs = rest.get(2..)?;
                    (reqs.len() == 2 * n).then(|| (name, reqs.chunks_exact(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect::<Vec<_>>()))
                })();
                match parsed {
                    None => invalid(&mut r, "malformed NBD_OPT_INFO/GO data"),
                    Some((name, _)) if !known_export(name) => {
                        let msg = format!("no export {:?}; this server has \"{EXPORT_NAME}\" (also the default, \"\")", String::from_utf8_lossy(name));
                        p::option_reply(&mut r, opt, p::REP_ERR_UNKNOWN, msg.as_bytes());
                    }
                    Some((_, infos)) => {
                        let mut d = Vec::new();
                        d.put(&p::INFO_EXPORT.to_be_bytes());
                        d.put(&size.to_be_bytes());
                        d.put(&transmission_flags(style).to_be_bytes());
                        p::option_reply(&mut r, opt, p::REP_INFO, &d);
                        // sent unasked too: the defaults' preferred size is 4 KiB, ours is the
                        // disk's block size; any offset and length are served (minimum 1)
                        d.clear();
                        d.put(&p::INFO_BLOCK_SIZE.to_be_bytes());
                        d.put(&1u32.to_be_bytes());
                        d.put(&bs.to_be_bytes());
                        d.put(&(MAX_PAYLOAD as u32).to_be_bytes());
                        p::option_reply(&mut r, opt, p::REP_INFO, &d);
                        if infos.contains(&p::INFO_NAME) {
                            d.clear();
                            d.put(&p::INFO_NAME.to_be_bytes());
                            d.put(EXPORT_NAME.as_bytes());
                            p::option_reply(&mut r, opt, p::REP_INFO, &d);
                        }
                        if infos.contains(&p::INFO_DESCRIPTION) {
                            d.clear();
                            d.put(&p::INFO_DESCRIPTION.to_be_bytes());
                            d.put(format!("faultline faulty disk ({})", sh.disk.describe_store()).as_bytes());
                            p::option_reply(&mut r, opt, p::REP_INFO, &d);
                        }
                        p::option_reply(&mut r, opt, p::REP_ACK, &[]);
                        if opt == p::OPT_GO {
                            send(s, &r)?;
                            return Ok(Some(style));
                        }
                    }
                }
            }
            p::OPT_STRUCTURED_REPLY if !data.is_empty() => invalid(&mut r, "NBD_OPT_STRUCTURED_REPLY takes no data"),
            p::OPT_STRUCTURED_REPLY if style == Style::Extended => {
                p::option_reply(&mut r, opt, p::REP_ERR_EXT_HEADER_REQD, b"extended headers are already in use")
            }
            p::OPT_STRUCTURED_REPLY => {
                style = Style::Structured;
                p::option_reply(&mut r, opt, p::REP_ACK, &[]);
            }
            p::OPT_EXTENDED_HEADERS if !data.is_empty() => invalid(&mut r, "NBD_OPT_EXTENDED_HEADERS takes no data"),
            p::OPT_EXTENDED_HEADERS => {
                style = Style::Extended;
                p::option_reply(&mut r, opt, p::REP_ACK, &[]);
            }
            _ => p::option_reply(&mut r, opt, p::REP_ERR_UNSUP, format!("option {opt} is not supported by faultline").as_bytes()),
        }
        send(s, &r)?;
    }
    Err(format!("more than {MAX_OPTIONS} options"))
}

/// The connection's output buffer: fully initialized, so a read can land in it directly.
struct Out {
    buf: Vec<u8>,
    len: usize,
}

impl Sink for Out {
    fn put(&mut self, b: &[u8]) {
        let end = self.len + b.len();
        if end > self.buf.len() {
            self.buf.resize(end.max(self.buf.len() * 2), 0);
        }
        self.buf[self.len..end].copy_from_slice(b);
        self.len = end;
    }
}

struct Conn<'a> {
    sh: &'a Shared,
    rd: Sock,
    /// Input: bytes [start, end) are received and not yet consumed.
    inb: Vec<u8>,
    start: usize,
    end: usize,
    out: Out,
    /// Replies go out under this lock (the reader's batches and the delay thread's late
    /// replies), so messages never interleave.
    writer: Arc<Mutex<Sock>>,
    style: Style,
    /// Payload buffer for writes larger than the input buffer.
    big: Vec<u8>,
    /// The last wait for input was short: poll before sleeping (see `SPIN`).
    spin: bool,
    /// Between a request's header and its end: a wait for input is for its payload.
    in_request: bool,
    tune: Tuner,
    /// The current request's receipt, and whether its reply went to the delay thread (which
    /// then counts it out of `in_flight`).
    t0: Instant,
    delayed: bool,
}

/// The later of two results: the first error wins, delays add up (the second step starts
/// when the first ends, as a FUA write's flush does).
fn then(a: Outcome, b: impl FnOnce() -> Outcome) -> Outcome {
    if a.errno.is_some() {
        return a;
    }
    let b = b();
    let delay = match (a.delay, b.delay) {
        (Some(x), Some(y)) => Some(x + y),
        (x, y) => x.or(y),
    };
    Outcome { errno: b.errno, delay }
}

fn fault_msg(errno: i32) -> String {
    format!("faultline: {} (errno {errno})", io::Error::from_raw_os_error(errno))
}

impl Conn<'_> {
    fn flush(&mut self) -> Res<()> {
        if self.out.len > 0 {
            let w = self.writer.lock().unwrap();
            send(&w, &self.out.buf[..self.out.len])?;
            self.out.len = 0;
        }
        Ok(())
    }

    /// Make at least `n` bytes available at `inb[start..]` (`n` <= the buffer), flushing the
    /// pending replies before waiting for the client. `false`: the client closed the
    /// connection before the first byte.
    fn fill(&mut self, n: usize) -> Res<bool> {
        if self.end - self.start >= n {
            return Ok(true);
        }
        // a wait for the next request, or for the rest of one begun (a payload the client
        // sends after its header, as libnbd does: two sends)
        let mid = self.end > self.start || self.in_request;
        // everything consumed: start over at the front, where the cache lines are warm and a
        // whole large write fits (at queue depth 1 the buffer's first bytes are all it uses)
        if self.start + n > self.inb.len() || self.start == self.end {
            self.inb.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        self.flush()?;
        while self.end - self.start < n {
            let got = self.receive(mid)?;
            if got == 0 {
                if self.end == self.start {
                    return Ok(false);
                }
                return Err("the client closed the connection inside a request".into());
            }
            self.end += got;
        }
        Ok(true)
    }

    /// Read what the client has sent into the input buffer (0: closed), polling first when
    /// requests have been coming soon after each other. `mid`: the rest of a request is
    /// awaited; such a wait polls when the gate is open but leaves the gate as it is, so a
    /// write whose payload comes in a second send is one wake-up, as a read is.
    fn receive(&mut self, mid: bool) -> Res<usize> {
        use std::os::fd::AsRawFd;
        let budget = spin_budget();
        if self.spin && self.tune.polls() && !budget.is_zero() && !SPINNING.swap(true, Ordering::Acquire) {
            let t = Instant::now();
            let fd = self.rd.as_raw_fd();
            let given0 = switches_given();
            let got = loop {
                let room = &mut self.inb[self.end..];
                // SAFETY: `room` is a live, writable buffer of `room.len()` bytes
                let r = unsafe { libc::recv(fd, room.as_mut_ptr().cast(), room.len(), libc::MSG_DONTWAIT) };
                if r >= 0 {
                    break Some(r as usize);
                }
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::WouldBlock && e.kind() != io::ErrorKind::Interrupted {
                    SPINNING.store(false, Ordering::Release);
                    return Err(format!("receive: {e}"));
                }
                if t.elapsed() >= budget {
                    break None;
                }
                // lets a client woken on this CPU run; a CPU wanted again and again ends the poll
                std::thread::yield_now();
                if switches_given() - given0 >= SPIN_GIVEN {
                    self.tune.given += 1;
                    break None;
                }
            };
            SPINNING.store(false, Ordering::Release);
            if let Some(n) = got {
                // the gate stays open: the request came within the poll
                return Ok(n);
            }
        }
        let t = Instant::now();
        let n = (&self.rd).read(&mut self.inb[self.end..]).map_err(io_err("receive"))?;
        if mid {
            // a request's tail says nothing about the client's rate: the gate stays as it is
            return Ok(n);
        }
        // spin next time only for a connection whose client sends its next requests soon (a
        // high rate), at any queue depth: with requests in flight a client that is the
        // bottleneck (libnbd's, one thread) sends cheaper to a server that is not asleep, and
        // `tune` stops polling where it takes a CPU the client wants. Idle connections beside it
        // (a client disk's pool) do not count; `SPINNING` keeps the spinners to one.
        self.spin = t.elapsed() < SPIN_GAP;
        Ok(n)
    }

    fn serve(&mut self) -> Res<()> {
        let ext = self.style == Style::Extended;
        let hl = Request::header_len(ext);
        loop {
            self.in_request = false;
            if !self.fill(hl)? {
                return Ok(());
            }
            self.in_request = true;
            let req = Request::parse(&self.inb[self.start..self.start + hl], ext).map_err(|m| format!("bad request magic {:#x}", m.0))?;
            self.start += hl;
            if req.cmd == p::CMD_DISC {
                return self.flush();
            }
            let c = &self.sh.counters;
            c.requests.fetch_add(1, Ordering::Relaxed);
            c.in_flight.fetch_add(1, Ordering::Relaxed);
            self.t0 = Instant::now();
            self.tune.tick(self.t0, self.spin);
            self.delayed = false;
            // a panic on the request path ends the connection: what of this request (or an
            // early reply) already went out is not known here, and the client fails every
            // request in flight on a closed connection (frontend::guard)
            let r = crate::frontend::guard::caught(|| self.request(&req)).unwrap_or_else(|m| {
                let then = "the connection is closed";
                crate::frontend::guard::report(p::cmd_name(req.cmd), req.offset, req.length, &m, then);
                Err(format!("a {} request panicked", p::cmd_name(req.cmd)))
            });
            if !self.delayed {
                let c = &self.sh.counters;
                c.in_flight_ns.fetch_add(self.t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                c.in_flight.fetch_sub(1, Ordering::Relaxed);
            }
            r?;
            if self.out.len >= OUT_BUF / 2 {
                self.flush()?;
            }
        }
    }

    /// Payload bytes the request carries on the wire.
    fn payload_len(&self, req: &Request) -> u64 {
        match self.style {
            Style::Extended if req.flags & p::CMD_FLAG_PAYLOAD_LEN != 0 => req.length,
            Style::Extended => 0,
            _ if req.cmd == p::CMD_WRITE => req.length,
            _ => 0,
        }
    }

    fn reply(&mut self, req: &Request, o: Outcome, msg: impl FnOnce() -> String) {
        let err = o.errno.map(p::wire_errno).unwrap_or(0);
        let text = if err != 0 { msg() } else { String::new() };
        match o.delay {
            None => p::status_reply(&mut self.out, self.style, req, err, &text),
            Some(d) => {
                let mut v = Vec::with_capacity(64);
                p::status_reply(&mut v, self.style, req, err, &text);
                self.later(d, v);
            }
        }
    }

    fn error(&mut self, req: &Request, errno: i32, msg: String) {
        self.reply(req, Outcome { errno: Some(errno), delay: None }, || msg);
    }

    /// Send `bytes` after `delay`, from the delay thread.
    fn later(&mut self, delay: Duration, bytes: Vec<u8>) {
        let w = self.writer.clone();
        let (c, t0) = (self.sh.counters.clone(), self.t0);
        self.delayed = true;
        self.sh.delayer.at(
            Instant::now() + delay,
            Box::new(move || {
                let s = w.lock().unwrap();
                // a closed connection: the client is gone, nothing to tell
                let _ = (&*s).write_all(&bytes);
                c.in_flight_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                c.in_flight.fetch_sub(1, Ordering::Relaxed);
            }),
        );
    }

    fn request(&mut self, req: &Request) -> Res<()> {
        let size = self.sh.disk.size();
        let payload = self.payload_len(req);
        if payload > MAX_PAYLOAD {
            return Err(format!("{} payload of {payload} bytes (limit {MAX_PAYLOAD})", p::cmd_name(req.cmd)));
        }
        let allowed = p::CMD_FLAG_FUA
            | match req.cmd {
                p::CMD_READ if self.style != Style::Simple => p::CMD_FLAG_DF,
                p::CMD_WRITE if self.style == Style::Extended => p::CMD_FLAG_PAYLOAD_LEN,
                p::CMD_WRITE_ZEROES => p::CMD_FLAG_NO_HOLE | p::CMD_FLAG_FAST_ZERO,
                _ => 0,
            };
        let beyond = req.offset.checked_add(req.length).is_none_or(|e| e > size);
        let range_msg = || format!("offset {} + length {} is beyond the export ({size} bytes)", req.offset, req.length);
        if req.cmd == p::CMD_WRITE {
            return self.write(req, payload, req.flags & !allowed != 0, beyond);
        }
        if payload > 0 {
            // a payload on a command that takes none: consume it to stay in step, then refuse
            self.skip(payload)?;
            self.error(req, libc::EINVAL, format!("{} takes no payload", p::cmd_name(req.cmd)));
            return Ok(());
        }
        if req.flags & !allowed != 0 {
            self.error(req, libc::EINVAL, format!("flags {:#x} are not valid for {}", req.flags, p::cmd_name(req.cmd)));
            return Ok(());
        }
        let disk = self.sh.disk.clone();
        let fua = req.flags & p::CMD_FLAG_FUA != 0;
        // FUA: the request's writes durable at once, then a flush (`Disk::with_fua`)
        let with_fua = |f: &dyn Fn(&Disk) -> Outcome| if fua { disk.with_fua(f) } else { f(&disk) };
        match req.cmd {
            p::CMD_READ => self.read(req, beyond),
            p::CMD_FLUSH => {
                let o = disk.flush();
                let e = o.errno;
                self.reply(req, o, || fault_msg(e.unwrap_or(0)));
            }
            p::CMD_TRIM | p::CMD_CACHE if beyond => self.error(req, libc::EINVAL, range_msg()),
            p::CMD_TRIM => {
                let o = with_fua(&|d| d.discard(req.offset, req.length));
                let e = o.errno;
                self.reply(req, o, || fault_msg(e.unwrap_or(0)));
            }
            // the store is memory or the page cache: nothing to prefetch
            p::CMD_CACHE => self.reply(req, Outcome::default(), String::new),
            p::CMD_WRITE_ZEROES if beyond => self.error(req, libc::ENOSPC, range_msg()),
            p::CMD_WRITE_ZEROES => {
                let no_hole = req.flags & p::CMD_FLAG_NO_HOLE != 0;
                if no_hole && req.flags & p::CMD_FLAG_FAST_ZERO != 0 {
                    // writing zeroes is no faster than a write
                    self.error(req, libc::ENOTSUP, "fast zero with NBD_CMD_FLAG_NO_HOLE is a plain write here".into());
                    return Ok(());
                }
                // without NO_HOLE a discard (the store reads zeroes after it), as the loop
                // device sends write-zeroes: rules see it as `discard`
                let o = with_fua(&|d| if no_hole { write_zeroes(d, req.offset, req.length) } else { d.discard(req.offset, req.length) });
                let e = o.errno;
                self.reply(req, o, || fault_msg(e.unwrap_or(0)));
            }
            p::CMD_BLOCK_STATUS => self.error(req, libc::EINVAL, "no metadata context was negotiated".into()),
            c => self.error(req, libc::EINVAL, format!("unknown command {c}")),
        }
        Ok(())
    }

    fn read(&mut self, req: &Request, beyond: bool) {
        if req.length > MAX_PAYLOAD {
            // structured replies could split it; the document allows refusing up front
            let e = if self.style == Style::Simple { libc::EINVAL } else { libc::EOVERFLOW };
            return self.error(req, e, format!("read of {} bytes (limit {MAX_PAYLOAD})", req.length));
        }
        if beyond {
            let size = self.sh.disk.size();
            return self.error(req, libc::EINVAL, format!("offset {} + length {} is beyond the export ({size} bytes)", req.offset, req.length));
        }
        let len = req.length as usize;
        if len == 0 && self.style != Style::Simple {
            // an OFFSET_DATA chunk carries at least one byte
            return self.reply(req, Outcome::default(), String::new);
        }
        // the reply header, then the data read straight into the output buffer
        let at = self.out.len;
        p::read_prefix(&mut self.out, self.style, req, len as u64);
        let data = self.out.len;
        if data + len > self.out.buf.len() {
            self.out.buf.resize(data + len, 0);
        }
        let o = self.sh.disk.read(req.offset, &mut self.out.buf[data..data + len]);
        if let Some(e) = o.errno {
            self.out.len = at;
            return self.reply(req, o, || fault_msg(e));
        }
        match o.delay {
            None => self.out.len = data + len,
            Some(d) => {
                let bytes = self.out.buf[at..data + len].to_vec();
                self.out.len = at;
                self.later(d, bytes);
            }
        }
    }

    /// A write: the payload is consumed whatever the verdict, so the stream stays in step.
    fn write(&mut self, req: &Request, payload: u64, bad_flags: bool, beyond: bool) -> Res<()> {
        let len = payload as usize;
        // a payload that fits where it starts (always so at queue depth 1: the buffer starts
        // over when empty) is received in place; a large one that does not goes straight to
        // its own buffer: moving it to the front of the input buffer would cost another copy
        let in_buf = len <= self.end - self.start || len < 64 << 10 || self.start + len <= self.inb.len();
        if in_buf {
            self.fill(len)?;
        } else {
            // larger than the input buffer is meant for: what is buffered, then the rest
            // straight into its own buffer
            self.big.resize(len, 0);
            let have = (self.end - self.start).min(len);
            self.big[..have].copy_from_slice(&self.inb[self.start..self.start + have]);
            self.start += have;
            self.flush()?;
            read_exact(&self.rd, &mut self.big[have..], "write payload").map_err(|e| e.replace("no data for 10s", "timed out"))?;
        }
        let size = self.sh.disk.size();
        let verdict = if self.style == Style::Extended && req.flags & p::CMD_FLAG_PAYLOAD_LEN == 0 {
            Some((libc::EINVAL, "a write needs NBD_CMD_FLAG_PAYLOAD_LEN with extended headers".to_string()))
        } else if bad_flags {
            Some((libc::EINVAL, format!("flags {:#x} are not valid for WRITE", req.flags)))
        } else if beyond {
            Some((libc::ENOSPC, format!("offset {} + length {} is beyond the export ({size} bytes)", req.offset, req.length)))
        } else {
            None
        };
        let o = match verdict {
            Some((e, msg)) => {
                if in_buf {
                    self.start += len;
                }
                self.error(req, e, msg);
                return Ok(());
            }
            None => {
                let fua = req.flags & p::CMD_FLAG_FUA != 0;
                // Nothing of a next request is here yet (queue depth 1): the reply would go
                // out before the next wait anyway, so send it as soon as the outcome is known.
                // On the RAM store that is once the range is locked, before the bytes are
                // copied in (no later request can see the old bytes): the client's next
                // request is on its way while the copy runs.
                let next = self.end - self.start - if in_buf { len } else { 0 };
                let early = !fua && next == 0;
                let (out, writer, style) = (&mut self.out, &self.writer, self.style);
                let data = if in_buf { &self.inb[self.start..self.start + len] } else { &self.big[..len] };
                let (mut rest, mut sent) = (None, Ok(()));
                let disk = &self.sh.disk;
                crate::disk::cache::as_fua(fua, || {
                    disk.write_then(req.offset, data, |o| {
                        if early && o.errno.is_none() && o.delay.is_none() {
                            p::status_reply(out, style, req, 0, "");
                            sent = send(&writer.lock().unwrap(), &out.buf[..out.len]);
                            out.len = 0;
                        } else {
                            rest = Some(o);
                        }
                    })
                });
                if in_buf {
                    self.start += len;
                }
                sent?;
                match rest {
                    None => return Ok(()),
                    // the flush of a FUA write (`Disk::with_fua`)
                    Some(o) if fua => then(o, || crate::disk::cache::as_fua(true, || self.sh.disk.flush())),
                    Some(o) => o,
                }
            }
        };
        let e = o.errno;
        self.reply(req, o, || fault_msg(e.unwrap_or(0)));
        Ok(())
    }

    /// Consume and drop `n` payload bytes.
    fn skip(&mut self, mut n: u64) -> Res<()> {
        while n > 0 {
            let step = n.min(self.inb.len() as u64 / 2) as usize;
            self.fill(step)?;
            self.start += step;
            n -= step as u64;
        }
        Ok(())
    }
}

/// NBD_CMD_WRITE_ZEROES with NO_HOLE: zeroes written as writes (rules see `write`), 1 MiB at a
/// time.
fn write_zeroes(disk: &Disk, off: u64, len: u64) -> Outcome {
    static ZERO: [u8; 1 << 20] = [0; 1 << 20];
    let mut o = Outcome::default();
    let mut done = 0;
    while done < len {
        let n = (len - done).min(ZERO.len() as u64) as usize;
        o = then(o, || disk.write(off + done, &ZERO[..n]));
        if o.errno.is_some() {
            break;
        }
        done += n as u64;
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs one epoch of `n` steady requests `us` µs apart, `given` of whose polls handed the
    /// CPU over.
    fn epoch(t: &mut Tuner, now: &mut Instant, n: u32, given: u32, us: u64) {
        for i in 0..n {
            if i < given {
                t.given += 1;
            }
            *now += Duration::from_micros(us);
            t.tick(*now, true);
        }
    }

    #[test]
    fn crowded_polls_end_polling() {
        let mut now = Instant::now();
        let mut t = Tuner::new();
        t.t0 = now;
        epoch(&mut t, &mut now, EPOCH, EPOCH / 4, 10);
        assert!(t.polls(), "a quarter of the polls crowded: polling goes on");
        epoch(&mut t, &mut now, EPOCH, EPOCH / 2, 10);
        assert!(!t.polls(), "half of the polls crowded: polling ends");
        // the probe of polling, faster than sleeping but crowded, is not kept
        for _ in 0..MAINS {
            epoch(&mut t, &mut now, EPOCH, 0, 10);
        }
        assert!(t.polls(), "the probe epoch polls");
        epoch(&mut t, &mut now, PROBE, PROBE, 5);
        assert!(!t.polls(), "a crowded probe leaves the connection sleeping");
        // the next probe, faster and not crowded, is kept
        for _ in 0..MAINS {
            epoch(&mut t, &mut now, EPOCH, 0, 10);
        }
        epoch(&mut t, &mut now, PROBE, 0, 5);
        assert!(t.polls(), "a faster, uncrowded probe brings polling back");
    }
}
