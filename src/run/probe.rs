//! Host sampling shared by the namespace run's prober (run::hosts) and `faultline agent
//! --probe` (run::agents' probers on remote hosts): CPU of processes and of the machine,
//! memory, link and TCP counters from /proc.

use std::time::Duration;

use crate::report::networked::HostCounters;

pub fn ticks_per_s() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100).max(1) as f64
}

/// (user, system) seconds of a process.
pub fn proc_cpu(pid: u32) -> (f64, f64) {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return (0.0, 0.0) };
    let Some(i) = s.rfind(')') else { return (0.0, 0.0) };
    let f: Vec<&str> = s[i + 2..].split(' ').collect();
    let g = |k: usize| f.get(k).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) / ticks_per_s();
    (g(11), g(12))
}

pub fn proc_rss_mib(pid: u32) -> f64 {
    let pages: f64 = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok().and_then(|s| s.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0.0);
    pages * 4096.0 / (1 << 20) as f64
}

/// /proc/stat's first line: (user+nice, system+irq+softirq, steal, total) in ticks.
pub fn machine_cpu() -> (u64, u64, u64, u64) {
    let s = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = s.lines().next().unwrap_or("").split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let g = |i: usize| v.get(i).copied().unwrap_or(0);
    (g(0) + g(1), g(2) + g(5) + g(6), g(7), v.iter().take(8).sum())
}

pub fn mem_available_mib() -> f64 {
    let s = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    s.lines().find(|l| l.starts_with("MemAvailable:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok()).unwrap_or(0.0) / 1024.0
}

/// (rx packets, rx dropped, tx packets, tx dropped) of interface `iface` (None: every
/// interface but lo, summed) from a net/dev file (`/proc/net`, or a namespace's).
pub fn link_counters(proc_net: &str, iface: Option<&str>) -> (u64, u64, u64, u64) {
    let s = std::fs::read_to_string(format!("{proc_net}/dev")).unwrap_or_default();
    let mut t = (0, 0, 0, 0);
    for l in s.lines().filter(|l| l.contains(':')) {
        let name = l.split(':').next().unwrap_or("").trim();
        if iface.map_or(name == "lo", |i| name != i) {
            continue;
        }
        let v: Vec<u64> = l.split(':').nth(1).unwrap_or("").split_whitespace().filter_map(|x| x.parse().ok()).collect();
        let g = |i: usize| v.get(i).copied().unwrap_or(0);
        t = (t.0 + g(1), t.1 + g(3), t.2 + g(9), t.3 + g(11));
    }
    t
}

/// TCP RetransSegs from a net/snmp file of the namespace.
pub fn tcp_retrans(proc_net: &str) -> u64 {
    let s = std::fs::read_to_string(format!("{proc_net}/snmp")).unwrap_or_default();
    let tcp: Vec<&str> = s.lines().filter(|l| l.starts_with("Tcp:")).collect();
    if tcp.len() < 2 {
        return 0;
    }
    let names: Vec<&str> = tcp[0].split_whitespace().collect();
    let vals: Vec<&str> = tcp[1].split_whitespace().collect();
    names.iter().position(|n| *n == "RetransSegs").and_then(|i| vals.get(i)?.parse().ok()).unwrap_or(0)
}

/// Processes whose process group is `pgid` (what an agent's spawned command became).
pub fn group_pids(pgid: i32) -> Vec<u32> {
    let Ok(d) = std::fs::read_dir("/proc") else { return vec![] };
    d.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            let s = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            s.rfind(')').and_then(|i| s[i + 2..].split(' ').nth(2)?.parse::<i32>().ok()) == Some(pgid)
        })
        .collect()
}

/// One host sample of `faultline agent --probe`: the host's clock, the groups' CPU and
/// memory, the machine's CPU and memory, link and TCP counters; counters are deltas since the
/// previous sample.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct HostSample {
    pub t_ns: u64,
    #[serde(flatten)]
    pub sys: HostCounters,
}

/// Sample this host every `interval` (on multiples of it from the first sample), `count`
/// times (None: until stdout closes), CPU and memory of the processes in `groups`, requests
/// of the disk server at `socket`; each sample goes to `emit`, which returns false to stop.
pub fn stream(interval: Duration, groups: &[i32], socket: Option<&str>, count: Option<u64>, mut emit: impl FnMut(&HostSample) -> bool) {
    // the server's request counter (0 without a socket or while it cannot be asked)
    let requests = || {
        socket
            .and_then(|s| {
                crate::frontend::control::Client(crate::frontend::control::Socket { path: s.into(), timeout: Some(Duration::from_secs(30)) }).stats().ok()
            })
            .map_or(0, |st| st.faults.requests)
    };
    let mut last_req = requests();
    let t0 = std::time::Instant::now();
    let mut last_m = machine_cpu();
    let pids = || groups.iter().flat_map(|g| group_pids(*g)).collect::<Vec<u32>>();
    let cpu = |p: &[u32]| p.iter().map(|x| proc_cpu(*x)).fold((0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1));
    let links = || {
        let l = link_counters("/proc/net", None);
        (l, tcp_retrans("/proc/net"))
    };
    let mut last_cpu = cpu(&pids());
    let mut last_l = links();
    let mut last_t = 0.0;
    for k in 1.. {
        if count.is_some_and(|c| k > c) {
            return;
        }
        let due = interval * k as u32;
        std::thread::sleep(due.saturating_sub(t0.elapsed()));
        let t = t0.elapsed().as_secs_f64();
        let dt = (t - last_t).max(1e-3);
        let m = machine_cpu();
        let total = (m.3.saturating_sub(last_m.3)).max(1) as f64;
        let mp = |a: u64, b: u64| a.saturating_sub(b) as f64 / total * 100.0;
        let p = pids();
        let c = cpu(&p);
        let l = links();
        let req = requests();
        let d = |a: u64, b: u64| a.saturating_sub(b);
        let s = HostSample {
            t_ns: crate::sys::now_ns(),
            sys: HostCounters {
                cpu_user_pct: (c.0 - last_cpu.0).max(0.0) / dt * 100.0,
                cpu_system_pct: (c.1 - last_cpu.1).max(0.0) / dt * 100.0,
                machine_user_pct: mp(m.0, last_m.0),
                machine_system_pct: mp(m.1, last_m.1),
                machine_steal_pct: mp(m.2, last_m.2),
                rss_mib: p.iter().map(|x| proc_rss_mib(*x)).sum(),
                mem_available_mib: mem_available_mib(),
                rx_packets: d(l.0.0, last_l.0.0),
                rx_dropped: d(l.0.1, last_l.0.1),
                tx_packets: d(l.0.2, last_l.0.2),
                tx_dropped: d(l.0.3, last_l.0.3),
                tcp_retrans: d(l.1, last_l.1),
                requests: d(req, last_req),
            },
        };
        last_req = req;
        (last_m, last_cpu, last_l, last_t) = (m, c, l, t);
        if !emit(&s) {
            return;
        }
    }
}
