//! An NBD target as a client names it: libnbd's URI forms `nbd://HOST[:PORT]/[EXPORT]` and
//! `nbd+unix:///[EXPORT]?socket=PATH`, plus the client's request policy (timeout, retries,
//! backoff, connections) as query keys or an experiment's `nbd:` map. Parsing only: the client
//! itself is `nbd::client`.

use super::units::{format_duration, parse_duration};
use std::path::PathBuf;
use std::time::Duration;

/// Where the server listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NbdEndpoint {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

/// How the client treats requests that fail or take too long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NbdPolicy {
    /// A request without a reply this long counts as failed; its connection is reconnected.
    pub timeout: Duration,
    /// Further attempts after a failed or timed-out request (0: fail at once).
    pub retries: u32,
    /// Wait before the first retry, doubled per retry up to `backoff_max`.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Connections in the pool when the server allows several (CAN_MULTI_CONN); else 1.
    pub connections: u32,
}

impl Default for NbdPolicy {
    fn default() -> NbdPolicy {
        NbdPolicy {
            timeout: Duration::from_secs(30),
            retries: 3,
            backoff_initial: Duration::from_millis(1),
            backoff_max: Duration::from_millis(100),
            connections: 4,
        }
    }
}

/// A remote export and the policy to reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NbdTarget {
    pub endpoint: NbdEndpoint,
    pub export: String,
    pub policy: NbdPolicy,
}

pub const NBD_DEFAULT_PORT: u16 = 10809;
const URI_HELP: &str = "nbd://HOST[:PORT]/[EXPORT][?KEY=VALUE&...] or nbd+unix:///[EXPORT]?socket=PATH[&KEY=VALUE...]; keys: timeout, retries, backoff_initial, backoff_max, connections";

impl NbdPolicy {
    /// Set one key (`timeout`, `retries`, `backoff_initial`, `backoff_max`, `connections`).
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        let dur = |v: &str| parse_duration(v).map_err(|e| format!("`{key}`: {e}"));
        match key {
            "timeout" => {
                let d = dur(value)?;
                if d < Duration::from_millis(1) {
                    return Err(format!("`timeout={value}` is too short; allowed: 1ms or more"));
                }
                self.timeout = d;
            }
            "retries" => self.retries = value.parse().ok().filter(|n| *n <= 1000).ok_or_else(|| format!("`retries={value}`: allowed: 0..1000"))?,
            "backoff_initial" => self.backoff_initial = dur(value)?,
            "backoff_max" => self.backoff_max = dur(value)?,
            "connections" => {
                self.connections = value.parse().ok().filter(|n| (1..=64).contains(n)).ok_or_else(|| format!("`connections={value}`: allowed: 1..64"))?
            }
            _ => return Err(format!("unknown NBD client key `{key}`; allowed: timeout, retries, backoff_initial, backoff_max, connections")),
        }
        if self.backoff_max < self.backoff_initial {
            self.backoff_max = self.backoff_initial;
        }
        Ok(())
    }

    /// The wait before retry number `attempt` (0-based).
    pub fn backoff(&self, attempt: u32) -> Duration {
        self.backoff_initial.saturating_mul(1u32 << attempt.min(20)).min(self.backoff_max)
    }
}

fn unescape(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok()).ok_or_else(|| format!("bad %-escape in `{s}`"))?;
            out.push(h);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("`{s}` is not UTF-8 once unescaped"))
}

fn escape(s: &str) -> String {
    s.bytes().map(|c| if c.is_ascii_alphanumeric() || b"-._~/".contains(&c) { (c as char).to_string() } else { format!("%{c:02X}") }).collect()
}

impl std::str::FromStr for NbdTarget {
    type Err = String;
    fn from_str(s: &str) -> Result<NbdTarget, String> {
        let (rest, unix) = if let Some(r) = s.strip_prefix("nbd+unix://") {
            (r, true)
        } else if let Some(r) = s.strip_prefix("nbd://") {
            (r, false)
        } else {
            return Err(format!("`{s}` is not an NBD URI; allowed: {URI_HELP}"));
        };
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (auth, path) = rest.split_once('/').unwrap_or((rest, ""));
        let export = unescape(path)?;
        let mut policy = NbdPolicy::default();
        let mut socket = None;
        for kv in query.split('&').filter(|kv| !kv.is_empty()) {
            let (k, v) = kv.split_once('=').ok_or_else(|| format!("`{s}`: `{kv}` is not KEY=VALUE"))?;
            let v = unescape(v)?;
            if k == "socket" && unix {
                socket = Some(PathBuf::from(v));
            } else {
                policy.set(k, &v).map_err(|e| format!("`{s}`: {e}"))?;
            }
        }
        let endpoint = if unix {
            if !auth.is_empty() {
                return Err(format!("`{s}`: nbd+unix:// takes no host (nbd+unix:///EXPORT?socket=PATH)"));
            }
            NbdEndpoint::Unix(socket.ok_or_else(|| format!("`{s}`: nbd+unix:// needs ?socket=PATH"))?)
        } else {
            let (host, port) = if let Some(v6) = auth.strip_prefix('[') {
                let (h, p) = v6.split_once(']').ok_or_else(|| format!("`{s}`: unclosed [ in the host"))?;
                (h.to_string(), p.strip_prefix(':'))
            } else {
                match auth.rsplit_once(':') {
                    Some((h, p)) => (h.to_string(), Some(p)),
                    None => (auth.to_string(), None),
                }
            };
            if host.is_empty() {
                return Err(format!("`{s}`: no host; allowed: {URI_HELP}"));
            }
            let port = match port {
                None => NBD_DEFAULT_PORT,
                Some(p) => p.parse().map_err(|_| format!("`{s}`: port `{p}` is not 0..65535"))?,
            };
            NbdEndpoint::Tcp { host, port }
        };
        Ok(NbdTarget { endpoint, export, policy })
    }
}

/// As its URI (results, saved content maps).
impl serde::Serialize for NbdTarget {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for NbdTarget {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl std::fmt::Display for NbdTarget {
    /// The URI with every policy key that differs from the default (so it round-trips, e.g.
    /// from `faultline run` to its disk servers).
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let mut q: Vec<String> = Vec::new();
        match &self.endpoint {
            NbdEndpoint::Tcp { host, port } if host.contains(':') => write!(f, "nbd://[{host}]:{port}/{}", escape(&self.export))?,
            NbdEndpoint::Tcp { host, port } => write!(f, "nbd://{host}:{port}/{}", escape(&self.export))?,
            NbdEndpoint::Unix(p) => {
                write!(f, "nbd+unix:///{}", escape(&self.export))?;
                q.push(format!("socket={}", escape(&p.to_string_lossy())));
            }
        }
        let (p, d) = (&self.policy, NbdPolicy::default());
        if p.timeout != d.timeout {
            q.push(format!("timeout={}", format_duration(p.timeout)));
        }
        if p.retries != d.retries {
            q.push(format!("retries={}", p.retries));
        }
        if p.backoff_initial != d.backoff_initial {
            q.push(format!("backoff_initial={}", format_duration(p.backoff_initial)));
        }
        if p.backoff_max != d.backoff_max {
            q.push(format!("backoff_max={}", format_duration(p.backoff_max)));
        }
        if p.connections != d.connections {
            q.push(format!("connections={}", p.connections));
        }
        if !q.is_empty() {
            write!(f, "?{}", q.join("&"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_forms_parse_and_round_trip() {
        let t: NbdTarget = "nbd://127.0.0.1:10900/disk?timeout=1s&retries=5&backoff_initial=2ms&backoff_max=50ms".parse().unwrap();
        assert_eq!(t.endpoint, NbdEndpoint::Tcp { host: "127.0.0.1".into(), port: 10900 });
        assert_eq!(t.export, "disk");
        assert_eq!((t.policy.timeout, t.policy.retries), (Duration::from_secs(1), 5));
        assert_eq!(t.policy.backoff(0), Duration::from_millis(2));
        assert_eq!(t.policy.backoff(10), Duration::from_millis(50));
        assert_eq!(t.to_string().parse::<NbdTarget>().unwrap(), t);
        let u: NbdTarget = "nbd+unix:///?socket=/tmp/a%20b.sock".parse().unwrap();
        assert_eq!(u.endpoint, NbdEndpoint::Unix("/tmp/a b.sock".into()));
        assert_eq!(u.export, "");
        assert_eq!(u.to_string().parse::<NbdTarget>().unwrap(), u);
        let d: NbdTarget = "nbd://example.org".parse().unwrap();
        assert_eq!(d.endpoint, NbdEndpoint::Tcp { host: "example.org".into(), port: NBD_DEFAULT_PORT });
        let v6: NbdTarget = "nbd://[::1]:99/x".parse().unwrap();
        assert_eq!(v6.endpoint, NbdEndpoint::Tcp { host: "::1".into(), port: 99 });
        assert_eq!(v6.to_string().parse::<NbdTarget>().unwrap(), v6);
    }

    #[test]
    fn bad_uris_say_what_is_allowed() {
        for (bad, want) in [
            ("http://x", "allowed: nbd://"),
            ("nbd+unix:///e", "needs ?socket"),
            ("nbd://:1/", "no host"),
            ("nbd://h:99999/", "not 0..65535"),
            ("nbd://h/?retries=x", "allowed: 0..1000"),
            ("nbd://h/?frobs=1", "allowed: timeout, retries"),
            ("nbd://h/?timeout=0s", "1ms or more"),
        ] {
            let e = bad.parse::<NbdTarget>().unwrap_err();
            assert!(e.contains(want), "{bad}: {e}");
        }
    }
}
