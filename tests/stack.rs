//! Stacks on real faultline disks: ext4/xfs/btrfs with options, cold cache, btrfs checksums,
//! btrfs raid1 self-heal, dedup sharing and blast radius, command stack, teardown order, and
//! cleanup after kill -9 of a process holding a mounted file system.

mod common;

use common::RunDir;
use faultline::content::{block_hash, fill_block};
use faultline::disk::{DiskConfig, StoreSpec};
use faultline::spec::rule::{Action, FlipAt, Op, Rule, Target};
use faultline::stack::command::{Cmdline, CommandEnv, CommandSpec, run_command, spawn_command};
use faultline::stack::fs::{BuiltStack, FsKind, StackSpec, extents};
use faultline::stack::served::ServedDisk;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const BS: usize = 4096;

/// kill -9 leaves FUSE mounts without a daemon until cleanup; mkfs.btrfs fails while one is
/// mounted (see BuiltStack::build): those tests run alone, the others share.
static KILL9: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    KILL9.read().unwrap_or_else(|e| e.into_inner())
}

fn disk(size: u64) -> ServedDisk {
    let cfg = DiskConfig {
        size: Some(size),
        block_size: 4096,
        store: StoreSpec::Ram,
        destructive: false,
        force: false,
        latency: None,
        populate: None,
        ..Default::default()
    };
    ServedDisk::start(&cfg, &Default::default(), |_| Ok(vec![]), None).unwrap()
}

const MIB: u64 = 1 << 20;

/// `n` blocks of deterministic, distinct content.
fn content(first_id: u64, n: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; n * BS];
    for i in 0..n {
        fill_block(first_id + i as u64, seed, &mut v[i * BS..(i + 1) * BS]);
    }
    v
}

fn hash_of_block(data: &[u8], i: usize) -> u128 {
    block_hash(&data[i * BS..(i + 1) * BS])
}

fn write_synced(p: &Path, data: &[u8]) {
    use std::io::Write;
    let mut f = std::fs::File::create(p).unwrap();
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
}

fn read_flip(hash: u128) -> Rule {
    Rule::new(Action::Bitflip { at: FlipAt::default() }, &[Op::Read], Target::Content { hash })
}

fn rot(hash: u128, times: Option<u64>) -> Rule {
    let mut r = Rule::new(Action::Rot { at: FlipAt::default() }, &[], Target::Content { hash });
    r.times = times;
    r
}

fn sync_fs(p: &Path) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(p).unwrap();
    // SAFETY: an fd we hold open for the call
    assert_eq!(unsafe { libc::syncfs(f.as_raw_fd()) }, 0);
}

fn fs_mounted(p: &Path) -> bool {
    faultline::sys::mount::is_mounted(p)
}

fn ext4(mkfs: &[&str], mount: &[&str]) -> StackSpec {
    StackSpec::Fs { kind: FsKind::Ext4, mkfs: mkfs.iter().map(|s| s.to_string()).collect(), mount: mount.iter().map(|s| s.to_string()).collect() }
}

fn proc_mounts_line(mnt: &Path) -> String {
    let want = format!(" {} ", mnt.display());
    std::fs::read_to_string("/proc/mounts").unwrap().lines().find(|l| l.contains(&want)).unwrap_or("").to_string()
}

fn assert_torn_down(mnt: &Path) {
    assert!(!fs_mounted(mnt), "{} still mounted", mnt.display());
    assert!(!mnt.exists(), "{} left behind", mnt.display());
}

#[test]
fn ext4_options_and_cold_cache_rereads_the_disk() {
    let _g = shared();
    let d = disk(256 * MIB);
    let dev = d.device().to_owned();
    let mut b = BuiltStack::build(&ext4(&["-b", "4096", "-I", "256"], &["data=journal"]), std::slice::from_ref(&dev)).unwrap();
    let mnt = b.mountpoint.clone().unwrap();
    let line = proc_mounts_line(&mnt);
    assert!(line.contains(" ext4 ") && line.contains("data=journal"), "{line}");
    let out = std::process::Command::new("dumpe2fs").arg("-h").arg(&dev).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().any(|l| l.starts_with("Inode size:") && l.trim_end().ends_with("256")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("Block size:") && l.trim_end().ends_with("4096")), "{text}");
    // the ledger knows the mount before anything else can go wrong
    let ledgers = ledger_files(std::process::id());
    assert!(ledgers.iter().any(|t| t.contains(&mnt.display().to_string())), "{ledgers:?}");

    let data = content(1000, 16, 1);
    let f = mnt.join("f");
    write_synced(&f, &data);
    // a read-side flip armed now is not seen through the page cache ...
    d.disk.arm(vec![read_flip(hash_of_block(&data, 5))]).unwrap();
    assert_eq!(std::fs::read(&f).unwrap(), data, "cached read should not reach the disk");
    // ... but after cold_cache the read reaches the disk, and ext4 (no data checksums) returns it silently
    b.cold_cache().unwrap();
    assert!(proc_mounts_line(&mnt).contains("data=journal"), "options kept across the remount");
    let got = std::fs::read(&f).unwrap();
    let diff: Vec<usize> = (0..data.len()).filter(|&i| got[i] != data[i]).collect();
    assert_eq!(diff, vec![5 * BS], "exactly the first byte of block 5 flipped");
    assert_eq!(got[5 * BS] ^ data[5 * BS], 1);
    assert!(b.teardown().unwrap().is_empty());
    assert_torn_down(&mnt);
    assert!(!ledger_files(std::process::id()).iter().any(|t| t.contains(&mnt.display().to_string())));
    d.teardown().unwrap();
}

fn ledger_files(pid: u32) -> Vec<String> {
    std::fs::read_dir(faultline::sys::ledger::run_dir().join("runs"))
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(&format!("{pid}-")))
                .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn xfs_and_btrfs_with_options() {
    let _g = shared();
    let d1 = disk(320 * MIB);
    let d2 = disk(256 * MIB);
    let xfs = StackSpec::Fs { kind: FsKind::Xfs, mkfs: vec!["-b".into(), "size=4096".into(), "-i".into(), "size=512".into()], mount: vec!["noatime".into()] };
    let bt = StackSpec::Fs { kind: FsKind::Btrfs, mkfs: vec!["--nodesize".into(), "16384".into()], mount: vec!["nodatasum".into()] };
    let b1 = BuiltStack::build(&xfs, &[d1.device().to_owned()]).unwrap();
    let b2 = BuiltStack::build(&bt, &[d2.device().to_owned()]).unwrap();
    let (m1, m2) = (b1.mountpoint.clone().unwrap(), b2.mountpoint.clone().unwrap());
    let l1 = proc_mounts_line(&m1);
    assert!(l1.contains(" xfs ") && l1.contains("noatime"), "{l1}");
    let l2 = proc_mounts_line(&m2);
    assert!(l2.contains(" btrfs ") && l2.contains("nodatasum"), "{l2}");
    let out = std::process::Command::new("xfs_info").arg(&m1).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("isize=512"), "{}", String::from_utf8_lossy(&out.stdout));
    let data = content(7, 64, 2);
    for m in [&m1, &m2] {
        write_synced(&m.join("f"), &data);
        assert_eq!(std::fs::read(m.join("f")).unwrap(), data);
    }
    // btrfs health: device stats per device, all zero here
    let h = b2.health();
    assert!(h.iter().any(|l| l.contains("corruption_errs 0")), "{h:?}");
    // nodatasum: no data checksums, so a flipped block comes back silently
    let mut b2 = b2;
    b2.cold_cache().unwrap();
    d2.disk.arm(vec![read_flip(hash_of_block(&data, 9))]).unwrap();
    let got = std::fs::read(m2.join("f")).unwrap();
    assert_eq!((0..data.len()).filter(|&i| got[i] != data[i]).collect::<Vec<_>>(), vec![9 * BS]);
    b1.teardown().unwrap();
    b2.teardown().unwrap();
    assert_torn_down(&m1);
    assert_torn_down(&m2);
    d1.teardown().unwrap();
    d2.teardown().unwrap();
}

#[test]
fn mkfs_and_mount_errors_name_the_command() {
    let _g = shared();
    let d = disk(256 * MIB);
    let dev = d.device().to_owned();
    let e = BuiltStack::build(&ext4(&["-I", "100"], &[]), std::slice::from_ref(&dev)).err().expect("bad inode size");
    let msg = format!("{e:#}");
    assert!(msg.contains("mkfs.ext4 -F -q -I 100") && msg.contains("invalid inode size 100"), "{msg}");
    let e = BuiltStack::build(&ext4(&[], &["data=nonsense"]), std::slice::from_ref(&dev)).err().expect("bad mount option");
    let msg = format!("{e:#}");
    assert!(msg.contains("mount -t ext4 -o data=nonsense"), "{msg}");
    // the kernel's reason is in the message too (among the kernel's lines of the time, which
    // may include other devices' when other tests mount at once)
    assert!(msg.split_once("kernel: ").is_some_and(|(_, k)| k.contains("ext4: Bad value for 'data'")), "{msg}");
    // not a faultline device of this process: refused, nothing run
    let e = BuiltStack::build(&ext4(&[], &[]), &[PathBuf::from("/dev/zero")]).err().unwrap();
    assert!(format!("{e:#}").contains("refusing to use /dev/zero for a stack"), "{e:#}");
    let other = common::Serve::start("64MiB", "rules: []\n");
    let e = BuiltStack::build(&ext4(&[], &[]), std::slice::from_ref(&other.dev)).err().unwrap();
    assert!(format!("{e:#}").contains("not a faultline loop device of this process"), "{e:#}");
    let e = BuiltStack::build(&StackSpec::Raw, std::slice::from_ref(&other.dev)).err().unwrap();
    assert!(format!("{e:#}").contains("not a faultline loop device of this process"), "{e:#}");
    other.stop();
    let e = BuiltStack::build(&StackSpec::BtrfsRaid1 { mkfs: vec![], mount: vec![] }, std::slice::from_ref(&dev)).err().unwrap();
    assert!(format!("{e:#}").contains("needs 2 device(s)"), "{e:#}");
    d.teardown().unwrap();
}

#[test]
fn btrfs_checksums_turn_a_flipped_block_into_eio() {
    let _g = shared();
    let d = disk(256 * MIB);
    let mut b = BuiltStack::build(&StackSpec::Fs { kind: FsKind::Btrfs, mkfs: vec![], mount: vec![] }, &[d.device().to_owned()]).unwrap();
    let f = b.mountpoint.clone().unwrap().join("f");
    let data = content(50_000, 32, 3);
    write_synced(&f, &data);
    b.cold_cache().unwrap();
    let armed = d.disk.arm(vec![read_flip(hash_of_block(&data, 3))]).unwrap();
    let r = std::fs::read(&f);
    assert!(armed[0].fired.load(Ordering::Relaxed) > 0, "the flip never fired");
    let e = r.expect_err("btrfs returned data whose checksum cannot match");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    let st = b.device_stats().unwrap();
    assert!(st[0].corruption_errs > 0, "{st:?}");
    let h = b.health();
    // the counters always; the kernel's "csum failed" line unless rate-limited system-wide
    assert!(h.iter().any(|l| l.contains("corruption_errs") && !l.contains("corruption_errs 0")), "{h:?}");
    d.disk.engine().clear();
    b.teardown().unwrap();
    d.teardown().unwrap();
}

#[test]
fn btrfs_raid1_heals_rot_on_one_leg() {
    let _g = shared();
    let a = disk(256 * MIB);
    let bdisk = disk(256 * MIB);
    let devs = vec![a.device().to_owned(), bdisk.device().to_owned()];
    let mut b = BuiltStack::build(&StackSpec::BtrfsRaid1 { mkfs: vec![], mount: vec![] }, &devs).unwrap();
    let out = std::process::Command::new("btrfs").args(["filesystem", "df"]).arg(b.mountpoint.as_ref().unwrap()).output().unwrap();
    let df = String::from_utf8_lossy(&out.stdout);
    assert!(df.contains("Data, RAID1") && df.contains("Metadata, RAID1"), "{df}");
    let f = b.mountpoint.clone().unwrap().join("f");
    let data = content(70_000, 64, 4);
    write_synced(&f, &data);
    // rot the copy of block 7 on leg A only (at rest: both reads and scrubs see it)
    let armed = a.disk.arm(vec![rot(hash_of_block(&data, 7), None)]).unwrap();
    assert_eq!(armed[0].blocks.load(Ordering::Relaxed), 1, "one stored copy on leg A rotted");
    // btrfs picks the mirror by reader pid parity: read from fresh processes until one read leg A
    let mut hit = false;
    let mut parities = [0, 0];
    for i in 0..10 {
        b.cold_cache().unwrap();
        // steer the next pid's parity: even tries read with an even pid, odd with an odd one
        let last: u32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid").unwrap().trim().parse().unwrap();
        if (last + 1) % 2 != i % 2 {
            std::process::Command::new("true").status().unwrap();
        }
        let child = std::process::Command::new("cat").arg(&f).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
        parities[(child.id() % 2) as usize] += 1;
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "read failed: {}", String::from_utf8_lossy(&out.stderr));
        assert!(out.stdout == data, "raid1 returned wrong data");
        let st = b.device_stats().unwrap();
        let sa = st.iter().find(|s| s.device == devs[0]).unwrap();
        let sb = st.iter().find(|s| s.device == devs[1]).unwrap();
        assert_eq!(sb.corruption_errs, 0, "{st:?}");
        if sa.corruption_errs > 0 {
            hit = true;
            break;
        }
    }
    assert!(hit, "no read went to leg A in 10 tries (reader pid parities even/odd: {parities:?})");
    let h = b.health();
    assert!(h.iter().any(|l| l.starts_with(&format!("{}: ", devs[0].display())) && !l.contains("corruption_errs 0")), "{h:?}");
    // healed: the good copy was written back to leg A (a scan for the content finds it again)
    sync_fs(b.mountpoint.as_ref().unwrap());
    let again = a.disk.arm(vec![rot(hash_of_block(&data, 7), None)]).unwrap();
    assert_eq!(again[0].blocks.load(Ordering::Relaxed), 1, "leg A's copy was not repaired");
    b.teardown().unwrap();
    a.teardown().unwrap();
    bdisk.teardown().unwrap();
}

/// Write two files with the same content (and one unique), dedupe, check one physical copy is
/// shared, rot that single physical block, and see both files hit.
fn dedup_blast_radius(kind: FsKind, size: u64) {
    let d = disk(size);
    let mut b = BuiltStack::build(&StackSpec::Dedup { kind, mkfs: vec![], mount: vec![], with_duperemove: true }, &[d.device().to_owned()]).unwrap();
    let mnt = b.mountpoint.clone().unwrap();
    let dup = content(90_000, 256, 5);
    let uniq = content(95_000, 256, 5);
    for (n, c) in [("a", &dup), ("b", &dup), ("u", &uniq)] {
        write_synced(&mnt.join(n), c);
    }
    let phys = |n: &str| extents(&mnt.join(n)).unwrap().iter().map(|e| (e.logical, e.physical, e.length)).collect::<Vec<_>>();
    assert_ne!(phys("a"), phys("b"), "copies start out in separate blocks");
    let rep = b.dedupe().unwrap();
    assert_eq!(rep.shared_before, 0, "{rep:?}");
    assert!(rep.duperemove_net_change.unwrap_or(0) > 0, "{rep:?}");
    assert!(rep.shared_after >= 2 * MIB, "both 1 MiB files share their extents: {rep:?}");
    if kind == FsKind::Btrfs {
        assert!(rep.btrfs_set_shared.unwrap_or(0) >= MIB, "{rep:?}");
    }
    assert_eq!(phys("a"), phys("b"), "a and b map to the same physical extents");
    assert!(rep.trimmed, "{rep:?}");
    // rot every stored block with that content: after dedup (and trim of the freed copy)
    // there is one, and it backs block 10 of both files
    let armed = d.disk.arm(vec![rot(hash_of_block(&dup, 10), None)]).unwrap();
    assert_eq!(armed[0].blocks.load(Ordering::Relaxed), 1, "one physical copy left on the disk");
    b.cold_cache().unwrap();
    for n in ["a", "b"] {
        match (kind, std::fs::read(mnt.join(n))) {
            (FsKind::Btrfs, Err(e)) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "{n}: {e}"),
            (FsKind::Xfs, Ok(got)) => {
                let diff: Vec<usize> = (0..dup.len()).filter(|&i| got[i] != dup[i]).collect();
                assert_eq!(diff, vec![10 * BS], "{n}: silent corruption of block 10");
            }
            (k, r) => panic!("{k:?} {n}: unexpected {:?}", r.map(|v| v.len())),
        }
    }
    assert_eq!(std::fs::read(mnt.join("u")).unwrap(), uniq, "the unique file is untouched");
    b.teardown().unwrap();
    d.teardown().unwrap();
}

#[test]
fn dedup_btrfs_shares_blocks_and_rot_hits_every_sharer() {
    let _g = shared();
    dedup_blast_radius(FsKind::Btrfs, 256 * MIB);
}

#[test]
fn dedup_xfs_reflink_shares_blocks_and_rot_hits_every_sharer() {
    let _g = shared();
    dedup_blast_radius(FsKind::Xfs, 320 * MIB);
}

fn shell(s: &str, timeout: Option<Duration>) -> CommandSpec {
    CommandSpec { command: Cmdline::Shell(s.into()), timeout, cwd: None, acks: false, check: None }
}

fn pid_alive(pid: i32) -> bool {
    // a zombie still answers kill(0); read its state
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
}

#[test]
fn command_stack_env_exit_and_kills() {
    let _g = shared();
    let d = disk(256 * MIB);
    let dev = d.device().to_owned();
    // raw: device variables, no mount
    let raw = BuiltStack::build(&StackSpec::Raw, std::slice::from_ref(&dev)).unwrap();
    let o = raw
        .run_command(Some(&shell("echo dev=$FAULTLINE_DEVICE devs=$FAULTLINE_DEVICES mnt=${FAULTLINE_MOUNT-unset}; echo oops >&2; exit 3", None)), None)
        .unwrap();
    assert_eq!(o.exit_code, Some(3));
    assert!(!o.success());
    assert_eq!(o.stdout_tail.trim(), format!("dev={0} devs={0} mnt=unset", dev.display()));
    assert_eq!(o.stderr_tail.trim(), "oops");
    drop(raw);
    // a command stack on ext4: runs in the mount point, argv form
    let spec = StackSpec::Command {
        base: Box::new(ext4(&[], &[])),
        command: CommandSpec {
            command: Cmdline::Argv(vec!["/bin/sh".into(), "-c".into(), "pwd; echo hi > $FAULTLINE_MOUNT/x".into()]),
            timeout: None,
            cwd: None,
            acks: false,
            check: None,
        },
    };
    let b = BuiltStack::build(&spec, std::slice::from_ref(&dev)).unwrap();
    let mnt = b.mountpoint.clone().unwrap();
    let o = b.run_command(None, None).unwrap();
    assert!(o.success(), "{o:?}");
    assert_eq!(o.stdout_tail.trim(), mnt.display().to_string());
    assert_eq!(std::fs::read_to_string(mnt.join("x")).unwrap(), "hi\n");
    // timeout: the whole group goes, including a background child
    let pidf = mnt.join("bg.pid");
    let cmd = shell(&format!("sleep 1000 & echo $! > {}; sleep 1000", pidf.display()), Some(Duration::from_millis(700)));
    let o = b.run_command(Some(&cmd), None).unwrap();
    assert!(o.timed_out && o.signal == Some(libc::SIGTERM), "{o:?}");
    assert!(o.seconds >= 0.7 && o.seconds < 5.0, "{o:?}");
    let bg: i32 = std::fs::read_to_string(&pidf).unwrap().trim().parse().unwrap();
    assert!(!pid_alive(bg), "background child {bg} survived the timeout");
    // cancel (what faultline's Ctrl-C handler sets); a TERM-ignoring command gets KILL
    let flag = Arc::new(AtomicBool::new(false));
    let f2 = flag.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        f2.store(true, Ordering::Relaxed);
    });
    let o = run_command(&shell("trap '' TERM; sleep 1000 & wait; sleep 1000", None), &CommandEnv::default(), Some(&flag)).unwrap();
    t.join().unwrap();
    assert!(o.cancelled && o.signal == Some(libc::SIGKILL), "{o:?}");
    assert!(o.seconds < 6.0);
    // dropped while running: the whole group goes
    let running = spawn_command(&shell("sleep 1000 & sleep 1000", None), &CommandEnv::default()).unwrap();
    let pgid = running.pgid();
    std::thread::sleep(Duration::from_millis(100));
    // signal 0 only checks that the group exists
    let exists = || {
        // SAFETY: kill takes no pointers
        unsafe { libc::kill(-pgid, 0) == 0 }
    };
    assert!(exists(), "group should be running");
    drop(running);
    let t = std::time::Instant::now();
    while exists() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!exists(), "group {pgid} survived the drop");
    // the command's ledger entry is gone
    let procs: Vec<serde_json::Value> =
        ledger_files(std::process::id()).iter().map(|t| serde_json::from_str::<serde_json::Value>(t).unwrap()["procs"].clone()).collect();
    assert!(procs.iter().all(|p| p.as_array().is_none_or(|a| a.is_empty())), "{procs:?}");
    b.teardown().unwrap();
    d.teardown().unwrap();
}

#[test]
fn teardown_order_with_a_busy_file_system() {
    let _g = shared();
    let d = disk(256 * MIB);
    let dev = d.device().to_owned();
    // busy for a moment: the retried plain unmount succeeds, no lazy unmount
    let b = BuiltStack::build(&ext4(&[], &[]), std::slice::from_ref(&dev)).unwrap();
    let mnt = b.mountpoint.clone().unwrap();
    let file = std::fs::File::create(mnt.join("open")).unwrap();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        drop(file);
    });
    let notes = b.teardown().unwrap();
    t.join().unwrap();
    assert!(notes.is_empty(), "{notes:?}");
    assert_torn_down(&mnt);
    // busy throughout: lazy unmount as the last resort, and it says so
    let b = BuiltStack::build(&ext4(&[], &[]), std::slice::from_ref(&dev)).unwrap();
    let mnt = b.mountpoint.clone().unwrap();
    let file = std::fs::File::create(mnt.join("open")).unwrap();
    let notes = b.teardown().unwrap();
    assert!(notes.iter().any(|n| n.contains("lazily")), "{notes:?}");
    assert!(!fs_mounted(&mnt));
    drop(file);
    // the disk torn down while its file system is still mounted: the fs goes first
    let b = BuiltStack::build(&ext4(&[], &[]), std::slice::from_ref(&dev)).unwrap();
    let mnt = b.mountpoint.clone().unwrap();
    write_synced(&mnt.join("f"), b"x");
    let name = dev.file_name().unwrap().to_string_lossy().to_string();
    let backing = |n: &str| std::fs::read_to_string(format!("/sys/block/{n}/loop/backing_file")).unwrap_or_default();
    let ours = backing(&name);
    assert!(ours.starts_with(&format!("{}/mnt-", faultline::sys::ledger::run_dir().display())), "{ours}");
    d.teardown().unwrap();
    assert!(!fs_mounted(&mnt));
    assert_ne!(backing(&name), ours, "loop device still attached to our disk");
    b.teardown().unwrap();
    assert!(!mnt.exists());
}

/// Start `faultline stack-hold`, wait for "ready", return (child, devices, mount).
fn hold(run: &RunDir, stack: &str, busy: bool) -> (std::process::Child, Vec<PathBuf>, PathBuf) {
    let mut cmd = std::process::Command::new(common::bin());
    cmd.env("FAULTLINE_RUN_DIR", &run.0);
    cmd.args(["stack-hold", "--stack", stack, "--size", "256MiB"]).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    if busy {
        cmd.arg("--busy");
    }
    let mut child = cmd.spawn().unwrap();
    let mut r = BufReader::new(child.stdout.take().unwrap());
    let (mut devs, mut mnt) = (vec![], PathBuf::new());
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap() == 0 {
            let mut err = String::new();
            let _ = std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err);
            panic!("stack-hold exited early: {err}");
        }
        match line.trim().split_once(' ') {
            Some(("device", d)) => devs.push(PathBuf::from(d)),
            Some(("mount", m)) => mnt = PathBuf::from(m),
            _ if line.trim() == "ready" => break,
            _ => panic!("unexpected line {line:?}"),
        }
    }
    (child, devs, mnt)
}

fn cleanup_after_kill9(stack: &str, busy: bool) {
    let run = RunDir::new(stack);
    let (mut child, devs, mnt) = hold(&run, stack, busy);
    let pid = child.id();
    assert!(mnt.starts_with(&run.0));
    assert!(fs_mounted(&mnt));
    // busy: a process of the command (not its main process) keeps its cwd in the mount
    let bg = busy.then(|| std::fs::read_to_string(mnt.join("busy.pid")).unwrap().trim().parse::<i32>().unwrap());
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(fs_mounted(&mnt), "kill -9 cannot have unmounted anything");
    if let Some(bg) = bg {
        assert!(pid_alive(bg), "the busy process should outlive faultline");
    }
    let text = run.cleanup().0;
    assert!(text.contains(&format!("unmounted {}\n", mnt.display())), "no clean unmount: {text}");
    if let Some(bg) = bg {
        assert!(text.contains("killed process group"), "{text}");
        assert!(!pid_alive(bg), "busy process survived cleanup");
    }
    for d in &devs {
        assert!(text.contains(&format!("detached {}", d.display())), "{text}");
    }
    assert!(text.contains(&format!("forgot run of pid {pid}")), "{text}");
    assert!(!fs_mounted(&mnt), "{text}");
    assert!(!mnt.exists());
    assert!(run.leftovers().is_empty(), "left: {:?}", run.leftovers());
    // the fs unmount came before the first detach
    let unm = text.find(&format!("unmounted {}", mnt.display())).unwrap();
    let det = text.find("detached").unwrap();
    assert!(unm < det, "{text}");
    // and a second cleanup finds nothing
    assert_eq!(run.cleanup().0.trim(), "nothing to clean up");
}

#[test]
fn cleanup_after_kill9_of_a_busy_ext4_stack() {
    let _g = KILL9.write().unwrap_or_else(|e| e.into_inner());
    cleanup_after_kill9("ext4", true);
}

#[test]
fn cleanup_after_kill9_of_btrfs_raid1_two_disks_one_process() {
    let _g = KILL9.write().unwrap_or_else(|e| e.into_inner());
    cleanup_after_kill9("btrfs-raid1", false);
}

#[test]
fn raw_cold_cache_drops_the_device_cache() {
    let _g = shared();
    let d = disk(64 * MIB);
    let dev = d.device().to_owned();
    let mut b = BuiltStack::build(&StackSpec::Raw, std::slice::from_ref(&dev)).unwrap();
    assert!(b.mountpoint.is_none());
    let data = content(123_000, 8, 9);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&dev).unwrap();
        f.write_all_at(&data, 0).unwrap();
        f.sync_all().unwrap();
        let mut got = vec![0u8; data.len()];
        f.read_exact_at(&mut got, 0).unwrap(); // now in the page cache
        d.disk.arm(vec![read_flip(hash_of_block(&data, 2))]).unwrap();
        f.read_exact_at(&mut got, 0).unwrap();
        assert_eq!(got, data, "a cached read should not reach the disk");
        b.cold_cache().unwrap();
        f.read_exact_at(&mut got, 0).unwrap();
        let diff: Vec<usize> = (0..data.len()).filter(|&i| got[i] != data[i]).collect();
        assert_eq!(diff, vec![2 * BS], "after cold_cache the read reaches the disk");
        // a medium error on the raw device shows in the kernel log notes
        d.disk.arm(vec![Rule::new(Action::Error { errno: libc::EIO }, &[Op::Read], Target::Range { start: 4 * BS as u64, end: 5 * BS as u64 })]).unwrap();
        let name = dev.file_name().unwrap().to_string_lossy().to_string();
        // the kernel rate-limits these lines (system-wide): retry for a while
        let mut h = vec![];
        for _ in 0..12 {
            b.cold_cache().unwrap();
            assert!(f.read_exact_at(&mut got[..BS], 4 * BS as u64).is_err());
            h = b.health();
            if h.iter().any(|l| l.contains("I/O error") && l.contains(&name)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        assert!(h.iter().any(|l| l.contains("I/O error") && l.contains(&name)), "{h:?}");
    }
    b.teardown().unwrap();
    d.teardown().unwrap();
}

#[test]
fn ctrl_c_kills_the_command_group_and_tears_everything_down() {
    let _g = shared();
    let run = RunDir::new("ctrlc");
    let (mut child, _devs, mnt) = hold(&run, "ext4", true);
    let bg: i32 = std::fs::read_to_string(mnt.join("busy.pid")).unwrap().trim().parse().unwrap();
    assert!(pid_alive(bg));
    // SAFETY: kill takes no pointers; our child, not yet waited for (its pid is not reused)
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let st = child.wait().unwrap();
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err);
    assert!(st.success(), "stack-hold exited with {st}: {err}");
    assert!(!pid_alive(bg), "the command's background process survived Ctrl-C");
    assert!(!fs_mounted(&mnt) && !mnt.exists(), "{err}");
    assert!(run.leftovers().is_empty(), "left: {:?}", run.leftovers());
    assert_eq!(run.cleanup().0.trim(), "nothing to clean up");
}

#[test]
fn cleanup_reads_ledgers_of_older_versions() {
    let _g = shared();
    // a dead pid: a child we reaped
    let mut c = std::process::Command::new("true").spawn().unwrap();
    let dead = c.id();
    c.wait().unwrap();
    let run = RunDir::new("old");
    let dir = run.0.join("old-dir");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::create_dir_all(run.0.join("runs")).unwrap();
    // the format before fs_mounts/procs existed, under the old file name
    let old = serde_json::json!({"pid": dead, "start_time": 1, "dirs": [dir], "mounts": [], "loops": [], "socket": null, "device": null});
    let path = run.0.join(format!("runs/{dead}.json"));
    std::fs::write(&path, old.to_string()).unwrap();
    let text = run.cleanup().0;
    assert!(text.contains(&format!("removed {}", dir.display())) && text.contains(&format!("forgot run of pid {dead}")), "{text}");
    assert!(!dir.exists() && !path.exists());
}
