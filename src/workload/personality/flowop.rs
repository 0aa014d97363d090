//! The personalities' flowop sequences (filebench's workloads/*.f) and their types.

use crate::spec::workload::config::{CONTENT_BLOCK, Personality};
use rand::Rng;
use rand::rngs::SmallRng;

/// filebench's flowop types used by the three personalities.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    CreateFile,
    WriteWholeFile,
    AppendFileRand,
    OpenFile,
    ReadWholeFile,
    CloseFile,
    DeleteFile,
    StatFile,
    Fsync,
    /// faultline's (not filebench's): `replace: true`'s atomic replace of the file open on the
    /// descriptor (a temp file written whole, fsynced, renamed over it); its latency is the
    /// rename's, the temp's create, writes and fsyncs count as theirs.
    RenameFile,
}

impl Kind {
    pub const ALL: [Kind; 10] = [
        Kind::CreateFile,
        Kind::WriteWholeFile,
        Kind::AppendFileRand,
        Kind::OpenFile,
        Kind::ReadWholeFile,
        Kind::CloseFile,
        Kind::DeleteFile,
        Kind::StatFile,
        Kind::Fsync,
        Kind::RenameFile,
    ];

    /// filebench's flowop name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::CreateFile => "createfile",
            Kind::WriteWholeFile => "writewholefile",
            Kind::AppendFileRand => "appendfilerand",
            Kind::OpenFile => "openfile",
            Kind::ReadWholeFile => "readwholefile",
            Kind::CloseFile => "closefile",
            Kind::DeleteFile => "deletefile",
            Kind::StatFile => "statfile",
            Kind::Fsync => "fsync",
            Kind::RenameFile => "renamefile",
        }
    }

    /// The flowops the study's R:W ratio counts: reads ...
    pub fn is_read(self) -> bool {
        self == Kind::ReadWholeFile
    }

    /// ... and writes.
    pub fn is_write(self) -> bool {
        matches!(self, Kind::WriteWholeFile | Kind::AppendFileRand)
    }
}

/// One step of a thread's loop: the flowop, its file set (index in `Layout::sets`) and its
/// descriptor slot (filebench's `fd=`; 0: none, the flowop picks a file itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flowop {
    pub kind: Kind,
    pub set: usize,
    pub fd: usize,
}

/// The flowop sequence of each thread, as in filebench's workloads/*.f; `replace` (varmail):
/// the rewrite of the message just read (its second appendfilerand + fsync) is a `renamefile`
/// (an atomic replace, `Worker::replace`).
pub fn flowops(p: Personality, replace: bool) -> Vec<Flowop> {
    use Kind::*;
    let f = |kind, fd| Flowop { kind, set: 0, fd };
    match p {
        Personality::Fileserver => vec![
            f(CreateFile, 1),
            f(WriteWholeFile, 1),
            f(CloseFile, 1),
            f(OpenFile, 1),
            f(AppendFileRand, 1),
            f(CloseFile, 1),
            f(OpenFile, 1),
            f(ReadWholeFile, 1),
            f(CloseFile, 1),
            f(DeleteFile, 0),
            f(StatFile, 0),
        ],
        Personality::Webserver => {
            let mut v = Vec::new();
            for _ in 0..10 {
                v.extend([f(OpenFile, 1), f(ReadWholeFile, 1), f(CloseFile, 1)]);
            }
            // appendlog: fd 2 on the one-file `logfiles` set, opened on first use, never closed
            v.push(Flowop { kind: AppendFileRand, set: 1, fd: 2 });
            v
        }
        Personality::Varmail => {
            let mut v = vec![f(DeleteFile, 0), f(CreateFile, 1), f(AppendFileRand, 1), f(Fsync, 1), f(CloseFile, 1), f(OpenFile, 1), f(ReadWholeFile, 1)];
            if replace {
                v.push(f(RenameFile, 1));
            } else {
                v.extend([f(AppendFileRand, 1), f(Fsync, 1)]);
            }
            v.extend([f(CloseFile, 1), f(OpenFile, 1), f(ReadWholeFile, 1), f(CloseFile, 1)]);
            v
        }
    }
}

/// The flowop types a sequence's results report: its own, and those a `renamefile` also
/// performs (the temp's create, whole-file write and fsync).
pub fn reported(seq: &[Flowop]) -> Vec<Kind> {
    let mut k: Vec<Kind> = seq.iter().map(|f| f.kind).collect();
    if k.contains(&Kind::RenameFile) {
        k.extend([Kind::CreateFile, Kind::WriteWholeFile, Kind::Fsync]);
    }
    k.sort_unstable();
    k.dedup();
    k
}

/// An append's size: filebench's `appendfilerand` draws uniformly in [0, iosize); here
/// rounded to the nearest 4 KiB, which keeps the mean (iosize / 2) and whole-block writes.
pub fn append_size(rng: &mut SmallRng, max: u64) -> u64 {
    let u = rng.random_range(0..max.max(1));
    ((u as f64 / CONTENT_BLOCK as f64).round() as u64) * CONTENT_BLOCK
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// The R:W mix of one loop of each personality, as the study states it.
    #[test]
    fn flowop_sequences_give_the_filebench_mix() {
        let mix = |p| {
            let s = flowops(p, false);
            (s.iter().filter(|f| f.kind.is_read()).count(), s.iter().filter(|f| f.kind.is_write()).count())
        };
        assert_eq!(mix(Personality::Fileserver), (1, 2));
        assert_eq!(mix(Personality::Webserver), (10, 1));
        assert_eq!(mix(Personality::Varmail), (2, 2));
        // varmail is fsync-heavy: one fsync per append
        let v = flowops(Personality::Varmail, false);
        assert_eq!(v.iter().filter(|f| f.kind == Kind::Fsync).count(), 2);
        // over N loops the counts scale (no flowop is conditional on the iteration)
        let n = 1000;
        let f = flowops(Personality::Fileserver, false);
        let ops: Vec<Kind> = (0..n).flat_map(|_| f.iter().map(|x| x.kind)).collect();
        assert_eq!(ops.iter().filter(|k| **k == Kind::CreateFile).count(), n);
        assert_eq!(ops.iter().filter(|k| **k == Kind::DeleteFile).count(), n);
        assert_eq!(ops.len(), 11 * n);
        // varmail's replace: the rewrite's append + fsync become one renamefile, which also
        // writes (the whole temp) and fsyncs: the reported mix stays 1:1
        let r = flowops(Personality::Varmail, true);
        assert_eq!(r.len(), v.len() - 1);
        assert_eq!(r.iter().filter(|f| f.kind == Kind::RenameFile).count(), 1);
        let k = reported(&r);
        assert!(k.contains(&Kind::WriteWholeFile) && k.contains(&Kind::Fsync) && k.contains(&Kind::RenameFile), "{k:?}");
        assert!(!reported(&v).contains(&Kind::RenameFile));
    }

    #[test]
    fn append_sizes_keep_filebench_mean() {
        let mut rng = SmallRng::seed_from_u64(1);
        let n = 200_000;
        let xs: Vec<u64> = (0..n).map(|_| append_size(&mut rng, 16 << 10)).collect();
        assert!(xs.iter().all(|x| x % CONTENT_BLOCK == 0 && *x <= 16 << 10));
        let mean = xs.iter().sum::<u64>() as f64 / n as f64;
        // filebench: uniform in [0, 16 KiB): mean 8 KiB
        assert!((mean / 8192.0 - 1.0).abs() < 0.01, "{mean}");
    }
}
