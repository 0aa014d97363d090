//! The user-space netem: one thread, an event loop, reads every host's TUN device and forwards
//! each IPv4 packet to the TUN device of the host it is addressed to, through the rules of that
//! link (source host -> destination host). A packet no active rule delays is written at once;
//! delayed packets wait in the loop's own deadline heap and are written when due.
//!
//! One thread for all because a write into a host's TUN device runs that host's receive path
//! in the writer, so the answer (a ping's reply, a TCP ACK) is in the other device's queue when
//! the write returns: the loop reads it at once, and a round trip through the relay costs one
//! thread wake-up (the first packet's), not one per direction and per timer. The loop drains
//! every device (a batch each in turn) before it sleeps, and it sleeps in one `ppoll` on all
//! devices until shortly before the next deadline (by the lateness of its recent timed
//! wake-ups, at least `SPIN`; 1 ns timer slack), then polls without sleeping up to it. Buffers of delayed packets are recycled, so the steady state
//! allocates nothing.
//!
//! Kernel fast path (`bypass`): when the hosts are also joined by veth pairs, a host's route
//! to a peer points at the veth while no rule on that link (direction) is active or about to
//! be, and at its TUN device (the relay) otherwise. The switch to the relay is made
//! `BYPASS_LEAD` before a rule's window opens (at once for a rule active now, before `set`
//! returns), so the relay sees every packet the rule applies to; the switch back waits until
//! the rule is over and the link has no packet left in the timer queue.

use super::packet;
use super::tun;
use crate::spec::net::{Loss, NetFault, NetRule};
use crate::spec::rule::DelayDist;
use crate::sys::timer::{SPIN, Timed};
use anyhow::{Result, bail};
use arc_swap::ArcSwap;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::Distribution;
use serde_json::{Value, json};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Largest packet a TUN read returns: a 64 KiB segmentation burst and its header.
const MAX_PKT: usize = 65536 + tun::VNET_HDR;
/// Delayed packets waiting for one destination host at most (beyond: dropped and counted), so
/// a long delay on a fast link cannot take all memory.
const MAX_PENDING: usize = 65536;
/// How late a delayed packet may leave before it is dropped instead (`Loop::fire`).
const OVERDUE: Duration = Duration::from_millis(10);
/// Reads from one device before the loop turns to the next (and to due packets), so a busy
/// sender cannot starve the other devices or hold delayed packets past their time.
const BATCH: usize = 32;
/// The most the loop polls without sleeping before a deadline (`Loop::run`'s `lead`).
const MAX_LEAD: Duration = Duration::from_micros(250);
/// Recycled buffers kept: packets (at most `POOL_BUF` bytes of capacity each), and
/// segmentation bursts (delayed whole under a fixed delay; up to `MAX_PKT` each).
const POOL_MAX: usize = 8192;
const POOL_BUF: usize = 2048;
const POOL_BIG_MAX: usize = 512;
/// How long before a rule's window opens its link is routed through the relay: the route
/// change (an `ip` run) must be done before the first packet the rule applies to.
pub const BYPASS_LEAD: Duration = Duration::from_millis(250);
/// The route controller looks again at least this often (windows ending, queues draining).
const BYPASS_TICK: Duration = Duration::from_millis(20);

/// One emulated host as the relay sees it.
pub struct Port {
    pub name: String,
    pub addr: Ipv4Addr,
    /// The host's TUN device: the relay reads what the host sends and writes what it receives.
    /// With `raw`, a raw IP socket (IP_HDRINCL, connected to `addr`) instead: packets to this
    /// host leave through it without their virtio-net header, and nothing is read from it (a
    /// peer of an agent's host, reached by the host's own network: cluster::egress).
    pub fd: OwnedFd,
    pub raw: bool,
    /// The host's namespace, where `show` reads the TUN device's own drop counter ("" for
    /// this process's own).
    pub namespace: String,
    /// Per peer host (by index): the kernel path that reaches it directly, or None (always
    /// through the relay).
    pub bypass: Vec<Option<Bypass>>,
}

/// A link's kernel fast path: the route commands (`ip` arguments) that send its packets
/// through the relay, and back on the direct path.
#[derive(Clone, Debug)]
pub struct Bypass {
    /// The device of the direct path (its counters in `show`).
    pub dev: String,
    pub to_relay: Vec<String>,
    pub direct: Vec<String>,
}

#[derive(Default)]
struct Counters {
    packets: AtomicU64,
    bytes: AtomicU64,
    delivered: AtomicU64,
    dropped: AtomicU64,
    delayed: AtomicU64,
    duplicated: AtomicU64,
    reordered: AtomicU64,
    reset: AtomicU64,
    /// Delayed packets dropped because the relay fell more than `OVERDUE` behind.
    overdue: AtomicU64,
    /// Packets the destination's TUN device refused (its receive backlog full: EAGAIN,
    /// ENOBUFS), as a congested wire drops them. Not in `dropped`, which counts what the
    /// network faults dropped (rules, `overdue`, the timer queue's bound).
    backlog_full: AtomicU64,
}

struct RuleState {
    rng: SmallRng,
    /// Gilbert-Elliott: in the bad state.
    bad: bool,
    /// Token bucket as a virtual clock: when the bytes accepted so far have drained.
    tat: Option<Instant>,
}

/// A rule as installed on one link (its own random state and bucket).
struct LinkRule {
    id: u64,
    fault: NetFault,
    window: Option<crate::spec::rule::Window>,
    set_at: Instant,
    st: Mutex<RuleState>,
}

impl LinkRule {
    fn active(&self, now: Instant) -> bool {
        match self.window {
            None => true,
            Some(w) => {
                let e = now.saturating_duration_since(self.set_at);
                e >= w.from && w.to.is_none_or(|t| e < t)
            }
        }
    }
}

struct Link {
    rules: ArcSwap<Vec<Arc<LinkRule>>>,
    c: Counters,
    /// Lateness of delayed packets (ns past their due time when written).
    late: Mutex<hdrhistogram::Histogram<u64>>,
    /// Packets of this link waiting in a timer queue.
    pending: AtomicU64,
    /// The sender's route to the receiver points at the relay (always, without a bypass).
    via_relay: AtomicBool,
    /// Switches to the relay that came after a rule's window had opened (`BYPASS_LEAD` was
    /// not enough), so the window's first packets missed the rule; the latest of them (µs
    /// past its window's start), and the slowest route change (µs, one `ip` run).
    late_switches: AtomicU64,
    late_switch_max_us: AtomicU64,
    route_change_max_us: AtomicU64,
}

struct Pending {
    dst: usize,
    link: usize,
    due: Instant,
    buf: Vec<u8>,
}

/// A rule as set: its id and the moment its window counts from.
type SetRule = (u64, NetRule, Instant);

struct Shared {
    ports: Vec<Port>,
    links: Vec<Link>,
    /// Packets a host sent to no other host (not IPv4, or an unknown address).
    unroutable: Vec<AtomicU64>,
    offloads: Vec<AtomicBool>,
    /// No port is a raw socket: TUN devices may pass segmentation bursts.
    allow_offloads: bool,
    stop: AtomicBool,
    stop_fd: OwnedFd,
    /// The next rule id, and the rules as set (id, rule, when).
    rules: Mutex<(u64, Vec<SetRule>)>,
    busy_poll: Duration,
    normal_priority: bool,
    /// The loop's thread runs real-time (SCHED_FIFO); false if not asked or refused.
    realtime: AtomicBool,
    epoch: Instant,
    /// Serializes route switches; the controller thread waits on `ctl_cv` with it.
    ctl: Mutex<()>,
    ctl_cv: Condvar,
}

pub struct Relay {
    s: Arc<Shared>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

/// Relay settings.
#[derive(Clone, Copy, Debug, Default)]
pub struct RelayOptions {
    /// After a packet, keep reading without sleeping this long: a sleeping reader costs a
    /// wake-up per packet when packets come one at a time, at the price of a busy CPU.
    pub busy_poll: Duration,
    /// Route every packet through the relay, even on links without rules (no veth pairs,
    /// no kernel fast path): what `bench/net.sh` measures as the relay's own cost.
    pub always_relay: bool,
    /// Keep the relay's thread at normal priority (default: real-time, `Loop::run`).
    pub normal_priority: bool,
}

impl Relay {
    pub fn start(ports: Vec<Port>, opts: RelayOptions) -> Result<Relay> {
        let n = ports.len();
        let links = (0..n * n)
            .map(|li| Link {
                rules: ArcSwap::from_pointee(Vec::new()),
                c: Counters::default(),
                late: Mutex::new(hdrhistogram::Histogram::new_with_bounds(1, 120_000_000_000, 2).unwrap()),
                pending: AtomicU64::new(0),
                late_switches: AtomicU64::new(0),
                late_switch_max_us: AtomicU64::new(0),
                route_change_max_us: AtomicU64::new(0),
                via_relay: AtomicBool::new(ports[li / n].bypass.get(li % n).is_none_or(|b| b.is_none())),
            })
            .collect();
        let bypass = ports.iter().any(|p| p.bypass.iter().any(|b| b.is_some()));
        // a raw socket takes only finished packets (at most the MTU, checksums done)
        let allow_offloads = !ports.iter().any(|p| p.raw);
        for p in ports.iter().filter(|p| !p.raw) {
            tun::set_offloads(&p.fd, allow_offloads)?;
        }
        let s = Arc::new(Shared {
            links,
            unroutable: (0..n).map(|_| AtomicU64::new(0)).collect(),
            offloads: (0..n).map(|_| AtomicBool::new(allow_offloads)).collect(),
            allow_offloads,
            ports,
            stop: AtomicBool::new(false),
            stop_fd: tun::eventfd()?,
            rules: Mutex::new((1, Vec::new())),
            busy_poll: opts.busy_poll,
            normal_priority: opts.normal_priority,
            realtime: AtomicBool::new(false),
            epoch: Instant::now(),
            ctl: Mutex::new(()),
            ctl_cv: Condvar::new(),
        });
        let mut threads = Vec::new();
        let s2 = s.clone();
        threads.push(std::thread::Builder::new().name("fl-net-relay".into()).spawn(move || Loop::new(n).run(&s2))?);
        if bypass {
            let s2 = s.clone();
            threads.push(std::thread::Builder::new().name("fl-net-routes".into()).spawn(move || controller(&s2))?);
        }
        Ok(Relay { s, threads: Mutex::new(threads) })
    }

    /// Install a rule on every link it covers; returns its id.
    pub fn set(&self, rule: NetRule) -> Result<u64> {
        self.set_at(rule, Instant::now())
    }

    /// `set`, with the rule's window counted from `now` (a start agreed with other hosts).
    pub fn set_at(&self, rule: NetRule, now: Instant) -> Result<u64> {
        let names: Vec<String> = self.s.ports.iter().map(|p| p.name.clone()).collect();
        rule.validate(&names).map_err(anyhow::Error::msg)?;
        let mut g = self.s.rules.lock().unwrap();
        let id = g.0;
        g.0 += 1;
        g.1.push((id, rule, now));
        self.rebuild(&g.1)?;
        drop(g);
        // the rule's link goes through the relay before `set` returns if it applies now
        reconcile(&self.s)?;
        self.s.ctl_cv.notify_all();
        Ok(id)
    }

    /// Remove rules by id (None: all); returns how many were removed.
    pub fn clear(&self, ids: Option<&[u64]>) -> Result<usize> {
        let mut g = self.s.rules.lock().unwrap();
        let before = g.1.len();
        match ids {
            None => g.1.clear(),
            Some(ids) => {
                if let Some(bad) = ids.iter().find(|i| !g.1.iter().any(|r| r.0 == **i)) {
                    bail!("no network rule {bad}; the rules are {:?} (see `faultline net show`)", g.1.iter().map(|r| r.0).collect::<Vec<_>>());
                }
                g.1.retain(|r| !ids.contains(&r.0));
            }
        }
        let n = before - g.1.len();
        self.rebuild(&g.1)?;
        drop(g);
        reconcile(&self.s)?;
        Ok(n)
    }

    /// Swap in each link's rule list (rules keep their per-link state across rebuilds), and
    /// turn segmentation offloads off on hosts whose outgoing links have rules that decide
    /// per packet (`per_packet`).
    fn rebuild(&self, rules: &[SetRule]) -> Result<()> {
        let n = self.s.ports.len();
        for a in 0..n {
            let mut any = false;
            for b in (0..n).filter(|&b| b != a) {
                let link = &self.s.links[a * n + b];
                let old = link.rules.load();
                let new: Vec<Arc<LinkRule>> = rules
                    .iter()
                    .filter(|(_, r, _)| r.covers(&self.s.ports[a].name, &self.s.ports[b].name))
                    .map(|(id, r, at)| {
                        old.iter().find(|o| o.id == *id).cloned().unwrap_or_else(|| {
                            let seed = r.seed.map(|s| s ^ ((a * n + b) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                            Arc::new(LinkRule {
                                id: *id,
                                fault: r.fault.clone(),
                                window: r.window,
                                set_at: *at,
                                st: Mutex::new(RuleState {
                                    rng: seed.map(SmallRng::seed_from_u64).unwrap_or_else(|| SmallRng::from_rng(&mut rand::rng())),
                                    bad: false,
                                    tat: None,
                                }),
                            })
                        })
                    })
                    .collect();
                any |= new.iter().any(|r| per_packet(&r.fault));
                link.rules.store(Arc::new(new));
            }
            let on = !any && self.s.allow_offloads;
            if !self.s.ports[a].raw && self.s.offloads[a].swap(on, Relaxed) != on {
                tun::set_offloads(&self.s.ports[a].fd, on)?;
            }
        }
        Ok(())
    }

    /// Hosts, rules (with whether each is active now) and per-link counters, as JSON.
    pub fn show(&self) -> Value {
        let s = &self.s;
        let n = s.ports.len();
        let now = Instant::now();
        let rules: Vec<Value> = s
            .rules
            .lock()
            .unwrap()
            .1
            .iter()
            .map(|(id, r, at)| {
                let e = now.saturating_duration_since(*at);
                let active = r.window.is_none_or(|w| e >= w.from && w.to.is_none_or(|t| e < t));
                json!({"id": id, "rule": r, "active": active, "age_s": e.as_secs_f64()})
            })
            .collect();
        // one `ip` per host: its devices' counters (fl0's drops, the veths' packets)
        let stats: Vec<std::collections::HashMap<String, Value>> = s.ports.iter().map(|p| dev_stats(&p.namespace)).collect();
        let mut links = Vec::new();
        for (a, st) in stats.iter().enumerate() {
            for b in (0..n).filter(|&b| b != a) {
                let l = &s.links[a * n + b];
                let c = &l.c;
                let h = l.late.lock().unwrap();
                let q = |p: f64| if h.is_empty() { Value::Null } else { json!(h.value_at_quantile(p) as f64 / 1000.0) };
                links.push(json!({
                    "from": s.ports[a].name, "to": s.ports[b].name,
                    "packets": c.packets.load(Relaxed), "bytes": c.bytes.load(Relaxed),
                    "delivered": c.delivered.load(Relaxed), "dropped": c.dropped.load(Relaxed),
                    "delayed": c.delayed.load(Relaxed), "duplicated": c.duplicated.load(Relaxed),
                    "reordered": c.reordered.load(Relaxed), "reset": c.reset.load(Relaxed), "overdue": c.overdue.load(Relaxed),
                    "backlog_full": c.backlog_full.load(Relaxed),
                    "lateness_us": {"p50": q(0.5), "p99": q(0.99), "max": if h.is_empty() { Value::Null } else { json!(h.max() as f64 / 1000.0) }},
                    "rules": l.rules.load().iter().map(|r| r.id).collect::<Vec<_>>(),
                    "path": if l.via_relay.load(Relaxed) { "relay" } else { "veth" },
                    "late_switches": l.late_switches.load(Relaxed),
                    "late_switch_max_us": l.late_switch_max_us.load(Relaxed),
                    "route_change_max_us": l.route_change_max_us.load(Relaxed),
                    "bypass_packets": s.ports[a].bypass[b].as_ref().and_then(|d| st.get(d.dev.as_str())).map(|v| v["tx"]["packets"].clone()),
                }));
            }
        }
        let hosts: Vec<Value> = s
            .ports
            .iter()
            .enumerate()
            .map(|(i, p)| {
                json!({"name": p.name, "address": p.addr.to_string(), "unroutable": s.unroutable[i].load(Relaxed), "offloads": s.offloads[i].load(Relaxed),
                       "device_tx_dropped": if p.raw { None } else { stats[i].get(super::IFNAME) }.and_then(|v| v["tx"]["dropped"].as_u64())})
            })
            .collect();
        json!({"uptime_s": s.epoch.elapsed().as_secs_f64(), "realtime": s.realtime.load(Relaxed), "hosts": hosts, "rules": rules, "links": links})
    }

    /// Stop the threads; packets still waiting for their time are dropped.
    pub fn stop(self) {
        self.halt();
    }

    /// `stop` for a relay others still hold (the control socket's thread): the threads end,
    /// the devices' descriptors close when the last holder lets go.
    pub fn halt(&self) {
        self.s.stop.store(true, Relaxed);
        let _ = nix::unistd::write(&self.s.stop_fd, &1u64.to_ne_bytes());
        {
            let _g = self.s.ctl.lock().unwrap();
            self.s.ctl_cv.notify_all();
        }
        for t in self.threads.lock().unwrap().drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The counters (`stats64`) of each device in the host, by name, from `ip -s -j link`: fl0's
/// tx dropped are packets the TUN device dropped because its queue was full (the relay fell
/// behind); a veth's tx packets are those that bypassed the relay. Empty if unreadable.
fn dev_stats(ns: &str) -> std::collections::HashMap<String, Value> {
    let mut c = std::process::Command::new("ip");
    if !ns.is_empty() {
        c.args(["-n", ns]);
    }
    let Ok(out) = c.args(["-s", "-j", "link", "show"]).output() else { return Default::default() };
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v.as_array().into_iter().flatten().filter_map(|d| Some((d["ifname"].as_str()?.to_string(), d["stats64"].clone()))).collect()
}

/// Whether link `a -> b` must go through the relay now: a rule on it is active, or opens
/// within `BYPASS_LEAD`, or packets of it still wait in a timer queue. Also returns the next
/// moment this may change by the clock alone (a window opening or closing).
fn wants_relay(l: &Link, now: Instant) -> (bool, Option<Instant>) {
    let mut want = l.pending.load(Relaxed) > 0;
    let mut next: Option<Instant> = None;
    let mut at = |t: Instant| next = Some(next.map_or(t, |n: Instant| n.min(t)));
    for r in l.rules.load().iter() {
        let Some(w) = r.window else {
            want = true;
            continue;
        };
        let open = (r.set_at + w.from).checked_sub(BYPASS_LEAD).unwrap_or(r.set_at).max(r.set_at);
        let close = w.to.map(|t| r.set_at + t);
        if now >= open && close.is_none_or(|c| now < c) {
            want = true;
        }
        if now < open {
            at(open);
        }
        if let Some(c) = close.filter(|&c| now < c) {
            at(c);
        }
    }
    (want, next)
}

/// Point each bypassed link's route where `wants_relay` says (`ip route replace`: atomic, a
/// packet takes one path or the other). Returns the next moment to look again.
fn reconcile(s: &Shared) -> Result<Option<Instant>> {
    let _g = s.ctl.lock().unwrap();
    let n = s.ports.len();
    let now = Instant::now();
    let mut next = None;
    let mut err = None;
    for a in 0..n {
        for b in (0..n).filter(|&b| b != a) {
            let Some(bp) = &s.ports[a].bypass[b] else { continue };
            let l = &s.links[a * n + b];
            let (want, at) = wants_relay(l, now);
            next = match (next, at) {
                (Some(x), Some(y)) => Some(std::cmp::min(x, y)),
                (x, y) => x.or(y),
            };
            if want != l.via_relay.load(Relaxed) {
                let args: Vec<&str> = if want { &bp.to_relay } else { &bp.direct }.iter().map(String::as_str).collect();
                let via = if want { "the relay" } else { bp.dev.as_str() };
                let asked = Instant::now();
                match crate::sys::netns::ip(&args) {
                    Ok(()) => {
                        l.via_relay.store(want, Relaxed);
                        let done = Instant::now();
                        l.route_change_max_us.fetch_max((done - asked).as_micros() as u64, Relaxed);
                        // a window that opened (later than when its rule was set) before the
                        // route was in place
                        let late = l
                            .rules
                            .load()
                            .iter()
                            .filter(|r| r.window.is_some_and(|w| !w.from.is_zero() && r.set_at + w.from < done && r.active(done)))
                            .map(|r| done - (r.set_at + r.window.map_or(Duration::ZERO, |w| w.from)))
                            .max();
                        if let Some(by) = late.filter(|_| want) {
                            l.late_switches.fetch_add(1, Relaxed);
                            l.late_switch_max_us.fetch_max(by.as_micros() as u64, Relaxed);
                        }
                    }
                    Err(e) => err = Some(e.context(format!("cannot route {} -> {} via {via}", s.ports[a].name, s.ports[b].name))),
                }
            }
        }
    }
    match err {
        Some(e) => Err(e),
        None => Ok(next),
    }
}

/// Switches the bypassed links' routes as windows open and close and timer queues drain.
fn controller(s: &Shared) {
    while !s.stop.load(Relaxed) {
        let next = match reconcile(s) {
            Ok(n) => n,
            Err(e) => {
                if !s.stop.load(Relaxed) {
                    eprintln!("faultline: relay: {e:#}");
                }
                None
            }
        };
        let wait = next.map_or(BYPASS_TICK, |t| t.saturating_duration_since(Instant::now()).min(BYPASS_TICK));
        let g = s.ctl.lock().unwrap();
        if s.stop.load(Relaxed) {
            break;
        }
        let _ = s.ctl_cv.wait_timeout(g, wait).unwrap();
    }
}

fn write_pkt(p: &Port, buf: &[u8]) -> bool {
    // a full receive backlog (EAGAIN/ENOBUFS) drops the packet, as a wire would
    let buf = if p.raw { buf.get(tun::VNET_HDR..).unwrap_or_default() } else { buf };
    nix::unistd::write(&p.fd, buf).is_ok()
}

fn lookup(s: &Shared, addr: Ipv4Addr) -> Option<usize> {
    s.ports.iter().position(|p| p.addr == addr)
}

fn sample(d: &DelayDist, rng: &mut SmallRng) -> Duration {
    let secs = match *d {
        DelayDist::Fixed(d) => return d,
        DelayDist::Uniform { min, max } => rng.random_range(min.as_secs_f64()..=max.as_secs_f64()),
        DelayDist::Normal { mean, stddev } => rand_distr::Normal::new(mean.as_secs_f64(), stddev.as_secs_f64()).map(|n| n.sample(rng)).unwrap_or(0.0),
        DelayDist::Lognormal { median, sigma } => rand_distr::LogNormal::new(median.as_secs_f64().ln(), sigma).map(|n| n.sample(rng)).unwrap_or(0.0),
        DelayDist::Pareto { scale, shape } => rand_distr::Pareto::new(scale.as_secs_f64(), shape).map(|n| n.sample(rng)).unwrap_or(0.0),
    };
    // a heavy tail must not hold a packet for ever
    Duration::from_secs_f64(secs.clamp(0.0, 60.0))
}

/// Whether a fault must see each packet as it would be on a wire (at most the MTU), rather
/// than a segmentation burst of up to 64 KiB: loss, duplication, reordering, jitter, a drawn
/// delay and the rate queue decide per packet. A fixed delay, a partition and a reset treat
/// every segment of a burst alike, so the burst may pass whole (full speed under them).
fn per_packet(f: &NetFault) -> bool {
    f.loss.is_some()
        || f.duplicate.is_some()
        || f.reorder.is_some()
        || f.jitter.is_some()
        || f.rate.is_some()
        || !matches!(f.delay, None | Some(DelayDist::Fixed(_)))
}

/// What the rules of a link decide for one packet.
enum Verdict {
    Drop,
    Send { extra: Duration, copies: u8 },
}

fn judge(s: &Shared, i: usize, rules: &[Arc<LinkRule>], pkt: &[u8], c: &Counters, scratch: &mut Vec<u8>) -> Verdict {
    let now = Instant::now();
    let mut extra = Duration::ZERO;
    let mut copies = 1u8;
    for r in rules.iter().filter(|r| r.active(now)) {
        let f = &r.fault;
        if f.partition {
            return Verdict::Drop;
        }
        if f.reset && packet::tcp_reset_for(pkt, scratch) {
            // the sender hears a RST from the peer; the segment never arrives
            write_pkt(&s.ports[i], scratch);
            c.reset.fetch_add(1, Relaxed);
            return Verdict::Drop;
        }
        let mut st = r.st.lock().unwrap();
        let st = &mut *st;
        match f.loss {
            Some(Loss::Random { probability }) if st.rng.random::<f64>() < probability => return Verdict::Drop,
            Some(Loss::GilbertElliott { p, r, loss_good, loss_bad }) => {
                st.bad = if st.bad { st.rng.random::<f64>() >= r } else { st.rng.random::<f64>() < p };
                if st.rng.random::<f64>() < if st.bad { loss_bad } else { loss_good } {
                    return Verdict::Drop;
                }
            }
            _ => {}
        }
        if let Some(d) = f.duplicate
            && st.rng.random::<f64>() < d
        {
            copies = 2;
            c.duplicated.fetch_add(1, Relaxed);
        }
        if let Some(d) = &f.delay {
            let mut dl = sample(d, &mut st.rng);
            if let Some(j) = f.jitter {
                let j = j.as_secs_f64();
                dl = Duration::from_secs_f64((dl.as_secs_f64() + st.rng.random_range(-j..=j)).max(0.0));
            }
            extra += dl;
        }
        if let Some(ro) = f.reorder
            && st.rng.random::<f64>() < ro.probability
        {
            extra += ro.gap;
            c.reordered.fetch_add(1, Relaxed);
        }
        if let Some(rate) = f.rate {
            let t = now + extra;
            let bits = (pkt.len() - tun::VNET_HDR) as f64 * 8.0;
            let tx = Duration::from_secs_f64(bits / rate.bits_per_sec as f64);
            let burst = Duration::from_secs_f64(rate.burst as f64 * 8.0 / rate.bits_per_sec as f64);
            let tat = st.tat.map_or(t, |x| x.max(t));
            let depart = (tat + tx).checked_sub(burst).map_or(t, |d| d.max(t));
            if depart - t > rate.queue {
                return Verdict::Drop;
            }
            st.tat = Some(tat + tx);
            extra = depart - now;
        }
    }
    Verdict::Send { extra, copies }
}

/// The relay's thread: the devices it reads, the packets waiting for their time, and the
/// recycled buffers (touched by this thread only, so without locks).
struct Loop {
    heap: BinaryHeap<Reverse<Timed<Pending>>>,
    seq: u64,
    /// Delayed packets waiting per destination host (bounded by `MAX_PENDING`).
    queued: Vec<usize>,
    pool: Vec<Vec<u8>>,
    pool_big: Vec<Vec<u8>>,
    scratch: Vec<u8>,
}

impl Loop {
    fn new(n: usize) -> Loop {
        Loop { heap: BinaryHeap::new(), seq: 0, queued: vec![0; n], pool: Vec::new(), pool_big: Vec::new(), scratch: Vec::with_capacity(128) }
    }

    fn run(&mut self, s: &Shared) {
        use nix::errno::Errno;
        // a sleep overshoots its deadline by the timer slack (50 µs by default): ask for 1 ns
        // SAFETY: PR_SET_TIMERSLACK takes a value, no pointer; it affects this thread only
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64) };
        // A packet wakes this thread; at normal priority the wake-up waits for a CPU behind
        // whatever else runs (tens of µs per round trip on a busy machine), where a wire or a
        // kernel driver's softirq would not wait. Real-time priority 1 preempts ordinary tasks
        // at once; the thread sleeps whenever no packet is ready or due (spinning at most `SPIN`
        // before a deadline, or `busy_poll`), and the kernel's real-time throttling keeps 5% of
        // each CPU for others. Refused (no CAP_SYS_NICE, a cgroup without real-time budget):
        // normal priority, reported by `show`.
        if !s.normal_priority {
            let p = libc::sched_param { sched_priority: 1 };
            // SAFETY: sched_setscheduler reads `p`, alive for the call; pid 0 is this thread
            let ok = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &p) } == 0;
            s.realtime.store(ok, Relaxed);
        }
        let mut buf = vec![0u8; MAX_PKT];
        let readers: Vec<usize> = (0..s.ports.len()).filter(|&i| !s.ports[i].raw).collect();
        let mut fds: Vec<libc::pollfd> = readers
            .iter()
            .map(|&i| s.ports[i].fd.as_raw_fd())
            .chain(std::iter::once(s.stop_fd.as_raw_fd()))
            .map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
            .collect();
        let mut last = Instant::now();
        // How long before a deadline the loop stops sleeping: twice the mean lateness of its
        // timed wake-ups (in a VM tens of µs, more on a loaded host), at least `SPIN`, so a
        // packet is released on time and not a wake-up late; the polling meanwhile also reads
        // what arrives without a wake-up
        let mut lead = SPIN;
        let mut wake_ns = 0u64;
        while !s.stop.load(Relaxed) {
            self.fire(s);
            let mut progress = false;
            for (k, &i) in readers.iter().enumerate() {
                if fds[k].fd < 0 {
                    continue;
                }
                for _ in 0..BATCH {
                    match nix::unistd::read(&s.ports[i].fd, &mut buf) {
                        Ok(len) if len > 0 => {
                            self.forward(s, i, &buf[..len]);
                            progress = true;
                        }
                        Err(Errno::EAGAIN) => break,
                        Err(Errno::EINTR) => {}
                        r => {
                            // this host's device is gone or broken: the others go on
                            eprintln!("faultline: relay: reading host {}: {}", s.ports[i].name, r.err().map_or("end of file".into(), |e| e.to_string()));
                            fds[k].fd = -1;
                            break;
                        }
                    }
                }
            }
            let now = Instant::now();
            if progress {
                last = now;
                continue;
            }
            if !s.busy_poll.is_zero() && now - last < s.busy_poll {
                std::hint::spin_loop();
                continue;
            }
            // nothing to read: sleep until a device is readable or until `lead` before the next
            // deadline; nearer than that, poll without sleeping (a wake-up may come late)
            let timeout = match self.heap.peek().map(|Reverse(t)| t.at.saturating_duration_since(now)) {
                Some(d) if d <= lead => continue,
                Some(d) => Some(d - lead),
                None => None,
            };
            let ts = timeout.map(|d| libc::timespec { tv_sec: d.as_secs() as libc::time_t, tv_nsec: d.subsec_nanos() as libc::c_long });
            let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
            // SAFETY: `fds` is a live array of `fds.len()` pollfds; `tsp` is null or points at
            // `ts`, alive for the call; no signal mask is passed
            let r = unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, tsp, std::ptr::null()) };
            if let (0, Some(t)) = (r, timeout) {
                // woken by the timeout: how late the machine delivered it sets the next lead
                let over = Instant::now().saturating_duration_since(now + t);
                wake_ns = (wake_ns * 7 + over.as_nanos() as u64) / 8;
                lead = Duration::from_nanos(2 * wake_ns).clamp(SPIN, MAX_LEAD);
            }
        }
    }

    /// Writes the delayed packets that are due. A packet that is more than `OVERDUE` late when
    /// its turn comes is dropped instead: the relay has fallen behind (a fast sender, a busy
    /// machine), and like a congested queue it tells TCP so by a loss rather than by holding
    /// ever more packets ever longer.
    fn fire(&mut self, s: &Shared) {
        if self.heap.is_empty() {
            return;
        }
        let now = Instant::now();
        while self.heap.peek().is_some_and(|Reverse(t)| t.at <= now) {
            let p = self.heap.pop().unwrap().0.item;
            self.queued[p.dst] -= 1;
            let link = &s.links[p.link];
            link.pending.fetch_sub(1, Relaxed);
            let late = Instant::now().saturating_duration_since(p.due);
            if late > OVERDUE {
                link.c.overdue.fetch_add(1, Relaxed);
                link.c.dropped.fetch_add(1, Relaxed);
            } else if write_pkt(&s.ports[p.dst], &p.buf) {
                link.c.delivered.fetch_add(1, Relaxed);
                let _ = link.late.lock().unwrap().record((late.as_nanos() as u64).max(1));
            } else {
                link.c.backlog_full.fetch_add(1, Relaxed);
            }
            let (pool, max) = if p.buf.capacity() <= POOL_BUF { (&mut self.pool, POOL_MAX) } else { (&mut self.pool_big, POOL_BIG_MAX) };
            if pool.len() < max {
                pool.push(p.buf);
            }
        }
    }

    #[inline]
    fn forward(&mut self, s: &Shared, i: usize, pkt: &[u8]) {
        let n = s.ports.len();
        let Some(j) = packet::ipv4_dst(pkt).and_then(|a| lookup(s, a)).filter(|&j| j != i) else {
            s.unroutable[i].fetch_add(1, Relaxed);
            return;
        };
        let li = i * n + j;
        let link = &s.links[li];
        let c = &link.c;
        c.packets.fetch_add(1, Relaxed);
        c.bytes.fetch_add((pkt.len() - tun::VNET_HDR) as u64, Relaxed);
        let rules = link.rules.load();
        let (extra, copies) = if rules.is_empty() {
            (Duration::ZERO, 1)
        } else {
            match judge(s, i, &rules, pkt, c, &mut self.scratch) {
                Verdict::Drop => {
                    c.dropped.fetch_add(1, Relaxed);
                    return;
                }
                Verdict::Send { extra, copies } => (extra, copies),
            }
        };
        if extra.is_zero() {
            for _ in 0..copies {
                if write_pkt(&s.ports[j], pkt) {
                    c.delivered.fetch_add(1, Relaxed);
                } else {
                    c.backlog_full.fetch_add(1, Relaxed);
                }
            }
            return;
        }
        let due = Instant::now() + extra;
        c.delayed.fetch_add(1, Relaxed);
        for _ in 0..copies {
            if self.queued[j] >= MAX_PENDING {
                c.dropped.fetch_add(1, Relaxed);
                continue;
            }
            let pool = if pkt.len() <= POOL_BUF { &mut self.pool } else { &mut self.pool_big };
            let mut buf = pool.pop().unwrap_or_default();
            buf.clear();
            buf.extend_from_slice(pkt);
            link.pending.fetch_add(1, Relaxed);
            self.queued[j] += 1;
            // `seq` keeps equal deadlines in arrival order
            self.seq += 1;
            self.heap.push(Reverse(Timed { at: due, seq: self.seq, item: Pending { dst: j, link: li, due, buf } }));
        }
    }
}
