//! The FUSE control file system (/sys/fs/fuse/connections): writing to a connection's
//! `abort` file fails every request it has pending and every later one. It frees processes
//! stuck in uninterruptible sleep on a FUSE-backed device whose server died with them.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};

const DIR: &str = "/sys/fs/fuse/connections";

/// The connection directory, mounting fusectl there first when it is not mounted.
fn connections() -> Result<PathBuf> {
    let dir = Path::new(DIR);
    if !super::mount::mounts().iter().any(|m| m.fs_type == "fusectl") {
        if !dir.exists() {
            bail!("{DIR} does not exist: the fuse module is not loaded");
        }
        nix::mount::mount(Some("fusectl"), dir, Some("fusectl"), nix::mount::MsFlags::empty(), None::<&str>)
            .with_context(|| format!("cannot mount fusectl on {DIR}"))?;
    }
    Ok(dir.to_owned())
}

/// The FUSE connection serving mount point `p` (its number is the minor of the mount's st_dev).
pub fn connection_of(p: &Path) -> Option<u32> {
    super::mount::find(p).filter(|m| m.fs_type == "fuse" || m.fs_type.starts_with("fuse.")).map(|m| m.dev.1)
}

/// Abort connection `n`: its pending and future requests fail with ENOTCONN/EIO. Returns
/// false when the connection is gone already.
pub fn abort(n: u32) -> Result<bool> {
    let f = connections()?.join(n.to_string()).join("abort");
    if !f.exists() {
        return Ok(false);
    }
    std::fs::write(&f, "1").with_context(|| format!("cannot write to {}", f.display()))?;
    Ok(true)
}
