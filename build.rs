//! Compiles the monitor's BPF programs (C, CO-RE against the committed vmlinux.h) with clang
//! and generates their Rust skeletons (libbpf-cargo) into OUT_DIR.

use libbpf_cargo::SkeletonBuilder;
use std::path::PathBuf;

const PROGS: &[&str] = &["block", "syscall", "pairs"];

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").expect("CARGO_CFG_TARGET_ARCH");
    println!("cargo:rerun-if-changed=src/monitor/bpf");
    for name in PROGS {
        let src = format!("src/monitor/bpf/{name}.bpf.c");
        SkeletonBuilder::new()
            .source(&src)
            .clang_args(["-Isrc/monitor/bpf", "-Wall", "-Wno-unused-function"])
            .build_and_generate(out.join(format!("{name}.skel.rs")))
            .unwrap_or_else(|e| panic!("building {src} (needs clang; scripts/setup.sh installs it) for {arch}: {e:#}"));
    }
}
