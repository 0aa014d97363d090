//! The command lines an agents run sends: a client's `faultline workload` and the target's
//! `faultline host --fault` YAML.

use crate::spec::workload::config::{ErrorPolicy, IoEngine, Pattern, SyncMode, Workload};
use anyhow::{Result, bail};
use std::time::Duration;

/// `faultline workload` flags for a client's block workload (`Experiment::client_workload`:
/// with a power cut its slice of the disk as `--base`/`--span` and its content seed) against
/// `uri`; `oracle`: the power cut's model, for a client whose durability record the cut's
/// oracle reads (`--crash-oracle`).
pub(super) fn workload_argv(fl: &str, w: &Workload, uri: &str, start_ns: u64, oracle: Option<crate::spec::disk::SurvivalModel>) -> Result<Vec<String>> {
    if w.personality.is_some() {
        bail!("clients through agents run block workloads; a personality cannot be sent");
    }
    if w.profile != crate::content::profile::Profile::none() {
        bail!("clients through agents write unique content (no duplicate `profile`)");
    }
    let us = |d: Duration| format!("{}us", d.as_micros());
    let mut a: Vec<String> = vec![fl.into(), "workload".into(), "--nbd".into(), uri.into(), "--jsonl".into(), format!("--start-at-ns={start_ns}")];
    a.push(format!(
        "--pattern={}",
        match w.pattern {
            Pattern::Sequential => "sequential".to_string(),
            Pattern::Uniform => "uniform".into(),
            Pattern::Hotspot => "hotspot".into(),
            Pattern::Zipf(t) => format!("zipf:{t}"),
        }
    ));
    a.push(format!("--write-pct={}", w.write_pct));
    a.push(format!("--bs={}", w.block_size));
    a.push(format!("--engine={}", if w.engine == IoEngine::IoUring { "io_uring" } else { "psync" }));
    a.push(format!("--iodepth={}", w.iodepth));
    a.push(format!("--threads={}", w.threads));
    a.extend(w.size.map(|s| format!("--size={s}")));
    a.extend(w.ops.map(|s| format!("--ops={s}")));
    a.extend(w.duration.map(|d| format!("--duration={}", us(d))));
    a.extend(w.rate_iops.map(|s| format!("--rate-iops={s}")));
    a.extend(w.span.map(|s| format!("--span={s}")));
    // the slice's first byte on the export (a power cut's client); 0 is the default
    a.extend((w.base > 0).then(|| format!("--base={}", w.base)));
    a.push(format!(
        "--on-error={}",
        match w.on_error {
            ErrorPolicy::Stop => "stop".to_string(),
            ErrorPolicy::Continue => "continue".into(),
            ErrorPolicy::Retry(n) => format!("retry:{n}"),
        }
    ));
    a.push(format!("--interval={}", us(w.interval)));
    a.push(format!("--seed={}", w.seed));
    // over NBD `fsync:N` is a FLUSH every N writes and `dsync` a FUA on each write
    a.push(format!(
        "--sync={}",
        match w.sync {
            SyncMode::None => "none".to_string(),
            SyncMode::Direct => "direct".into(),
            SyncMode::Dsync => "dsync".into(),
            SyncMode::Fsync(n) => format!("fsync:{n}"),
        }
    ));
    a.extend(oracle.map(|m| format!("--crash-oracle={m}")));
    Ok(a)
}

/// A host fault as the inline YAML `faultline host --fault` takes (None: a `kill`, which the
/// controller does through the target's agent, `kill_target`).
pub(super) fn host_fault_yaml(h: &crate::spec::host::HostFault) -> Result<Option<String>> {
    use crate::spec::host::{CpuMethod, HostAction};
    let what = match &h.action {
        HostAction::Cpu { share, method } => {
            format!("type: cpu, share: {}%, method: {}", share * 100.0, if *method == CpuMethod::Quota { "quota" } else { "spin" })
        }
        HostAction::Memory { limit, hold } => {
            let mut s = "type: memory".to_string();
            if let Some(l) = limit {
                s += &format!(", limit: {l}B");
            }
            if let Some(x) = hold {
                s += &format!(", hold: {x}B");
            }
            s
        }
        HostAction::Freeze => "type: freeze".into(),
        HostAction::Kill => return Ok(None),
    };
    let ms = |d: Duration| format!("{}ms", d.as_millis());
    let window = match h.to {
        Some(to) => format!("{{from: {}, to: {}}}", ms(h.from), ms(to)),
        None => format!("{{from: {}}}", ms(h.from)),
    };
    Ok(Some(format!("{{{what}, window: {window}}}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With a power cut each remote client's command line carries its slice (`--base`,
    /// `--span`), its content seed and the cut's model; client 0's slice starts at byte 0 and
    /// needs no `--base`.
    #[test]
    fn each_client_of_a_cut_gets_its_slice_and_seed_on_its_command_line() {
        let text = "name: t\nhosts: {clients: [a, b], agents: {target: {ssh: root@s, address: 10.0.0.5}, a: {ssh: root@a}, b: {ssh: root@b}}}\ndisk: {size: 64MiB, write_cache: volatile}\nworkload: {block_size: 4KiB, duration: 5s, content: {seed: 4}}\nfaults:\n  - {type: power-cut, model: torn, when: {after_ops: 100}}\n";
        let e = crate::spec::experiment::parse_experiment(text, "e.yaml").unwrap();
        let uri = "nbd://10.0.0.5:10809/";
        let argv = |i: usize| {
            let w = e.client_workload(&e.setups[0], uri, i).unwrap();
            workload_argv("faultline", &w, uri, 7, Some(crate::spec::disk::SurvivalModel::Torn)).unwrap()
        };
        let has = |a: &[String], f: &str| a.iter().any(|x| x == f);
        let (a, b) = (argv(0), argv(1));
        assert!(!a.iter().any(|x| x.starts_with("--base")) && has(&a, "--span=33554432") && has(&a, "--seed=4"), "{a:?}");
        assert!(has(&b, "--base=33554432") && has(&b, "--span=33554432") && has(&b, "--seed=5"), "{b:?}");
        assert!(has(&b, "--crash-oracle=torn") && has(&b, "--start-at-ns=7"), "{b:?}");
    }
}
