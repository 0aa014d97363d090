//! XXH3-128 of a block computed in the same pass that copies it into the RAM store: each
//! 64-byte stripe is loaded once, stored (non-temporal stores; the store uses it for large
//! writes only: with ordinary stores, for small writes, it measured slower than hashing first)
//! and folded into the hash accumulators. Hashing a block and then copying it leaves
//! the stores idle while the block is hashed; here they drain while the hash computes, which
//! hides most of the hashing (BENCHMARKS.md, "The cost of content rules on writes"). The result is standard
//! XXH3-128 with the default secret and seed 0 (`content::block_hash`; tests check it against
//! xxhash-rust). Only the long-input path (more than 240 bytes, whole stripes) is written here:
//! blocks are 512 bytes or more, a power of two. AVX2 (32-byte vectors) even where the CPU has
//! AVX-512: 512-bit multiplies lower the core's clock for a while after them, which slowed the
//! rest of each request more than the wider vectors saved (BENCHMARKS.md, bench/micro/avxfreq.rs).
//! `fits` says no on CPUs without AVX2, and the store hashes, then copies.

/// The default secret of XXH3 (the reference's `XXH3_kSecret`).
const SECRET: [u8; 192] = [
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c, 0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40,
    0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21, 0xb8, 0x08, 0x46, 0x74,
    0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53,
    0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8, 0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f,
    0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5,
    0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb, 0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26,
    0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16,
    0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
];

const PRIME32_1: u64 = 0x9E37_79B1;
const PRIME32_2: u64 = 0x85EB_CA77;
const PRIME32_3: u64 = 0xC2B2_AE3D;
const PRIME64_1: u64 = 0x9E37_79B1_85EB_CA87;
const PRIME64_2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const PRIME64_3: u64 = 0x1656_67B1_9E37_79F9;
const PRIME64_4: u64 = 0x85EB_CA77_C2B2_AE63;
const PRIME64_5: u64 = 0x27D4_EB2F_1656_67C5;

const STRIPE: usize = 64;
/// Stripes per block: (secret length - stripe) / 8 bytes of secret consumed per stripe.
const STRIPES_PER_BLOCK: usize = (SECRET.len() - STRIPE) / 8;
const BLOCK: usize = STRIPE * STRIPES_PER_BLOCK;

/// Whether `hash_copy` takes a block of `len` bytes into a destination at `dst` on this CPU.
pub fn fits(dst: *const u8, len: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        len > 240 && len.is_multiple_of(STRIPE) && (dst as usize).is_multiple_of(64) && std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (dst, len);
        false
    }
}

/// Copy `len` bytes from `src` to `dst` and return their XXH3-128: with non-temporal stores
/// (`STREAM`; the caller must `sfence` before others may read the bytes) or ordinary ones.
///
/// # Safety
/// `fits(dst, len)`; `src` readable and `dst` writable for `len` bytes, not overlapping.
#[cfg(target_arch = "x86_64")]
pub unsafe fn hash_copy<const STREAM: bool>(src: *const u8, dst: *mut u8, len: usize) -> u128 {
    // SAFETY: the caller's contract, which includes AVX2 (`fits`)
    unsafe { hash_copy_avx2::<STREAM>(src, dst, len) }
}

#[cfg(not(target_arch = "x86_64"))]
pub unsafe fn hash_copy<const STREAM: bool>(_: *const u8, _: *mut u8, _: usize) -> u128 {
    unreachable!("`fits` is false off x86_64")
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn hash_copy_avx2<const STREAM: bool>(src: *const u8, dst: *mut u8, len: usize) -> u128 {
    use std::arch::x86_64::*;
    let s = SECRET.as_ptr();
    let mut acc = [PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1];
    // SAFETY: every load from src and store to dst lies in [0, len) (stripes end at or before
    // len, the last one ends at len); dst is 32-byte aligned (`fits`), and so is every store
    // (multiples of 32 from it); secret loads lie in SECRET (offsets up to 128 + 64 = 192); AVX2
    // is enabled on this function and the caller checked the CPU has it (`fits`)
    unsafe {
        let mut a0 = _mm256_loadu_si256(acc.as_ptr() as *const __m256i);
        let mut a1 = _mm256_loadu_si256(acc.as_ptr().add(4) as *const __m256i);
        // one stripe: stream it to dst and fold it into the accumulators with the secret at `k`
        // (macros, not closures: the body must be compiled with AVX2 enabled)
        macro_rules! fold {
            ($a:expr, $d:expr, $ko:expr) => {{
                let key = _mm256_xor_si256($d, _mm256_loadu_si256(s.add($ko) as *const __m256i));
                let product = _mm256_mul_epu32(key, _mm256_srli_epi64::<32>(key));
                let swapped = _mm256_shuffle_epi32::<0b01_00_11_10>($d);
                $a = _mm256_add_epi64(_mm256_add_epi64($a, swapped), product);
            }};
        }
        macro_rules! stripe {
            ($at:expr, $k:expr) => {{
                let (at, k) = ($at, $k);
                let d0 = _mm256_loadu_si256(src.add(at) as *const __m256i);
                let d1 = _mm256_loadu_si256(src.add(at + 32) as *const __m256i);
                if STREAM {
                    _mm256_stream_si256(dst.add(at) as *mut __m256i, d0);
                    _mm256_stream_si256(dst.add(at + 32) as *mut __m256i, d1);
                } else {
                    _mm256_store_si256(dst.add(at) as *mut __m256i, d0);
                    _mm256_store_si256(dst.add(at + 32) as *mut __m256i, d1);
                }
                fold!(a0, d0, k);
                fold!(a1, d1, k + 32);
            }};
        }
        let prime = _mm256_set1_epi64x(PRIME32_1 as i64);
        macro_rules! scramble {
            ($a:expr, $ko:expr) => {{
                let x = _mm256_xor_si256($a, _mm256_srli_epi64::<47>($a));
                let key = _mm256_xor_si256(x, _mm256_loadu_si256(s.add($ko) as *const __m256i));
                let lo = _mm256_mul_epu32(key, prime);
                let hi = _mm256_mul_epu32(_mm256_shuffle_epi32::<0b00_11_00_01>(key), prime);
                $a = _mm256_add_epi64(lo, _mm256_slli_epi64::<32>(hi));
            }};
        }
        let blocks = (len - 1) / BLOCK;
        for b in 0..blocks {
            for n in 0..STRIPES_PER_BLOCK {
                stripe!(b * BLOCK + n * STRIPE, n * 8);
            }
            scramble!(a0, SECRET.len() - STRIPE);
            scramble!(a1, SECRET.len() - STRIPE + 32);
        }
        let rest = ((len - 1) - blocks * BLOCK) / STRIPE;
        for n in 0..rest {
            stripe!(blocks * BLOCK + n * STRIPE, n * 8);
        }
        // the last stripe ends at len (whole stripes: it follows the ones above)
        stripe!(len - STRIPE, SECRET.len() - STRIPE - 7);
        _mm256_storeu_si256(acc.as_mut_ptr() as *mut __m256i, a0);
        _mm256_storeu_si256(acc.as_mut_ptr().add(4) as *mut __m256i, a1);
    }
    finish(&acc, len)
}

/// The 128-bit result from the accumulators.
fn finish(acc: &[u64; 8], len: usize) -> u128 {
    let len = len as u64;
    let low = merge(acc, 11, len.wrapping_mul(PRIME64_1));
    let high = merge(acc, SECRET.len() - STRIPE - 11, !len.wrapping_mul(PRIME64_2));
    (u128::from(high) << 64) | u128::from(low)
}

fn secret64(at: usize) -> u64 {
    u64::from_le_bytes(SECRET[at..at + 8].try_into().unwrap())
}

/// XXH3's final merge of the accumulators with the secret from `at`.
fn merge(acc: &[u64; 8], at: usize, start: u64) -> u64 {
    let mut h = start;
    for i in 0..4 {
        let x = u128::from(acc[2 * i] ^ secret64(at + 16 * i)) * u128::from(acc[2 * i + 1] ^ secret64(at + 16 * i + 8));
        h = h.wrapping_add((x as u64) ^ ((x >> 64) as u64));
    }
    h ^= h >> 37;
    h = h.wrapping_mul(0x1656_6791_9E37_79F9);
    h ^ (h >> 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Standard XXH3-128 (xxhash-rust, the reference) and the same bytes at the destination, for
    /// every length the fused path takes up to 16 KiB, over random and zero data.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn hash_copy_is_xxh3_128_and_copies() {
        #[repr(align(64))]
        struct Dst([u8; 16384 + 64]);
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let src: Vec<u8> = (0..16384 + 64)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        let zero = vec![0u8; 16384];
        let mut dst = Box::new(Dst([0; 16384 + 64]));
        let mut tried = 0;
        for len in (256..=16384).step_by(64) {
            for (what, s) in [("random", &src[3..3 + len]), ("zero", &zero[..len])] {
                if !fits(dst.0.as_ptr(), len) {
                    println!("SKIPPED: hash_copy_is_xxh3_128_and_copies: no AVX2 on this CPU");
                    return;
                }
                // streaming or not
                for stream in [false, true] {
                    dst.0.fill(0xEE);
                    let (d, sp) = (dst.0.as_mut_ptr(), s.as_ptr());
                    // SAFETY: fits() checked (AVX2, alignment, length); s and dst are separate
                    // buffers of at least len bytes
                    let h = unsafe { if stream { hash_copy::<true>(sp, d, len) } else { hash_copy::<false>(sp, d, len) } };
                    let k = if stream { "streaming" } else { "ordinary stores" };
                    assert_eq!(h, xxhash_rust::xxh3::xxh3_128(s), "{k}, {what}, {len} bytes");
                    assert_eq!(h, crate::content::block_hash(s), "{k}, {what}, {len} bytes");
                    assert_eq!(&dst.0[..len], s, "{k}, {what}, {len} bytes copied");
                    assert!(dst.0[len..].iter().all(|b| *b == 0xEE), "{k}, {what}, {len}: wrote past the end");
                    tried += 1;
                }
            }
        }
        assert_eq!(tried, 2 * 2 * ((16384 - 256) / 64 + 1));
    }
}
