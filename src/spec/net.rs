//! Emulated hosts and network faults (docs/net.md): `HostsSpec` (the hosts of an experiment,
//! each a network namespace) and `NetRule` (faults on the packets from one host to another,
//! sticky or in a window). Plain settings and their parsing; the relay that applies them is
//! `net`.

use super::rule::{DelayDist, Window};
use super::units::{parse_duration, parse_ratio};
use serde::{Deserialize, Serialize};
use std::time::Duration;

pub const HOST_NAME_HELP: &str = "1 to 16 characters out of a-z, 0-9, '-', starting with a letter, e.g. client, target, client-2";

/// A host name as a namespace name and an address label may carry it.
pub fn check_host_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 16
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok { Ok(()) } else { Err(format!("`{name}` is not a host name; expected {HOST_NAME_HELP}")) }
}

/// What runs in a host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostRole {
    /// Drives the workload.
    Client,
    /// faultline's NBD server with its own disk and rules.
    Target,
    /// Any server started by a command in the host (e.g. `nbdkit memory 1G`).
    Command(String),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostSpec {
    pub name: String,
    pub role: HostRole,
}

/// The hosts of a networked experiment, in address order (the first gets 10.77.0.1).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostsSpec {
    pub hosts: Vec<HostSpec>,
}

impl HostsSpec {
    /// Check names (valid, distinct) and that there is something to talk to.
    pub fn validate(&self) -> Result<(), String> {
        if self.hosts.len() < 2 {
            return Err(format!("`hosts` needs at least two hosts (e.g. client and target); got {}", self.hosts.len()));
        }
        if self.hosts.len() > 200 {
            return Err(format!("`hosts` allows at most 200 hosts; got {}", self.hosts.len()));
        }
        for (i, h) in self.hosts.iter().enumerate() {
            check_host_name(&h.name)?;
            if self.hosts[..i].iter().any(|o| o.name == h.name) {
                return Err(format!("host `{}` is declared twice", h.name));
            }
        }
        Ok(())
    }

    pub fn names(&self) -> Vec<String> {
        self.hosts.iter().map(|h| h.name.clone()).collect()
    }
}

/// A comma-separated host list, e.g. "client,target".
pub fn parse_host_list(text: &str) -> Result<Vec<String>, String> {
    let names: Vec<String> = text.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
    let spec = HostsSpec { hosts: names.iter().map(|n| HostSpec { name: n.clone(), role: HostRole::Client }).collect() };
    spec.validate()?;
    Ok(names)
}

/// Which packets are lost.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Loss {
    /// Each packet independently.
    Random { probability: f64 },
    /// Bursts (Gilbert-Elliott): a good and a bad state; per packet, good -> bad with
    /// probability `p`, bad -> good with `r`; a packet is lost with `loss_good` in the good
    /// state and `loss_bad` in the bad one (Gilbert's model: 0 and 1).
    GilbertElliott { p: f64, r: f64, loss_good: f64, loss_bad: f64 },
}

impl Loss {
    /// The long-run loss ratio.
    pub fn mean(&self) -> f64 {
        match *self {
            Loss::Random { probability } => probability,
            Loss::GilbertElliott { p, r, loss_good, loss_bad } => {
                if p + r == 0.0 {
                    loss_good
                } else {
                    let bad = p / (p + r);
                    bad * loss_bad + (1.0 - bad) * loss_good
                }
            }
        }
    }
}

/// Some packets held back by `gap` so that later ones overtake them.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reorder {
    pub probability: f64,
    pub gap: Duration,
}

/// A bandwidth cap: a token bucket of `burst` bytes refilled at `bits_per_sec`; packets wait
/// for tokens in a queue at most `queue` long (in time to drain), beyond which they are dropped.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rate {
    pub bits_per_sec: u64,
    pub burst: u64,
    pub queue: Duration,
}

pub const RATE_HELP: &str = "a rate: a number with bit, kbit, mbit or gbit (per second, powers of 1000), e.g. 100mbit";

pub fn parse_rate(text: &str) -> Result<u64, String> {
    let s = text.trim().to_ascii_lowercase();
    let s = s.strip_suffix("/s").or_else(|| s.strip_suffix("ps")).unwrap_or(&s);
    let end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = (&s[..end], s[end..].trim());
    let mult = match unit {
        "bit" => 1.0,
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        _ => return Err(format!("`{text}` is not a rate; expected {RATE_HELP}")),
    };
    let v: f64 = num.parse().map_err(|_| format!("`{text}` is not a rate; expected {RATE_HELP}"))?;
    let bps = (v * mult).round();
    if !(1000.0..=1e12).contains(&bps) {
        return Err(format!("`{text}` is out of range; a rate is 1kbit to 1000gbit"));
    }
    Ok(bps as u64)
}

/// What happens to the packets of a link while a rule is active. Several faults in one rule
/// apply in this order: partition, reset, loss, duplicate, then the packet's time in the
/// relay adds up delay (+ jitter), reorder gap and the rate queue.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetFault {
    pub delay: Option<DelayDist>,
    /// Each packet's delay moves by a uniform amount in [-jitter, +jitter] (never below 0);
    /// like netem, this can reorder packets.
    pub jitter: Option<Duration>,
    pub loss: Option<Loss>,
    /// Probability that a packet is sent twice.
    pub duplicate: Option<f64>,
    pub reorder: Option<Reorder>,
    pub rate: Option<Rate>,
    /// Drop every packet.
    pub partition: bool,
    /// Drop every TCP segment and answer it with a RST to its sender (connections break with
    /// ECONNRESET, new ones are refused); other packets pass.
    pub reset: bool,
}

impl NetFault {
    pub fn is_empty(&self) -> bool {
        *self == NetFault::default()
    }

    pub fn validate(&self) -> Result<(), String> {
        let prob =
            |v: f64, what: &str| if (0.0..=1.0).contains(&v) { Ok(()) } else { Err(format!("{what} {v} is out of range; expected a ratio between 0 and 1")) };
        if self.is_empty() {
            return Err("a network rule needs at least one fault: delay, jitter, loss, duplicate, reorder, rate, partition or reset".into());
        }
        match self.loss {
            Some(Loss::Random { probability }) => prob(probability, "loss")?,
            Some(Loss::GilbertElliott { p, r, loss_good, loss_bad }) => {
                prob(p, "loss p")?;
                prob(r, "loss r")?;
                prob(loss_good, "loss_good")?;
                prob(loss_bad, "loss_bad")?;
            }
            None => {}
        }
        if let Some(d) = self.duplicate {
            prob(d, "duplicate")?;
        }
        if let Some(r) = self.reorder {
            prob(r.probability, "reorder")?;
            if r.gap.is_zero() {
                return Err("reorder gap must be more than 0".into());
            }
        }
        if let Some(r) = self.rate
            && r.burst < 1500
        {
            return Err(format!("rate burst {} B is less than one packet (1500 B)", r.burst));
        }
        if self.jitter.is_some() && self.delay.is_none() {
            return Err("jitter needs a delay to vary (e.g. delay 1ms, jitter 200us)".into());
        }
        Ok(())
    }
}

/// Faults on the packets from `from` to `to` (None: any host), in a window counted from the
/// moment the rule is set (None: sticky until cleared). `both` also applies the rule to the
/// reverse direction (to -> from).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetRule {
    #[serde(default)]
    pub from: Option<String>,
    #[serde(default)]
    pub to: Option<String>,
    #[serde(default)]
    pub both: bool,
    #[serde(default)]
    pub window: Option<Window>,
    /// Seed of the rule's random choices (loss, duplicate, reorder, jitter, delay draws).
    #[serde(default)]
    pub seed: Option<u64>,
    pub fault: NetFault,
}

impl NetRule {
    /// Check the faults and that the hosts named exist among `hosts`.
    pub fn validate(&self, hosts: &[String]) -> Result<(), String> {
        for h in [&self.from, &self.to].into_iter().flatten() {
            if !hosts.contains(h) {
                return Err(format!("unknown host `{h}`; the hosts are: {}", hosts.join(", ")));
            }
        }
        // from and to must differ: the relay sees only packets between two hosts, so a rule from
        // a host to itself would never match
        if let (Some(f), Some(t)) = (&self.from, &self.to)
            && f == t
        {
            return Err(format!(
                "from and to are the same host `{f}`: its packets to itself never pass the relay; allowed: two different hosts (or leave one out for any)"
            ));
        }
        if let Some(w) = self.window
            && w.to.is_some_and(|t| t <= w.from)
        {
            return Err("window end must come after its start".into());
        }
        self.fault.validate()
    }

    /// Does this rule apply to packets from host `a` to host `b`?
    pub fn covers(&self, a: &str, b: &str) -> bool {
        let m = |want: &Option<String>, h: &str| want.as_deref().is_none_or(|w| w == h);
        (m(&self.from, a) && m(&self.to, b)) || (self.both && m(&self.from, b) && m(&self.to, a))
    }
}

/// "P" or "P,R" or "P,R,LOSS_BAD,LOSS_GOOD": a Gilbert-Elliott loss (ratios or percentages).
/// R defaults to 25% (bursts of 4 packets on average), LOSS_BAD to 1, LOSS_GOOD to 0.
pub fn parse_gilbert(text: &str) -> Result<Loss, String> {
    let parts: Vec<&str> = text.split(',').collect();
    if parts.is_empty() || parts.len() > 4 {
        return Err(format!("`{text}` is not a Gilbert-Elliott loss; expected P[,R[,LOSS_BAD[,LOSS_GOOD]]], e.g. 1%,25%"));
    }
    let get = |i: usize, d: f64| parts.get(i).map(|s| parse_ratio(s)).unwrap_or(Ok(d));
    Ok(Loss::GilbertElliott { p: get(0, 0.0)?, r: get(1, 0.25)?, loss_bad: get(2, 1.0)?, loss_good: get(3, 0.0)? })
}

/// "PROB" or "PROB:GAP" (gap defaults to 1ms).
pub fn parse_reorder(text: &str) -> Result<Reorder, String> {
    let (p, g) = text.split_once(':').map(|(p, g)| (p, Some(g))).unwrap_or((text, None));
    Ok(Reorder { probability: parse_ratio(p)?, gap: g.map(parse_duration).transpose()?.unwrap_or(Duration::from_millis(1)) })
}

/// "FROM..TO" or "FROM.." (durations from when the rule is set).
pub fn parse_window(text: &str) -> Result<Window, String> {
    let Some((a, b)) = text.split_once("..") else {
        return Err(format!("`{text}` is not a window; expected FROM..TO or FROM.. (durations from when the rule is set), e.g. 2s..5s"));
    };
    let from = if a.trim().is_empty() { Duration::ZERO } else { parse_duration(a)? };
    let to = if b.trim().is_empty() { None } else { Some(parse_duration(b)?) };
    if to.is_some_and(|t| t <= from) {
        return Err(format!("window `{text}`: its end must come after its start"));
    }
    Ok(Window { from, to })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(parse_rate("100mbit"), Ok(100_000_000));
        assert_eq!(parse_rate("1.5gbit"), Ok(1_500_000_000));
        assert!(parse_rate("100").unwrap_err().contains("kbit"));
        assert!(parse_rate("1bit").is_err());
    }

    #[test]
    fn gilbert_mean() {
        let l = parse_gilbert("1%,25%").unwrap();
        assert!((l.mean() - 0.01 / 0.26).abs() < 1e-12);
        assert!(parse_gilbert("2").is_err());
    }

    #[test]
    fn rule_validation_names_hosts() {
        let hosts = vec!["client".to_string(), "target".to_string()];
        let mut r =
            NetRule { from: Some("clint".into()), to: None, both: false, window: None, seed: None, fault: NetFault { partition: true, ..Default::default() } };
        assert!(r.validate(&hosts).unwrap_err().contains("client, target"));
        r.from = Some("client".into());
        assert!(r.validate(&hosts).is_ok());
        assert!(r.covers("client", "target") && !r.covers("target", "client"));
        r.both = true;
        assert!(r.covers("target", "client"));
        r.fault = NetFault::default();
        assert!(r.validate(&hosts).is_err());
        r.fault.partition = true;
        r.to = Some("client".into());
        assert!(r.validate(&hosts).unwrap_err().contains("from and to are the same host `client`"));
    }

    #[test]
    fn the_documented_json_form_parses() {
        // docs/net.md, "The control socket"
        let j = r#"{"from":"client","to":"target","both":false,"window":null,"seed":null,
 "fault":{"delay":{"fixed":{"secs":0,"nanos":1000000}},"loss":{"random":{"probability":0.001}}}}"#;
        let r: NetRule = serde_json::from_str(j).unwrap();
        assert_eq!(r.fault.delay, Some(DelayDist::Fixed(Duration::from_millis(1))));
        assert_eq!(r.fault.loss, Some(Loss::Random { probability: 0.001 }));
        assert!(serde_json::from_str::<NetRule>(r#"{"fault":{"los":{}}}"#).is_err());
    }

    #[test]
    fn windows_and_names() {
        assert_eq!(parse_window("2s..5s").unwrap(), Window { from: Duration::from_secs(2), to: Some(Duration::from_secs(5)) });
        assert_eq!(parse_window("1s..").unwrap().to, None);
        assert!(parse_window("2s").is_err());
        assert!(check_host_name("Client").is_err());
        assert!(parse_host_list("client").is_err());
        assert!(parse_host_list("a,a").is_err());
        assert_eq!(parse_reorder("5%").unwrap().gap, Duration::from_millis(1));
    }
}
