//! The virtual disk: a chain of layers over a store (nbdkit's filters over a plugin). The
//! transports (FUSE over io_uring, classic /dev/fuse, the NBD server) call the top, `Disk`;
//! each layer does its part and calls the one below (`layer::Layer`):
//!
//! ```text
//! Disk          range check (EINVAL outside the disk)
//! Counted       per-op request counts and service times (service.rs)
//! Modelled      the latency model: admits each request, holds its reply to the due time (latency.rs)
//! Faults        the fault engine: fails, edits, drops, redirects, delays (faults.rs)
//! WriteCache    the volatile write cache and the power switch (cache.rs, docs/crash.md)
//! store         RAM | file | device | NBD client (store.rs)
//! ```
//!
//! Each layer holds the next by value, so the chain is one type (`Chain`): static calls, no
//! allocation per layer. Delays are returned, not slept, so a transport can reply late from
//! another thread without holding up other requests. Counters are kept by whoever counts: the
//! disk's own here, the NBD server's by the server, the NBD client's by the client store.

pub mod cache;
pub mod faults;
pub mod hashcopy;
pub mod latency;
pub mod layer;
pub mod service;
pub mod store;

use crate::fault::Rule;
use crate::fault::engine::ArmedRule;
pub use crate::spec::disk::{DiskConfig, StoreSpec};
use anyhow::{Result, bail};
pub use layer::Layer;
use std::sync::Arc;
use std::time::{Duration, Instant};
pub use store::Store;

/// Result of one request, as the front end must report it.
#[derive(Debug, Default)]
pub struct Outcome {
    pub errno: Option<i32>,
    pub delay: Option<Duration>,
}

impl Outcome {
    pub const OK: Outcome = Outcome { errno: None, delay: None };

    /// A failed store operation: its errno (EIO where it has none).
    pub fn io(e: std::io::Error) -> Outcome {
        Outcome { errno: Some(e.raw_os_error().unwrap_or(libc::EIO)), delay: None }
    }

    /// A layer's own delay on top of this outcome from below. An error from below is answered
    /// as it came (the layer's delay was for a request that succeeded).
    pub fn after(self, delay: Option<Duration>) -> Outcome {
        if self.errno.is_some() || delay.is_none() {
            return self;
        }
        Outcome { errno: None, delay: Some(self.delay.unwrap_or_default() + delay.unwrap_or_default()) }
    }

    /// The reply is due at `due` (the latency model's time), and a delay rule's delay comes on
    /// top of it; a reply already past its due time goes at once (plus any rule delay).
    fn due(mut self, due: Option<Instant>) -> Outcome {
        if let Some(at) = due {
            let left = at.saturating_duration_since(Instant::now()) + self.delay.unwrap_or_default();
            self.delay = (!left.is_zero()).then_some(left);
        }
        self
    }
}

/// The layers under `Disk`, top to bottom.
pub type Chain = service::Counted<latency::Modelled<faults::Faults<Cached>>>;
/// The cache over the store.
pub type Cached = cache::WriteCache<layer::StoreLayer>;

pub struct Disk {
    top: Chain,
    size: u64,
    block_size: u32,
    describe: String,
    /// The NBD client's counters when the store is a remote export (the client keeps them).
    nbd_client: Option<Arc<crate::nbd::client::Counters>>,
    /// Test-only (`frontend::guard`): a read or write covering this byte panics.
    panic_at: Option<u64>,
    /// The loop device the disk is served on, whose page cache a power cut drops.
    loop_device: std::sync::OnceLock<std::path::PathBuf>,
}

impl Disk {
    pub fn open(cfg: &DiskConfig) -> Result<Disk> {
        let bs = crate::spec::disk::check_block_size(cfg.block_size as u64).map_err(anyhow::Error::msg)?;
        let check_size = |size: u64| {
            if size < bs as u64 * 16 || !size.is_multiple_of(bs as u64) {
                bail!("disk size {size} must be a multiple of the block size ({bs}) and at least 16 blocks");
            }
            Ok(())
        };
        // a size given is checked before any store is reserved or any file created
        if let Some(size) = cfg.size {
            check_size(size)?;
        }
        if cfg.write_cache == cache::CacheMode::Volatile {
            crate::spec::disk::check_write_cache_size(cfg.write_cache_size).map_err(anyhow::Error::msg)?;
        }
        let mut nbd_client = None;
        let store: Box<dyn Store> = match &cfg.store {
            StoreSpec::Ram => {
                let Some(size) = cfg.size else { bail!("a RAM disk needs --size (e.g. --size 8GiB)") };
                Box::new(store::RamStore::new(size)?)
            }
            StoreSpec::File(p) => Box::new(store::FileStore::open(p, cfg.size)?),
            StoreSpec::Device(p) => {
                let d = store::FileStore::open_device(p, cfg.destructive, cfg.force)?;
                if cfg.size.is_some_and(|s| s != d.size()) {
                    bail!("--size does not match the device ({} bytes); leave --size out for devices", d.size());
                }
                Box::new(d)
            }
            StoreSpec::Nbd(t) => {
                let d = store::NbdStore::connect(t)?;
                if cfg.size.is_some_and(|s| s != d.size()) {
                    bail!("--size does not match the NBD export ({} bytes); leave --size out for NBD stores", d.size());
                }
                nbd_client = Some(d.counters());
                Box::new(d)
            }
        };
        check_size(store.size())?;
        if cfg.populates() {
            store.populate()?;
        }
        let mut d = Disk::over_cached(store, bs, cfg.latency.clone().map(latency::Latency::new), cfg.write_cache, cfg.write_cache_size);
        d.nbd_client = nbd_client;
        d.panic_at = match std::env::var("FAULTLINE_TEST_PANIC_AT") {
            Ok(v) => Some(v.parse().map_err(|_| anyhow::anyhow!("FAULTLINE_TEST_PANIC_AT={v:?}: not a byte offset (a test-only setting)"))?),
            Err(_) => None,
        };
        Ok(d)
    }

    /// The chain over `store`, with the latency model if given.
    pub fn over(store: Box<dyn Store>, block_size: u32, latency: Option<latency::Latency>) -> Disk {
        Disk::over_cached(store, block_size, latency, cache::CacheMode::None, 0)
    }

    /// The chain over `store`, with the latency model if given and the write cache.
    pub fn over_cached(store: Box<dyn Store>, block_size: u32, latency: Option<latency::Latency>, cache: cache::CacheMode, cache_size: u64) -> Disk {
        let (size, describe) = (store.size(), store.describe());
        let cached = cache::WriteCache::new(cache, cache_size, layer::StoreLayer(store));
        let top = service::Counted::new(latency::Modelled::new(latency, faults::Faults::new(block_size, cached)));
        Disk { top, size, block_size, describe, nbd_client: None, panic_at: None, loop_device: Default::default() }
    }

    pub fn size(&self) -> u64 {
        self.size
    }
    pub fn block_size(&self) -> u32 {
        self.block_size
    }
    pub fn describe_store(&self) -> String {
        self.describe.clone()
    }
    /// The NBD client's counters when the store is a remote export.
    pub fn client_counters(&self) -> Option<crate::nbd::client::CounterSnapshot> {
        self.nbd_client.as_ref().map(|c| c.snapshot())
    }

    /// The fault layer (its engine: rules, log, stats).
    pub fn faults(&self) -> &faults::Faults<Cached> {
        self.top.next().next()
    }
    /// The write cache and power switch (docs/crash.md).
    pub fn cache(&self) -> &Cached {
        self.faults().next()
    }
    /// Cut the power: the cache applies `model` (seeded) to the unflushed writes, then every
    /// request fails until `power_on`. Refused on a disk without a volatile cache.
    ///
    /// Served on a loop device, its page cache goes too, once the power is off: dirty pages
    /// fail their writeback against the dead device and clean ones are dropped, so nothing
    /// read after power-on comes from before the cut (docs/crash.md). Call it from a thread
    /// that serves no FUSE request (that writeback comes back to the daemon).
    pub fn power_cut(&self, model: cache::SurvivalModel, seed: u64) -> Result<cache::CutReport> {
        let r = self.cache().power_cut(model, seed)?;
        if let Some(dev) = self.loop_device.get() {
            crate::sys::drop_page_cache(dev)?;
        }
        Ok(r)
    }
    /// The loop device the disk is served on (`ServedDisk`): a power cut drops its page cache.
    pub fn set_loop_device(&self, dev: &std::path::Path) {
        let _ = self.loop_device.set(dev.to_owned());
    }
    /// Power on after a cut.
    pub fn power_on(&self) -> Result<()> {
        self.cache().power_on()
    }
    pub fn engine(&self) -> &crate::fault::Engine {
        &self.faults().engine
    }
    /// The device's service time per request (`disk::latency`), if the disk has a model.
    pub fn latency(&self) -> Option<&latency::Latency> {
        self.top.next().model()
    }
    /// Per-op request counts and service times (`stats`' `service`).
    pub fn service(&self) -> &service::ServiceCounters {
        self.top.counters()
    }

    pub fn geometry(&self) -> crate::spec::rule::check::DiskGeometry {
        crate::spec::rule::check::DiskGeometry { size: self.size(), block_size: self.block_size }
    }

    fn in_range(&self, off: u64, len: u64) -> bool {
        off.checked_add(len).is_some_and(|e| e <= self.size)
    }

    /// The test-only panic (`FAULTLINE_TEST_PANIC_AT`) for a request in range.
    fn panic_if_asked(&self, off: u64, len: u64) {
        if let Some(at) = self.panic_at
            && (off..off + len).contains(&at)
        {
            panic!("FAULTLINE_TEST_PANIC_AT={at}: a request covering this byte panics (test-only)");
        }
    }

    /// Read into `buf`. Read-side corruption edits only the returned buffer.
    pub fn read(&self, off: u64, buf: &mut [u8]) -> Outcome {
        if !self.in_range(off, buf.len() as u64) {
            return Outcome { errno: Some(libc::EINVAL), delay: None };
        }
        self.panic_if_asked(off, buf.len() as u64);
        self.top.read(off, buf)
    }

    /// Write `data`. Write-side corruption lands in the stored copy.
    pub fn write(&self, off: u64, data: &[u8]) -> Outcome {
        let mut out = None;
        self.write_then(off, data, |o| out = Some(o));
        out.expect("write_then always answers")
    }

    /// Write `data`; `ack` gets the outcome as soon as it is decided. On the RAM store that can
    /// be before the bytes are in: the request's chunks are locked first, so no later request
    /// can see the old bytes, and the copy overlaps the kernel's completion path (BENCHMARKS.md).
    pub fn write_then(&self, off: u64, data: &[u8], ack: impl FnOnce(Outcome)) {
        self.write_from(off, store::Src::Borrowed(data), |o, _| ack(o))
    }

    /// Like `write_then`, but the bytes are lent (`store::Lent`) and `ack` gets their buffer
    /// back with the outcome: on the RAM store once the bytes are stored and hashed (content
    /// edits follow, under the same locks, on the stored copy), so the caller may reuse the
    /// buffer from the acknowledgement on: the ring front end's reply goes into it.
    pub fn write_then_copied<'a>(&self, off: u64, data: store::Lent<'a>, ack: impl FnOnce(Outcome, &'a mut [u8])) {
        self.write_from(off, store::Src::Lent(data), |o, lent| ack(o, lent.expect("a lent buffer comes back with the acknowledgement").into_buf()))
    }

    /// `ack` gets the outcome and, for `Src::Lent`, the buffer back.
    fn write_from<'a>(&self, off: u64, data: store::Src<'a>, ack: impl FnOnce(Outcome, Option<store::Lent<'a>>)) {
        if !self.in_range(off, data.len() as u64) {
            return ack(Outcome { errno: Some(libc::EINVAL), delay: None }, data.lent());
        }
        self.panic_if_asked(off, data.len() as u64);
        self.top.write(off, data, ack)
    }

    pub fn flush(&self) -> Outcome {
        self.top.flush()
    }

    /// Run `f`'s requests with FUA (Forced Unit Access), then flush: the NBD server's
    /// `NBD_CMD_FLAG_FUA`. Without a volatile cache that is `f` then a flush, as before; with
    /// one, the writes `f` makes are durable at once (every survival model keeps them) while
    /// earlier unflushed writes stay volatile: the flush that follows goes down to the store
    /// (and through the rules and counters as any flush) but ends no epoch (docs/crash.md).
    pub fn with_fua(&self, f: impl FnOnce(&Disk) -> Outcome) -> Outcome {
        cache::as_fua(true, || {
            let o = f(self);
            if o.errno.is_some() {
                return o;
            }
            let fl = self.flush();
            let delay = match (o.delay, fl.delay) {
                (Some(x), Some(y)) => Some(x + y),
                (x, y) => x.or(y),
            };
            Outcome { errno: fl.errno, delay }
        })
    }

    /// A FUA write (`with_fua`).
    pub fn write_fua(&self, off: u64, data: &[u8]) -> Outcome {
        self.with_fua(|d| d.write(off, data))
    }

    pub fn discard(&self, off: u64, len: u64) -> Outcome {
        if !self.in_range(off, len) {
            return Outcome { errno: Some(libc::EINVAL), delay: None };
        }
        self.top.discard(off, len)
    }

    /// Arm rules; `rot` rules corrupt the stored data now (and stay listed with their counts).
    pub fn arm(&self, rules: Vec<Rule>) -> Result<Vec<Arc<ArmedRule>>> {
        // every path that arms (rules file, `add`, `arm`, a run, an agent) comes here: one check
        crate::spec::rule::check::check_rules(&rules, self.geometry()).map_err(anyhow::Error::msg)?;
        self.faults().arm(rules)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::{Action, Op, Target};
    use crate::spec::rule::FlipAt;

    fn disk() -> Disk {
        Disk::open(&DiskConfig {
            size: Some(1 << 24),
            block_size: 4096,
            store: StoreSpec::Ram,
            destructive: false,
            force: false,
            latency: None,
            populate: None,
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn write_flip_is_stored_read_flip_is_not() {
        let d = disk();
        let data = vec![0xAAu8; 8192];
        d.arm(vec![Rule::new(Action::Bitflip { at: FlipAt::default() }, &[Op::Write], Target::Range { start: 0, end: 4096 })]).unwrap();
        assert!(d.write(0, &data).errno.is_none());
        d.engine().clear();
        d.arm(vec![Rule::new(Action::Bitflip { at: FlipAt { byte: Some(1), bit: Some(1) } }, &[Op::Read], Target::Range { start: 4096, end: 8192 })]).unwrap();
        let mut b = vec![0u8; 8192];
        d.read(0, &mut b);
        assert_eq!((b[0], b[4097]), (0xAB, 0xA8));
        d.engine().clear();
        d.read(0, &mut b);
        assert_eq!((b[0], b[4097]), (0xAB, 0xAA), "read flip must not reach the store");
    }

    #[test]
    fn rot_by_content_and_write_modes() {
        let d = disk();
        let mut blk = vec![0u8; 4096];
        crate::content::fill_block(5, 0, &mut blk);
        d.write(40960, &blk);
        d.write(81920, &blk);
        let h = crate::content::block_hash(&blk);
        d.arm(vec![Rule::new(Action::Rot { at: FlipAt::default() }, &[], Target::Content { hash: h })]).unwrap();
        let mut b = vec![0u8; 4096];
        d.read(40960, &mut b);
        assert_eq!(b[0], blk[0] ^ 1);
        d.read(81920, &mut b);
        assert_eq!(b[0], blk[0] ^ 1);
        assert_eq!(d.engine().list()[0].blocks, 2);

        d.engine().clear();
        d.arm(vec![Rule::new(Action::MisdirectedWrite { shift: 4096 }, &[Op::Write], Target::Any)]).unwrap();
        d.write(0, &blk);
        d.read(0, &mut b);
        assert!(b.iter().all(|x| *x == 0));
        d.read(4096, &mut b);
        assert_eq!(b, blk);
    }

    /// The RAM store takes edits-only content rules in one pass (`write_locked`); a file store
    /// hashes first, then writes. Same requests, same rules: same bytes stored, same faults
    /// logged, same delays; and a content error rule (whole request) takes the two-pass path.
    #[test]
    fn one_pass_content_writes_match_two_pass() {
        use crate::spec::rule::{DelayDist, Fill};
        let dir = tempfile::tempdir().unwrap();
        let size = 1u64 << 22;
        let ram = disk_of(StoreSpec::Ram, size);
        let file = disk_of(StoreSpec::File(dir.path().join("store")), size);
        let block = |id| {
            let mut b = vec![0u8; 4096];
            crate::content::fill_block(id, 1, &mut b);
            b
        };
        let h = |id| crate::content::block_hash(&block(id));
        let rules = || {
            vec![
                Rule::new(Action::Bitflip { at: FlipAt { byte: Some(9), bit: Some(3) } }, &[Op::Write], Target::Content { hash: h(1) }),
                Rule::new(Action::Corrupt { offset: 100, length: Some(50), fill: Fill::Random }, &[Op::Write], Target::Content { hash: h(2) }),
                Rule::new(Action::Delay { delay: DelayDist::Fixed(Duration::from_micros(70)) }, &[Op::Write], Target::Content { hash: h(3) }),
                Rule::new(Action::Bitflip { at: FlipAt::default() }, &[Op::Write], Target::Range { start: 200 << 12, end: 201 << 12 }),
            ]
        };
        // requests: 4 KiB, 128 KiB (streamed), unaligned edges, content ids 0..4 mixed
        let reqs: Vec<(u64, Vec<u8>)> = (0..40u64)
            .map(|k| {
                let n = [1usize, 32, 3, 64][k as usize % 4];
                let mut d: Vec<u8> = (0..n as u64).flat_map(|i| block((k + i) % 5)).collect();
                let off = (k * 97 % 900) << 12;
                if k % 5 == 4 {
                    d.truncate(d.len() - 512); // ends inside a block
                    return (off + 512, d); // starts inside one
                }
                (off, d)
            })
            .collect();
        for d in [&ram, &file] {
            d.arm(rules()).unwrap();
        }
        for (off, data) in &reqs {
            let (a, b) = (ram.write(*off, data), file.write(*off, data));
            assert_eq!((a.errno, a.delay), (b.errno, b.delay), "request at {off}");
        }
        let (mut x, mut y) = (vec![0u8; size as usize], vec![0u8; size as usize]);
        ram.read(0, &mut x);
        file.read(0, &mut y);
        assert!(x == y, "stored bytes differ between the one-pass and the two-pass write");
        let key = |d: &Disk| d.engine().log.since(0, 1 << 20).into_iter().map(|e| (e.rule, e.offset, e.len, e.blocks, e.detail)).collect::<Vec<_>>();
        let log = key(&ram);
        assert!(log.len() > 20, "the rules fired ({} entries)", log.len());
        assert_eq!(log, key(&file));
        // the ring front end's write: acknowledged once stored, and the caller reuses its
        // buffer from the acknowledgement on (here: scribbles over it); the hashing and edits
        // that follow must come from the stored copy. Rules that only edit (a content delay
        // would hold the acknowledgement until after the hashing), against a plain write.
        let edits = || rules().into_iter().filter(|r| !matches!(r.action, Action::Delay { .. })).collect::<Vec<_>>();
        let (plain, copied) = (disk_of(StoreSpec::Ram, size), disk_of(StoreSpec::Ram, size));
        plain.arm(edits()).unwrap();
        copied.arm(edits()).unwrap();
        for (off, data) in &reqs {
            let want = plain.write(*off, data);
            let mut buf = data.clone();
            let mut got = None;
            copied.write_then_copied(*off, store::Lent::new(&mut buf, data.len()), |o, buf| {
                buf.fill(0xA5);
                got = Some(o);
            });
            let got = got.unwrap();
            assert_eq!((got.errno, got.delay), (want.errno, want.delay), "request at {off}");
        }
        let (mut w, mut z) = (vec![0u8; size as usize], vec![0u8; size as usize]);
        plain.read(0, &mut w);
        copied.read(0, &mut z);
        assert!(w == z, "stored bytes differ when the source buffer is reused after the acknowledgement");
        let fired = key(&plain);
        assert!(fired.len() > 20, "the edit rules fired ({} entries)", fired.len());
        assert_eq!(key(&copied), fired, "faults differ when the source buffer is reused after the acknowledgement");
        // an error by content fails the whole request and stores nothing, in both
        for d in [&ram, &file] {
            d.arm(vec![Rule::new(Action::Error { errno: libc::EIO }, &[Op::Write], Target::Content { hash: h(4) })]).unwrap();
            let data: Vec<u8> = [0, 4].iter().flat_map(|i| block(*i)).collect();
            assert_eq!(d.write(950 << 12, &data).errno, Some(libc::EIO));
            let mut b = vec![1u8; 8192];
            d.read(950 << 12, &mut b);
            assert!(b.iter().all(|x| *x == 0), "a failed write stored something");
        }
    }

    /// The RAM store acknowledges a write once its chunks are locked, before the copy: a read
    /// started from the acknowledgement must still see the new bytes, edits included.
    #[test]
    fn early_ack_is_never_observed_early() {
        let d = std::sync::Arc::new(disk());
        let mut blk = vec![0u8; 4096];
        crate::content::fill_block(8, 0, &mut blk);
        let h = crate::content::block_hash(&blk);
        d.arm(vec![Rule::new(Action::Bitflip { at: FlipAt { byte: Some(0), bit: Some(0) } }, &[Op::Write], Target::Content { hash: h })]).unwrap();
        for round in 0..20u64 {
            let data: Vec<u8> = (0..256u64).flat_map(|i| if i == 255 { blk.clone() } else { vec![(round + i) as u8 | 1; 4096] }).collect();
            let off = round * (1 << 20) % (15 << 20);
            let mut reader = None;
            d.write_then(off, &data, |o| {
                assert!(o.errno.is_none());
                let d = d.clone();
                reader = Some(std::thread::spawn(move || {
                    let mut b = vec![0u8; 1 << 20];
                    d.read(off, &mut b);
                    b
                }));
            });
            let seen = reader.unwrap().join().unwrap();
            let mut want = data.clone();
            want[255 * 4096] ^= 1;
            assert!(seen == want, "round {round}: a read issued after the ack saw other bytes");
        }
    }

    /// A store that holds still inside `update`'s read-modify-write (under the inner store's
    /// locks) while `gate` is set, after saying so in `inside` (the round number), so a test
    /// can start a write exactly there.
    struct Gated {
        inner: Box<dyn Store>,
        ctl: Arc<GateCtl>,
    }

    #[derive(Default)]
    struct GateCtl {
        gate: std::sync::atomic::AtomicBool,
        inside: std::sync::atomic::AtomicU64,
        round: std::sync::atomic::AtomicU64,
    }

    impl Store for Gated {
        fn read(&self, off: u64, buf: &mut [u8]) -> std::io::Result<()> {
            self.inner.read(off, buf)
        }
        fn write(&self, off: u64, data: &[u8]) -> std::io::Result<()> {
            self.inner.write(off, data)
        }
        fn flush(&self) -> std::io::Result<()> {
            self.inner.flush()
        }
        fn discard(&self, off: u64, len: u64) -> std::io::Result<()> {
            self.inner.discard(off, len)
        }
        fn size(&self) -> u64 {
            self.inner.size()
        }
        fn describe(&self) -> String {
            self.inner.describe()
        }
        fn write_locked<'a>(
            &self,
            off: u64,
            data: store::Src<'a>,
            hashed: Option<store::Hashed>,
            locked: &mut dyn FnMut(Option<store::Lent<'a>>),
            edit: &mut dyn FnMut(&[u128], &mut [u8]),
        ) -> Result<(), store::Src<'a>> {
            self.inner.write_locked(off, data, hashed, locked, edit)
        }
        fn update(&self, off: u64, len: usize, f: &mut dyn FnMut(&mut [u8]) -> bool) -> std::io::Result<bool> {
            use std::sync::atomic::Ordering::SeqCst;
            self.inner.update(off, len, &mut |b| {
                if self.ctl.gate.load(SeqCst) {
                    self.ctl.inside.store(self.ctl.round.load(SeqCst), SeqCst);
                    std::thread::sleep(Duration::from_millis(2));
                }
                f(b)
            })
        }
    }

    /// A rot racing client writes to its block. Each round one write (a new pattern) and one rot
    /// run; afterwards the block holds that write's bytes, or those with the flip if the rot
    /// came after. A rot that read the old bytes and stored them back flipped after the write
    /// would leave the previous pattern: the write undone. Gated rounds start the write while
    /// the rot is inside its read-modify-write (so it must wait for the rot), free rounds start
    /// both together.
    #[test]
    fn rot_never_undoes_a_concurrent_write() {
        use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
        let dir = tempfile::tempdir().unwrap();
        let size = 1u64 << 22;
        let stores: [(&str, Box<dyn Store>); 2] = [
            ("ram", Box::new(store::RamStore::new(size).unwrap())),
            ("file", Box::new(store::FileStore::open(&dir.path().join("store"), Some(size)).unwrap())),
        ];
        for (name, inner) in stores {
            let ctl = Arc::new(GateCtl::default());
            let d = Disk::over(Box::new(Gated { inner, ctl: ctl.clone() }), 4096, None);
            let at = FlipAt { byte: Some(0), bit: Some(0) };
            let (off, bs) = (3 * 4096u64, 4096usize);
            let rule = d.engine().add(vec![Rule::new(Action::Rot { at }, &[], Target::Range { start: off, end: off + bs as u64 })]).remove(0);
            let pattern = |k: u64| -> Vec<u8> { (0..bs / 8).flat_map(|_| k.to_le_bytes()).collect() };
            let (gated_rounds, rounds) = (40u64, 2000u64);
            // round k starts when `go` reaches k; `done` counts finished operations; u64::MAX in
            // `go` stops the helpers (after a failed round, or after 10 s without progress)
            let (go, done) = (AtomicU64::new(0), AtomicU64::new(0));
            let wait_for = |a: &AtomicU64, v: u64| {
                let t = std::time::Instant::now();
                while a.load(SeqCst) < v && go.load(SeqCst) != u64::MAX {
                    if t.elapsed() > Duration::from_secs(10) {
                        go.store(u64::MAX, SeqCst);
                    }
                    std::thread::yield_now();
                }
                go.load(SeqCst) != u64::MAX
            };
            let failed = std::thread::scope(|s| {
                s.spawn(|| {
                    for k in 1..=rounds {
                        let start = if k <= gated_rounds { &ctl.inside } else { &go };
                        if !wait_for(start, k) {
                            break;
                        }
                        assert!(d.write(off, &pattern(k)).errno.is_none());
                        done.fetch_add(1, SeqCst);
                    }
                });
                s.spawn(|| {
                    for k in 1..=rounds {
                        if !wait_for(&go, k) {
                            break;
                        }
                        d.faults().rot(&rule, &at).unwrap();
                        done.fetch_add(1, SeqCst);
                    }
                });
                let mut b = vec![0u8; bs];
                for k in 1..=rounds {
                    ctl.gate.store(k <= gated_rounds, SeqCst);
                    ctl.round.store(k, SeqCst);
                    go.store(k, SeqCst);
                    if !wait_for(&done, 2 * k) {
                        return Some(format!("round {k} did not finish"));
                    }
                    d.read(off, &mut b);
                    let mut want = pattern(k);
                    // a gated write waits for the rot: never flipped
                    if k > gated_rounds && b[0] != want[0] {
                        want[0] ^= 1;
                    }
                    if b != want {
                        go.store(u64::MAX, SeqCst);
                        let seen = u64::from_le_bytes(b[8..16].try_into().unwrap());
                        return Some(format!("round {k}: the block holds pattern {seen}{}", if b[0] == pattern(seen)[0] { "" } else { " flipped" }));
                    }
                }
                None
            });
            assert!(failed.is_none(), "{name}: {}", failed.unwrap());
        }
    }

    /// The chain's order: the latency model sits above the faults, so a write a rule loses or
    /// fails still takes the device's time (a lost write is not told apart by its speed), and a
    /// delay rule's delay comes on top of the model's; the counters see every request with the
    /// delay its reply is held for.
    #[test]
    fn the_model_times_requests_the_faults_lose_or_fail() {
        let model = crate::spec::latency::parse_latency("write: 5ms\nread: 5ms\n", "t").unwrap();
        let d = Disk::over(Box::new(store::RamStore::new(1 << 24).unwrap()), 4096, Some(latency::Latency::new(model)));
        let range = |b: u64| Target::Range { start: b * 4096, end: (b + 1) * 4096 };
        d.arm(vec![
            Rule::new(Action::LostWrite, &[Op::Write], range(1)),
            Rule::new(Action::Error { errno: libc::EIO }, &[Op::Write], range(2)),
            Rule::new(Action::Delay { delay: crate::spec::rule::DelayDist::Fixed(Duration::from_millis(20)) }, &[Op::Read], range(3)),
        ])
        .unwrap();
        let blk = vec![7u8; 4096];
        let held = |o: &Outcome| o.delay.unwrap_or_default();
        let (plain, lost, failed) = (d.write(0, &blk), d.write(4096, &blk), d.write(2 * 4096, &blk));
        for (name, o) in [("stored", &plain), ("lost", &lost)] {
            assert_eq!(o.errno, None, "{name}");
            assert!(held(o) > Duration::from_millis(4) && held(o) <= Duration::from_millis(5), "{name} write held {:?}", held(o));
        }
        assert_eq!(failed.errno, Some(libc::EIO));
        assert!(held(&failed) > Duration::from_millis(4), "a failed write held {:?}", held(&failed));
        let mut b = vec![1u8; 4096];
        assert!(d.read(4096, &mut b).errno.is_none() && b.iter().all(|x| *x == 0), "the lost write was stored");
        let o = d.read(3 * 4096, &mut b);
        assert!(held(&o) > Duration::from_millis(24) && held(&o) <= Duration::from_millis(25), "model + rule delay: {:?}", held(&o));
        let s = d.service().snapshot();
        assert_eq!((s["write"].count, s["read"].count), (3, 2));
        assert!(s["write"].delay_ns >= 3 * 4_000_000, "{:?}", s["write"]);
    }

    #[test]
    fn zero_length_write_succeeds() {
        assert_eq!(disk().write(4096, &[]).errno, None);
    }

    fn disk_of(store: StoreSpec, size: u64) -> Disk {
        Disk::open(&DiskConfig {
            size: Some(size),
            block_size: 4096,
            store,
            destructive: false,
            force: false,
            latency: None,
            populate: None,
            ..Default::default()
        })
        .unwrap()
    }
}
