//! A served disk: store + engine + FUSE/loop front end and/or NBD server + control socket +
//! ledger, started as one unit and torn down as one (explicitly, on drop, or by `faultline
//! cleanup` after a crash).

use crate::disk::{Disk, DiskConfig};
use crate::fault::Rule;
use crate::frontend::nbd::{NbdAddr, NbdServer};
use crate::frontend::{self, Exposed};
use crate::sys::ledger::LedgerFile;
use anyhow::Result;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub struct ServedDisk {
    pub disk: Arc<Disk>,
    exposed: Option<Exposed>,
    nbd: Option<NbdServer>,
    ledger: Option<LedgerFile>,
    pub socket: Option<PathBuf>,
}

/// How the disk is exposed: the loop device (FUSE + /dev/loopN), an NBD server, or both.
#[derive(Clone, Debug)]
pub struct Exposure {
    pub loop_device: bool,
    pub nbd: Option<NbdAddr>,
}

impl Default for Exposure {
    fn default() -> Exposure {
        Exposure { loop_device: true, nbd: None }
    }
}

impl ServedDisk {
    /// `rules` are armed before the device appears, so no request escapes them.
    pub fn start(cfg: &DiskConfig, front: &frontend::Options, rules: impl FnOnce(&Disk) -> Result<Vec<Rule>>, socket: Option<&Path>) -> Result<ServedDisk> {
        Self::start_as(cfg, front, &Exposure::default(), rules, socket)
    }

    /// `start`, exposed as `how` says (the NBD server starts after the loop device).
    pub fn start_as(
        cfg: &DiskConfig,
        front: &frontend::Options,
        how: &Exposure,
        rules: impl FnOnce(&Disk) -> Result<Vec<Rule>>,
        socket: Option<&Path>,
    ) -> Result<ServedDisk> {
        if how.loop_device {
            frontend::preflight()?;
        } else if how.nbd.is_none() {
            anyhow::bail!("without the loop device the disk needs --nbd ADDRESS, or it is exposed nowhere");
        }
        if let Some(s) = socket {
            crate::sys::check_new_socket(s)?;
        }
        let disk = Arc::new(Disk::open(cfg)?);
        disk.arm(rules(&disk)?)?;
        let mut ledger = LedgerFile::create()?;
        let mut me = ServedDisk { disk: disk.clone(), exposed: None, nbd: None, ledger: None, socket: None };
        if how.loop_device {
            match Exposed::new(disk.clone(), front, &mut ledger) {
                Ok(e) => {
                    // a power cut drops the device's page cache (docs/crash.md)
                    disk.set_loop_device(&e.device);
                    me.exposed = Some(e)
                }
                Err(e) => {
                    // undo whatever part was built (e.g. the mount point of a failed mount)
                    crate::sys::ledger::release(&ledger.data, &mut Vec::new());
                    ledger.remove();
                    return Err(e);
                }
            }
        }
        me.ledger = Some(ledger);
        if let Some(a) = &how.nbd {
            me.nbd = Some(NbdServer::start(disk.clone(), a)?);
        }
        if let Some(s) = socket {
            // `check_new_socket` let a missing directory through only where it is a run directory
            if let Some(parent) = s.parent() {
                std::fs::create_dir_all(parent)?;
            }
            me.ledger.as_mut().unwrap().update(|l| l.socket = Some(s.to_owned()))?;
            let e = me.exposed.as_ref();
            let info = frontend::control::ServerInfo {
                device: e.map(|e| e.device.clone()),
                transport: e.map(|e| e.transport.clone()),
                cpu_latency_unavailable: e.and_then(|e| e.cpu_latency_unavailable.clone()),
                nbd: me.nbd.as_ref().map(|n| n.uri()),
                block_size: disk.block_size(),
                size: disk.size(),
            };
            frontend::control::start(s, disk, me.nbd.as_ref().map(|n| n.counters()), info)?;
            me.socket = Some(s.to_owned());
        }
        Ok(me)
    }

    /// The loop device (`/dev/loopN`); empty when the disk is served over NBD only.
    pub fn device(&self) -> &Path {
        self.exposed.as_ref().map_or(Path::new(""), |e| &e.device)
    }

    /// The NBD export's URI (libnbd form), when served over NBD.
    pub fn nbd_uri(&self) -> Option<String> {
        self.nbd.as_ref().map(|n| n.uri())
    }

    /// How requests reach the daemon ("io_uring", or "/dev/fuse" and why; "nbd only").
    pub fn transport(&self) -> &str {
        self.exposed.as_ref().map_or("NBD only", |e| &e.transport)
    }

    /// Why `cpu_latency: auto` could not ask, if it could not.
    pub fn cpu_latency_unavailable(&self) -> Option<&str> {
        self.exposed.as_ref().and_then(|e| e.cpu_latency_unavailable.as_deref())
    }

    pub fn teardown(mut self) -> Result<()> {
        self.release()
    }

    fn release(&mut self) -> Result<()> {
        // NBD clients first: their connections end, the disk stays until the loop device goes
        drop(self.nbd.take());
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
