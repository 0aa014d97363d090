//! A served disk: store + engine + FUSE/loop front end + control socket + ledger, started as
//! one unit and torn down as one (explicitly, on drop, or by `faultline cleanup` after a crash).

use crate::disk::{Disk, DiskConfig};
use crate::fault::Rule;
use crate::frontend::{self, Exposed};
use crate::sys::ledger::LedgerFile;
use anyhow::Result;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub struct ServedDisk {
    pub disk: Arc<Disk>,
    exposed: Option<Exposed>,
    ledger: Option<LedgerFile>,
    pub socket: Option<PathBuf>,
}

impl ServedDisk {
    /// `rules` are armed before the device appears, so no request escapes them.
    pub fn start(cfg: &DiskConfig, front: &frontend::Options, rules: impl FnOnce(&Disk) -> Result<Vec<Rule>>, socket: Option<&Path>) -> Result<ServedDisk> {
        frontend::preflight()?;
        let disk = Arc::new(Disk::open(cfg)?);
        disk.arm(rules(&disk)?)?;
        let mut ledger = LedgerFile::create()?;
        let mut me = ServedDisk { disk: disk.clone(), exposed: None, ledger: None, socket: None };
        match Exposed::new(disk.clone(), front, &mut ledger) {
            Ok(e) => me.exposed = Some(e),
            Err(e) => {
                // undo whatever part was built (e.g. the mount point of a failed mount)
                crate::sys::ledger::release(&ledger.data, &mut Vec::new());
                ledger.remove();
                return Err(e);
            }
        }
        me.ledger = Some(ledger);
        if let Some(s) = socket {
            if let Some(parent) = s.parent() {
                std::fs::create_dir_all(parent)?;
            }
            me.ledger.as_mut().unwrap().update(|l| l.socket = Some(s.to_owned()))?;
            let e = me.exposed.as_ref().expect("exposed");
            let info = serde_json::json!({
                "device": e.device,
                "transport": e.transport,
                "cpu_latency_unavailable": e.cpu_latency_unavailable,
                "block_size": disk.block_size(),
                "size": disk.size(),
            });
            frontend::control::start(s, disk, info)?;
            me.socket = Some(s.to_owned());
        }
        Ok(me)
    }

    pub fn device(&self) -> &Path {
        &self.exposed.as_ref().expect("exposed").device
    }

    /// How requests reach the daemon ("io_uring", or "/dev/fuse" and why).
    pub fn transport(&self) -> &str {
        &self.exposed.as_ref().expect("exposed").transport
    }

    /// Why `cpu_latency: auto` could not ask, if it could not.
    pub fn cpu_latency_unavailable(&self) -> Option<&str> {
        self.exposed.as_ref().expect("exposed").cpu_latency_unavailable.as_deref()
    }

    pub fn teardown(mut self) -> Result<()> {
        self.release()
    }

    fn release(&mut self) -> Result<()> {
        // a file system of this process still mounted on the device goes first: the loop
        // device cannot be detached under it
        if let Some(e) = &self.exposed
            && !e.device.as_os_str().is_empty()
        {
            for note in crate::stack::fs::release_on_device(&e.device) {
                eprintln!("faultline: {note}");
            }
        }
        let r = match self.exposed.take() {
            Some(e) => e.teardown(),
            None => Ok(()),
        };
        if let Some(s) = self.socket.take() {
            let _ = std::fs::remove_file(s);
        }
        if let Some(l) = self.ledger.take()
            && r.is_ok()
        {
            l.remove();
        }
        // else: keep the ledger so `faultline cleanup` can finish the job
        r
    }
}

impl Drop for ServedDisk {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            eprintln!("faultline: teardown: {e:#}");
        }
    }
}
