//! XXH3-128 content hashing speed on one core (`content::block_hash` over 4 KiB blocks of a
//! 128 KiB buffer). `cargo bench --bench hashspeed`
use std::time::Instant;
fn main() {
    let buf = vec![7u8; 128 << 10];
    let n = 20000;
    let t = Instant::now();
    let mut acc = 0u128;
    for _ in 0..n {
        for c in buf.chunks_exact(4096) {
            acc ^= faultline::content::block_hash(c);
        }
    }
    let s = t.elapsed().as_secs_f64();
    println!("xxh3-128 4KiB blocks: {:.1} GB/s ({:.2} us per 128KiB) {}", (n * buf.len()) as f64 / s / 1e9, s / n as f64 * 1e6, acc & 1);
}
