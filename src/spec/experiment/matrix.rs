//! `matrix:` in experiments: named axes, each a list of partial setups; every combination of
//! one entry per axis becomes a setup named `entry/entry/...` in the axes' order (the first
//! axis varies slowest). Entries merge into the experiment's base: disk keys apply in axis
//! order, stack keys may be set by one axis each (lists `mkfs`, `mount` are joined), faults
//! are joined (and replace the base's list, as a setup's do), and so are `host_faults` and
//! `net_faults`; `repeat`, `workload` and `nbd` may be set by one axis only. Documented in docs/experiment.md.

use super::super::disk::DiskSpec;
use super::super::rule::yaml::{RawRule, WordOr};
use super::{RawSetup, RawStack, Setup, disk, faults, loc, repeat, stack};
use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_saphyr::Spanned;
use std::collections::HashMap;

/// At most this many setups from one matrix (a typo in an axis must not plan a week of runs).
pub const MAX_SETUPS: usize = 10_000;

/// The axes in the file's order (a map would sort them, and names follow the file's order).
#[derive(Clone)]
pub(super) struct RawMatrix(Vec<(String, Vec<Spanned<RawSetup>>)>);

impl<'de> Deserialize<'de> for RawMatrix {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawMatrix;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map of axes: axis name -> list of partial setups, each with a `name`")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<RawMatrix, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = m.next_entry::<String, Vec<Spanned<RawSetup>>>()? {
                    out.push((k, v));
                }
                Ok(RawMatrix(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// What the matrix merges into: the experiment's own keys.
pub(super) struct MatrixBase<'a> {
    pub disk: &'a DiskSpec,
    pub stack: Option<&'a Spanned<WordOr<RawStack>>>,
    pub faults: Option<&'a Vec<Spanned<RawRule>>>,
    pub repeat: u32,
    pub host_faults: &'a [crate::spec::host::HostFault],
    pub net_faults: &'a [crate::spec::networked::NetFaultSpec],
    /// The experiment's `hosts:` (an entry's `nbd:` and `net_faults:` need them).
    pub hosts: Option<&'a crate::spec::networked::NetworkedHosts>,
    /// Through agents (a host fault may `kill` the target).
    pub agents: bool,
}

pub(super) fn expand_matrix(m: &Spanned<RawMatrix>, base: &MatrixBase, source: &str) -> Result<Vec<Setup>, String> {
    let at = loc(m);
    let axes = &m.value.0;
    if axes.is_empty() {
        return Err(format!(
            "{source}:{at}: `matrix` is empty; give at least one axis: a name and a list of partial setups, e.g. `matrix: {{fs: [{{name: ext4, stack: ext4}}]}}`"
        ));
    }
    let mut count: usize = 1;
    for (i, (axis, entries)) in axes.iter().enumerate() {
        if axis.is_empty() || axis.contains('/') {
            return Err(format!("{source}:{at}: matrix axis name `{axis}` must be non-empty and contain no `/`"));
        }
        if axes[..i].iter().any(|(a, _)| a == axis) {
            return Err(format!("{source}:{at}: matrix axis `{axis}` is given twice; each axis name once"));
        }
        if entries.is_empty() {
            return Err(format!("{source}:{at}: matrix axis `{axis}` is empty; give at least one entry (a partial setup with a `name`)"));
        }
        for (j, e) in entries.iter().enumerate() {
            let n = &e.value.name;
            // setup names are paths under the results' maps/ (joined with `/`): a name with `/`,
            // `.` or `..` would put a setup's maps outside its own directory, or above the results
            if n.is_empty() || n.contains('/') || n == "." || n == ".." {
                return Err(format!("{source}:{}: matrix axis `{axis}`: entry name `{n}` must be non-empty and contain no `/` (nor be `.` or `..`)", loc(e)));
            }
            if entries[..j].iter().any(|x| &x.value.name == n) {
                return Err(format!("{source}:{}: matrix axis `{axis}`: entry name `{n}` is used twice; names must be unique within an axis", loc(e)));
            }
        }
        count = count.saturating_mul(entries.len());
    }
    if count > MAX_SETUPS {
        return Err(format!("{source}:{at}: `matrix` makes {count} setups; allowed: at most {MAX_SETUPS}"));
    }
    let mut out = Vec::with_capacity(count);
    let mut idx = vec![0usize; axes.len()];
    loop {
        let combo: Vec<(&str, &Spanned<RawSetup>)> = axes.iter().zip(&idx).map(|((a, es), &i)| (a.as_str(), &es[i])).collect();
        out.push(combine(&combo, base, source)?);
        // the last axis varies fastest
        let mut k = axes.len();
        loop {
            if k == 0 {
                return Ok(out);
            }
            k -= 1;
            idx[k] += 1;
            if idx[k] < axes[k].1.len() {
                break;
            }
            idx[k] = 0;
        }
    }
}

/// `axis` entry `name` (file:line:col), for errors.
fn who(axis: &str, e: &Spanned<RawSetup>, source: &str) -> String {
    format!("axis `{axis}` entry `{}` ({source}:{})", e.value.name, loc(e))
}

fn conflict(key: &str, a: &str, b: &str, source: &str, at: &str) -> String {
    format!(
        "{source}:{at}: matrix: `{key}` is set by {a} and by {b}; only one axis may set it (disk keys apply in axis order; stack lists mkfs and mount, and faults, are joined)"
    )
}

fn combine(combo: &[(&str, &Spanned<RawSetup>)], base: &MatrixBase, source: &str) -> Result<Setup, String> {
    let name = combo.iter().map(|(_, e)| e.value.name.as_str()).collect::<Vec<_>>().join("/");
    let description = combo.iter().filter_map(|(_, e)| e.value.description.clone()).filter(|d| !d.is_empty()).collect::<Vec<_>>().join("; ");
    let mut d = base.disk.clone();
    for (_, e) in combo {
        d = disk(e.value.disk.as_ref(), Some(&d), source)?;
    }
    let st = merged_stack(combo, base, source)?;
    let list = if combo.iter().any(|(_, e)| e.value.faults.is_some()) {
        Some(combo.iter().flat_map(|(_, e)| e.value.faults.clone().unwrap_or_default()).collect())
    } else {
        base.faults.cloned()
    };
    let (f, power_cut) = faults(list, &d, &st, source)?;
    let once = |key: &str, set: &dyn Fn(&RawSetup) -> bool| -> Result<Option<usize>, String> {
        let mut by: Option<usize> = None;
        for (i, (axis, e)) in combo.iter().enumerate() {
            if set(&e.value) {
                if let Some(p) = by {
                    let (pa, pe) = combo[p];
                    return Err(conflict(key, &who(pa, pe, source), &who(axis, e, source), source, &loc(e)));
                }
                by = Some(i);
            }
        }
        Ok(by)
    };
    let rep = match once("repeat", &|s| s.repeat.is_some())? {
        Some(i) => repeat(combo[i].1.value.repeat.as_ref().expect("set"), source)?,
        None => base.repeat,
    };
    let workload = once("workload", &|s| s.workload.is_some())?.and_then(|i| combo[i].1.value.workload.clone());
    // host and network faults: the entries' lists joined, replacing the base's (as faults)
    let host_faults = if combo.iter().any(|(_, e)| e.value.host_faults.is_some()) {
        let list = combo.iter().flat_map(|(_, e)| e.value.host_faults.clone().unwrap_or_default()).collect();
        crate::spec::host::validate_experiment(list, source, base.agents)?
    } else {
        base.host_faults.to_vec()
    };
    let net_faults = if combo.iter().any(|(_, e)| e.value.net_faults.is_some()) {
        let list = combo.iter().flat_map(|(_, e)| e.value.net_faults.clone().unwrap_or_default()).collect();
        crate::spec::networked::net_faults(list, base.hosts, source)?
    } else {
        base.net_faults.to_vec()
    };
    let nbd = match once("nbd", &|s| s.nbd.is_some())? {
        Some(i) => Some(super::super::networked::setup_nbd(combo[i].1.value.nbd.as_ref().expect("set"), base.hosts.is_some(), &name, source)?),
        None => None,
    };
    Ok(Setup {
        name,
        description,
        disk: d,
        stack: st,
        faults: f,
        power_cut,
        repeat: rep,
        workload,
        host_faults,
        net_faults,
        nbd,
        axes: combo.iter().map(|(a, e)| (a.to_string(), e.value.name.clone())).collect(),
    })
}

/// A stack word as the map it stands for; None for `raw` and words `stack()` rejects.
fn as_map(w: &WordOr<RawStack>) -> Option<RawStack> {
    let fs = |f: &str| Some(f.to_string());
    match w {
        WordOr::Map(m) => Some(m.clone()),
        WordOr::Word(w) => match w.as_str() {
            "ext4" | "xfs" | "btrfs" => Some(RawStack { fs: fs(w), ..Default::default() }),
            "btrfs-raid1" => Some(RawStack { fs: fs("btrfs"), raid1: Some(true), ..Default::default() }),
            "dedup" | "dedup-btrfs" => Some(RawStack { fs: fs("btrfs"), dedup: Some(true), ..Default::default() }),
            "dedup-xfs" => Some(RawStack { fs: fs("xfs"), dedup: Some(true), ..Default::default() }),
            _ => None,
        },
    }
}

fn merged_stack(combo: &[(&str, &Spanned<RawSetup>)], base: &MatrixBase, source: &str) -> Result<super::StackSpec, String> {
    type Setter<'a> = (&'a str, &'a Spanned<RawSetup>, &'a Spanned<WordOr<RawStack>>);
    let setters: Vec<Setter> = combo.iter().filter_map(|(a, e)| e.value.stack.as_ref().map(|s| (*a, *e, s))).collect();
    let Some(last) = setters.last() else {
        return match base.stack {
            Some(s) => stack(s, source),
            None => Ok(super::StackSpec::Raw),
        };
    };
    // an axis entry `raw` stands alone: no other axis may add stack keys to it
    if let Some((a, e, s)) = setters.iter().find(|(.., s)| matches!(&s.value, WordOr::Word(w) if w == "raw")) {
        if let Some((a2, e2, _)) = setters.iter().find(|(.., s2)| !std::ptr::eq(*s2, *s)) {
            return Err(conflict("stack", &who(a, e, source), &who(a2, e2, source), source, &loc(e2)));
        }
        return Ok(super::StackSpec::Raw);
    }
    let mut merged = match base.stack {
        Some(b) => match as_map(&b.value) {
            Some(m) => m,
            // a base `raw` is overridden by the axes; an unknown word is an error
            None if matches!(&b.value, WordOr::Word(w) if w == "raw") => RawStack::default(),
            None => return stack(b, source),
        },
        None => RawStack::default(),
    };
    let mut set_by: HashMap<&str, (&str, &Spanned<RawSetup>)> = HashMap::new();
    for (axis, e, s) in &setters {
        let Some(m) = as_map(&s.value) else { return stack(s, source) };
        macro_rules! once {
            ($($f:ident),*) => {$(
                if let Some(v) = &m.$f {
                    let key = concat!("stack.", stringify!($f));
                    if let Some((pa, pe)) = set_by.get(key) {
                        return Err(conflict(key, &who(pa, pe, source), &who(axis, e, source), source, &loc(s)));
                    }
                    merged.$f = Some(v.clone());
                    set_by.insert(key, (axis, e));
                }
            )*};
        }
        once!(fs, raid1, dedup, command, timeout, dedupe_with);
        if let Some(l) = &m.mkfs {
            merged.mkfs.get_or_insert_with(Vec::new).extend(l.iter().cloned());
        }
        if let Some(l) = &m.mount {
            merged.mount.get_or_insert_with(Vec::new).extend(l.iter().cloned());
        }
    }
    let s = last.2;
    stack(&Spanned { value: WordOr::Map(merged), referenced: s.referenced, defined: s.defined }, source)
}
