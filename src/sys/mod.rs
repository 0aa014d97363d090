//! Operating-system plumbing every layer above may use, and which uses none of them: the
//! resource ledger and run directory, mounts and mountinfo, loop devices and their sysfs
//! knobs, processes, the FUSE control file system, time limits for calls that may hang, a precise
//! timer queue, and the wall clock hosts agree instants on.

pub mod cgroup;
pub mod fusectl;
pub mod ledger;
pub mod limit;
pub mod loopdev;
pub mod mount;
pub mod netns;
pub mod process;
pub mod timer;

/// CLOCK_REALTIME in ns since the epoch: the clock instants agreed between hosts are on (an
/// agents run's start, a disk's fault clock started ahead).
pub fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// The running kernel's release as (major, minor), from /proc/sys/kernel/osrelease
/// ("6.18.0-1-amd64" is (6, 18)); `None` when it cannot be read.
pub fn kernel_version() -> Option<(u32, u32)> {
    parse_release(&std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?)
}

fn parse_release(s: &str) -> Option<(u32, u32)> {
    let mut it = s.trim().split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// The size of a file or block device in bytes (a device's size is where a seek to its end lands).
pub fn file_size(p: &std::path::Path) -> anyhow::Result<u64> {
    use anyhow::Context;
    use std::io::Seek;
    let mut f = std::fs::File::open(p).with_context(|| format!("cannot open {}", p.display()))?;
    f.seek(std::io::SeekFrom::End(0)).with_context(|| format!("cannot find the size of {}", p.display()))
}

/// A control socket's path, checked before anything is built: its directory exists (the run
/// directory comes with the ledger), and what is there already is a stale socket. A live socket
/// is another server's; a file or directory is the user's, and binding would have removed it.
pub fn check_new_socket(s: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(s) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(s).is_ok() {
                anyhow::bail!("control socket {} is in use by a running server; give another --socket", s.display());
            }
        }
        Ok(_) => anyhow::bail!("control socket {}: the path exists and is not a socket (binding would remove it); give a new path", s.display()),
        Err(_) => {}
    }
    let dir = s.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    // a run directory is made when needed: this process's, or the default one an older agent's
    // controller names
    if !dir.is_dir() && dir != ledger::run_dir() && dir != std::path::Path::new("/run/faultline") {
        anyhow::bail!("control socket {}: directory {} does not exist; create it or give a socket in an existing directory", s.display(), dir.display());
    }
    Ok(())
}

/// An output file's path, checked before the work that fills it (`flag` names it in errors):
/// not a directory, in a directory that exists. Checked first so a bad path costs nothing, not
/// the measurement it would have held.
pub fn check_out_file(o: &std::path::Path, flag: &str) -> anyhow::Result<()> {
    if o.is_dir() {
        anyhow::bail!("{flag} {}: is a directory; give a file path", o.display());
    }
    let dir = o.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    if !dir.is_dir() {
        anyhow::bail!("{flag} {}: directory {} does not exist; create it or give a path in an existing one", o.display(), dir.display());
    }
    Ok(())
}

/// The machine's memory in bytes (MemTotal in /proc/meminfo), if it can be read.
pub fn mem_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = text.lines().find_map(|l| l.strip_prefix("MemTotal:"))?.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// Send one JSON value as a line in a single write. `writeln!` on an unbuffered socket sends each
/// token of the JSON on its own (a syscall each), which made large control replies take seconds.
pub fn write_json_line(w: &mut impl std::io::Write, v: &serde_json::Value) -> std::io::Result<()> {
    let mut buf = serde_json::to_vec(v)?;
    buf.push(b'\n');
    w.write_all(&buf)
}

/// One exchange on a JSON-lines control connection (docs/control.md): `req` out as one line,
/// one reply line back; the reply's `result`, or its `error` as an error. `server` names the
/// other end in errors, those it replied with included ("the disk server: ...").
pub fn json_exchange(w: &mut impl std::io::Write, r: &mut impl std::io::BufRead, req: &serde_json::Value, server: &str) -> anyhow::Result<serde_json::Value> {
    use anyhow::Context;
    write_json_line(w, req).with_context(|| format!("{server} is gone"))?;
    let mut line = String::new();
    if r.read_line(&mut line).with_context(|| format!("no reply from {server}"))? == 0 {
        anyhow::bail!("{server} closed its control socket");
    }
    let v: serde_json::Value = serde_json::from_str(&line).with_context(|| format!("bad reply from {server}"))?;
    if v["ok"] == serde_json::json!(true) { Ok(v["result"].clone()) } else { anyhow::bail!("{server}: {}", v["error"].as_str().unwrap_or("unknown error")) }
}

/// Connect to a JSON-lines control socket and make one exchange (`json_exchange`); `connect`
/// says what to check when the socket does not answer, `timeout` bounds the wait for the reply.
pub fn json_call(
    path: &std::path::Path,
    req: &serde_json::Value,
    server: &str,
    connect: &str,
    timeout: Option<std::time::Duration>,
) -> anyhow::Result<serde_json::Value> {
    use anyhow::Context;
    let s = std::os::unix::net::UnixStream::connect(path).with_context(|| format!("cannot connect to {} ({connect})", path.display()))?;
    s.set_read_timeout(timeout)?;
    let mut w = s.try_clone()?;
    json_exchange(&mut w, &mut std::io::BufReader::new(s), req, server)
}

// BLKFLSBUF = _IO(0x12, 97): write back a block device's dirty page cache, then drop it
nix::ioctl_none!(blkflsbuf, 0x12, 97);

/// Write back and drop the page cache of block device `dev` (BLKFLSBUF): after a power cut its
/// dirty pages fail their writeback against the dead device and its clean ones go, so a
/// buffered read after power-on sees what the device holds. Its writeback comes back to this
/// process when the device is ours: call it from a thread that serves no request.
pub fn drop_page_cache(dev: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(dev).with_context(|| format!("cannot open {} to drop its page cache", dev.display()))?;
    // SAFETY: our open fd; BLKFLSBUF takes no argument
    unsafe { blkflsbuf(f.as_raw_fd()) }.with_context(|| format!("cannot drop the page cache of {} (BLKFLSBUF)", dev.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn kernel_releases_parse_to_major_minor() {
        assert_eq!(super::parse_release("6.18.0-1-amd64\n"), Some((6, 18)));
        assert_eq!(super::parse_release("5.15.0-91-generic"), Some((5, 15)));
        assert_eq!(super::parse_release("6.1"), Some((6, 1)));
        assert_eq!(super::parse_release("garbage"), None);
    }
}
