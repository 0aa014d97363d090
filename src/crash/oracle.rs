//! What a crash state must still hold of what the workload wrote: the oracle behind one small
//! interface (`Oracle`: a state's facts and where its data is -> counts), so a finer one can
//! take its place.
//!
//! `EndOracle`, the one built here, knows one durability point: the `synced` mark the
//! explorer adds once the workload returned and the file system (or the device) was synced,
//! after which the disk had acknowledged a flush covering every write. In a state whose base
//! holds that mark every block the content maps list must read back as written (else
//! `durable_lost`); in earlier states a block that does not is `unsynced_lost` (allowed) and
//! one that does is `unsynced_kept`. It does not tell garbage from an older version
//! (`garbage` stays 0) and knows no fsync inside the workload: a state before the end cannot
//! fail it.

use crate::workload::maps::{Maps, Target};
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OracleCounts {
    /// Blocks checked.
    pub checked: u64,
    /// Acknowledged durable, now old, wrong or missing: a failure.
    pub durable_lost: u64,
    /// Content never written there (not classified by `EndOracle`).
    pub garbage: u64,
    /// Not yet durable and not there (allowed).
    pub unsynced_lost: u64,
    /// Not yet durable and there.
    pub unsynced_kept: u64,
    /// Durable and there.
    pub durable_ok: u64,
}

/// What the oracle knows of a state.
pub struct StateFacts {
    /// The state holds every entry through the log's durability point (the `synced` mark).
    pub past_sync: bool,
}

pub trait Oracle: Send + Sync {
    /// Check the state whose files are mounted at `root` (or whose device is `root`).
    fn check(&self, facts: &StateFacts, root: &Path) -> Result<OracleCounts>;
}

pub struct EndOracle {
    /// The workload's maps; their target is pointed at each state's mount or device in turn.
    pub maps: std::sync::Mutex<Maps>,
}

impl Oracle for EndOracle {
    fn check(&self, facts: &StateFacts, root: &Path) -> Result<OracleCounts> {
        let mut maps = self.maps.lock().unwrap();
        let target = match &maps.target {
            Target::Block { .. } => Target::Block { device: root.to_owned() },
            Target::File { names, .. } => Target::File { dir: root.to_owned(), names: names.clone() },
            Target::Nbd { .. } => anyhow::bail!("an NBD workload's writes cannot be checked on a crash state"),
        };
        maps.target = target;
        let r = crate::verify::verify(&maps)?;
        let bad = r.counts.checked - r.counts.ok;
        let mut c = OracleCounts { checked: r.counts.checked, ..Default::default() };
        if facts.past_sync {
            c.durable_ok = r.counts.ok;
            c.durable_lost = bad;
        } else {
            c.unsynced_kept = r.counts.ok;
            c.unsynced_lost = bad;
        }
        Ok(c)
    }
}
