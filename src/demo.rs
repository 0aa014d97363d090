//! `faultline demo`: the README's main job. A RAM-backed faulty disk with one bit-flip rule and
//! one EIO rule, a built-in O_DIRECT write + read-back pass, and a table of what was injected
//! next to what the client saw. (Superseded by `faultline run examples/quickstart.yaml` once the
//! workload engine lands.)

use crate::content::fill_block;
use crate::disk::{DiskConfig, StoreSpec};
use crate::fault::log::runs;
use crate::spec::units::format_size;
use crate::stack::served::ServedDisk;
use crate::workload::direct::{AlignedBuf, DirectDev};
use anyhow::{Result, bail};
use serde_json::json;
use std::collections::BTreeSet;
use std::path::Path;
use std::time::Instant;

pub const DEMO_RULES: &str = "\
rules:
  - name: flip-on-write
    type: bitflip
    op: write
    target: {block: 1000, count: 8}
  - name: eio-on-read
    type: error
    errno: EIO
    op: read
    target: {block: 3000, count: 4}
";

pub struct DemoOptions {
    pub size: u64,
    pub written: u64,
    pub out: std::path::PathBuf,
    pub seed: u64,
}

fn fmt_runs(r: &[[u64; 2]]) -> String {
    if r.is_empty() {
        return "-".into();
    }
    r.iter().map(|[a, n]| if *n == 1 { a.to_string() } else { format!("{a}..{}", a + n - 1) }).collect::<Vec<_>>().join(",")
}

pub fn run(o: &DemoOptions) -> Result<()> {
    const BS: u64 = 4096;
    if o.written > o.size || o.written < 4096 * BS {
        bail!("--write must be between 16MiB and the disk size ({})", format_size(o.size));
    }
    let cfg = DiskConfig { size: Some(o.size), block_size: BS as u32, store: StoreSpec::Ram, destructive: false, force: false };
    let served = ServedDisk::start(
        &cfg,
        &Default::default(),
        |d| crate::spec::rules::parse_rules(DEMO_RULES, "demo rules", d.geometry()).map_err(anyhow::Error::msg),
        None,
    )?;
    let dev_path = served.device().to_owned();
    println!("faultline demo: {} RAM disk on {}, {} blocks", format_size(o.size), dev_path.display(), format_size(BS));
    let dev = DirectDev::open(&dev_path)?;
    let nblocks = o.written / BS;

    // write pass: 1 MiB requests of deterministic content
    let t0 = Instant::now();
    let per = 256u64;
    let mut buf = AlignedBuf::new((per * BS) as usize);
    let mut write_errors = 0u64;
    for first in (0..nblocks).step_by(per as usize) {
        let n = per.min(nblocks - first);
        for i in 0..n {
            fill_block(first + i, o.seed, &mut buf[(i * BS) as usize..((i + 1) * BS) as usize]);
        }
        if dev.write_at(&buf[..(n * BS) as usize], first * BS).is_err() {
            write_errors += n;
        }
    }
    dev.sync()?;
    let t_write = t0.elapsed();

    // read-back pass: block by block, so every failure is located exactly
    let t1 = Instant::now();
    let mut one = AlignedBuf::new(BS as usize);
    let mut want = vec![0u8; BS as usize];
    let (mut corrupted, mut unreadable, mut ok) = (Vec::new(), Vec::new(), 0u64);
    for b in 0..nblocks {
        match dev.read_at(&mut one, b * BS) {
            Err(e) => unreadable.push((b, e.raw_os_error().unwrap_or(0))),
            Ok(()) => {
                fill_block(b, o.seed, &mut want);
                if one[..] == want[..] { ok += 1 } else { corrupted.push(b) }
            }
        }
    }
    let t_read = t1.elapsed();
    drop(dev);

    let rules = served.disk.engine.list();
    let log = served.disk.engine.log.since(0, usize::MAX);
    let stats = served.disk.engine.stats();
    served.teardown()?;

    let injected = |name: &str| -> BTreeSet<u64> {
        let id = rules.iter().find(|r| r.rule.name.as_deref() == Some(name)).map(|r| r.id);
        log.iter().filter(|e| Some(e.rule) == id).flat_map(|e| e.blocks.iter().flat_map(|[a, n]| *a..a + n)).collect()
    };
    let flipped = injected("flip-on-write");
    let failed = injected("eio-on-read");
    let seen_corrupt: BTreeSet<u64> = corrupted.iter().copied().collect();
    let seen_unreadable: BTreeSet<u64> = unreadable.iter().map(|u| u.0).collect();
    let exact = flipped == seen_corrupt && failed == seen_unreadable && write_errors == 0;

    println!(
        "wrote {} ({} blocks) in {:.2}s, read back block by block in {:.2}s\n",
        format_size(o.written),
        nblocks,
        t_write.as_secs_f64(),
        t_read.as_secs_f64()
    );
    println!("{:<4} {:<14} {:<8} {:<6} {:<24} {:>6} {:>7}", "id", "rule", "type", "op", "target", "fired", "blocks");
    for r in &rules {
        let target = match &r.rule.target {
            crate::fault::Target::Range { start, end } => format!("blocks {}..{}", start / BS, end / BS - 1),
            t => format!("{t:?}"),
        };
        println!(
            "{:<4} {:<14} {:<8} {:<6} {:<24} {:>6} {:>7}",
            r.id,
            r.rule.name.as_deref().unwrap_or("-"),
            r.rule.action.name(),
            r.rule.ops.ops().iter().map(|o| o.name()).collect::<Vec<_>>().join(","),
            target,
            r.fired,
            r.blocks
        );
    }
    println!("\n{:<30} {:>7}  where", "client saw", "blocks");
    println!("{:<30} {:>7}  {}", "corrupted, no error (silent)", corrupted.len(), fmt_runs(&runs(corrupted.iter().copied())));
    println!("{:<30} {:>7}  {}", "unreadable (EIO)", unreadable.len(), fmt_runs(&runs(seen_unreadable.iter().copied())));
    println!("{:<30} {:>7}", "ok", ok);
    println!(
        "\nverdict: {}",
        if exact {
            "every injected fault was seen by the client, exactly at the injected blocks"
        } else {
            "MISMATCH between injected faults and what the client saw"
        }
    );

    std::fs::create_dir_all(&o.out)?;
    let path = o.out.join("results.json");
    let doc = json!({
        "disk": {"size": o.size, "block_size": BS, "store": "ram", "device": dev_path},
        "workload": {"written_bytes": o.written, "blocks": nblocks, "write_seconds": t_write.as_secs_f64(), "read_seconds": t_read.as_secs_f64(), "seed": o.seed},
        "rules": rules,
        "faults": log,
        "device_stats": stats,
        "client": {
            "ok_blocks": ok,
            "corrupted_blocks": runs(corrupted.iter().copied()),
            "unreadable_blocks": unreadable.iter().map(|(b, e)| json!({"block": b, "errno": e})).collect::<Vec<_>>(),
            "write_errors": write_errors,
        },
        "injected": {"bitflip_blocks": runs(flipped.iter().copied()), "eio_blocks": runs(failed.iter().copied())},
        "exact_match": exact,
    });
    std::fs::write(&path, serde_json::to_vec_pretty(&doc)?)?;
    println!("results: {}", Path::new(&path).display());
    if !exact {
        bail!("the client's view does not match the injected faults (see {})", path.display());
    }
    Ok(())
}
