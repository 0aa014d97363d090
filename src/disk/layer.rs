//! The interface every layer of the disk offers the one above it (nbdkit's filter `next`
//! calls): read, write, flush, discard, each answered with an `Outcome`. A layer holds the
//! layer below it by value (`next`), so the chain is one concrete type (`disk::Chain`) and a
//! request goes down it by static calls: no dynamic dispatch or allocation per layer.
//!
//! Two capabilities are optional, for the layer that injects faults: `write_locked` (store a
//! write under locks that keep every other request off its range, hashing its blocks on the
//! way in and editing the stored bytes before the locks are released: one pass instead of hash
//! then copy, and an acknowledgement before the copy) and `update` (a read-modify-write under
//! the same locks, for faults that change data at rest). A layer below the fault layer that
//! cannot offer them in its own terms declines (the defaults); one that passes requests
//! through unchanged forwards them.

use super::Outcome;
use super::store::{Hashed, Lent, Src, Store};
use std::io;

pub trait Layer: Send + Sync {
    /// The size in bytes the layer exposes (requests are inside it: `Disk` checks).
    fn size(&self) -> u64;
    /// Read into `buf`.
    fn read(&self, off: u64, buf: &mut [u8]) -> Outcome;
    /// Write `data`; `ack` runs exactly once with the outcome and, for `Src::Lent`, the buffer
    /// back. It may run before the bytes are in, where no later request can see the old bytes
    /// (`write_locked`).
    fn write<'a>(&self, off: u64, data: Src<'a>, ack: impl FnOnce(Outcome, Option<Lent<'a>>));
    fn flush(&self) -> Outcome;
    /// Forget [off, off+len): reads return zeroes afterwards.
    fn discard(&self, off: u64, len: u64) -> Outcome;

    /// Optional: `Store::write_locked`'s contract. `Err(data)`: declined, nothing ran.
    fn write_locked<'a>(
        &self,
        off: u64,
        data: Src<'a>,
        hashed: Option<Hashed>,
        locked: &mut dyn FnMut(Option<Lent<'a>>),
        edit: &mut dyn FnMut(&[u128], &mut [u8]),
    ) -> Result<(), Src<'a>> {
        let _ = (off, hashed, locked, edit);
        Err(data)
    }
    /// Optional: `Store::update`'s contract (EOPNOTSUPP where the layer cannot).
    fn update(&self, off: u64, len: usize, f: &mut dyn FnMut(&mut [u8]) -> bool) -> io::Result<bool> {
        let _ = (off, len, f);
        Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
    }
}

/// The store as the bottom of the chain (nbdkit's plugin): its `io::Result`s become outcomes,
/// and it offers both capabilities as far as the store itself does. One dynamic call per
/// request here, on the store, as before the chain.
pub struct StoreLayer(pub Box<dyn Store>);

impl Layer for StoreLayer {
    fn size(&self) -> u64 {
        Store::size(&*self.0)
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Outcome {
        Store::read(&*self.0, off, buf).map_or_else(Outcome::io, |()| Outcome::OK)
    }
    /// Acknowledged under the store's locks before the copy where the store can
    /// (`write_locked`), else once written.
    fn write<'a>(&self, off: u64, data: Src<'a>, ack: impl FnOnce(Outcome, Option<Lent<'a>>)) {
        let mut ack = Some(ack);
        let r = Store::write_locked(&*self.0, off, data, None, &mut |lent| (ack.take().expect("locked runs once"))(Outcome::OK, lent), &mut |_, _| {});
        if let Err(data) = r {
            let o = Store::write(&*self.0, off, data.bytes()).map_or_else(Outcome::io, |()| Outcome::OK);
            (ack.take().expect("declined: nothing ran"))(o, data.lent());
        }
    }
    fn flush(&self) -> Outcome {
        Store::flush(&*self.0).map_or_else(Outcome::io, |()| Outcome::OK)
    }
    fn discard(&self, off: u64, len: u64) -> Outcome {
        Store::discard(&*self.0, off, len).map_or_else(Outcome::io, |()| Outcome::OK)
    }
    fn write_locked<'a>(
        &self,
        off: u64,
        data: Src<'a>,
        hashed: Option<Hashed>,
        locked: &mut dyn FnMut(Option<Lent<'a>>),
        edit: &mut dyn FnMut(&[u128], &mut [u8]),
    ) -> Result<(), Src<'a>> {
        Store::write_locked(&*self.0, off, data, hashed, locked, edit)
    }
    fn update(&self, off: u64, len: usize, f: &mut dyn FnMut(&mut [u8]) -> bool) -> io::Result<bool> {
        Store::update(&*self.0, off, len, f)
    }
}

/// Write `data` (borrowed) through `layer` and return the outcome once acknowledged.
pub fn write_now(layer: &impl Layer, off: u64, data: &[u8]) -> Outcome {
    let mut out = None;
    layer.write(off, Src::Borrowed(data), |o, _| out = Some(o));
    out.expect("a layer's write always acknowledges")
}
