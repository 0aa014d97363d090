//! The one check every fault rule passes before the disk arms it, whatever path it came by
//! (rules file, `fault add`, the control socket's `add` and `arm`, a run, an agent): a rule the
//! request path could not execute is refused with what is wrong and what is allowed. The YAML
//! path (`yaml`) runs the same check and adds the line and column.

use super::yaml::OPS;
use super::{Action, DelayDist, ERRNOS, FlipAt, Op, OpSet, Pattern, Rule, Target, Window};

/// What the rules are checked against.
#[derive(Clone, Copy, Debug)]
pub struct DiskGeometry {
    pub size: u64,
    pub block_size: u32,
}

pub(crate) fn check_window(w: &Window) -> Result<(), String> {
    if w.to.is_some_and(|t| t <= w.from) {
        return Err("window `to` must be later than `from`".into());
    }
    Ok(())
}

/// Whether `r` is a rule the disk can arm: the one check every rule passes whatever path it
/// came by (rules file, `fault add`, the socket's `add` and `arm`, a run, an agent), so a rule
/// that would make the request path fail (a uniform delay with max < min panics the
/// distribution's sampler) is refused when armed. The YAML path adds line and column.
pub fn check_rule(r: &Rule, geo: DiskGeometry) -> Result<(), String> {
    let bs = geo.block_size as u64;
    let kind = r.action.name();
    let flip = |at: &FlipAt| -> Result<(), String> {
        if let Some(byte) = at.byte
            && byte as u64 >= bs
        {
            return Err(format!("`byte: {byte}` is outside the block; allowed: 0..{}", bs - 1));
        }
        match at.bit {
            Some(bit) if bit > 7 => Err(format!("`bit: {bit}` is not a bit number; allowed: 0..7")),
            _ => Ok(()),
        }
    };
    match &r.action {
        Action::Bitflip { at } | Action::Rot { at } => flip(at)?,
        Action::Corrupt { offset, length, .. } => check_corrupt(*offset as u64, length.map(u64::from), bs)?,
        Action::Error { errno } => {
            if !(1..4096).contains(errno) {
                return Err(errno_out_of_range(*errno as i64));
            }
        }
        Action::Delay { delay, .. } => check_delay(delay)?,
        Action::LostWrite | Action::TornWrite { .. } => {}
        Action::MisdirectedWrite { shift } => {
            if *shift == 0 || shift.unsigned_abs() % bs != 0 {
                return Err(format!("`shift: {shift}` must be a non-zero multiple of the block size ({bs})"));
            }
        }
    }

    // ops
    let is_rot = matches!(r.action, Action::Rot { .. });
    let write_only = matches!(r.action, Action::LostWrite | Action::TornWrite { .. } | Action::MisdirectedWrite { .. });
    let data_ops = r.ops.has(Op::Flush) || r.ops.has(Op::Discard);
    if is_rot && r.ops != OpSet::NONE {
        return Err("type rot corrupts data at rest when armed; it takes no `op`".into());
    }
    if !is_rot && r.ops == OpSet::NONE {
        return Err(format!("`op: []` names no operation, so the rule would never match; allowed: {OPS}, or a list of them"));
    }
    if write_only && r.ops != OpSet::of(&[Op::Write]) {
        return Err(format!("type {kind} applies to writes only; use `op: write` or leave `op` out"));
    }
    if matches!(r.action, Action::Bitflip { .. } | Action::Corrupt { .. }) && data_ops {
        return Err(format!("type {kind} changes data; allowed ops: read, write"));
    }

    // target
    match r.target {
        Target::Any if is_rot => return Err("type rot needs a `target` (an offset range or a content hash) to say which stored data rots".into()),
        Target::Any => {}
        Target::Range { start, end } => {
            if end <= start {
                return Err(if end == start {
                    "target length is 0; it would never match".into()
                } else {
                    format!("target [{start}, {end}) ends before it starts")
                });
            }
            if end > geo.size {
                return Err(beyond_end(&format!("[{start}, {end})"), geo));
            }
        }
        Target::Content { .. } if data_ops => {
            return Err("content targets match data; flush and discard carry none. Use `op: read` and/or `op: write`".into());
        }
        Target::Content { .. } => {}
    }

    // when
    if r.times == Some(0) {
        return Err("`times: 0` would never fire; give a count >= 1, or leave `times` out for every match".into());
    }
    if let Some(p) = r.probability
        && !(0.0..=1.0).contains(&p)
    {
        return Err(format!("`probability: {p}` is out of range; expected {}", crate::spec::units::RATIO_HELP));
    }
    if let Some(w) = &r.window {
        check_window(w)?;
    }
    if let Some(p) = &r.pattern {
        if r.probability.is_some() {
            return Err("`probability` and `pattern` both choose which matches fire; give one (`probability: 10%` is `pattern: {random: {ratio: 10%}}`)".into());
        }
        if is_rot {
            return Err("type rot corrupts data at rest once, when armed; `pattern` selects among matching requests, which rot does not see".into());
        }
        check_pattern(p)?;
    }
    Ok(())
}

/// `check_rule` for each of a batch armed together; the error names the rule by its place in
/// the batch (and its name), as the YAML path names it by line.
pub fn check_rules(rules: &[Rule], geo: DiskGeometry) -> Result<(), String> {
    for (i, r) in rules.iter().enumerate() {
        check_rule(r, geo).map_err(|e| match &r.name {
            Some(n) => format!("rule #{} ({n}): {e}", i + 1),
            None => format!("rule #{}: {e}", i + 1),
        })?;
    }
    Ok(())
}

/// A corrupt action's bytes lie inside one block.
pub(crate) fn check_corrupt(offset: u64, length: Option<u64>, bs: u64) -> Result<(), String> {
    if offset >= bs {
        return Err(format!("`offset: {offset}` is outside the block; allowed: 0..{}", bs - 1));
    }
    if let Some(l) = length {
        // offset < bs (checked above): bs - offset cannot underflow, offset + l could overflow
        if l == 0 || l > bs - offset {
            return Err(format!("`length: {l}` must be 1..{} (offset + length within one block of {bs} bytes)", bs - offset));
        }
    }
    Ok(())
}

pub(crate) fn beyond_end(what: &str, geo: DiskGeometry) -> String {
    let bs = geo.block_size as u64;
    format!("target {what} lies beyond the end of the disk ({} bytes, {} blocks of {bs})", geo.size, geo.size / bs)
}

pub(crate) fn errno_out_of_range(n: i64) -> String {
    format!("errno {n} is out of range; allowed: 1..4095 or a name: {}", ERRNOS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", "))
}

/// A pattern as armed: the same bounds `parse_pattern` enforces, and a burst's period the one
/// its ratio and length give (the engine divides by it).
pub(crate) fn check_pattern(p: &Pattern) -> Result<(), String> {
    match *p {
        Pattern::Random { ratio } => check_pattern_ratio(ratio),
        Pattern::Burst { ratio, length, period } => {
            check_pattern_ratio(ratio)?;
            check_burst_length(length)?;
            let want = burst_period(ratio, length)?;
            if period != want {
                return Err(format!(
                    "burst `period: {period}` does not follow from `length: {length}` and `ratio: {ratio}`; allowed: {want} (length / ratio, rounded)"
                ));
            }
            Ok(())
        }
        Pattern::Interval { every } => check_interval(every),
    }
}

pub(crate) fn check_pattern_ratio(x: f64) -> Result<(), String> {
    if x > 0.0 && x <= 1.0 { Ok(()) } else { Err(format!("pattern `ratio: {x}` never selects a request; allowed: (0, 1], e.g. 10% or 0.1")) }
}

pub(crate) fn check_burst_length(length: u64) -> Result<(), String> {
    if length == 0 { Err("burst `length: 0` is no run at all; allowed: 1 or more requests".into()) } else { Ok(()) }
}

pub(crate) fn check_interval(every: u64) -> Result<(), String> {
    if every == 0 { Err("interval `every: 0` is no interval; allowed: 1 or more requests".into()) } else { Ok(()) }
}

/// Requests per burst period: one run of `length` in every `length / ratio`, rounded to a whole
/// number of requests, which must keep the ratio within 1% of what was asked.
pub(crate) fn burst_period(ratio: f64, length: u64) -> Result<u64, String> {
    let exact = length as f64 / ratio;
    if !exact.is_finite() || exact >= u64::MAX as f64 {
        return Err(format!(
            "burst `length: {length}` with `ratio: {ratio}` gives a period of {exact:e} requests, beyond 2^64; use a larger ratio or a shorter run"
        ));
    }
    let whole = |l: u64| (l as f64 / ratio).round().max(l as f64) as u64;
    let off = |l: u64| ((l as f64 / whole(l) as f64) - ratio).abs() / ratio;
    let period = whole(length);
    if off(length) > 0.01 {
        let hint = (1..=100_000u64).find(|l| off(*l) <= 0.001).map(|l| format!(", e.g. `length: {l}`")).unwrap_or_default();
        return Err(format!(
            "burst `length: {length}` with `ratio: {ratio}` gives a period of {exact:.2} requests; a whole {period} would make the ratio {:.4}, more than 1% off: choose a length that makes length / ratio (nearly) whole{hint}",
            length as f64 / period as f64
        ));
    }
    Ok(period)
}

/// A delay distribution its sampler accepts (`fault::engine::sample_delay` unwraps them).
pub fn check_delay(d: &DelayDist) -> Result<(), String> {
    let pos = |x: f64, k: &str| if x > 0.0 && x.is_finite() { Ok(()) } else { Err(format!("`{k}: {x}` must be a positive number")) };
    match *d {
        DelayDist::Fixed(_) | DelayDist::Normal { .. } => Ok(()),
        DelayDist::Uniform { min, max } if max < min => Err("uniform delay: `max` must be >= `min`".into()),
        DelayDist::Uniform { .. } => Ok(()),
        DelayDist::Lognormal { median, .. } if median.is_zero() => Err("lognormal delay: `median` must be > 0".into()),
        DelayDist::Lognormal { sigma, .. } => pos(sigma, "sigma"),
        DelayDist::Pareto { scale, .. } if scale.is_zero() => Err("pareto delay: `scale` must be > 0".into()),
        DelayDist::Pareto { shape, .. } => pos(shape, "shape"),
    }
}
