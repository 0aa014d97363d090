//! Workload specs (YAML): a `workload:` mapping, fio-style keys, documented in docs/workload.md.
//!
//! Two steps like rules: serde-saphyr reads `WorkloadYaml` (unknown keys and bad units are
//! rejected with line/column), then `resolve` checks values and combinations and builds a
//! `workload::Workload`. Experiment files embed a `Spanned<WorkloadYaml>` and call `resolve`.

use super::units::{Dur, Size};
use crate::content::profile::Profile;
pub mod config;

pub use config::{CONTENT_BLOCK, ErrorPolicy, Interface, IoEngine, Pattern, Personality, PersonalitySpec, SyncMode, Workload};
use serde::Deserialize;
use serde_saphyr::Spanned;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct WorkloadYaml {
    pub interface: Option<Spanned<String>>,
    pub device: Option<Spanned<String>>,
    /// `interface: nbd`: the export's URI (nbd://HOST:PORT/EXPORT, nbd+unix:///EXPORT?socket=PATH).
    pub target: Option<Spanned<String>>,
    pub dir: Option<Spanned<String>>,
    pub files: Option<Spanned<u32>>,
    pub file_size: Option<Spanned<Size>>,
    pub pattern: Option<Spanned<String>>,
    pub mix: Option<Spanned<MixYaml>>,
    pub write_pct: Option<Spanned<u8>>,
    pub block_size: Option<Spanned<Size>>,
    pub engine: Option<Spanned<String>>,
    pub iodepth: Option<Spanned<u32>>,
    pub threads: Option<Spanned<u32>>,
    pub size: Option<Spanned<Size>>,
    pub span: Option<Spanned<Size>>,
    pub duration: Option<Spanned<Dur>>,
    pub ops: Option<Spanned<u64>>,
    pub rate_iops: Option<Spanned<u64>>,
    pub sync: Option<Spanned<String>>,
    /// O_DIRECT for file data (files and personalities; filebench's `directio`).
    pub direct: Option<Spanned<bool>>,
    /// File interface: fill the files' holes before the run (fio's "Laying out IO file").
    pub layout: Option<Spanned<bool>>,
    pub on_error: Option<Spanned<String>>,
    pub interval: Option<Spanned<Dur>>,
    pub content: Option<Spanned<ContentYaml>>,
    /// fileserver | webserver | varmail (filebench's personalities; `personality`).
    pub personality: Option<Spanned<String>>,
    /// Personality: fraction of filebench's file count (0 < scale <= 1, default 1).
    pub scale: Option<Spanned<f64>>,
    /// Personality (varmail): each `fsync` flowop also fsyncs the file's directory.
    pub fsync_dir: Option<Spanned<bool>>,
    /// Personality (varmail): a file's rewrite is an atomic replace (temp file, fsync, rename).
    pub replace: Option<Spanned<bool>>,
}

/// `mix: {read: 70, write: 30}` (percent; one of them is enough).
#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct MixYaml {
    pub read: Option<u8>,
    pub write: Option<u8>,
}

/// `content: {profile: NAME|PATH|none, seed: N}`.
#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct ContentYaml {
    pub profile: Option<String>,
    pub seed: Option<u64>,
}

#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
struct WorkloadFile {
    workload: Spanned<WorkloadYaml>,
}

/// Where an experiment (or the CLI) points the workload: a device (block interface) or a
/// directory (file interface, e.g. a mounted file system). Overrides the YAML's device/dir;
/// when the YAML has no `interface`, it decides it.
#[derive(Clone, Debug, PartialEq)]
pub enum Where {
    Device(PathBuf),
    Dir(PathBuf),
}

fn at<T>(source: &str, s: &Spanned<T>, key: &str, what: impl std::fmt::Display) -> String {
    format!("{source}:{}:{}: {key}: {what}", s.referenced.line(), s.referenced.column())
}

/// Parse a document whose top level is `workload:`. `source` names it in errors.
pub fn parse_workload(text: &str, source: &str, target: Option<Where>) -> Result<Workload, String> {
    let f: WorkloadFile = serde_saphyr::from_str(text).map_err(|e| crate::spec::yaml_error(source, &e))?;
    let l = &f.workload.referenced;
    // errors about the whole mapping get its line and column
    resolve(&f.workload.value, source, target)
        .map_err(|e| e.replacen(&format!("{source}: workload:"), &format!("{source}:{}:{}: workload:", l.line(), l.column()), 1))
}

pub fn parse_workload_file(path: &Path, target: Option<Where>) -> Result<Workload, String> {
    let text = crate::spec::read_text(path, "workload file")?;
    parse_workload(&text, &path.display().to_string(), target)
}

/// Validate a parsed `workload:` mapping into a `Workload` (its profile already fitted to the
/// run, see `Workload::fit_profile`). `target` (a `Where`, or None) is the device or directory
/// to use, overriding the YAML's `device`/`dir`. `source` names the file in errors; errors
/// about one key read `file:line:col: key: what is wrong; allowed: ...`, errors about the
/// mapping as a whole `source: workload: ...`.
pub fn resolve(y: &WorkloadYaml, source: &str, target: impl Into<Option<Where>>) -> Result<Workload, String> {
    let target: Option<Where> = target.into();
    if y.personality.is_some() {
        return resolve_personality(y, source, target);
    }
    if let Some(s) = &y.scale {
        return Err(at(source, s, "scale", "belongs to `personality`"));
    }
    if let Some(s) = &y.fsync_dir {
        return Err(at(source, s, "fsync_dir", "belongs to `personality: varmail` (its fsync flowops); a file workload's directory is fsynced before it runs"));
    }
    if let Some(s) = &y.replace {
        return Err(at(source, s, "replace", "belongs to `personality: varmail` (its rewrite of a message file); a file workload rewrites its files in place"));
    }
    let whole = |what: &str| format!("{source}: workload: {what}");
    let iface = match (y.interface.as_ref().map(|v| v.value.as_str()), &target) {
        (Some(i), _) => i,
        (None, Some(Where::Dir(_))) => "file",
        (None, _) => "block",
    };
    let (device_or_dir, wrong) = match (&target, iface) {
        // the export named in the file is the target, wherever the caller points
        (_, "nbd") => (None, None),
        (Some(Where::Device(p)), "block") | (Some(Where::Dir(p)), "file") => (Some(p.as_path()), None),
        (Some(Where::Device(p)), _) => (None, Some(format!("the workload runs on the device {} (no file system): use `interface: block`", p.display()))),
        (Some(Where::Dir(p)), _) => (None, Some(format!("the workload runs on a file system at {}: use `interface: file`", p.display()))),
        (None, _) => (None, None),
    };
    if let (Some(m), Some(i)) = (wrong, &y.interface) {
        return Err(at(source, i, "interface", m));
    }
    if let (Some(t), false) = (&y.target, iface == "nbd") {
        return Err(at(source, t, "target", "belongs to `interface: nbd`"));
    }
    let interface = match iface {
        "block" => {
            if let Some(d) = &y.dir {
                return Err(at(source, d, "dir", "belongs to `interface: file`; a block workload takes `device`"));
            }
            for (k, v) in [("files", y.files.as_ref().map(|s| &s.referenced)), ("file_size", y.file_size.as_ref().map(|s| &s.referenced))] {
                if let Some(l) = v {
                    return Err(format!("{source}:{}:{}: {k}: belongs to `interface: file`", l.line(), l.column()));
                }
            }
            let device = match (device_or_dir, &y.device) {
                (Some(p), _) => p.to_path_buf(),
                (None, Some(d)) => PathBuf::from(&d.value),
                (None, None) => return Err(whole("no `device`: a block workload needs the device path (e.g. device: /dev/loop0)")),
            };
            Interface::Block { device }
        }
        "file" => {
            if let Some(d) = &y.device {
                return Err(at(source, d, "device", "belongs to `interface: block`; a file workload takes `dir`"));
            }
            if let Some(s) = &y.span {
                return Err(at(source, s, "span", "belongs to `interface: block`; files have `file_size`"));
            }
            let dir = match (device_or_dir, &y.dir) {
                (Some(p), _) => p.to_path_buf(),
                (None, Some(d)) => PathBuf::from(&d.value),
                (None, None) => return Err(whole("no `dir`: a file workload needs a directory (dir: /mnt/test)")),
            };
            let count = y.files.as_ref().map(|f| f.value).unwrap_or(1);
            if let Some(f) = y.files.as_ref().filter(|f| f.value == 0) {
                return Err(at(source, f, "files", "must be at least 1"));
            }
            let Some(fs) = &y.file_size else { return Err(whole("no `file_size`: a file workload needs the size of each file (file_size: 64MiB)")) };
            if fs.value.0 == 0 || fs.value.0 % CONTENT_BLOCK != 0 {
                return Err(at(source, fs, "file_size", format!("{} is not a positive multiple of 4KiB", fs.value)));
            }
            if (count as u64).checked_mul(fs.value.0).is_none() {
                return Err(at(source, fs, "file_size", format!("{count} files of {} are more bytes than a u64 holds", fs.value)));
            }
            Interface::File { dir, count, size: fs.value.0 }
        }
        "nbd" => {
            for (k, v) in [
                ("device", y.device.as_ref().map(|s| &s.referenced)),
                ("dir", y.dir.as_ref().map(|s| &s.referenced)),
                ("files", y.files.as_ref().map(|s| &s.referenced)),
                ("file_size", y.file_size.as_ref().map(|s| &s.referenced)),
            ] {
                if let Some(l) = v {
                    return Err(format!("{source}:{}:{}: {k}: does not belong to `interface: nbd` (it takes `target: nbd://...`)", l.line(), l.column()));
                }
            }
            let Some(t) = &y.target else { return Err(whole("no `target`: an nbd workload needs the export's URI (target: nbd://HOST:PORT/EXPORT)")) };
            Interface::Nbd { target: t.value.parse().map_err(|e: String| at(source, t, "target", e))? }
        }
        other => return Err(at(source, y.interface.as_ref().unwrap(), "interface", format!("`{other}` is not an interface; allowed: block, file, nbd"))),
    };
    let mut w = Workload::new(interface);
    if let Some(p) = &y.pattern {
        w.pattern = p.value.parse::<Pattern>().map_err(|e| at(source, p, "pattern", e))?;
    }
    match (&y.mix, &y.write_pct) {
        (Some(_), Some(p)) => return Err(at(source, p, "write_pct", "give either `mix` or `write_pct`, not both")),
        (Some(m), None) => {
            let bad = |what: String| at(source, m, "mix", format!("{what}; allowed: {{read: PERCENT, write: PERCENT}} adding up to 100"));
            w.write_pct = match (m.value.read, m.value.write) {
                (Some(r), Some(wr)) if r as u32 + wr as u32 == 100 => wr,
                (Some(r), Some(wr)) => return Err(bad(format!("read {r} + write {wr} is not 100"))),
                (Some(r), None) if r <= 100 => 100 - r,
                (None, Some(wr)) if wr <= 100 => wr,
                (None, None) => return Err(bad("empty".into())),
                _ => return Err(bad("a percentage is over 100".into())),
            };
        }
        (None, Some(p)) if p.value > 100 => return Err(at(source, p, "write_pct", format!("{} is not a percentage; allowed: 0..100", p.value))),
        (None, Some(p)) => w.write_pct = p.value,
        (None, None) => {}
    }
    if let Some(b) = &y.block_size {
        if b.value.0 == 0 || b.value.0 % CONTENT_BLOCK != 0 || b.value.0 > 1 << 20 {
            return Err(at(source, b, "block_size", format!("{} is not allowed; allowed: a multiple of 4KiB up to 1MiB", b.value)));
        }
        w.block_size = b.value.0;
    }
    if let Some(e) = &y.engine {
        w.engine = e.value.parse::<IoEngine>().map_err(|m| at(source, e, "engine", m))?;
    }
    if let Some(q) = &y.iodepth {
        if q.value == 0 || q.value > 4096 {
            return Err(at(source, q, "iodepth", format!("{} is out of range; allowed: 1..4096", q.value)));
        }
        if q.value > 1 && w.engine == IoEngine::Psync {
            return Err(at(source, q, "iodepth", "psync has one I/O in flight per thread; use `engine: io_uring` for a queue depth"));
        }
        w.iodepth = q.value;
    }
    if let Some(t) = &y.threads {
        if t.value == 0 || t.value > 1024 {
            return Err(at(source, t, "threads", format!("{} is out of range; allowed: 1..1024", t.value)));
        }
        w.threads = t.value;
    }
    zero_bounds(y, source)?;
    w.size = y.size.as_ref().map(|s| s.value.0);
    w.span = y.span.as_ref().map(|s| s.value.0);
    w.duration = y.duration.as_ref().map(|d| d.value.0);
    w.ops = y.ops.as_ref().map(|o| o.value);
    if w.size.is_none() && w.ops.is_none() && w.duration.is_none() {
        return Err(whole("no bound: give at least one of size, ops, duration (whichever comes first ends the run)"));
    }
    if let Some(r) = &y.rate_iops {
        if r.value == 0 {
            return Err(at(source, r, "rate_iops", "must be at least 1 (leave it out for peak rate)"));
        }
        w.rate_iops = Some(r.value);
    }
    if let Some(s) = &y.sync {
        w.sync = s.value.parse::<SyncMode>().map_err(|m| at(source, s, "sync", m))?;
    }
    if let Some(d) = &y.direct {
        direct_key(d, y.sync.as_ref(), &mut w, source)?;
    }
    if let Some(l) = &y.layout {
        if l.value && !matches!(w.interface, Interface::File { .. }) {
            return Err(at(
                source,
                l,
                "layout",
                "fills the holes of the file interface's files; a device or an NBD export has none; allowed: files (or leave it out)",
            ));
        }
        w.layout = l.value;
    }
    if let Some(o) = &y.on_error {
        w.on_error = o.value.parse::<ErrorPolicy>().map_err(|m| at(source, o, "on_error", m))?;
    }
    interval_and_content(y, &mut w, source)?;
    if let (Interface::File { count, .. }, Some(t)) = (&w.interface, &y.threads)
        && *count < t.value
    {
        return Err(at(source, t, "threads", format!("{} threads need at least as many files (files: {count})", t.value)));
    }
    // checked here, with the spec's line: a file below one block, or less than one block per
    // thread, cannot run, and the run's own check would come after its setup, without the line
    let bs = Size(w.block_size);
    if let (Interface::File { size, .. }, Some(f)) = (&w.interface, &y.file_size)
        && *size < w.block_size
    {
        return Err(at(source, f, "file_size", format!("{} is smaller than one block ({bs}); allowed: at least block_size", Size(*size))));
    }
    if let Some(s) = y.span.as_ref().filter(|s| s.value.0 / w.block_size < w.threads as u64) {
        return Err(at(
            source,
            s,
            "span",
            format!("{} holds fewer blocks of {bs} than there are threads ({}); allowed: at least one block per thread", s.value, w.threads),
        ));
    }
    w.fit_profile();
    Ok(w)
}

/// A `personality:` workload: filebench's file set and flowop loop in `dir` (file interface).
/// Keys that shape I/O of the other workloads (pattern, mix, block size, engine, sync, ...) do
/// not apply and are errors; `threads`, bounds (`duration`, `ops`), `interval`, `on_error`
/// (stop | continue) and `content` do.
fn resolve_personality(y: &WorkloadYaml, source: &str, target: Option<Where>) -> Result<Workload, String> {
    let whole = |what: &str| format!("{source}: workload: {what}");
    let p = y.personality.as_ref().expect("called with a personality");
    let kind = p.value.parse::<Personality>().map_err(|m| at(source, p, "personality", m))?;
    if let Some(i) = y.interface.as_ref().filter(|i| i.value != "file") {
        return Err(at(source, i, "interface", "a personality runs on files: use `interface: file` (or leave it out)"));
    }
    let not_here = [
        ("device", y.device.as_ref().map(|s| &s.referenced)),
        ("files", y.files.as_ref().map(|s| &s.referenced)),
        ("file_size", y.file_size.as_ref().map(|s| &s.referenced)),
        ("pattern", y.pattern.as_ref().map(|s| &s.referenced)),
        ("mix", y.mix.as_ref().map(|s| &s.referenced)),
        ("write_pct", y.write_pct.as_ref().map(|s| &s.referenced)),
        ("block_size", y.block_size.as_ref().map(|s| &s.referenced)),
        ("engine", y.engine.as_ref().map(|s| &s.referenced)),
        ("iodepth", y.iodepth.as_ref().map(|s| &s.referenced)),
        ("size", y.size.as_ref().map(|s| &s.referenced)),
        ("span", y.span.as_ref().map(|s| &s.referenced)),
        ("rate_iops", y.rate_iops.as_ref().map(|s| &s.referenced)),
        ("sync", y.sync.as_ref().map(|s| &s.referenced)),
        ("layout", y.layout.as_ref().map(|s| &s.referenced)),
    ];
    for (k, l) in not_here {
        if let Some(l) = l {
            return Err(format!(
                "{source}:{}:{}: {k}: does not apply to `personality` (its file set, flowops and I/O sizes come from filebench's workload file); allowed with it: dir, scale, threads, duration, ops, interval, on_error, content, direct, fsync_dir, replace",
                l.line(),
                l.column()
            ));
        }
    }
    let dir = match (&target, &y.dir) {
        (Some(Where::Dir(p)), _) => p.clone(),
        (Some(Where::Device(d)), _) => return Err(at(source, p, "personality", format!("runs on a file system, not on the device {}", d.display()))),
        (None, Some(d)) => PathBuf::from(&d.value),
        (None, None) => return Err(whole("no `dir`: a personality needs a directory (dir: /mnt/test)")),
    };
    let mut spec = kind.defaults();
    if let Some(s) = &y.scale {
        if !(s.value > 0.0 && s.value <= 1.0) {
            return Err(at(source, s, "scale", format!("{} is out of range; allowed: more than 0, at most 1 (0.01 = 1% of filebench's files)", s.value)));
        }
        spec = spec.scaled(s.value);
    }
    let mut w = Workload::new(Interface::File { dir, count: spec.nfiles.min(u32::MAX as u64) as u32, size: spec.meanfilesize });
    w.threads = spec.threads;
    if let Some(t) = &y.threads {
        if t.value == 0 || t.value > 1024 {
            return Err(at(source, t, "threads", format!("{} is out of range; allowed: 1..1024", t.value)));
        }
        w.threads = t.value;
    }
    // buffered, as filebench by default; `direct: true` is its `directio`
    w.sync = SyncMode::None;
    w.direct = y.direct.as_ref().is_some_and(|d| d.value);
    zero_bounds(y, source)?;
    w.duration = y.duration.as_ref().map(|d| d.value.0);
    w.ops = y.ops.as_ref().map(|o| o.value);
    if w.ops.is_none() && w.duration.is_none() {
        return Err(whole("no bound: give duration or ops (flowops over all threads); whichever comes first ends the run"));
    }
    if let Some(o) = &y.on_error {
        w.on_error = o.value.parse::<ErrorPolicy>().map_err(|m| at(source, o, "on_error", m))?;
        if matches!(w.on_error, ErrorPolicy::Retry(_)) {
            return Err(at(source, o, "on_error", "retry is not supported with `personality`; allowed: stop, continue"));
        }
    }
    interval_and_content(y, &mut w, source)?;
    if let Some(f) = &y.fsync_dir {
        if kind != Personality::Varmail && f.value {
            return Err(at(source, f, "fsync_dir", format!("{} has no fsync flowop to extend; allowed: varmail", kind.name())));
        }
        spec.fsync_dir = f.value;
    }
    if let Some(r) = &y.replace {
        if kind != Personality::Varmail && r.value {
            return Err(at(source, r, "replace", format!("{} has no rewrite of an existing file to replace; allowed: varmail", kind.name())));
        }
        spec.replace = r.value;
    }
    w.personality = Some(spec);
    w.fit_profile();
    Ok(w)
}

/// `direct` on a block, file or NBD workload. Files: O_DIRECT with any sync mode but `none`
/// (buffered); `direct: false` without `sync` is buffered (`sync: none`). Sizes need no check
/// here: `file_size` and `block_size` are already whole 4 KiB blocks, which is what O_DIRECT
/// asks of offsets and lengths on a 512 B or 4 KiB device, and buffers are page-aligned.
fn direct_key(d: &Spanned<bool>, sync: Option<&Spanned<String>>, w: &mut Workload, source: &str) -> Result<(), String> {
    match (&w.interface, d.value) {
        (Interface::Nbd { .. }, _) => Err(at(source, d, "direct", "does not apply to `interface: nbd` (requests go straight to the export, no page cache)")),
        (Interface::Block { .. }, false) => Err(at(source, d, "direct", "a block workload always opens the device O_DIRECT; allowed: true (or leave it out)")),
        (Interface::Block { .. }, true) => Ok(()),
        (Interface::File { .. }, direct) => {
            match (direct, sync, w.sync) {
                (true, Some(s), SyncMode::None) => {
                    return Err(at(
                        source,
                        s,
                        "sync",
                        "`none` is buffered I/O, but `direct: true` asks for O_DIRECT; allowed with it: direct, dsync, fsync:N (or leave sync out)",
                    ));
                }
                (false, Some(s), SyncMode::Direct) => {
                    return Err(at(
                        source,
                        s,
                        "sync",
                        "`direct` is O_DIRECT, but `direct: false` asks for buffered I/O; allowed with it: none, dsync, fsync:N (or leave sync out)",
                    ));
                }
                (false, None, _) => w.sync = SyncMode::None,
                _ => {}
            }
            w.direct = direct;
            Ok(())
        }
    }
}

/// A bound (size, ops, duration) must be more than 0: a 0 would end the run before its first
/// I/O, and an empty run would pass as a successful one.
fn zero_bounds(y: &WorkloadYaml, source: &str) -> Result<(), String> {
    let what = "0 ends the run before its first I/O; allowed: more than 0 (or leave it out)";
    match (&y.size, &y.ops, &y.duration) {
        (Some(s), _, _) if s.value.0 == 0 => Err(at(source, s, "size", what)),
        (_, Some(o), _) if o.value == 0 => Err(at(source, o, "ops", what)),
        (_, _, Some(d)) if d.value.0.is_zero() => Err(at(source, d, "duration", what)),
        _ => Ok(()),
    }
}

/// A profile by name (`none`, or NAME for profiles/NAME.profile shipped with faultline) or path
/// (as given, else relative to the spec file's directory).
/// `interval` and `content`, the same for block, file and personality workloads.
fn interval_and_content(y: &WorkloadYaml, w: &mut Workload, source: &str) -> Result<(), String> {
    if let Some(i) = &y.interval {
        if i.value.0 < Duration::from_millis(10) {
            return Err(at(source, i, "interval", "is below the minimum; allowed: 10ms or more"));
        }
        w.interval = i.value.0;
    }
    if let Some(c) = &y.content {
        if let Some(seed) = c.value.seed {
            w.seed = seed;
        }
        if let Some(p) = &c.value.profile {
            w.profile = load_profile(p, source).map_err(|m| at(source, c, "content.profile", m))?;
        }
    }
    Ok(())
}

pub fn load_profile(p: &str, source: &str) -> Result<Profile, String> {
    if p == "none" {
        return Ok(Profile::none());
    }
    let mut tried = Vec::new();
    let as_path = Path::new(p);
    let mut candidates = vec![as_path.to_path_buf()];
    if let Some(d) = Path::new(source).parent() {
        candidates.push(d.join(p));
    }
    if !p.contains('/') {
        for d in profile_dirs() {
            candidates.push(d.join(format!("{p}.profile")));
        }
    }
    for c in candidates {
        if c.is_file() {
            return Profile::load(&c).map_err(|e| format!("{e:#}"));
        }
        tried.push(c.display().to_string());
    }
    let names: Vec<String> = profile_dirs()
        .into_iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".profile").map(str::to_string))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    Err(format!("no profile `{p}` (looked at {}); allowed: none, a profile file, or one of: {}", tried.join(", "), names.join(", ")))
}

/// Where shipped profiles live: next to the binary (and two levels up, for target/release),
/// then the source tree it was built from.
pub fn profile_dirs() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Ok(exe) = std::env::current_exe()
        && let Some(d) = exe.parent()
    {
        v.push(d.join("profiles"));
        v.push(d.join("../share/faultline/profiles"));
        v.push(d.join("../../profiles"));
    }
    v.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles"));
    v.retain(|d| d.is_dir());
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(y: &str) -> Result<Workload, String> {
        parse_workload(y, "w.yaml", None)
    }

    #[test]
    fn full_spec() {
        let w = p("workload:\n  interface: file\n  dir: /tmp/x\n  files: 4\n  file_size: 1MiB\n  pattern: zipf:1.1\n  mix: {read: 30, write: 70}\n  block_size: 16KiB\n  engine: io_uring\n  iodepth: 8\n  threads: 2\n  size: 1GiB\n  duration: 5s\n  rate_iops: 1000\n  sync: fsync:16\n  on_error: retry:3\n  interval: 100ms\n  content: {profile: none, seed: 9}\n").unwrap();
        assert_eq!(w.interface, Interface::File { dir: "/tmp/x".into(), count: 4, size: 1 << 20 });
        assert_eq!((w.write_pct, w.block_size, w.engine, w.iodepth, w.threads), (70, 16384, IoEngine::IoUring, 8, 2));
        assert_eq!((w.sync, w.on_error, w.rate_iops, w.seed), (SyncMode::Fsync(16), ErrorPolicy::Retry(3), Some(1000), 9));
        assert_eq!(w.pattern, Pattern::Zipf(1.1));
        // a shipped profile by name
        let w = p("workload:\n  device: /dev/null\n  size: 1GiB\n  content: {profile: debian12-usr}\n").unwrap();
        assert!(w.profile.dedup_ratio() > 1.0);
    }

    #[test]
    fn target_decides_the_interface() {
        let y = "workload:\n  file_size: 1MiB\n  ops: 10\n";
        let w = parse_workload(y, "w.yaml", Some(Where::Dir("/mnt/x".into()))).unwrap();
        assert_eq!(w.interface, Interface::File { dir: "/mnt/x".into(), count: 1, size: 1 << 20 });
        let w = parse_workload("workload:\n  device: /dev/a\n  ops: 1\n", "w.yaml", Some(Where::Device("/dev/b".into()))).unwrap();
        assert_eq!(w.interface, Interface::Block { device: "/dev/b".into() });
        let e = parse_workload("workload:\n  interface: block\n  ops: 1\n", "w.yaml", Some(Where::Dir("/mnt/x".into()))).unwrap_err();
        assert!(e.starts_with("w.yaml:2:14: interface: the workload runs on a file system at /mnt/x: use `interface: file`"), "{e}");
    }

    /// Numbers at the ends of their types, alone and multiplied together (files x file_size,
    /// iodepth x block size x threads for the I/O buffers): an error naming the key or the
    /// product, never an overflow or an aborted allocation.
    #[test]
    fn huge_numbers_are_errors() {
        let cases = [
            ("workload:\n  device: /dev/x\n  ops: 1\n  engine: io_uring\n  iodepth: 65535\n", "w.yaml:5:12: iodepth: 65535 is out of range; allowed: 1..4096"),
            ("workload:\n  device: /dev/x\n  ops: 1\n  block_size: 64MiB\n", "w.yaml:4:15: block_size: 64MiB is not allowed"),
            ("workload:\n  device: /dev/x\n  ops: 1\n  threads: 4294967295\n", "w.yaml:4:12: threads: 4294967295 is out of range; allowed: 1..1024"),
            (
                "workload:\n  interface: file\n  dir: /x\n  files: 4294967295\n  file_size: 16777215TiB\n  ops: 1\n",
                "w.yaml:5:14: file_size: 4294967295 files of 16777215TiB are more bytes than a u64 holds",
            ),
        ];
        for (y, want) in cases {
            let e = p(y).unwrap_err();
            assert!(e.contains(want), "for {y:?}\n got: {e}\nwant: {want}");
        }
        // a size near 2^64 (times the write share) scales the profile without overflowing
        let w = p("workload:\n  device: /dev/x\n  size: 16777215TiB\n  content: {profile: debian12-usr}\n").unwrap();
        assert!(w.profile.total_blocks() > 1 << 40, "{}", w.profile.total_blocks());
        // the run-time check of the values together (the CLI's flags reach only this one)
        let mut w = Workload::new(Interface::Block { device: "/dev/null".into() });
        (w.engine, w.iodepth, w.block_size, w.threads, w.ops) = (IoEngine::IoUring, 65535, 64 << 20, 65535, Some(1));
        let e = |w: &Workload| w.check().unwrap_err().to_string();
        assert!(e(&w).contains("block size 67108864 must be a multiple of 4096 up to 1MiB"), "{}", e(&w));
        w.block_size = 1 << 20;
        assert!(e(&w).contains("iodepth 65535 is too deep; at most 4096"), "{}", e(&w));
        w.iodepth = 4096;
        assert!(e(&w).contains("65535 threads are too many; at most 1024"), "{}", e(&w));
        w.threads = 1024;
        // 4097 MiB per thread x 1024: more memory than a test machine has
        if let Err(e) = w.check() {
            assert!(
                e.to_string().contains("iodepth 4096 x block size 1MiB x 1024 threads needs 4097GiB of I/O buffers, more than this machine's memory"),
                "{e}"
            );
        }
        (w.iodepth, w.threads) = (8, 2);
        w.check().unwrap();
    }

    #[test]
    fn errors_name_line_column_and_allowed() {
        let cases = [
            ("workload:\n  device: /dev/x\n  ops: 1\n  colour: red\n", "w.yaml:4:3: unknown field `colour`, expected one of interface, device"),
            ("workload:\n  device: /dev/x\n  ops: 1\n  pattern: spiral\n", "w.yaml:4:12: pattern: `spiral` is not a pattern; allowed: sequential"),
            ("workload:\n  device: /dev/x\n  ops: 1\n  engine: aio\n", "w.yaml:4:11: engine: `aio` is not an engine; allowed: psync, io_uring"),
            (
                "workload:\n  device: /dev/x\n  ops: 1\n  sync: sometimes\n",
                "w.yaml:4:9: sync: `sometimes` is not a sync mode; allowed: none, direct, dsync, fsync:N",
            ),
            ("workload:\n  device: /dev/x\n  ops: 1\n  mix: {read: 60, write: 60}\n", "w.yaml:4:8: mix: read 60 + write 60 is not 100"),
            ("workload:\n  device: /dev/x\n", "w.yaml:2:3: workload: no bound"),
            ("workload:\n  interface: block\n  ops: 1\n", "w.yaml:2:3: workload: no `device`"),
            ("workload:\n  device: /dev/x\n  ops: 1\n  interval: 1ms\n", "w.yaml:4:13: interval: is below the minimum; allowed: 10ms"),
            ("workload:\n  device: /dev/x\n  ops: 0\n", "w.yaml:3:8: ops: 0 ends the run before its first I/O; allowed: more than 0"),
            ("workload:\n  device: /dev/x\n  ops: 1\n  span: 3000\n", "w.yaml:4:9: span: 3000B holds fewer blocks of 4KiB than there are threads (1)"),
            (
                "workload:\n  interface: file\n  dir: /x\n  file_size: 64KiB\n  block_size: 128KiB\n  ops: 1\n",
                "w.yaml:4:14: file_size: 64KiB is smaller than one block (128KiB)",
            ),
            ("workload:\n  device: /dev/x\n  size: 0\n  duration: 1s\n", "w.yaml:3:9: size: 0 ends the run before its first I/O"),
            ("workload:\n  personality: varmail\n  dir: /x\n  duration: 0s\n", "w.yaml:4:13: duration: 0 ends the run before its first I/O"),
            ("workload:\n  device: /dev/x\n  ops: 1\n  pattern: zipf:inf\n", "w.yaml:4:12: pattern: `zipf:inf` is not a pattern"),
            ("workload:\n  device: /dev/x\n  ops: 1\n  iodepth: 32\n", "iodepth: psync has one I/O in flight"),
            ("workload:\n  interface: file\n  dir: /x\n  ops: 1\n", "no `file_size`"),
            ("workload:\n  device: /dev/x\n  ops: 1\n  content: {profile: nosuch}\n", "allowed: none, a profile file, or one of: debian12-usr"),
            ("workload:\n  device: /dev/x\n  ops: 1\n  block_size: 1000\n", "w.yaml:4:15: block_size: 1000B is not allowed; allowed: a multiple of 4KiB"),
        ];
        for (y, want) in cases {
            let e = p(y).unwrap_err();
            assert!(e.contains(want), "for {y:?}\n got: {e}\nwant: {want}");
        }
    }

    #[test]
    fn direct_key() {
        let w = p("workload:\n  personality: varmail\n  dir: /mnt/x\n  ops: 10\n").unwrap();
        assert!(!w.o_direct(), "personalities are buffered by default");
        let w = p("workload:\n  personality: varmail\n  dir: /mnt/x\n  ops: 10\n  direct: true\n").unwrap();
        assert!(w.o_direct());
        let f = "workload:\n  interface: file\n  dir: /x\n  file_size: 1MiB\n  ops: 10\n";
        let w = p(f).unwrap();
        assert!(w.o_direct() && !w.direct, "files are O_DIRECT by default (sync: direct)");
        let w = p(&format!("{f}  direct: false\n")).unwrap();
        assert!(!w.o_direct() && w.sync == SyncMode::None);
        let w = p(&format!("{f}  direct: true\n  sync: fsync:4\n")).unwrap();
        assert!(w.o_direct() && w.sync == SyncMode::Fsync(4));
        let w = p(&format!("{f}  direct: false\n  sync: dsync\n")).unwrap();
        assert!(!w.o_direct() && w.sync == SyncMode::Dsync);
        for (y, want) in [
            (format!("{f}  direct: true\n  sync: none\n"), "w.yaml:7:9: sync: `none` is buffered I/O, but `direct: true` asks for O_DIRECT; allowed with it"),
            (format!("{f}  direct: false\n  sync: direct\n"), "w.yaml:7:9: sync: `direct` is O_DIRECT, but `direct: false`"),
            ("workload:\n  device: /dev/x\n  ops: 1\n  direct: false\n".into(), "w.yaml:4:11: direct: a block workload always opens the device O_DIRECT"),
            (format!("{f}  direct: 1\n"), "w.yaml:6:"),
        ] {
            let e = p(&y).unwrap_err();
            assert!(e.contains(want), "{e}\nwanted: {want}");
        }
    }

    #[test]
    fn personality_keys() {
        let w = p("workload:\n  personality: varmail\n  dir: /mnt/x\n  scale: 0.1\n  duration: 5s\n").unwrap();
        let ps = w.personality.as_ref().unwrap();
        assert_eq!((ps.kind, ps.nfiles, ps.meandirwidth, w.threads, w.sync), (Personality::Varmail, 100, 1_000_000, 16, SyncMode::None));
        let w = p("workload:\n  personality: fileserver\n  dir: /mnt/x\n  threads: 4\n  ops: 100\n").unwrap();
        assert_eq!((w.threads, w.personality.unwrap().nfiles), (4, 10_000));
        let w = p("workload:\n  personality: varmail\n  dir: /mnt/x\n  ops: 10\n  fsync_dir: true\n").unwrap();
        assert!(w.personality.unwrap().fsync_dir);
        assert!(!p("workload:\n  personality: varmail\n  dir: /mnt/x\n  ops: 10\n").unwrap().personality.unwrap().fsync_dir);
        assert!(p("workload:\n  personality: varmail\n  dir: /mnt/x\n  ops: 10\n  replace: true\n").unwrap().personality.unwrap().replace);
        assert!(!p("workload:\n  personality: varmail\n  dir: /mnt/x\n  ops: 10\n").unwrap().personality.unwrap().replace);
        for (y, want) in [
            ("workload:\n  personality: mailserver\n  dir: /x\n  ops: 1\n", "allowed: fileserver, webserver, varmail"),
            ("workload:\n  personality: varmail\n  dir: /x\n  ops: 1\n  block_size: 8KiB\n", "w.yaml:5:15: block_size: does not apply to `personality`"),
            ("workload:\n  personality: varmail\n  dir: /x\n  ops: 1\n  scale: 2\n", "w.yaml:5:10: scale: 2 is out of range"),
            ("workload:\n  personality: varmail\n  dir: /x\n", "no bound"),
            ("workload:\n  device: /dev/x\n  ops: 1\n  scale: 0.5\n", "scale: belongs to `personality`"),
            (
                "workload:\n  personality: fileserver\n  dir: /x\n  ops: 1\n  fsync_dir: true\n",
                "w.yaml:5:14: fsync_dir: fileserver has no fsync flowop to extend; allowed: varmail",
            ),
            ("workload:\n  dir: /x\n  ops: 1\n  fsync_dir: true\n", "w.yaml:4:14: fsync_dir: belongs to `personality: varmail`"),
            (
                "workload:\n  personality: webserver\n  dir: /x\n  ops: 1\n  replace: true\n",
                "w.yaml:5:12: replace: webserver has no rewrite of an existing file to replace; allowed: varmail",
            ),
            ("workload:\n  dir: /x\n  ops: 1\n  replace: true\n", "w.yaml:4:12: replace: belongs to `personality: varmail`"),
        ] {
            let e = p(y).unwrap_err();
            assert!(e.contains(want), "for {y:?}\n got: {e}\nwant: {want}");
        }
    }
}
