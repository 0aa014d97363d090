//! Does vector work slow the code that follows it on the same core? Each step folds a hot
//! 128 KiB buffer into XXH3-style accumulators (multiply, shuffle, add: the hashing of a 128 KiB
//! write) with 256-bit (AVX2) or 512-bit (AVX-512) vectors, or does nothing, and then times a
//! fixed scalar loop (~30 µs, about one request's worth). A core that lowers its clock after
//! 512-bit multiplies shows it as a slower scalar loop after the AVX-512 steps. The three kinds
//! run in phases of 2,000 steps (the clock change outlasts a step), rotating, over 4 rounds;
//! medians per kind. `cargo bench --bench avxfreq`
use std::time::Instant;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn fold_avx2(b: &[u8]) -> u64 {
    use std::arch::x86_64::*;
    // SAFETY: loads of 32 bytes at multiples of 32 below b.len() (a multiple of 32)
    unsafe {
        let mut a = _mm256_set1_epi64x(1);
        for c in b.chunks_exact(32) {
            let d = _mm256_loadu_si256(c.as_ptr() as *const __m256i);
            let p = _mm256_mul_epu32(d, _mm256_srli_epi64::<32>(d));
            a = _mm256_add_epi64(_mm256_add_epi64(a, _mm256_shuffle_epi32::<0b01_00_11_10>(d)), p);
        }
        let mut o = [0u64; 4];
        _mm256_storeu_si256(o.as_mut_ptr() as *mut __m256i, a);
        o.iter().fold(0, |x, y| x ^ y)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn fold_avx512(b: &[u8]) -> u64 {
    use std::arch::x86_64::*;
    // SAFETY: loads of 64 bytes at multiples of 64 below b.len() (a multiple of 64)
    unsafe {
        let mut a = _mm512_set1_epi64(1);
        for c in b.chunks_exact(64) {
            let d = _mm512_loadu_si512(c.as_ptr() as *const _);
            let p = _mm512_mul_epu32(d, _mm512_srli_epi64::<32>(d));
            a = _mm512_add_epi64(_mm512_add_epi64(a, _mm512_shuffle_epi32::<0b01_00_11_10>(d)), p);
        }
        let mut o = [0u64; 8];
        _mm512_storeu_si512(o.as_mut_ptr() as *mut _, a);
        o.iter().fold(0, |x, y| x ^ y)
    }
}

fn scalar() -> f64 {
    let t0 = Instant::now();
    let mut x = 1u64;
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    std::hint::black_box(x);
    t0.elapsed().as_secs_f64() * 1e6
}

#[cfg(target_arch = "x86_64")]
fn main() {
    if !std::arch::is_x86_feature_detected!("avx512f") || !std::arch::is_x86_feature_detected!("avx2") {
        println!("this CPU lacks AVX2 or AVX-512F: nothing to compare");
        return;
    }
    let buf: Vec<u8> = (0..128 << 10).map(|i| (i * 7 % 251) as u8).collect();
    let kinds = ["none", "avx2", "avx512"];
    let mut t: [Vec<f64>; 3] = Default::default();
    for round in 0..4 {
        for j in 0..3 {
            let k = (round + j) % 3;
            for _ in 0..2000 {
                // SAFETY: the CPU has both (checked above)
                let h = unsafe {
                    match k {
                        1 => fold_avx2(&buf),
                        2 => fold_avx512(&buf),
                        _ => 0,
                    }
                };
                std::hint::black_box(h);
                t[k].push(scalar());
            }
        }
    }
    for (k, v) in kinds.iter().zip(t.iter_mut()) {
        v.sort_by(f64::total_cmp);
        println!("after {k}: scalar loop {:.2}us (median of {})", v[v.len() / 2], v.len());
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("x86_64 only");
}
