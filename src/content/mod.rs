//! Block content: the XXH3-128 identity of a block, and deterministic block bytes from a
//! content id (so written data never has to be kept, only its id).

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

/// Fill `out` with the bytes of content `id` under `seed`. Deterministic (saved content maps
/// depend on it); ids that differ give unrelated bytes. Each lane is a xorshift64 generator
/// seeded by splitmix64 from (id, seed, lane): multiply-free steps that vectorize are much
/// cheaper than one splitmix64 per word, which matters at large block sizes (BENCHMARKS.md).
pub fn fill_block(id: u64, seed: u64, out: &mut [u8]) {
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

    #[test]
    fn hex_round_trip() {
        let h = block_hash(b"hello");
        assert_eq!(parse_hash(&hash_hex(h)).unwrap(), h);
        assert!(parse_hash("xyz").is_err());
    }
}
