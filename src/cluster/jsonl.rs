//! The lines of `faultline workload --jsonl`: one JSON object a line on stdout, what the
//! agents' controller (run::agents) reads from every client. One type for the emitter and the
//! reader, so a field renamed on one side is a compile error, not a silent zero on the other.

use crate::workload::WorkloadResult;
use serde::{Deserialize, Serialize};

/// One line. Untagged: each kind is told by its keys (`start_ns`, `t_s`, `result`, `oracle`),
/// the form the emitter has always printed, so controller and agent of different builds still
/// agree.
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged, expecting = "a workload line: {\"start_ns\"}, {\"t_s\", \"ops\", \"bytes\", \"errors\"}, {\"result\"} or {\"oracle\"}")]
pub enum JsonLine {
    /// The first I/O was issued at `start_ns` (CLOCK_REALTIME of the emitting host, ns since
    /// the epoch); printed once, before any interval.
    Start { start_ns: u64 },
    /// One interval's deltas.
    Interval(Interval),
    /// The last line: the whole result (what `faultline workload` writes to result.json).
    Result { result: Box<WorkloadResult> },
    /// `--crash-oracle`: after the result, once told to reread (SIGUSR2), what the durability
    /// oracle found on the export (the `crash.oracle` of results.json).
    Oracle { oracle: Box<crate::verify::crash::OracleReport> },
}

/// What a workload did over one interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    /// End of the interval, seconds from the first I/O.
    pub t_s: f64,
    pub ops: u64,
    pub bytes: u64,
    pub errors: u64,
}

impl JsonLine {
    /// The line as printed (no newline).
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).expect("a workload line serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_read_back_as_printed() {
        let start: JsonLine = serde_json::from_str(&JsonLine::Start { start_ns: 7 }.to_line()).unwrap();
        assert!(matches!(start, JsonLine::Start { start_ns: 7 }));
        let iv = Interval { t_s: 0.5, ops: 3, bytes: 12288, errors: 1 };
        let back: JsonLine = serde_json::from_str(&JsonLine::Interval(iv).to_line()).unwrap();
        assert!(matches!(back, JsonLine::Interval(i) if i == iv));
        let res = WorkloadResult {
            seconds: 1.5,
            read: Default::default(),
            write: crate::workload::LatencySummary { ops: 4, bytes: 16384, ..Default::default() },
            errors: [("write:EIO".to_string(), 1)].into(),
            failed_ios: vec![crate::workload::runner::IoError { op: "write".into(), file: None, offset: 4096, len: 4096, errno: libc::EIO }],
            retries: 2,
            retry_seconds: 0.0,
            nbd_client: Some(Default::default()),
            nbd_client_intervals: vec![],
            stopped_on_error: false,
            cpu_seconds: 0.1,
            timeseries: vec![crate::workload::Sample { t: 1.0, cpu_pct: 3.0, ..Default::default() }],
            flowops: Default::default(),
            flowops_skipped: 0,
            maps: None,
            windows: vec![],
        };
        let text = JsonLine::Result { result: Box::new(res) }.to_line();
        // the form agents of earlier builds print and read: the result under `result`
        assert!(text.starts_with("{\"result\":{\"seconds\":1.5,"), "{text}");
        let JsonLine::Result { result } = serde_json::from_str(&text).unwrap() else { panic!("not a result: {text}") };
        assert_eq!((result.write.ops, result.retries, result.failed_ios.len(), result.failed_ios[0].op.as_ref()), (4, 2, 1, "write"));
        assert_eq!((result.errors["write:EIO"], result.timeseries[0].cpu_pct, result.nbd_client), (1, 3.0, Some(Default::default())));
        let mut oracle = crate::verify::crash::OracleReport::default();
        (oracle.counts.checked, oracle.counts.durable_kept, oracle.counts.unsynced_lost) = (9, 7, 2);
        let text = JsonLine::Oracle { oracle: Box::new(oracle.clone()) }.to_line();
        assert!(text.starts_with("{\"oracle\":{"), "{text}");
        let JsonLine::Oracle { oracle: back } = serde_json::from_str(&text).unwrap() else { panic!("not an oracle line: {text}") };
        assert_eq!(*back, oracle);
    }

    #[test]
    fn a_line_of_no_known_form_says_what_is_allowed() {
        let e = serde_json::from_str::<JsonLine>("{\"ops\": 1}").unwrap_err().to_string();
        assert!(e.contains("a workload line"), "{e}");
    }
}
