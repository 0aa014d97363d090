//! Networked experiments (`hosts:`, docs/experiment.md "Hosts"): one repetition builds the
//! hosts as network namespaces joined by the relay (`net::Network`), starts the target's NBD
//! server inside the target host (faultline's, owned by the run as `disks` does, or a
//! command), runs each client's workload over NBD from a thread that entered the client's
//! namespace (its sockets live there), applies network, disk and host faults with windows
//! counted from the workload's start, samples every host each interval (probers), and gives
//! the repetition its `networked` (series, windows, per-window figures). `Namespaces` is this
//! placement's part of the repetition pipeline (run::pipeline). Everything built is
//! in the ledger (namespaces, the disk server's own records) and goes at teardown, on error,
//! on Ctrl-C, and with `faultline cleanup` after a crash.

use super::disks::DiskServer;
use super::pipeline::{FaultControl, Outcome, Placement, Rep};
use super::probe::{link_counters, machine_cpu, mem_available_mib, proc_cpu, proc_rss_mib, tcp_retrans};
use crate::net::{Network, RelayOptions};
use crate::report::networked::{ClientPoint, ClientSeries, FaultWindow, HostCounters, NetworkedHost, NetworkedRun, Probe};
use crate::spec::experiment::Setup;
use crate::spec::networked::{NetworkedHosts, TargetKind};
use crate::sys::netns;
use crate::workload::{Progress, WorkloadResult};
use anyhow::{Context, Result, bail};
use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// How long a command target gets to start listening.
const TARGET_START_LIMIT: Duration = Duration::from_secs(20);

pub const CPU_SOURCE: &str = "target: its processes (/proc/PID/stat); clients: the run's own process (the workload threads, the relay and the probers share it); machine_*: /proc/stat (namespaces share the machine's CPUs, there is no per-namespace figure)";

/// Enter network namespace `ns` with the calling thread (threads it starts inherit it).
fn enter(ns: &str) -> Result<()> {
    let f = std::fs::File::open(netns::path(ns)).with_context(|| format!("cannot open network namespace {ns}"))?;
    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).with_context(|| format!("setns into {ns}"))?;
    Ok(())
}

/// The target's server: faultline's disk server or a command's process group.
enum Target {
    Faultline(Arc<DiskServer>),
    Command(Child),
}

impl Target {
    fn stop(self) -> Result<()> {
        match self {
            Target::Faultline(d) => d.stop(),
            Target::Command(mut c) => {
                let pg = nix::unistd::Pid::from_raw(-(c.id() as i32));
                let _ = nix::sys::signal::kill(pg, nix::sys::signal::Signal::SIGTERM);
                let t = Instant::now();
                while c.try_wait()?.is_none() {
                    if t.elapsed() > Duration::from_secs(5) {
                        let _ = nix::sys::signal::kill(pg, nix::sys::signal::Signal::SIGKILL);
                        let _ = c.wait();
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(())
            }
        }
    }
}

/// Start the command target in its host and wait until its port answers (from a client host).
fn start_command(cmd: &str, ns: &str, port: u16, addr: std::net::Ipv4Addr, client_ns: &str) -> Result<Child> {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, "sh", "-c", cmd]).env("FAULTLINE_PORT", port.to_string()).stdin(Stdio::null()).stdout(Stdio::null()).process_group(0);
    // SAFETY: the hook runs in the forked child before exec and only makes one
    // async-signal-safe system call (prctl)
    unsafe {
        c.pre_exec(|| crate::sys::process::die_with_parent(nix::sys::signal::Signal::SIGTERM));
    }
    let mut child = c.spawn().with_context(|| format!("cannot start the target command `{cmd}`"))?;
    let cns = client_ns.to_string();
    let give_up = Arc::new(AtomicBool::new(false));
    let g = give_up.clone();
    let ready = std::thread::spawn(move || -> Result<bool> {
        enter(&cns)?;
        let t = Instant::now();
        while t.elapsed() < TARGET_START_LIMIT && !g.load(Relaxed) {
            if std::net::TcpStream::connect_timeout(&(addr, port).into(), Duration::from_millis(200)).is_ok() {
                return Ok(true);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(false)
    });
    // a command that fails before it listens will not listen: say so now, not after the limit
    // (one that exits with success may have left a daemon to listen)
    while !ready.is_finished() {
        if let Some(status) = child.try_wait()?
            && !status.success()
        {
            give_up.store(true, Relaxed);
            let _ = ready.join();
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(-(child.id() as i32)), nix::sys::signal::Signal::SIGKILL);
            bail!("target command `{cmd}` ended ({status}) before it listened on {addr}:{port}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let ok = ready.join().map_err(|_| anyhow::anyhow!("the readiness probe panicked"))??;
    if !ok {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(-(child.id() as i32)), nix::sys::signal::Signal::SIGKILL);
        let status = child.wait()?;
        bail!("target command `{cmd}` did not listen on {addr}:{port} within {} s ({status})", TARGET_START_LIMIT.as_secs());
    }
    Ok(child)
}

/// Running totals a prober turns into per-interval deltas.
#[derive(Default, Clone)]
struct Counters {
    cpu_user: f64,
    cpu_sys: f64,
    rx_packets: u64,
    tx_packets: u64,
    rx_dropped: u64,
    tx_dropped: u64,
    tcp_retrans: u64,
    relay_dropped: u64,
    relay_backlog_full: u64,
    requests: u64,
    ops: u64,
    errors: u64,
    retries: u64,
    timeouts: u64,
    in_flight: u64,
    in_flight_ns: u64,
}

/// What the prober samples, per host.
struct ProbeHost {
    name: String,
    namespace: String,
    /// Client: its thread inside the namespace (for /proc/PID/task/TID/net) and progress.
    client: Option<(Arc<AtomicI32>, Arc<Progress>)>,
}

struct Prober {
    hosts: Vec<ProbeHost>,
    net: Arc<Network>,
    disk: Option<Arc<DiskServer>>,
    t0: Instant,
    interval: Duration,
}

impl Prober {
    fn run(self, done: Arc<AtomicBool>) -> Vec<Probe> {
        let mut last: HashMap<String, Counters> = HashMap::new();
        let mut last_machine = machine_cpu();
        let mut last_t = 0.0;
        let mut out = Vec::new();
        let me = std::process::id();
        for k in 1.. {
            let due = self.interval * k;
            while self.t0.elapsed() < due {
                if done.load(Relaxed) {
                    return out;
                }
                std::thread::sleep(Duration::from_millis(10).min(due.saturating_sub(self.t0.elapsed())));
            }
            // the relay's counters first: `show` runs `ip` in every host, which a loaded
            // machine can stretch to a second; it reads the link counters at its end, so the
            // sample's time is taken after it (a time taken before labelled a partition's drops
            // a second early)
            let links = self.net.show().unwrap_or_default();
            let t = self.t0.elapsed().as_secs_f64();
            let dt = (t - last_t).max(1e-3);
            let m = machine_cpu();
            let total = (m.3.saturating_sub(last_machine.3)).max(1) as f64;
            let mpct = |a: u64, b: u64| (a.saturating_sub(b)) as f64 / total * 100.0;
            let (mu, ms, mst) = (mpct(m.0, last_machine.0), mpct(m.1, last_machine.1), mpct(m.2, last_machine.2));
            last_machine = m;
            let mem = mem_available_mib();
            for h in &self.hosts {
                let mut c = Counters::default();
                let (pids, proc_net): (Vec<u32>, Option<String>) = match &h.client {
                    Some((tid, p)) => {
                        let tid = tid.load(Relaxed);
                        c.ops = p.ops();
                        c.errors = p.errors();
                        if let Some(n) = p.nbd.get() {
                            let s = n.snapshot();
                            c.retries = s.retries;
                            c.timeouts = s.timeouts;
                        }
                        (vec![me], (tid > 0).then(|| format!("/proc/{me}/task/{tid}/net")))
                    }
                    None => {
                        let pids: Vec<u32> = netns::pids(&h.namespace).into_iter().map(|p| p as u32).collect();
                        let pn = pids.first().map(|p| format!("/proc/{p}/net"));
                        if let Some(s) = self.disk.as_ref().and_then(|d| d.stats().ok()) {
                            let q = s.nbd_server.unwrap_or_default();
                            (c.requests, c.in_flight, c.in_flight_ns) = (s.faults.requests, q.in_flight, q.in_flight_ns);
                        }
                        (pids, pn)
                    }
                };
                for p in &pids {
                    let (u, s) = proc_cpu(*p);
                    c.cpu_user += u;
                    c.cpu_sys += s;
                }
                if let Some(pn) = &proc_net {
                    (c.rx_packets, c.rx_dropped, c.tx_packets, c.tx_dropped) = link_counters(pn, None);
                    c.tcp_retrans = tcp_retrans(pn);
                }
                let into_host = |key: &str| -> u64 {
                    links["links"].as_array().map(|l| l.iter().filter(|x| x["to"] == h.name.as_str()).map(|x| x[key].as_u64().unwrap_or(0)).sum()).unwrap_or(0)
                };
                (c.relay_dropped, c.relay_backlog_full) = (into_host("dropped"), into_host("backlog_full"));
                let rss: f64 = pids.iter().map(|p| proc_rss_mib(*p)).sum();
                let prev = last.insert(h.name.clone(), c.clone()).unwrap_or_default();
                let d = |a: u64, b: u64| a.saturating_sub(b);
                out.push(Probe {
                    t_s: t,
                    host: h.name.clone(),
                    sys: HostCounters {
                        cpu_user_pct: (c.cpu_user - prev.cpu_user).max(0.0) / dt * 100.0,
                        cpu_system_pct: (c.cpu_sys - prev.cpu_sys).max(0.0) / dt * 100.0,
                        machine_user_pct: mu,
                        machine_system_pct: ms,
                        machine_steal_pct: mst,
                        rss_mib: rss,
                        mem_available_mib: mem,
                        rx_packets: d(c.rx_packets, prev.rx_packets),
                        tx_packets: d(c.tx_packets, prev.tx_packets),
                        rx_dropped: d(c.rx_dropped, prev.rx_dropped),
                        tx_dropped: d(c.tx_dropped, prev.tx_dropped),
                        tcp_retrans: d(c.tcp_retrans, prev.tcp_retrans),
                        requests: d(c.requests, prev.requests),
                    },
                    relay_dropped: d(c.relay_dropped, prev.relay_dropped),
                    relay_backlog_full: d(c.relay_backlog_full, prev.relay_backlog_full),
                    ops: d(c.ops, prev.ops),
                    errors: d(c.errors, prev.errors),
                    retries: d(c.retries, prev.retries),
                    timeouts: d(c.timeouts, prev.timeouts),
                    target_in_flight: c.in_flight,
                    target_queue_depth: d(c.in_flight_ns, prev.in_flight_ns) as f64 / 1e9 / dt,
                });
            }
            last_t = t;
        }
        out
    }
}

/// The windows of every fault of the setup, in seconds from the workload's start.
pub(crate) fn windows(setup: &Setup, hosts: &NetworkedHosts) -> Vec<FaultWindow> {
    let secs = |d: Duration| d.as_secs_f64();
    let mut w = Vec::new();
    for n in &setup.net_faults {
        let (from, to) = n.rule.window.map_or((0.0, None), |x| (secs(x.from), x.to.map(secs)));
        w.push(FaultWindow {
            kind: "net".into(),
            description: n.name.clone().map_or_else(|| n.describe(), |m| format!("{m}: {}", n.describe())),
            from_s: from,
            to_s: to,
        });
    }
    for f in &setup.faults {
        let (from, to) = f.rule.window.map_or((0.0, None), |x| (secs(x.from), x.to.map(secs)));
        w.push(FaultWindow { kind: "disk".into(), description: format!("{}: {}", hosts.target, f.label), from_s: from, to_s: to });
    }
    for h in &setup.host_faults {
        w.push(FaultWindow { kind: "host".into(), description: format!("{}: {}", hosts.target, h.action), from_s: secs(h.from), to_s: h.to.map(secs) });
    }
    w
}

/// A client's series from its workload's result, its times moved by `shift` s (from its own
/// first I/O to the run's clock).
pub(crate) fn client_series(host: &str, r: &WorkloadResult, shift: f64) -> ClientSeries {
    let points = r
        .timeseries
        .iter()
        .map(|s| {
            let ops = s.read.iops + s.write.iops;
            let wmean = if ops > 0.0 { (s.read.mean_us * s.read.iops + s.write.mean_us * s.write.iops) / ops } else { 0.0 };
            ClientPoint { t_s: s.t + shift, iops: ops, mib_s: s.read.mib_s + s.write.mib_s, mean_us: wmean, p99_us: s.read.p99_us.max(s.write.p99_us) }
        })
        .collect();
    ClientSeries {
        host: host.to_string(),
        seconds: r.seconds,
        mib_s: r.read.mib_s + r.write.mib_s,
        ops: r.read.ops + r.write.ops,
        failed_ios: r.errors.values().sum(),
        io_errors: r.errors.clone(),
        nbd_client: r.nbd_client,
        points,
    }
}

/// The namespace placement: the hosts as network namespaces joined by the relay, the
/// target's server in the target host, each client's workload from a thread of this process
/// that entered its host's namespace.
pub(crate) struct Namespaces<'a> {
    hosts: &'a NetworkedHosts,
    net: Option<Arc<Network>>,
    target: Option<Target>,
    /// The target's disk server (a faultline target).
    disk: Option<Arc<DiskServer>>,
    /// Each client's workload (in `hosts.clients` order) against the target's URI.
    workload: Option<(Vec<crate::workload::Workload>, String)>,
    seq0: Vec<u64>,
    /// With a power cut: each client's content maps and durability record (the oracle's),
    /// and the cut's record once the drive is over (the crash phase completes it).
    clients_cut: Vec<ClientCut>,
    crash: Option<crate::report::model::CrashRecord>,
}

/// A client's record of a power cut, for the crash phase.
struct ClientCut {
    host: String,
    /// Its workload (its slice of the target's disk: `base`, `span`).
    w: crate::workload::Workload,
    maps: crate::workload::Maps,
    failed_ios: u64,
}

impl<'a> Namespaces<'a> {
    pub(crate) fn new(hosts: &'a NetworkedHosts) -> Self {
        Namespaces { hosts, net: None, target: None, disk: None, workload: None, seq0: Vec::new(), clients_cut: Vec::new(), crash: None }
    }
}

impl Placement for Namespaces<'_> {
    fn build(&mut self, r: &mut Rep) -> Result<()> {
        let hosts = self.hosts;
        super::pipeline::check_windows_only(r.setup)?;
        let net = Arc::new(Network::up(&hosts.names(), RelayOptions::default()).context("cannot build the hosts")?);
        self.net = Some(net.clone());
        let th = net.host(&hosts.target).context("target host")?.clone();
        let first_client = net.host(&hosts.clients[0]).context("client host")?.clone();
        r.phase(&format!("hosts: {}", net.hosts().iter().map(|h| format!("{} {}", h.name, h.address)).collect::<Vec<_>>().join(", ")));
        let bind = format!("tcp://{}:{}", th.address, hosts.port);
        let target = match &hosts.kind {
            TargetKind::Faultline => Target::Faultline(Arc::new(DiskServer::start_in(&r.setup.disk, 0, Some((&th.namespace, &bind)))?)),
            TargetKind::Command(cmd) => Target::Command(start_command(cmd, &th.namespace, hosts.port, th.address, &first_client.namespace)?),
        };
        if let Target::Faultline(d) = &target {
            self.disk = Some(d.clone());
        }
        self.target = Some(target);
        let q = hosts.nbd_query_for(r.setup);
        let q = if q.is_empty() { q } else { format!("?{q}") };
        let uri = format!("nbd://{}:{}/{q}", th.address, hosts.port);
        // with a power cut each client has its own slice of the disk (the same workload otherwise)
        let ws = (0..hosts.clients.len()).map(|i| r.exp.client_workload(r.setup, &uri, i).map_err(anyhow::Error::msg)).collect::<Result<Vec<_>>>()?;
        self.workload = Some((ws, uri));
        Ok(())
    }

    /// The disk's clock restarts now; its windows then count from (about) the workload's start.
    fn arm(&mut self, r: &mut Rep) -> Result<()> {
        if let Some(d) = &self.disk {
            self.seq0 = super::pipeline::arm_faults(&[&**d as &dyn FaultControl], &r.setup.faults)?.0;
        }
        Ok(())
    }

    fn drive(&mut self, r: &mut Rep, o: &mut Outcome) -> Result<()> {
        let (hosts, setup) = (self.hosts, r.setup);
        let net = self.net.as_ref().expect("hosts built before the drive");
        let (ws, uri) = self.workload.as_ref().expect("built before the drive");
        let th = net.host(&hosts.target).context("target host")?.clone();
        let t0 = Instant::now();
        for n in &setup.net_faults {
            net.set(n.rule.clone())?;
        }
        let host_sched = if setup.host_faults.is_empty() {
            None
        } else {
            crate::host::check(&setup.host_faults, false)?;
            let pids: Vec<u32> = netns::pids(&th.namespace).into_iter().map(|p| p as u32).collect();
            Some(crate::host::Schedule::start(setup.host_faults.clone(), crate::host::Targets { pids, restart: None }, t0)?)
        };
        r.phase(&format!("workload from {} client(s) against {uri}", hosts.clients.len()));
        let done = Arc::new(AtomicBool::new(false));
        let mut probe_hosts = vec![ProbeHost { name: th.name.clone(), namespace: th.namespace.clone(), client: None }];
        let progresses: Vec<Arc<Progress>> = hosts.clients.iter().map(|_| Arc::new(Progress::new())).collect();
        // looked up before the cutter starts: nothing below returns early while it watches
        let client_hosts = hosts.clients.iter().map(|c| net.host(c).context("client host").cloned()).collect::<Result<Vec<_>>>()?;
        // a power cut of the target (the spec allows it with faultline's target): the cutter
        // watches its trigger from here, the workload's start; each client tracks what it
        // made durable in its own slice, and no sync returning after the cut counts
        let power_off = Arc::new(AtomicBool::new(false));
        let mut crash_rec = None;
        let cutter = match (&setup.power_cut, &self.disk) {
            (Some(pc), Some(disk)) => {
                let seed = pc.seed.unwrap_or_else(rand::random);
                crash_rec = Some(super::crash_record(pc, seed));
                // the client hosts keep their power: each runs on into the dead target until
                // an I/O fails, at most as long as the NBD policy takes to give up on one request
                let until_error = match &ws[0].interface {
                    crate::workload::Interface::Nbd { target } => {
                        let p = &target.policy;
                        (p.timeout + p.backoff_max) * (p.retries + 1) + Duration::from_secs(1)
                    }
                    _ => Duration::from_secs(10),
                };
                let victims = super::crash::Victims {
                    progress: progresses.iter().map(|p| p.clone() as Arc<dyn super::crash::Running>).collect(),
                    power_off: Some(power_off.clone()),
                    until_error: Some(until_error),
                    ..Default::default()
                };
                Some(super::crash::Cutter::start(pc, seed, disk.clone(), victims)?)
            }
            (Some(_), None) => bail!("a power cut needs `target: faultline` (the spec refuses it otherwise)"),
            _ => None,
        };
        let track = cutter.is_some();
        let mut threads = Vec::new();
        for ((h, progress), w) in client_hosts.into_iter().zip(&progresses).zip(ws) {
            let progress = progress.clone();
            let tid = Arc::new(AtomicI32::new(0));
            probe_hosts.push(ProbeHost { name: h.name.clone(), namespace: h.namespace.clone(), client: Some((tid.clone(), progress.clone())) });
            let (w, ns, off) = (w.clone(), h.namespace.clone(), power_off.clone());
            threads.push((
                h.name.clone(),
                std::thread::spawn(move || -> Result<(WorkloadResult, Option<crate::workload::Maps>)> {
                    enter(&ns)?;
                    tid.store(nix::unistd::gettid().as_raw(), Relaxed);
                    let mut maps = crate::workload::Maps::new(&w)?;
                    if track {
                        maps.track_durability()?;
                        if let Some(d) = maps.durability.as_mut() {
                            d.power_off = off;
                        }
                    }
                    let res = crate::workload::run(&w, &maps, None, Some(&progress))?;
                    Ok((res, track.then_some(maps)))
                }),
            ));
        }
        let prober = Prober { hosts: probe_hosts, net: net.clone(), disk: self.disk.clone(), t0, interval: hosts.interval };
        let first_progress = progresses.first().cloned();
        let pdone = done.clone();
        let probe_thread = std::thread::spawn(move || prober.run(pdone));
        // Ctrl-C: the clients stop early, then everything is torn down in order
        let watcher = super::pipeline::forward_stop(r.stop, progresses, done.clone());
        let mut results = Vec::new();
        let mut first_err = None;
        let mut client_maps = Vec::new();
        for (name, t) in threads {
            match t.join().map_err(|_| anyhow::anyhow!("client {name}: its thread panicked")).and_then(|r| r) {
                Ok((r, m)) => {
                    client_maps.push((name.clone(), m));
                    results.push((name, r));
                }
                Err(e) => {
                    first_err.get_or_insert(e.context(format!("client {name}")));
                }
            }
        }
        done.store(true, Relaxed);
        // the cutter stops with the workload, whatever else failed
        let cut = cutter.map(|c| c.finish()).transpose();
        let probes = probe_thread.join().unwrap_or_default();
        let _ = watcher.join();
        let host_records = host_sched.map(|h| h.stop()).unwrap_or_default();
        let links = net.show().unwrap_or_default();
        // a route that reached the relay after a window opened: that window's first packets
        // took the kernel's path and missed its rules, so its figures are not the fault's
        for l in links["links"].as_array().into_iter().flatten().filter(|l| l["late_switches"].as_u64().is_some_and(|n| n > 0)) {
            let ms = |k: &str| l[k].as_f64().unwrap_or(0.0) / 1000.0;
            r.notes.push(format!(
                "network: the link {} -> {} reached the relay {} time(s) only after a rule's window had opened, up to {:.0} ms late (its slowest route change took {:.0} ms): the first packets of that window missed its rules",
                l["from"].as_str().unwrap_or_default(),
                l["to"].as_str().unwrap_or_default(),
                l["late_switches"],
                ms("late_switch_max_us"),
                ms("route_change_max_us")
            ));
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        if r.stop.load(Relaxed) {
            bail!("interrupted");
        }
        let cut = cut?.flatten();
        if let Some(mut rec) = crash_rec {
            super::crash_fired(&mut rec, cut);
            let failed: Vec<(String, u64)> = results.iter().map(|(n, x)| (n.clone(), x.errors.values().sum::<u64>())).collect();
            if rec.fired {
                r.notes.push(super::crash::lost_power_note(rec.t_s, "", &failed));
            }
            self.crash = Some(rec);
            self.clients_cut = client_maps
                .into_iter()
                .zip(ws)
                .zip(failed)
                .filter_map(|(((host, m), w), (_, failed_ios))| m.map(|maps| ClientCut { host, w: w.clone(), maps, failed_ios }))
                .collect();
        }
        let mut networked = NetworkedRun {
            hosts: net
                .hosts()
                .iter()
                .map(|h| NetworkedHost {
                    name: h.name.clone(),
                    role: if h.name == hosts.target { "target".into() } else { "client".into() },
                    address: h.address.to_string(),
                    namespace: h.namespace.clone(),
                })
                .collect(),
            interval_s: hosts.interval.as_secs_f64(),
            cpu_source: CPU_SOURCE.into(),
            clients: results.iter().map(|(n, r)| client_series(n, r, 0.0)).collect(),
            probes,
            windows: windows(setup, hosts),
            window_stats: vec![],
            links,
            start_lag_s: first_progress.and_then(|p| p.start.get().map(|s| s.saturating_duration_since(t0).as_secs_f64())).unwrap_or(0.0),
            agents: vec![],
        };
        networked.analyse();
        o.networked = Some(networked);
        // the repetition's own figures are the first client's (all clients are in `networked`)
        o.workload = Some(results.into_iter().next().context("no client result")?.1);
        o.host_faults = host_records;
        Ok(())
    }

    /// After a power cut of the target: its disk powers on (the clients stopped at the cut),
    /// and the durability oracle rereads every block each client wrote over NBD, from that
    /// client's host, through a client of its own (nothing cached above the target's disk),
    /// in the client's slice. The record's oracle is the sum; `clients` has each one's.
    fn crash(&mut self, r: &mut Rep, o: &mut Outcome) -> Result<()> {
        let Some(mut rec) = self.crash.take().and_then(|rec| super::crash::begin(rec, r, o, " of the target")) else { return Ok(()) };
        let t = Instant::now();
        let disk = self.disk.as_ref().context("a power cut needs faultline's target")?;
        disk.power_on()?;
        if !self.clients_cut.is_empty() {
            let net = self.net.as_ref().expect("hosts built before the crash");
            r.phase(&format!("crash: durability oracle (over NBD, from each of {} client host(s))", self.clients_cut.len()));
            let torn = rec.model == Some(crate::disk::cache::SurvivalModel::Torn);
            let mut clients = Vec::new();
            for c in &self.clients_cut {
                let ns = net.host(&c.host).context("client host")?.namespace.clone();
                let report = std::thread::scope(|sc| {
                    sc.spawn(|| -> Result<_> {
                        enter(&ns)?;
                        crate::verify::crash::verify_crash(&c.maps, torn)
                    })
                    .join()
                    .map_err(|_| anyhow::anyhow!("the oracle's thread panicked"))
                })??;
                clients.push(super::crash::client_oracle(&c.host, &c.w, c.failed_ios, report));
            }
            super::crash::set_client_oracles(&mut rec, clients);
        }
        rec.phase_s = t.elapsed().as_secs_f64();
        o.crash = Some(rec);
        Ok(())
    }

    fn collect(&mut self, r: &mut Rep, o: &mut Outcome) -> Result<()> {
        if let Some(d) = &self.disk {
            (o.faults, o.rules) = super::pipeline::collect_faults(&[&**d as &dyn FaultControl], &self.seq0, &mut r.notes)?;
        }
        Ok(())
    }

    /// The target's server, then the hosts.
    fn teardown(&mut self, _: &mut Rep) -> Result<()> {
        let stopped = self.target.take().map_or(Ok(()), Target::stop);
        self.disk = None;
        let down = match self.net.take().map(Arc::try_unwrap) {
            Some(Ok(net)) => net.down().map(drop),
            Some(Err(_)) => Err(anyhow::anyhow!("the network is still in use")),
            None => Ok(()),
        };
        stopped?;
        down
    }
}
