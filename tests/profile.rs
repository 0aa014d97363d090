//! Profile round trip: data generated from a profile, measured back with `faultline profile`,
//! has the profile's dedup ratio (within 2%).

mod common;
use common::bin;
use faultline::content::{fill_block, profile::Profile, stream::Stream};
use std::io::Write;

#[test]
fn generated_stream_measures_back_to_its_profile() {
    let dir = tempfile::tempdir().unwrap();
    let prof_text = "# a kernel-source-like shape\n0 9000\n1 800\n2 300\n5 60\n30 10\n400 1\n";
    let prof = Profile::parse(prof_text, "t").unwrap();
    let stream = Stream::new(&prof, 11);
    let data = dir.path().join("data");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&data).unwrap());
    let mut blk = vec![0u8; 4096];
    for n in 0..stream.cycle_len() {
        fill_block(stream.id_at(n), 11, &mut blk);
        f.write_all(&blk).unwrap();
    }
    drop(f);
    let out_path = dir.path().join("measured.profile");
    let out = std::process::Command::new(bin()).arg("profile").arg(&data).arg("-o").arg(&out_path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let measured = Profile::load(&out_path).unwrap();
    let (want, got) = (prof.dedup_ratio(), measured.dedup_ratio());
    assert!((got / want - 1.0).abs() < 0.02, "dedup ratio: profile {want:.4}, measured {got:.4}");
    // one full cycle reproduces the profile exactly
    assert_eq!(measured, prof);
}

#[test]
fn shipped_profiles_parse() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "profile") {
            let p = Profile::load(&e.path()).unwrap();
            if e.path().file_stem().is_some_and(|s| s == "none") {
                assert_eq!(p.dedup_ratio(), 1.0);
                continue;
            }
            // measured from real data: many blocks, and some duplicates
            assert!(p.total_blocks() > 100_000 && p.dedup_ratio() > 1.0, "{}", e.path().display());
            n += 1;
        }
    }
    assert!(n >= 2, "expected shipped profiles in {}", dir.display());
}
