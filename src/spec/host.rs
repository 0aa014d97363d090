//! Host faults (docs/host.md): CPU taken away, memory pressure, freeze, kill (and restart) of a
//! host's processes, sticky or in a time window. Parsed from `host_faults:` lists (a file given
//! to `faultline host`, or inline YAML) with line/column errors.

use super::units::{Ratio, Size};
use serde::Deserialize;
use serde_saphyr::Spanned;
use std::time::Duration;

pub const TYPES: &str = "cpu, memory, freeze, kill";

/// How CPU is taken away.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CpuMethod {
    /// A CFS quota on the processes' cgroup: exact, the processes get at most what is left.
    Quota,
    /// Spinning threads pinned to the CPUs, a noisy neighbour as stress tools make one: the
    /// scheduler shares each CPU between them and the processes, so less may be taken.
    Spin,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum HostAction {
    /// Take `share` of the machine's CPU time away from the processes.
    Cpu { share: f64, method: CpuMethod },
    /// `limit`: a memory limit on the processes' cgroup. `hold`: this much memory taken
    /// (allocated, touched and locked) by faultline, so the whole host has less.
    Memory { limit: Option<u64>, hold: Option<u64> },
    /// Stop every process (cgroup freezer), thaw at the window's end.
    Freeze,
    /// SIGKILL the processes at the window's start; restart the target at its end, if any.
    Kill,
}

impl HostAction {
    pub fn kind(&self) -> &'static str {
        match self {
            HostAction::Cpu { .. } => "cpu",
            HostAction::Memory { .. } => "memory",
            HostAction::Freeze => "freeze",
            HostAction::Kill => "kill",
        }
    }
}

impl std::fmt::Display for HostAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use super::units::format_size;
        match self {
            HostAction::Cpu { share, method } => write!(f, "cpu {:.0}% taken ({})", share * 100.0, if *method == CpuMethod::Quota { "quota" } else { "spin" }),
            HostAction::Memory { limit: Some(l), .. } => write!(f, "memory limited to {}", format_size(*l)),
            HostAction::Memory { hold: Some(h), .. } => write!(f, "memory: {} held", format_size(*h)),
            HostAction::Memory { .. } => write!(f, "memory"),
            HostAction::Freeze => write!(f, "freeze"),
            HostAction::Kill => write!(f, "kill"),
        }
    }
}

/// One host fault: what, on which host (experiments with `hosts:`), when.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct HostFault {
    pub name: Option<String>,
    pub host: Option<String>,
    #[serde(flatten)]
    pub action: HostAction,
    /// From the start of the workload; `to: None` = until the end (sticky from `from`).
    pub from: Duration,
    pub to: Option<Duration>,
    /// In experiments: whose processes (`disk`: the disk servers, the default). `faultline
    /// host` names processes itself and refuses the key.
    pub target: Option<String>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHostFault {
    name: Option<String>,
    host: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    share: Option<Ratio>,
    method: Option<String>,
    limit: Option<Size>,
    hold: Option<Size>,
    window: Option<super::rule::yaml::RawWindow>,
    target: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HostFaultsFile {
    host_faults: Vec<Spanned<RawHostFault>>,
}

/// Parse a document `host_faults: [...]`; `source` names it in errors.
pub fn parse_host_faults(text: &str, source: &str) -> Result<Vec<HostFault>, String> {
    let file: HostFaultsFile = serde_saphyr::from_str(text).map_err(|e| super::yaml_error(source, &e))?;
    if let Some(f) = file.host_faults.iter().find(|f| f.value.target.is_some()) {
        return Err(format!(
            "{source}:{}:{}: `target` belongs to experiment files; here --pid names the processes",
            f.referenced.line(),
            f.referenced.column()
        ));
    }
    validate_all(file.host_faults, source)
}

/// Validate an experiment's `host_faults:`: targets are the disk servers (`target: disk`,
/// the default), which must not be killed (the run's disk would go with them), unless the
/// hosts are reached through agents (`agents`: there the target host's server is killed and
/// started again by the controller, run::agents).
pub(crate) fn validate_experiment(raw: Vec<Spanned<RawHostFault>>, source: &str, agents: bool) -> Result<Vec<HostFault>, String> {
    for r in &raw {
        let at = format!("{source}:{}:{}", r.referenced.line(), r.referenced.column());
        match r.value.target.as_deref() {
            None | Some("disk") => {}
            Some(t) => return Err(format!("{at}: host fault target `{t}` is not known; allowed: disk (the processes serving the setup's disks)")),
        }
        if r.value.kind.as_deref() == Some("kill") && !agents {
            return Err(format!(
                "{at}: a kill of the disk server would take the run's disk with it; kill faults apply to processes named with `faultline host --pid`, and to the target's server with `hosts: {{agents: ...}}`"
            ));
        }
    }
    validate_all(raw, source)
}

/// Validate spanned raw entries (from a file or an experiment's `host_faults:`).
pub(crate) fn validate_all(raw: Vec<Spanned<RawHostFault>>, source: &str) -> Result<Vec<HostFault>, String> {
    let mut out = Vec::with_capacity(raw.len());
    for (i, r) in raw.into_iter().enumerate() {
        let loc = &r.referenced;
        let label = match &r.value.name {
            Some(n) => format!("host fault #{} ({n})", i + 1),
            None => format!("host fault #{}", i + 1),
        };
        out.push(validate(r.value).map_err(|e| format!("{source}:{}:{}: {label}: {e}", loc.line(), loc.column()))?);
    }
    Ok(out)
}

fn validate(r: RawHostFault) -> Result<HostFault, String> {
    let kind = r.kind.as_deref().ok_or_else(|| format!("needs `type` (one of {TYPES})"))?;
    let only = |allowed: &[&str]| -> Result<(), String> {
        let given = [("share", r.share.is_some()), ("method", r.method.is_some()), ("limit", r.limit.is_some()), ("hold", r.hold.is_some())];
        match given.iter().find(|(k, set)| *set && !allowed.contains(k)) {
            Some((k, _)) => Err(format!(
                "`{k}` does not apply to type {kind}{}",
                if allowed.is_empty() { String::new() } else { format!(" (its keys: {})", allowed.join(", ")) }
            )),
            None => Ok(()),
        }
    };
    let action = match kind {
        "cpu" => {
            only(&["share", "method"])?;
            let share = r.share.ok_or("type cpu needs `share` (the part of the machine's CPU time taken away, e.g. `share: 50%`)")?.0;
            if !(share > 0.0 && share < 1.0) {
                return Err(format!(
                    "`share` must be above 0% and below 100% (got {}%): at 100% the processes would never run; use type freeze for that",
                    share * 100.0
                ));
            }
            let method = match r.method.as_deref().unwrap_or("quota") {
                "quota" => CpuMethod::Quota,
                "spin" => CpuMethod::Spin,
                m => return Err(format!("unknown method `{m}`; allowed: quota (a cgroup CPU quota, exact), spin (spinning threads, a noisy neighbour)")),
            };
            HostAction::Cpu { share, method }
        }
        "memory" => {
            only(&["limit", "hold"])?;
            match (r.limit, r.hold) {
                (Some(_), Some(_)) | (None, None) => {
                    return Err(
                        "type memory needs exactly one of `limit` (a cgroup memory limit on the processes) or `hold` (memory taken from the whole host)".into(),
                    );
                }
                (Some(l), None) if l.0 < 1 << 20 => return Err("`limit` below 1MiB would OOM-kill the processes at once".into()),
                (l, h) => HostAction::Memory { limit: l.map(|s| s.0), hold: h.map(|s| s.0) },
            }
        }
        "freeze" => {
            only(&[])?;
            HostAction::Freeze
        }
        "kill" => {
            only(&[])?;
            HostAction::Kill
        }
        other => return Err(format!("unknown type `{other}`; allowed: {TYPES}")),
    };
    let (from, to) = match r.window.map(super::rule::yaml::parse_window).transpose()? {
        None => (Duration::ZERO, None),
        Some(w) => (w.from, w.to),
    };
    Ok(HostFault { name: r.name, host: r.host, action, from, to, target: r.target })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(y: &str) -> Result<HostFault, String> {
        parse_host_faults(&format!("host_faults:\n  - {y}\n"), "t.yaml").map(|mut v| v.remove(0))
    }

    #[test]
    fn the_four_types() {
        let c = one("{type: cpu, share: 50%, window: {from: 2s, to: 5s}}").unwrap();
        assert_eq!(c.action, HostAction::Cpu { share: 0.5, method: CpuMethod::Quota });
        assert_eq!((c.from, c.to), (Duration::from_secs(2), Some(Duration::from_secs(5))));
        assert_eq!(one("{type: cpu, share: 25%, method: spin}").unwrap().action, HostAction::Cpu { share: 0.25, method: CpuMethod::Spin });
        assert_eq!(one("{type: memory, limit: 64MiB}").unwrap().action, HostAction::Memory { limit: Some(64 << 20), hold: None });
        assert_eq!(one("{type: memory, hold: 1GiB}").unwrap().action, HostAction::Memory { limit: None, hold: Some(1 << 30) });
        let f = one("{type: freeze, window: {from: 1s}}").unwrap();
        assert_eq!((f.action, f.from, f.to), (HostAction::Freeze, Duration::from_secs(1), None));
        assert_eq!(one("{type: kill, host: target}").unwrap().host.as_deref(), Some("target"));
    }

    #[test]
    fn errors_say_where_and_what_is_allowed() {
        let e = one("{type: cpu, share: 100%}").unwrap_err();
        assert!(e.starts_with("t.yaml:2:5: host fault #1: `share` must be above 0%"), "{e}");
        let e = one("{type: cpu}").unwrap_err();
        assert!(e.contains("needs `share`"), "{e}");
        let e = one("{type: freeze, share: 10%}").unwrap_err();
        assert!(e.contains("`share` does not apply to type freeze"), "{e}");
        let e = one("{type: memory, limit: 1GiB, hold: 1GiB}").unwrap_err();
        assert!(e.contains("exactly one of"), "{e}");
        let e = one("{type: cpu, share: 10%, method: nice}").unwrap_err();
        assert!(e.contains("allowed: quota"), "{e}");
        let e = one("{type: hog}").unwrap_err();
        assert!(e.contains("allowed: cpu, memory, freeze, kill"), "{e}");
        let e = one("{type: freeze, window: {from: 5s, to: 1s}}").unwrap_err();
        assert!(e.contains("later than"), "{e}");
        let e = one("{type: freeze, colour: red}").unwrap_err();
        assert!(e.contains("colour"), "{e}");
    }
}
