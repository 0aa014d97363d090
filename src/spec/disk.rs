//! What a faultline disk is and how it is served: the settings that `faultline serve` takes as
//! flags and experiment files as `disk:`, defined once with their defaults. The disk layer
//! (`disk::Disk::open`) consumes `DiskConfig`, the front end (`frontend::Exposed`) consumes
//! `FrontendOptions`.

use std::path::PathBuf;
use std::time::Duration;

/// Which store backs the disk (`--store`, `disk: {store: ...}`).
#[derive(Clone, Debug, PartialEq)]
pub enum StoreSpec {
    Ram,
    File(PathBuf),
    Device(PathBuf),
    /// A remote NBD export (`nbd://...`, `nbd+unix://...`), through `nbd::client`.
    Nbd(super::nbd::NbdTarget),
}

impl std::str::FromStr for StoreSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.starts_with("nbd://") || s.starts_with("nbd+unix://") {
            return s.parse().map(StoreSpec::Nbd);
        }
        match s.split_once(':') {
            None if s == "ram" => Ok(StoreSpec::Ram),
            Some(("file", p)) if !p.is_empty() => Ok(StoreSpec::File(p.into())),
            Some(("device", p)) if !p.is_empty() => Ok(StoreSpec::Device(p.into())),
            _ => Err(format!("`{s}` is not a store; allowed: ram, file:PATH, device:PATH, nbd://HOST[:PORT]/EXPORT, nbd+unix:///EXPORT?socket=PATH")),
        }
    }
}

/// In documents as on the command line: `ram`, `file:PATH`, ...
impl serde::Serialize for StoreSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for StoreSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <String as serde::Deserialize>::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

impl std::fmt::Display for StoreSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            StoreSpec::Ram => f.write_str("ram"),
            StoreSpec::File(p) => write!(f, "file:{}", p.display()),
            StoreSpec::Device(p) => write!(f, "device:{}", p.display()),
            StoreSpec::Nbd(t) => write!(f, "{t}"),
        }
    }
}

/// The disk itself: size, block size, store.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskConfig {
    /// Needed for a RAM store and a new store file; a device or an existing file has its own.
    pub size: Option<u64>,
    pub block_size: u32,
    pub store: StoreSpec,
    /// A device store may be overwritten.
    pub destructive: bool,
    /// Serve a device even though it carries a partition table or file-system signature.
    pub force: bool,
    /// A service time per request (`spec::latency`, docs/latency.md); none: as fast as it goes.
    pub latency: Option<super::latency::LatencyModel>,
    /// Touch every page of a RAM store before the device appears; `None`: only where a latency
    /// model is set (`DiskConfig::populates`).
    pub populate: Option<bool>,
    /// A volatile write cache (docs/crash.md); `none`: every acknowledged write is durable.
    #[serde(default)]
    pub write_cache: CacheMode,
    /// The most unflushed bytes the cache holds before it writes everything back on its own.
    #[serde(default = "default_write_cache_size")]
    pub write_cache_size: u64,
}

/// The volatile cache's default bound on unflushed bytes.
pub const DEFAULT_WRITE_CACHE_SIZE: u64 = 256 << 20;

/// The volatile cache's bound must hold one block's undo copy (below it every write is written
/// back at once: the cache would keep nothing).
pub fn check_write_cache_size(n: u64) -> Result<u64, String> {
    if n < 4096 {
        return Err(format!("write_cache_size {n} is too small; allowed: 4KiB or more (default 256MiB)"));
    }
    Ok(n)
}

fn default_write_cache_size() -> u64 {
    DEFAULT_WRITE_CACHE_SIZE
}

/// Experiments' disk size when the file gives none.
pub const DEFAULT_EXPERIMENT_SIZE: u64 = 1 << 30;

impl Default for DiskConfig {
    fn default() -> DiskConfig {
        DiskConfig {
            size: None,
            block_size: 4096,
            store: StoreSpec::Ram,
            destructive: false,
            force: false,
            latency: None,
            populate: None,
            write_cache: Default::default(),
            write_cache_size: DEFAULT_WRITE_CACHE_SIZE,
        }
    }
}

impl DiskConfig {
    /// Whether a RAM store is populated before the device appears: as asked, else where a
    /// latency model is set (a simulated device must not change speed as it fills).
    pub fn populates(&self) -> bool {
        self.populate.unwrap_or(self.latency.is_some())
    }
}

/// A disk's block size: a power of two from 512 B to 64 KiB.
pub fn check_block_size(bs: u64) -> Result<u32, String> {
    if !(512..=65536).contains(&bs) || !bs.is_power_of_two() {
        return Err(format!("block size {bs} is not allowed; allowed: a power of two from 512B to 64KiB"));
    }
    Ok(bs as u32)
}

/// How the disk is served (not what it does: that is the disk's and the rules' business).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FrontendOptions {
    /// After a request, poll for the next one this long before sleeping (`frontend::poll`;
    /// while requests overlap, per-CPU ring threads poll `OWNER_POLL` instead); zero never
    /// polls.
    pub busy_poll: Duration,
    /// FUSE over io_uring (`frontend::uring`), classic /dev/fuse reads, or the first that works.
    pub ring: RingMode,
    /// The loop device's completion CPU (`frontend::steer`).
    pub rq_affinity: RqAffinity,
    /// Idle CPUs poll instead of halting while the disk is busy (`frontend::cpu_latency`).
    pub cpu_latency: CpuLatency,
    /// Threads serving the FUSE ring (`frontend::uring`): 0 = one ring per CPU queue, its
    /// thread pinned to that CPU (as libfuse does), all rings driven by one busy-polling
    /// thread while requests come one at a time; n = n threads sharing the queues.
    pub ring_threads: usize,
}

/// At queue depth 1 the gap between a reply and the next request is a few tens of µs on a
/// small VM: 50 µs catches nearly every next request and gives up soon on an idle disk.
pub const DEFAULT_BUSY_POLL: Duration = Duration::from_micros(50);

/// One ring per CPU queue: each queue served on its CPU under a deep queue, and one thread
/// busy-polling all of them at queue depth 1 (BENCHMARKS.md, "One ring per CPU queue": a fifth
/// more IOPS than one thread at QD32 for a third less CPU, level at QD1).
pub const DEFAULT_RING_THREADS: usize = 0;

impl Default for FrontendOptions {
    fn default() -> FrontendOptions {
        FrontendOptions {
            busy_poll: DEFAULT_BUSY_POLL,
            ring: RingMode::Auto,
            rq_affinity: RqAffinity::Auto,
            cpu_latency: CpuLatency::Auto,
            ring_threads: DEFAULT_RING_THREADS,
        }
    }
}

/// One served disk: the disk and its front end. Also the document a run hands each disk
/// server it starts (`serve --spec-json`), in the form serde gives it.
#[derive(Clone, Debug, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskSpec {
    pub disk: DiskConfig,
    pub front: FrontendOptions,
}

impl DiskSpec {
    /// The disk's size (0 where the store decides it: a device or an existing file).
    pub fn size(&self) -> u64 {
        self.disk.size.unwrap_or(0)
    }
}

/// Settings written as one keyword. Parsed and printed through clap's `ValueEnum`, so the
/// command line, experiment files and the arguments `run` passes to its disk servers share one
/// spelling; YAML's bare `on`/`off` (booleans) and `2` (a number) are read as those words.
pub trait Keyword: clap::ValueEnum + Copy + PartialEq + 'static {
    /// What the setting is, for error messages.
    const WHAT: &'static str;

    fn word(self) -> &'static str {
        let i = Self::value_variants().iter().position(|v| *v == self).expect("a variant of its own type");
        Self::NAMES[i]
    }

    /// The variants' names, in declaration order (checked against the derive by a test).
    const NAMES: &'static [&'static str];

    fn parse(s: &str) -> Result<Self, String> {
        <Self as clap::ValueEnum>::from_str(s, false).map_err(|_| format!("'{s}' is not a {} setting; allowed: {}", Self::WHAT, Self::NAMES.join(", ")))
    }
}

/// Deserializes a `Keyword` from a string, a bool or a number.
pub(crate) fn de_keyword<'de, T: Keyword, D: serde::Deserializer<'de>>(d: D) -> Result<T, D::Error> {
    use serde::Deserialize;
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        B(bool),
        N(u64),
        S(String),
    }
    // any other shape (a list, a map) gets the setting's own words, not serde's, which name the
    // private enum `Raw`
    let raw = Raw::deserialize(d).map_err(|_| serde::de::Error::custom(format!("not a {} setting; allowed: {}", T::WHAT, T::NAMES.join(", "))))?;
    let s = match raw {
        Raw::B(b) => b.to_string(),
        Raw::N(n) => n.to_string(),
        Raw::S(s) => s,
    };
    T::parse(&s).map_err(serde::de::Error::custom)
}

macro_rules! keyword {
    ($t:ty, $what:literal, [$($name:literal),+]) => {
        impl $crate::spec::disk::Keyword for $t {
            const WHAT: &'static str = $what;
            const NAMES: &'static [&'static str] = &[$($name),+];
        }
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str($crate::spec::disk::Keyword::word(*self))
            }
        }
        impl std::str::FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                <$t as $crate::spec::disk::Keyword>::parse(s)
            }
        }
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str($crate::spec::disk::Keyword::word(*self))
            }
        }
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                $crate::spec::disk::de_keyword(d)
            }
        }
    };
}

/// Whether the disk has a volatile write cache (`write_cache`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum CacheMode {
    /// every acknowledged write is durable (no cache; today's behaviour, costs nothing)
    #[default]
    None,
    /// writes are durable once a flush (or FUA) after them completes; a power cut loses
    /// what the survival model says
    Volatile,
}
keyword!(CacheMode, "write_cache", ["none", "volatile"]);

/// What survives of the unflushed writes when the power is cut (docs/crash.md, each with the
/// tool whose behaviour it matches).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SurvivalModel {
    /// none of them (LazyFS `clear-cache`, Jepsen's `lose-unfsynced-writes!`)
    LoseAll,
    /// a prefix in completion order (dm-log-writes + replay-log to an entry)
    KeepPrefix,
    /// any subset (CrashMonkey's random subsets of the last epoch)
    RandomSubset,
    /// each write keeps some of its 512 B sectors (CrashMonkey per sector, LazyFS torn-op)
    Torn,
    /// a later write survives an earlier one that is lost (a cache writing back out of order)
    Reorder,
}
keyword!(SurvivalModel, "survival model", ["lose-all", "keep-prefix", "random-subset", "torn", "reorder"]);

/// Whether the disk is served over FUSE over io_uring (`serve --ring`, `disk: {ring: ...}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RingMode {
    /// over io_uring where the kernel has it, else classic /dev/fuse reads (said at start-up)
    Auto,
    /// over io_uring or not at all
    #[value(alias = "yes", alias = "true")]
    On,
    /// classic /dev/fuse reads
    #[value(alias = "no", alias = "false")]
    Off,
}
keyword!(RingMode, "FUSE transport", ["auto", "on", "off"]);

/// What faultline does with the loop device's `rq_affinity` (`serve --rq-affinity`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RqAffinity {
    /// 2 while requests come one at a time, the device's own value otherwise (over io_uring;
    /// on the classic path, like `Keep`)
    Auto,
    /// never touch it
    Keep,
    /// 0 for the disk's lifetime
    #[value(name = "0")]
    Zero,
    /// 1 for the disk's lifetime
    #[value(name = "1")]
    One,
    /// 2 for the disk's lifetime
    #[value(name = "2")]
    Two,
}
keyword!(RqAffinity, "rq_affinity", ["auto", "keep", "0", "1", "2"]);

impl RqAffinity {
    /// The value this setting writes for the disk's lifetime, if it is a fixed one.
    pub fn fixed(self) -> Option<u8> {
        match self {
            RqAffinity::Zero => Some(0),
            RqAffinity::One => Some(1),
            RqAffinity::Two => Some(2),
            RqAffinity::Auto | RqAffinity::Keep => None,
        }
    }
}

/// What faultline does with the CPUs' wake-up latency (`serve --cpu-latency`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CpuLatency {
    /// 0 µs while the disk has requests
    Auto,
    /// never ask
    Keep,
    /// 0 µs for the disk's whole life
    Hold,
}
keyword!(CpuLatency, "cpu_latency", ["auto", "keep", "hold"]);

#[cfg(test)]
mod tests {
    use super::*;

    fn names<T: Keyword>() -> Vec<String> {
        T::value_variants().iter().map(|v| v.to_possible_value().unwrap().get_name().to_string()).collect()
    }

    #[test]
    fn keyword_names_match_the_derive() {
        assert_eq!(names::<RingMode>(), RingMode::NAMES);
        assert_eq!(names::<RqAffinity>(), RqAffinity::NAMES);
        assert_eq!(names::<CpuLatency>(), CpuLatency::NAMES);
    }

    #[test]
    fn keywords_parse_print_and_refuse() {
        for (s, want) in
            [("auto", RingMode::Auto), ("on", RingMode::On), ("yes", RingMode::On), ("true", RingMode::On), ("off", RingMode::Off), ("false", RingMode::Off)]
        {
            assert_eq!(RingMode::parse(s), Ok(want), "{s}");
        }
        assert_eq!(RingMode::On.to_string(), "on");
        assert_eq!(RqAffinity::parse("2"), Ok(RqAffinity::Two));
        assert_eq!(RqAffinity::Two.to_string(), "2");
        assert_eq!(RqAffinity::Two.fixed(), Some(2));
        assert_eq!(RqAffinity::Keep.fixed(), None);
        assert_eq!(CpuLatency::parse("hold"), Ok(CpuLatency::Hold));
        assert_eq!(CpuLatency::Keep.to_string(), "keep");
        for bad in ["", "Auto", "3", "maybe"] {
            assert!(RqAffinity::parse(bad).unwrap_err().contains("allowed: auto, keep, 0, 1, 2"), "{bad}");
            assert!(CpuLatency::parse(bad).unwrap_err().contains("allowed: auto, keep, hold"), "{bad}");
        }
        assert!(RingMode::parse("maybe").unwrap_err().contains("allowed: auto, on, off"));
    }

    #[test]
    fn keywords_from_yaml_words_bools_and_numbers() {
        #[derive(serde::Deserialize)]
        struct D {
            ring: RingMode,
            rq_affinity: RqAffinity,
            cpu_latency: CpuLatency,
        }
        let d: D = serde_saphyr::from_str("ring: off\nrq_affinity: 2\ncpu_latency: hold\n").unwrap();
        assert_eq!((d.ring, d.rq_affinity, d.cpu_latency), (RingMode::Off, RqAffinity::Two, CpuLatency::Hold));
        let d: D = serde_saphyr::from_str("ring: true\nrq_affinity: keep\ncpu_latency: auto\n").unwrap();
        assert_eq!(d.ring, RingMode::On);
        assert!(serde_saphyr::from_str::<D>("ring: on\nrq_affinity: 3\ncpu_latency: auto\n").is_err());
    }

    #[test]
    fn block_sizes() {
        assert_eq!(check_block_size(512), Ok(512));
        assert_eq!(check_block_size(65536), Ok(65536));
        for bad in [0, 256, 4095, 131072, u64::MAX] {
            assert!(check_block_size(bad).is_err(), "{bad}");
        }
    }
}
