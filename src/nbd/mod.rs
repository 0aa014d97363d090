//! NBD wire format, from the protocol document (NetworkBlockDevice/nbd, doc/proto.md, with the
//! extended-headers extension of its `extension-ext-header` branch): magic numbers, option and
//! command codes, flags, and the fixed-size headers as big-endian byte arrays. No I/O here
//! except in `client`. Below `disk` (whose NBD store is a client) and `frontend::nbd` (the
//! server, a transport); imports only `spec` (the target's URI and policy).

pub mod client;
pub mod sock;

/// The NBD server's request counters (`nbd::server` counts and keeps them, the control
/// socket's `stats` reports them as `nbd_server`).
#[derive(Debug, Default)]
pub struct ServerCounters {
    pub connections: std::sync::atomic::AtomicU64,
    pub requests: std::sync::atomic::AtomicU64,
    pub in_flight: std::sync::atomic::AtomicU64,
    pub in_flight_ns: std::sync::atomic::AtomicU64,
}

/// A copy of the server's counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ServerSnapshot {
    /// Connections in transmission now.
    pub connections: u64,
    /// Requests received since the start.
    pub requests: u64,
    /// Requests received and not yet answered now (a delayed reply counts until it is sent).
    pub in_flight: u64,
    /// The sum over requests of the time from receipt to reply: its growth over an interval,
    /// divided by the interval, is the mean number of requests in flight (Little's law).
    pub in_flight_ns: u64,
}

impl ServerCounters {
    pub fn snapshot(&self) -> ServerSnapshot {
        use std::sync::atomic::Ordering::Relaxed;
        ServerSnapshot {
            connections: self.connections.load(Relaxed),
            requests: self.requests.load(Relaxed),
            in_flight: self.in_flight.load(Relaxed),
            in_flight_ns: self.in_flight_ns.load(Relaxed),
        }
    }
}

// Handshake
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943; // "NBDMAGIC"
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054; // "IHAVEOPT"
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;

// handshake flags (server) and client flags
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// transmission flags
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// options
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;
pub const OPT_EXTENDED_HEADERS: u32 = 11;

// option replies
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;
pub const REP_ERR_EXT_HEADER_REQD: u32 = (1 << 31) + 10;

// NBD_REP_INFO types
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Transmission
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const EXTENDED_REQUEST_MAGIC: u32 = 0x21e4_1c71;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
pub const EXTENDED_REPLY_MAGIC: u32 = 0x6e8a_278c;

// commands
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

// command flags
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;
pub const CMD_FLAG_PAYLOAD_LEN: u16 = 1 << 5;

// structured reply flags and chunk types
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_BLOCK_STATUS_EXT: u16 = 6;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

// error values (the only ones the protocol allows on the wire)
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// A host errno as the protocol's error value. The protocol defines eight values; EDQUOT and
/// EFBIG become ENOSPC (as the document says), and everything else becomes EIO: a client
/// reads an unknown value as EINVAL or a failed request anyway, and the fault log keeps the
/// errno that was injected.
pub fn wire_errno(errno: i32) -> u32 {
    match errno {
        libc::EPERM | libc::EROFS => EPERM,
        libc::ENOMEM => ENOMEM,
        libc::EINVAL => EINVAL,
        libc::ENOSPC | libc::EDQUOT | libc::EFBIG => ENOSPC,
        libc::EOVERFLOW => EOVERFLOW,
        libc::ENOTSUP => ENOTSUP,
        libc::ESHUTDOWN => ESHUTDOWN,
        _ => EIO,
    }
}

/// The protocol's error value as a host errno (unknown values: EIO).
pub fn host_errno(wire: u32) -> i32 {
    match wire {
        EPERM => libc::EPERM,
        ENOMEM => libc::ENOMEM,
        EINVAL => libc::EINVAL,
        ENOSPC => libc::ENOSPC,
        EOVERFLOW => libc::EOVERFLOW,
        ENOTSUP => libc::ENOTSUP,
        ESHUTDOWN => libc::ESHUTDOWN,
        _ => libc::EIO,
    }
}

/// Old-style handshake's second magic (not supported by the client).
pub const CLISERV_MAGIC: u64 = 0x0000_4202_8186_1253;

/// The wire names of commands, for messages.
pub fn cmd_name(cmd: u16) -> &'static str {
    match cmd {
        CMD_READ => "READ",
        CMD_WRITE => "WRITE",
        CMD_DISC => "DISC",
        CMD_FLUSH => "FLUSH",
        CMD_TRIM => "TRIM",
        CMD_CACHE => "CACHE",
        CMD_WRITE_ZEROES => "WRITE_ZEROES",
        CMD_BLOCK_STATUS => "BLOCK_STATUS",
        _ => "unknown",
    }
}

/// Size of a compact request header; an extended one is 32 bytes.
pub const REQUEST_LEN: usize = 28;
pub const EXTENDED_REQUEST_LEN: usize = 32;

/// One request header, compact or extended (the compact length widened).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub cmd: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u64,
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().expect("4 bytes"))
}
fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().expect("8 bytes"))
}

/// Why a request header cannot be read; the connection ends (the stream is out of step).
#[derive(Debug, PartialEq, Eq)]
pub struct BadMagic(pub u32);

impl Request {
    /// Header size for the negotiated style.
    pub fn header_len(extended: bool) -> usize {
        if extended { EXTENDED_REQUEST_LEN } else { REQUEST_LEN }
    }

    /// Parse a header of `header_len(extended)` bytes. The magic must match the style: a
    /// client that negotiated extended headers and sends a compact one (or the reverse) is out
    /// of step with the stream.
    pub fn parse(b: &[u8], extended: bool) -> Result<Request, BadMagic> {
        let magic = be32(b);
        let want = if extended { EXTENDED_REQUEST_MAGIC } else { REQUEST_MAGIC };
        if magic != want {
            return Err(BadMagic(magic));
        }
        let length = if extended { be64(&b[24..]) } else { be32(&b[24..]) as u64 };
        Ok(Request { flags: be16(&b[4..]), cmd: be16(&b[6..]), cookie: be64(&b[8..]), offset: be64(&b[16..]), length })
    }

    /// The header as a client sends it (tests and tools).
    pub fn encode(&self, extended: bool) -> Vec<u8> {
        let mut v = Vec::with_capacity(EXTENDED_REQUEST_LEN);
        v.extend_from_slice(&(if extended { EXTENDED_REQUEST_MAGIC } else { REQUEST_MAGIC }).to_be_bytes());
        v.extend_from_slice(&self.flags.to_be_bytes());
        v.extend_from_slice(&self.cmd.to_be_bytes());
        v.extend_from_slice(&self.cookie.to_be_bytes());
        v.extend_from_slice(&self.offset.to_be_bytes());
        if extended {
            v.extend_from_slice(&self.length.to_be_bytes());
        } else {
            v.extend_from_slice(&(self.length as u32).to_be_bytes());
        }
        v
    }
}

/// Which reply headers the connection negotiated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    Simple,
    Structured,
    Extended,
}

impl Style {
    /// Bytes of a reply chunk header (a simple reply's for `Simple`).
    pub fn header_len(self) -> usize {
        match self {
            Style::Simple => 16,
            Style::Structured => 20,
            Style::Extended => 32,
        }
    }
}

/// Where reply bytes are appended: a `Vec`, or a connection's output buffer.
pub trait Sink {
    fn put(&mut self, b: &[u8]);
}
impl Sink for Vec<u8> {
    fn put(&mut self, b: &[u8]) {
        self.extend_from_slice(b);
    }
}

/// Append a simple reply header.
pub fn simple_reply(out: &mut impl Sink, error: u32, cookie: u64) {
    out.put(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out.put(&error.to_be_bytes());
    out.put(&cookie.to_be_bytes());
}

/// Append a structured (20-byte) or extended (32-byte) chunk header; `offset` is the request's
/// (extended headers echo it).
pub fn chunk_header(out: &mut impl Sink, style: Style, flags: u16, typ: u16, cookie: u64, offset: u64, len: u64) {
    match style {
        Style::Extended => {
            out.put(&EXTENDED_REPLY_MAGIC.to_be_bytes());
            out.put(&flags.to_be_bytes());
            out.put(&typ.to_be_bytes());
            out.put(&cookie.to_be_bytes());
            out.put(&offset.to_be_bytes());
            out.put(&len.to_be_bytes());
        }
        _ => {
            out.put(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
            out.put(&flags.to_be_bytes());
            out.put(&typ.to_be_bytes());
            out.put(&cookie.to_be_bytes());
            out.put(&(len as u32).to_be_bytes());
        }
    }
}

/// Append the reply to a request without data: success or an error, in the connection's style
/// (structured errors carry a message for the human at the client). A success under structured
/// replies is a simple reply, as the protocol allows for every command but a read (16 bytes that
/// libnbd takes in one receive, where a chunk header takes it two). Extended headers allow no
/// simple reply.
pub fn status_reply(out: &mut impl Sink, style: Style, req: &Request, error: u32, msg: &str) {
    match (style, error) {
        (Style::Simple, _) => simple_reply(out, error, req.cookie),
        (Style::Structured, 0) if req.cmd != CMD_READ => simple_reply(out, 0, req.cookie),
        (_, 0) => chunk_header(out, style, REPLY_FLAG_DONE, REPLY_TYPE_NONE, req.cookie, req.offset, 0),
        _ => {
            let msg = &msg.as_bytes()[..msg.len().min(4096)];
            chunk_header(out, style, REPLY_FLAG_DONE, REPLY_TYPE_ERROR, req.cookie, req.offset, 6 + msg.len() as u64);
            out.put(&error.to_be_bytes());
            out.put(&(msg.len() as u16).to_be_bytes());
            out.put(msg);
        }
    }
}

/// Bytes before a read's data: the simple reply header, or a chunk header of type OFFSET_DATA
/// plus its 8-byte offset.
pub fn read_prefix_len(style: Style) -> usize {
    match style {
        Style::Simple => 16,
        s => s.header_len() + 8,
    }
}

/// Append the header of a successful read of `len` bytes at the request's offset (the data
/// follows).
pub fn read_prefix(out: &mut impl Sink, style: Style, req: &Request, len: u64) {
    match style {
        Style::Simple => simple_reply(out, 0, req.cookie),
        s => {
            chunk_header(out, s, REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, req.cookie, req.offset, len + 8);
            out.put(&req.offset.to_be_bytes());
        }
    }
}

/// An option reply header and its data.
pub fn option_reply(out: &mut impl Sink, opt: u32, typ: u32, data: &[u8]) {
    out.put(&OPT_REPLY_MAGIC.to_be_bytes());
    out.put(&opt.to_be_bytes());
    out.put(&typ.to_be_bytes());
    out.put(&(data.len() as u32).to_be_bytes());
    out.put(data);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip_both_styles() {
        let r = Request { flags: CMD_FLAG_FUA, cmd: CMD_WRITE, cookie: 0x1122_3344_5566_7788, offset: 1 << 40, length: 4096 };
        for ext in [false, true] {
            let b = r.encode(ext);
            assert_eq!(b.len(), Request::header_len(ext));
            assert_eq!(Request::parse(&b, ext), Ok(r));
            // the other style's magic is refused (checked before any other field)
            assert!(Request::parse(&r.encode(!ext), ext).is_err());
        }
        let big = Request { length: 1 << 33, ..r };
        assert_eq!(Request::parse(&big.encode(true), true).unwrap().length, 1 << 33);
    }

    #[test]
    fn reply_layouts() {
        let req = Request { flags: 0, cmd: CMD_READ, cookie: 7, offset: 4096, length: 512 };
        let mut v = Vec::new();
        status_reply(&mut v, Style::Simple, &req, EIO, "x");
        assert_eq!(v, [0x67, 0x44, 0x66, 0x98, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 7]);
        v.clear();
        let write = Request { cmd: CMD_WRITE, ..req };
        status_reply(&mut v, Style::Structured, &write, 0, "");
        assert_eq!(v, [0x67, 0x44, 0x66, 0x98, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7], "a success: simple reply");
        v.clear();
        status_reply(&mut v, Style::Structured, &req, 0, "");
        assert_eq!(v.len(), 20, "an empty read: a chunk, never a simple reply");
        v.clear();
        status_reply(&mut v, Style::Extended, &write, 0, "");
        assert_eq!(v.len(), 32, "extended headers: a chunk even for a success");
        assert_eq!(&v[4..8], &[0, 1, 0, 0]); // DONE, TYPE_NONE
        v.clear();
        status_reply(&mut v, Style::Structured, &req, EIO, "bad");
        assert_eq!(v.len(), 20 + 6 + 3);
        assert_eq!(&v[4..8], &[0, 1, 0x80, 1]); // DONE, TYPE_ERROR
        assert_eq!(&v[16..20], &9u32.to_be_bytes());
        v.clear();
        read_prefix(&mut v, Style::Extended, &req, 512);
        assert_eq!(v.len(), read_prefix_len(Style::Extended));
        assert_eq!(&v[0..4], &EXTENDED_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&v[16..24], &4096u64.to_be_bytes()); // the request's offset echoed
        assert_eq!(&v[24..32], &520u64.to_be_bytes()); // payload: offset + data
        assert_eq!(wire_errno(libc::ETIMEDOUT), EIO);
        assert_eq!(wire_errno(libc::EDQUOT), ENOSPC);
        assert_eq!(wire_errno(libc::EROFS), EPERM);
    }
}
