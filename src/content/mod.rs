//! Block content: the XXH3-128 identity of a block, and deterministic block bytes from a
//! content id (so written data never has to be kept, only its id). A 4 KiB content block is a
//! random segment of its seed's pool stamped in every 512-byte sector with (id, sector): unique
//! per id down to the sector, incompressible on its own, and cheap to make (docs/workload.md).

pub mod profile;
pub mod stream;

use twox_hash::{XxHash3_64, XxHash3_128};

/// The content hash faultline matches on: XXH3-128 of one block-size chunk. twox-hash picks
/// AVX2 at run time (xxhash-rust decides at compile time, so a portable build would be held to
/// SSE2; BENCHMARKS.md).
#[inline]
pub fn block_hash(block: &[u8]) -> u128 {
    XxHash3_128::oneshot(block)
}

/// Seeded XXH3-64: the small keyed hash behind reproducible draws (probabilities, flip
/// positions, the id permutation).
#[inline]
pub fn seeded_hash(seed: u64, data: &[u8]) -> u64 {
    XxHash3_64::oneshot_with_seed(seed, data)
}

pub fn hash_hex(h: u128) -> String {
    format!("{h:032x}")
}

pub fn parse_hash(s: &str) -> Result<u128, String> {
    let t = s.trim().trim_start_matches("0x");
    if t.len() != 32 || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("`{s}` is not a content hash; expected 32 hex digits (XXH3-128 of one block)"));
    }
    u128::from_str_radix(t, 16).map_err(|e| e.to_string())
}

#[inline]
fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Independent generator lanes: 16 x u64 = 128 bytes per step, so the step vectorizes (AVX2).
const LANES: usize = 16;

/// The content block (bytes): content ids name blocks of this size.
pub const BLOCK: usize = 4096;
/// Every sector of a block carries its own stamp.
pub const SECTOR: usize = 512;
/// Random 4 KiB segments in a seed's pool: a block's bytes start from segment `id % SEGMENTS`.
pub const SEGMENTS: u64 = 256;
/// `held` value of a buffer block whose bytes are no pool segment (never filled, or read into).
pub const HELD_NONE: u32 = u32::MAX;

/// Fill `out` with the bytes of content `id` under `seed`. Deterministic (saved content maps
/// depend on it). A 4 KiB block is its seed's pool segment `id % SEGMENTS` with an 8-byte
/// stamp at the start of each 512-byte sector (`Pool::fill`); other lengths (fault fills) come
/// straight from the lane generator (`fill_lanes`).
pub fn fill_block(id: u64, seed: u64, out: &mut [u8]) {
    if out.len() == BLOCK {
        let mut held = HELD_NONE;
        with_pool(seed, |p| p.fill(id, out, &mut held));
    } else {
        fill_lanes(id, seed, out);
    }
}

/// Random bytes from (id, seed), any length. Each lane is a xorshift64 generator seeded by
/// splitmix64 from (id, seed, lane): multiply-free steps that vectorize are much cheaper than
/// one splitmix64 per word. Ids that differ give unrelated bytes.
pub fn fill_lanes(id: u64, seed: u64, out: &mut [u8]) {
    let base = splitmix64(id ^ splitmix64(seed ^ 0x6661_756c_746c_696e));
    let mut s = [0u64; LANES];
    for (l, x) in s.iter_mut().enumerate() {
        // never 0: xorshift's only fixed point
        *x = splitmix64(base.wrapping_add((l as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93))) | 1;
    }
    #[inline(always)]
    fn step(s: &mut [u64; LANES]) {
        for x in s.iter_mut() {
            *x ^= *x << 13;
            *x ^= *x >> 7;
            *x ^= *x << 17;
        }
    }
    let mut chunks = out.chunks_exact_mut(LANES * 8);
    for c in &mut chunks {
        step(&mut s);
        for (l, w) in c.chunks_exact_mut(8).enumerate() {
            w.copy_from_slice(&s[l].to_le_bytes());
        }
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        step(&mut s);
        let mut last = [0u8; LANES * 8];
        for (l, w) in last.chunks_exact_mut(8).enumerate() {
            w.copy_from_slice(&s[l].to_le_bytes());
        }
        let n = rest.len();
        rest.copy_from_slice(&last[..n]);
    }
}

/// A seed's segment pool: `SEGMENTS` random 4 KiB blocks (1 MiB), from which every 4 KiB
/// content block of that seed is made. Generating a block is then a copy plus eight stamps,
/// and a buffer block that already holds the right segment (`held`) needs only the stamps:
/// a write of sequential ids into the same buffer rewrites 8 of its 64 cache lines per block.
pub struct Pool {
    seed: u64,
    key: u64,
    bytes: Box<[u8]>,
}

impl Pool {
    pub fn new(seed: u64) -> Pool {
        let mut bytes = vec![0u8; SEGMENTS as usize * BLOCK].into_boxed_slice();
        for (k, seg) in bytes.chunks_exact_mut(BLOCK).enumerate() {
            fill_lanes(k as u64, seed ^ 0x706f_6f6c_7365_6564, seg);
        }
        Pool { seed, key: splitmix64(seed ^ 0x7374_616d_7073_6b79), bytes }
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The 4 KiB block of content `id` into `out` (BLOCK bytes). `held` is the segment `out`
    /// holds now (`HELD_NONE`: unknown) and is updated: when it is already `id`'s segment,
    /// only the stamps are written. Sector j's stamp is splitmix64((8 id + j) ^ key): a
    /// bijection of (id, j) for ids below 2^61, so no two sectors of distinct contents (or of
    /// one block) are equal.
    #[inline]
    pub fn fill(&self, id: u64, out: &mut [u8], held: &mut u32) {
        assert_eq!(out.len(), BLOCK, "content blocks are {BLOCK} bytes");
        let seg = (id % SEGMENTS) as u32;
        if *held != seg {
            let at = seg as usize * BLOCK;
            out.copy_from_slice(&self.bytes[at..at + BLOCK]);
            *held = seg;
        }
        for (j, sector) in out.chunks_exact_mut(SECTOR).enumerate() {
            let stamp = splitmix64(id.wrapping_mul(8).wrapping_add(j as u64) ^ self.key);
            sector[..8].copy_from_slice(&stamp.to_le_bytes());
        }
    }
}

/// Pools kept process-wide (a run uses one seed; tests and experiments a few).
const POOLS_KEPT: usize = 8;

/// Run `f` with `seed`'s pool: this thread's last pool, else the process's cache (built and
/// added on a miss; the oldest of `POOLS_KEPT` is dropped).
pub fn with_pool<R>(seed: u64, f: impl FnOnce(&Pool) -> R) -> R {
    use std::cell::RefCell;
    use std::sync::{Arc, Mutex};
    static POOLS: Mutex<Vec<Arc<Pool>>> = Mutex::new(Vec::new());
    thread_local! {
        static LAST: RefCell<Option<Arc<Pool>>> = const { RefCell::new(None) };
    }
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        if last.as_ref().is_none_or(|p| p.seed != seed) {
            let mut all = POOLS.lock().unwrap_or_else(|e| e.into_inner());
            let p = match all.iter().find(|p| p.seed == seed) {
                Some(p) => p.clone(),
                None => {
                    let p = Arc::new(Pool::new(seed));
                    if all.len() >= POOLS_KEPT {
                        all.remove(0);
                    }
                    all.push(p.clone());
                    p
                }
            };
            *last = Some(p);
        }
        f(last.as_ref().expect("set above"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Rules carry hashes computed elsewhere (xxhsum -H2, other tools): ours must be standard
    /// XXH3, on every length and on the SIMD path twox-hash picks here.
    #[test]
    fn hashes_are_reference_xxh3() {
        assert_eq!(block_hash(b""), 0x99aa06d3014798d86001c324468d497f);
        let mut data = vec![0u8; 70_000];
        fill_block(3, 9, &mut data[..65536]);
        for (i, b) in data[65536..].iter_mut().enumerate() {
            *b = (i * 131 + 7) as u8;
        }
        let lens = (0..=300).chain([511, 512, 1024, 4095, 4096, 4097, 8192, 65536, 70_000]);
        for len in lens {
            let d = &data[data.len() - len..];
            assert_eq!(block_hash(d), xxhash_rust::xxh3::xxh3_128(d), "xxh3-128, {len} bytes");
            assert_eq!(seeded_hash(len as u64 * 77, d), xxhash_rust::xxh3::xxh3_64_with_seed(d, len as u64 * 77), "xxh3-64, {len} bytes");
        }
    }

    #[test]
    fn deterministic_and_distinct() {
        let mut a = vec![0u8; 4096];
        let mut b = vec![0u8; 4096];
        fill_block(7, 1, &mut a);
        fill_block(7, 1, &mut b);
        assert_eq!(a, b);
        let mut seen = HashSet::new();
        for id in 0..20_000u64 {
            fill_block(id, 1, &mut a);
            assert!(seen.insert(block_hash(&a)), "collision at id {id}");
        }
        fill_block(7, 2, &mut b);
        fill_block(7, 1, &mut a);
        assert_ne!(a, b, "seed must change the bytes");
    }

    /// The in-place path (only stamps rewritten over a held segment) gives exactly the bytes
    /// of a fresh fill, whatever the buffer held before.
    #[test]
    fn in_place_fill_is_exact() {
        let p = Pool::new(5);
        let mut buf = vec![0u8; 8 * BLOCK];
        let mut held = vec![HELD_NONE; 8];
        let mut want = vec![0u8; BLOCK];
        for round in 0..4u64 {
            for (k, (b, h)) in buf.chunks_exact_mut(BLOCK).zip(&mut held).enumerate() {
                // rounds 0-2: sequential ids (segments line up with the buffer); 3: scattered
                let id = if round < 3 { round * SEGMENTS + k as u64 } else { 7919 * k as u64 + 3 };
                p.fill(id, b, h);
                fill_block(id, 5, &mut want);
                assert_eq!(b, &want[..], "round {round} block {k}");
            }
        }
        // a read into the buffer: the caller forgets what it held
        buf[100] ^= 0xff;
        held[0] = HELD_NONE;
        p.fill(42, &mut buf[..BLOCK], &mut held[0]);
        fill_block(42, 5, &mut want);
        assert_eq!(&buf[..BLOCK], &want[..]);
    }

    /// Distinct ids: distinct in every 512-byte sector (sector-level dedup sees unique data),
    /// and no 8-byte word repeats inside one block (no self-similarity to compress).
    #[test]
    fn every_sector_is_unique() {
        let mut b = vec![0u8; BLOCK];
        let mut sectors = HashSet::new();
        for id in 0..4096u64 {
            fill_block(id, 9, &mut b);
            for s in b.chunks_exact(SECTOR) {
                assert!(sectors.insert(block_hash(s)), "repeated sector at id {id}");
            }
            let words: HashSet<&[u8]> = b.chunks_exact(8).collect();
            assert_eq!(words.len(), BLOCK / 8, "repeated word in block {id}");
        }
    }

    #[test]
    fn other_lengths_are_deterministic() {
        let (mut a, mut b) = (vec![0u8; 1000], vec![0u8; 1000]);
        fill_block(3, 4, &mut a);
        fill_block(3, 4, &mut b);
        assert_eq!(a, b);
        fill_block(4, 4, &mut b);
        assert_ne!(a, b);
    }

    #[test]
    fn hex_round_trip() {
        let h = block_hash(b"hello");
        assert_eq!(parse_hash(&hash_hex(h)).unwrap(), h);
        assert!(parse_hash("xyz").is_err());
    }
}
