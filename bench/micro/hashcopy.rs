//! The RAM store's hashed write, three ways, side by side in one process: the copy alone, each
//! block hashed (`content::block_hash`) and then copied (the path before `disk::hashcopy`),
//! and each block hashed in the pass that copies it (`hashcopy::hash_copy`). 128 KiB writes
//! with non-temporal stores, sequential through a populated 512 MiB region, and 4 KiB writes
//! with ordinary stores at random blocks; the payload is hot as after the kernel's copy. The
//! three are interleaved write by write in a rotating order; medians per write.
//! `cargo bench --bench hashcopy`
use faultline::disk::hashcopy::{fits, hash_copy};
use std::time::Instant;

/// The store's copy for large writes: 32-byte non-temporal stores.
///
/// # Safety
/// AVX2; src readable, dst writable and 32-byte aligned for n bytes (a multiple of 32).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn nt_copy(src: *const u8, dst: *mut u8, n: usize) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's contract
    unsafe {
        for i in 0..n / 32 {
            _mm256_stream_si256(dst.add(i * 32) as *mut __m256i, _mm256_loadu_si256(src.add(i * 32) as *const __m256i));
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn main() {
    const BS: usize = 4096;
    const REGION: usize = 512 << 20;
    // SAFETY: a fresh anonymous mapping, checked below
    let base = unsafe { libc::mmap(std::ptr::null_mut(), REGION, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
    assert!(base != libc::MAP_FAILED);
    // SAFETY: our mapping
    unsafe { libc::madvise(base, REGION, libc::MADV_POPULATE_WRITE) };
    let base = base as *mut u8;
    if !fits(base, BS) {
        println!("this CPU has no AVX2: the store hashes, then copies");
        return;
    }
    let names = ["copy", "hash-then-copy", "one-pass"];
    let mut rnd = 88172645463325252u64;
    let mut sink = 0u128;
    for (w, stream) in [(128usize << 10, true), (BS, false)] {
        let mut payload: Vec<u8> = (0..w + 64).map(|i| (i * 31 % 251) as u8).collect();
        let at = payload.as_ptr().align_offset(64);
        for round in 0..3 {
            let mut t: Vec<Vec<f64>> = vec![Vec::new(); 3];
            for k in 0..(REGION / w).min(30_000) {
                let off = if stream {
                    k * w
                } else {
                    rnd ^= rnd << 13;
                    rnd ^= rnd >> 7;
                    rnd ^= rnd << 17;
                    (rnd as usize % (REGION / BS)) * BS
                };
                let v = (k + k / 3 + round) % 3;
                for c in payload.chunks_mut(64) {
                    c[0] = c[0].wrapping_add(1);
                }
                let src = &payload[at..at + w];
                // SAFETY: off + w <= REGION: inside the mapping, page aligned
                let dst = unsafe { base.add(off) };
                let t0 = Instant::now();
                // SAFETY: fits() checked (AVX2, alignment, block size); src and dst are separate
                // buffers of w bytes
                unsafe {
                    for b in 0..w / BS {
                        let (s, d) = (src[b * BS..].as_ptr(), dst.add(b * BS));
                        match (v, stream) {
                            (0, true) => nt_copy(s, d, BS),
                            (0, false) => std::ptr::copy_nonoverlapping(s, d, BS),
                            (1, _) => {
                                sink ^= faultline::content::block_hash(&src[b * BS..][..BS]);
                                if stream { nt_copy(s, d, BS) } else { std::ptr::copy_nonoverlapping(s, d, BS) }
                            }
                            (_, true) => sink ^= hash_copy::<true>(s, d, BS),
                            (_, false) => sink ^= hash_copy::<false>(s, d, BS),
                        }
                    }
                    std::arch::x86_64::_mm_sfence();
                }
                t[v].push(t0.elapsed().as_secs_f64() * 1e6);
            }
            let mut line = format!("{} KiB round {round}:", w >> 10);
            for (i, mut x) in t.into_iter().enumerate() {
                x.sort_by(f64::total_cmp);
                line += &format!(" {}={:.2}us", names[i], x[x.len() / 2]);
            }
            println!("{line} (median per write)");
        }
    }
    std::hint::black_box(sink);
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("x86_64 only");
}
