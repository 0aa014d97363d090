//! Compiles the monitor's BPF programs (C, CO-RE against the committed vmlinux.h) with clang
//! and generates their Rust skeletons (libbpf-cargo) into OUT_DIR, and the numeric `#define`s
//! of the headers the programs share with Rust as constants (OUT_DIR/bpf_defines.rs,
//! `monitor::defines`), so the sizes both sides agree on are written once, in the header.

use libbpf_cargo::SkeletonBuilder;
use std::path::PathBuf;

const PROGS: &[&str] = &["block", "syscall", "pairs"];
/// The headers shared with src/monitor/*.rs.
const HEADERS: &[&str] = &["block.h", "pairs.h", "syscall.h"];

/// `pub const NAME: usize = VALUE;` for every `#define NAME VALUE` of `header` whose value is
/// a decimal integer (include guards and other defines are skipped).
fn defines(header: &str) -> String {
    let path = format!("src/monitor/bpf/{header}");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    let mut out = format!("// from {path}\n");
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("#define") {
            continue;
        }
        let (Some(name), Some(value)) = (words.next(), words.next()) else { continue };
        if value.parse::<u64>().is_ok() {
            out += &format!("pub const {name}: usize = {value};\n");
        }
    }
    out
}

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").expect("CARGO_CFG_TARGET_ARCH");
    println!("cargo:rerun-if-changed=src/monitor/bpf");
    let consts: String = HEADERS.iter().map(|h| defines(h)).collect();
    std::fs::write(out.join("bpf_defines.rs"), consts).expect("writing bpf_defines.rs");
    for name in PROGS {
        let src = format!("src/monitor/bpf/{name}.bpf.c");
        SkeletonBuilder::new()
            .source(&src)
            .clang_args(["-Isrc/monitor/bpf", "-Wall", "-Wno-unused-function"])
            .build_and_generate(out.join(format!("{name}.skel.rs")))
            .unwrap_or_else(|e| panic!("building {src} (needs clang; scripts/setup.sh installs it) for {arch}: {e:#}"));
    }
}
