//! Content generation speed: bytes of deterministic block content per second on one core,
//! for fill_block alone and for the full per-write path (stream id + fill).
use faultline::content::{fill_block, profile::Profile, stream::Stream};
use std::time::Instant;

fn main() {
    let mut buf = vec![0u8; 128 << 10];
    let n = 20_000u64;
    let t = Instant::now();
    for i in 0..n {
        for (k, c) in buf.chunks_exact_mut(4096).enumerate() {
            fill_block(i * 32 + k as u64, 1, c);
        }
    }
    let s = t.elapsed().as_secs_f64();
    let fill = (n * buf.len() as u64) as f64 / s / 1e9;
    let prof = Profile::load(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/profiles/linux-6.1-source.profile"))).unwrap();
    let st = Stream::new(&prof, 1);
    let t = Instant::now();
    for i in 0..n {
        for (k, c) in buf.chunks_exact_mut(4096).enumerate() {
            fill_block(st.id_at(i * 32 + k as u64), 1, c);
        }
    }
    let s = t.elapsed().as_secs_f64();
    let full = (n * buf.len() as u64) as f64 / s / 1e9;
    std::hint::black_box(&buf); // the filled bytes count as used
    println!("content_fill_gb_s={fill:.2} content_stream_fill_gb_s={full:.2} (4 KiB blocks, one core)");
}
