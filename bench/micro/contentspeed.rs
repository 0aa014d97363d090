//! Content generation speed: bytes of deterministic block content per second on one core,
//! for fill_block alone (copy + stamps), for the full per-write path (stream id + fill), and
//! for the engines' in-place path (sequential ids into a buffer that already holds their
//! segments: stamps only).
//! `cargo bench --bench contentspeed`
use faultline::content::{HELD_NONE, fill_block, profile::Profile, stream::Stream, with_pool};
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
    // a 1 MiB buffer, as the psync engine's batches, refilled with the next 256 ids each time
    let mut big = vec![0u8; 1 << 20];
    let mut held = vec![HELD_NONE; big.len() / 4096];
    let rounds = n / 8;
    let t = Instant::now();
    with_pool(1, |p| {
        for i in 0..rounds {
            for (k, (c, h)) in big.chunks_exact_mut(4096).zip(&mut held).enumerate() {
                p.fill(i * 256 + k as u64, c, h);
            }
        }
    });
    let s = t.elapsed().as_secs_f64();
    let inplace = (rounds * big.len() as u64) as f64 / s / 1e9;
    std::hint::black_box(&buf); // the filled bytes count as used
    std::hint::black_box(&big);
    println!("content_fill_gb_s={fill:.2} content_stream_fill_gb_s={full:.2} content_inplace_fill_gb_s={inplace:.2} (4 KiB blocks, one core)");
}
