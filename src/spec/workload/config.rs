//! What a workload is: the settings, validated, built from flags (`faultline workload`) or YAML
//! (`spec::workload`); the `workload` layer runs them.

use crate::content::profile::Profile;
use crate::content::stream::Stream;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

/// Which block of a region the next request touches (`workload::pattern` generates them).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pattern {
    Sequential,
    Uniform,
    /// TPC-C NURand: a skewed, non-contiguous hot set.
    Hotspot,
    /// Zipf with exponent theta; ranks are scattered over the region.
    Zipf(f64),
}

impl std::str::FromStr for Pattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sequential" | "seq" => Ok(Pattern::Sequential),
            "uniform" | "random" => Ok(Pattern::Uniform),
            "hotspot" | "nurand" => Ok(Pattern::Hotspot),
            _ => {
                if let Some(t) = s.strip_prefix("zipf:").or_else(|| s.strip_prefix("zipf")) {
                    let theta: f64 =
                        t.trim_start_matches(['(', ':']).trim_end_matches(')').parse().map_err(|_| format!("`{s}`: zipf needs a theta, e.g. zipf:1.2"))?;
                    // theta must be finite: the Zipf sampler never returns for an infinite one
                    if theta > 0.0 && theta.is_finite() {
                        return Ok(Pattern::Zipf(theta));
                    }
                }
                Err(format!("`{s}` is not a pattern; allowed: sequential, uniform, hotspot, zipf:THETA (a finite THETA > 0, e.g. zipf:1.2)"))
            }
        }
    }
}

/// Content is generated, mapped and verified in 4 KiB units whatever the I/O size.
pub const CONTENT_BLOCK: u64 = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ErrorPolicy {
    Stop,
    Continue,
    /// Retry a failed I/O up to N times with exponential backoff from 1 ms.
    Retry(u32),
}

impl std::str::FromStr for ErrorPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "stop" => Ok(ErrorPolicy::Stop),
            "continue" => Ok(ErrorPolicy::Continue),
            _ => match s.strip_prefix("retry:").and_then(|n| n.parse().ok()) {
                Some(n) => Ok(ErrorPolicy::Retry(n)),
                None => Err(format!("`{s}` is not an error policy; allowed: stop, continue, retry:N")),
            },
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IoEngine {
    Psync,
    IoUring,
}

impl std::str::FromStr for IoEngine {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "psync" => Ok(IoEngine::Psync),
            "io_uring" | "io-uring" | "uring" => Ok(IoEngine::IoUring),
            _ => Err(format!("`{s}` is not an engine; allowed: psync, io_uring")),
        }
    }
}

/// How writes reach stable storage. Block devices are always opened O_DIRECT.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SyncMode {
    /// Buffered (page cache); files are fsynced once at the end.
    None,
    /// O_DIRECT.
    Direct,
    /// O_DSYNC.
    Dsync,
    /// fsync (fdatasync on a device) after every N completed writes of a thread.
    Fsync(u32),
}

impl std::str::FromStr for SyncMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(SyncMode::None),
            "direct" => Ok(SyncMode::Direct),
            "dsync" => Ok(SyncMode::Dsync),
            _ => match s.strip_prefix("fsync:").and_then(|n| n.parse().ok()).filter(|n| *n > 0) {
                Some(n) => Ok(SyncMode::Fsync(n)),
                None => Err(format!("`{s}` is not a sync mode; allowed: none, direct, dsync, fsync:N (N >= 1)")),
            },
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "interface", rename_all = "snake_case")]
pub enum Interface {
    /// A block device (or any file) used from offset 0, O_DIRECT.
    Block { device: PathBuf },
    /// `count` files of `size` bytes in `dir`, named by `files::file_name`.
    File { dir: PathBuf, count: u32, size: u64 },
    /// An NBD export spoken to directly (`nbd::client`), no loop device in between.
    Nbd { target: crate::spec::nbd::NbdTarget },
}

#[derive(Clone, Debug)]
pub struct Workload {
    pub interface: Interface,
    pub pattern: Pattern,
    /// Percentage of operations that are writes (0..=100).
    pub write_pct: u8,
    pub block_size: u64,
    pub engine: IoEngine,
    /// In-flight I/Os per thread (io_uring; psync is always 1).
    pub iodepth: u32,
    pub threads: u32,
    /// Bounds, whichever comes first: bytes (reads + writes), ops, time.
    pub size: Option<u64>,
    pub ops: Option<u64>,
    pub duration: Option<Duration>,
    /// Target IOPS over all threads; None = as fast as possible.
    pub rate_iops: Option<u64>,
    pub sync: SyncMode,
    /// O_DIRECT for file data whatever `sync` says (`direct: true`, filebench's `directio`):
    /// with `dsync` or `fsync:N` on files, and for personalities. `sync: direct` is O_DIRECT
    /// too (`o_direct`).
    pub direct: bool,
    /// File interface: the holes of the files are written (zeros) before the timed run, as
    /// fio lays out its files, so reads reach the device (a hole is read as zeros by the file
    /// system, no I/O).
    pub layout: bool,
    pub on_error: ErrorPolicy,
    /// Time series sampling interval (>= 10 ms).
    pub interval: Duration,
    /// Block interface: bytes of the device used from offset 0 (default: all of it).
    pub span: Option<u64>,
    /// `interface: nbd`: where the workload's offset 0 lies on the export (not a YAML key).
    /// Every request goes `base` bytes further; the content maps, the durability record and
    /// the oracle's reread keep the workload's own offsets. A networked experiment's power cut
    /// gives each client its own slice of the target's disk this way (docs/crash.md).
    pub base: u64,
    /// Duplicate profile of the written content, and the seed of content and patterns.
    pub profile: Profile,
    pub seed: u64,
    /// A filebench personality (file interface): its file set and flowop loop replace
    /// pattern, mix and block size (`workload::personality`).
    pub personality: Option<PersonalitySpec>,
    /// `baseline: windows` (set by `faultline run`, spec::windows): every completed op is
    /// also sorted into its window, `WorkloadResult::windows`.
    pub windows: Option<crate::spec::windows::WindowPlan>,
}

impl Workload {
    /// Defaults like fio's: sequential writes of 4 KiB, psync, one thread, 1 s samples.
    pub fn new(interface: Interface) -> Workload {
        Workload {
            interface,
            pattern: Pattern::Sequential,
            write_pct: 100,
            block_size: 4096,
            engine: IoEngine::Psync,
            iodepth: 1,
            threads: 1,
            size: None,
            ops: None,
            duration: None,
            rate_iops: None,
            sync: SyncMode::Direct,
            direct: false,
            layout: false,
            on_error: ErrorPolicy::Continue,
            interval: Duration::from_secs(1),
            span: None,
            base: 0,
            profile: Profile::none(),
            seed: 1,
            personality: None,
            windows: None,
        }
    }

    /// File data (and devices, always) go O_DIRECT.
    pub fn o_direct(&self) -> bool {
        self.direct || self.sync == SyncMode::Direct
    }

    /// The content stream: write n (over all threads, in issue order) carries
    /// `stream().id_at(n)`. Exactly `Stream::new(&self.profile, self.seed)`.
    pub fn stream(&self) -> Stream {
        Stream::new(&self.profile, self.seed)
    }

    /// Bytes the workload addresses: the device span (reads the device size) or all files.
    pub fn capacity(&self) -> anyhow::Result<u64> {
        match &self.interface {
            Interface::Block { device } => match self.span {
                Some(s) => Ok(s),
                None => crate::sys::file_size(device),
            },
            Interface::File { count, size, .. } => {
                (*count as u64).checked_mul(*size).ok_or_else(|| anyhow::anyhow!("{count} files of {size} bytes: more bytes than a u64 holds"))
            }
            // the export's size is known once connected (spec does no network I/O)
            Interface::Nbd { target } => self.span.ok_or_else(|| anyhow::anyhow!("the size of {target} is known once connected")),
        }
    }

    /// Scale `profile` to the data this run is expected to write (`size`, else the capacity,
    /// times the write share), so a run shorter than the profile still carries its dedup
    /// ratio. `resolve` and the CLI call it once the bounds are known; without a size or a
    /// readable capacity the profile is left as it is.
    pub fn fit_profile(&mut self) {
        let Some(bytes) = self.size.or_else(|| self.capacity().ok()) else { return };
        // in u128: a size near 2^64 times the percentage must not overflow
        let blocks = (bytes as u128 * self.write_pct.max(1) as u128 / 100 / CONTENT_BLOCK as u128).max(1) as u64;
        self.profile = self.profile.scaled(blocks);
    }

    /// Checks the values together before a run; called by `run`.
    pub fn check(&self) -> anyhow::Result<()> {
        use anyhow::bail;
        if self.block_size == 0 || !self.block_size.is_multiple_of(CONTENT_BLOCK) || self.block_size > 256 * CONTENT_BLOCK {
            bail!("block size {} must be a multiple of {CONTENT_BLOCK} up to 1MiB", self.block_size);
        }
        if self.size.is_none() && self.ops.is_none() && self.duration.is_none() {
            bail!("a workload needs a bound: size, ops or duration");
        }
        if self.size == Some(0) || self.ops == Some(0) || self.duration == Some(Duration::ZERO) {
            bail!("a bound of 0 (size, ops or duration) ends the run before its first I/O; allowed: more than 0");
        }
        if self.threads == 0 || self.iodepth == 0 {
            bail!("threads and iodepth must be at least 1");
        }
        if self.iodepth > 4096 {
            bail!("iodepth {} is too deep; at most 4096", self.iodepth);
        }
        if matches!(self.interface, Interface::Nbd { .. }) && (self.engine != IoEngine::Psync || self.iodepth != 1) {
            bail!("interface: nbd runs one request at a time per thread (engine: psync, iodepth: 1); use `threads` for more requests in flight");
        }
        if self.threads > 1024 {
            bail!("{} threads are too many; at most 1024", self.threads);
        }
        // the I/O buffers: per thread one per I/O in flight plus one staged (psync: one, and
        // one filled ahead)
        let fmt = crate::spec::units::format_size;
        let per_thread = (self.iodepth as u64 + 1).checked_mul(self.block_size);
        match per_thread.and_then(|p| p.checked_mul(self.threads as u64)) {
            None => bail!("iodepth {} x block size {} x {} threads overflows", self.iodepth, self.block_size, self.threads),
            Some(total) if crate::sys::mem_total().is_some_and(|m| total > m) => bail!(
                "iodepth {} x block size {} x {} threads needs {} of I/O buffers, more than this machine's memory ({})",
                self.iodepth,
                fmt(self.block_size),
                self.threads,
                fmt(total),
                fmt(crate::sys::mem_total().unwrap_or(0))
            ),
            Some(_) => {}
        }
        if self.interval < Duration::from_millis(10) {
            bail!("interval must be at least 10ms");
        }
        if self.rate_iops == Some(0) {
            bail!("rate_iops must be at least 1");
        }
        if let Some(p) = &self.personality {
            return p.check();
        }
        if let Some(s) = self.span.filter(|s| s / self.block_size < self.threads as u64) {
            bail!("span {s} holds fewer blocks of {} than there are threads ({}); allowed: at least one block per thread", self.block_size, self.threads);
        }
        if let Interface::File { count, size, .. } = &self.interface {
            if *count < self.threads {
                bail!("{count} files for {} threads: each thread needs at least one file", self.threads);
            }
            if *size < self.block_size || size % CONTENT_BLOCK != 0 {
                bail!("file size {size} must be a multiple of {CONTENT_BLOCK} and at least the block size {}", self.block_size);
            }
        }
        Ok(())
    }
}

/// The filebench personalities (filebench's workloads/*.f).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Personality {
    Fileserver,
    Webserver,
    Varmail,
}

impl std::str::FromStr for Personality {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fileserver" => Ok(Personality::Fileserver),
            "webserver" => Ok(Personality::Webserver),
            "varmail" => Ok(Personality::Varmail),
            _ => Err(format!("`{s}` is not a personality; allowed: fileserver, webserver, varmail")),
        }
    }
}

impl Personality {
    pub fn name(self) -> &'static str {
        match self {
            Personality::Fileserver => "fileserver",
            Personality::Webserver => "webserver",
            Personality::Varmail => "varmail",
        }
    }

    /// The parameters of filebench's own workload file (workloads/fileserver.f, webserver.f,
    /// varmail.f in github.com/filebench/filebench), at scale 1.
    pub fn defaults(self) -> PersonalitySpec {
        let (nfiles, meandirwidth, meanfilesize, threads, prealloc_pct) = match self {
            Personality::Fileserver => (10_000, 20, 128 << 10, 50, 80),
            Personality::Webserver => (1_000, 20, 16 << 10, 100, 100),
            Personality::Varmail => (1_000, 1_000_000, 16 << 10, 16, 80),
        };
        PersonalitySpec {
            kind: self,
            scale: 1.0,
            nfiles,
            meandirwidth,
            meanfilesize,
            size_gamma: 1.5,
            iosize: 1 << 20,
            meanappendsize: 16 << 10,
            threads,
            prealloc_pct,
            fsync_dir: false,
            replace: false,
        }
    }
}

/// A personality's file set and I/O sizes (filebench's `$nfiles`, `$meandirwidth`,
/// `$filesize` = gamma(mean, 1.5), `$iosize`, `$meanappendsize`, `$nthreads`, `prealloc`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PersonalitySpec {
    pub kind: Personality,
    /// Fraction of filebench's file count (`nfiles` is already scaled).
    pub scale: f64,
    pub nfiles: u64,
    pub meandirwidth: u64,
    pub meanfilesize: u64,
    /// Shape of the gamma distribution of file sizes (filebench: 1.5).
    pub size_gamma: f64,
    /// Chunk of whole-file reads and writes.
    pub iosize: u64,
    /// filebench's `appendfilerand` size bound: an append is uniform in [0, meanappendsize),
    /// here rounded to the nearest 4 KiB (mean kept: meanappendsize / 2).
    pub meanappendsize: u64,
    /// filebench's `$nthreads` (the workload's `threads` is what runs).
    pub threads: u32,
    /// Percent of the files that exist (written to their size) before the timed phase.
    pub prealloc_pct: u8,
    /// `fsync_dir: true` (varmail): each `fsync` flowop fsyncs the file, then its parent
    /// directory, so created files' and deletes' directory entries can become durable (the
    /// durability oracle's rule; filebench's fsync syncs the file only).
    pub fsync_dir: bool,
    /// `replace: true` (varmail): the rewrite of an existing message (its second
    /// appendfilerand + fsync) is an atomic replace: a temp file beside it written whole,
    /// fsynced, renamed over it, the directory fsynced with `fsync_dir` (faultline's, not
    /// filebench's: the pattern whose durability the power-cut oracle checks for renames).
    pub replace: bool,
}

impl PersonalitySpec {
    /// At `scale` (0 < scale <= 1): `nfiles` scaled, at least one file.
    pub fn scaled(mut self, scale: f64) -> PersonalitySpec {
        self.scale = scale;
        self.nfiles = ((self.nfiles as f64 * scale).round() as u64).max(1);
        self
    }

    pub fn check(&self) -> anyhow::Result<()> {
        if !(self.scale > 0.0 && self.scale <= 1.0) {
            anyhow::bail!("scale {} is out of range; allowed: more than 0, at most 1", self.scale);
        }
        Ok(())
    }
}
