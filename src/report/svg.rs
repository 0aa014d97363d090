//! Small hand-written SVG charts: a line chart (axes, ticks, legend, vertical markers) and a
//! log-scale grouped bar chart.
//! Hand-written rather than plotters: the report needs markers it can tag (class, <title>),
//! deterministic output without any font machinery, and no extra dependency to build.

use super::html::esc;
use std::fmt::Write;

/// Linear map from a data interval to a pixel interval (pixels may run backwards, as y does).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scale {
    pub d0: f64,
    pub d1: f64,
    pub p0: f64,
    pub p1: f64,
}

impl Scale {
    pub fn new(d0: f64, d1: f64, p0: f64, p1: f64) -> Scale {
        // a zero-width domain would divide by zero: widen it
        let d1 = if d1 > d0 { d1 } else { d0 + 1.0 };
        Scale { d0, d1, p0, p1 }
    }
    pub fn px(&self, v: f64) -> f64 {
        let v = v.clamp(self.d0, self.d1);
        self.p0 + (v - self.d0) / (self.d1 - self.d0) * (self.p1 - self.p0)
    }
}

/// "Nice" tick values (steps of 1, 2 or 5 x 10^k) covering [0, max], about `n` of them.
/// The last tick is >= max, so it can serve as the axis end.
pub fn nice_ticks(max: f64, n: usize) -> Vec<f64> {
    let max = if max.is_finite() && max > 0.0 { max } else { 1.0 };
    let raw = max / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    let count = (max / step - 1e-9).ceil() as usize;
    (0..=count).map(|i| i as f64 * step).collect()
}

/// Tick label: no trailing zeros, no float noise (0.30000000000000004).
pub fn fmt_tick(v: f64) -> String {
    if v == v.round() && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

pub struct Series {
    pub name: String,
    pub color: String,
    pub dashed: bool,
    pub points: Vec<(f64, f64)>,
}

/// A vertical red line at `x` with a short cap in `color` (its repetition's colour);
/// `title` becomes its hover text.
pub struct Marker {
    pub x: f64,
    pub title: String,
    pub color: String,
}

pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    pub markers: Vec<Marker>,
    pub width: f64,
    pub height: f64,
    /// Fixed axis ends (x, y) instead of the data's, so that small multiples share one scale.
    pub extent: Option<(f64, f64)>,
}

const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 28.0;
const BOTTOM: f64 = 44.0;
const LEGEND_ROW: f64 = 18.0;

/// Distinct colours for repetitions (colour-blind safe Okabe-Ito order).
pub const PALETTE: [&str; 8] = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"];

impl LineChart {
    /// The x and y scales of the plot area: x from 0 to the last point or marker, y from 0
    /// to the nice tick at or above the largest value.
    pub fn scales(&self) -> (Scale, Scale, Vec<f64>, Vec<f64>) {
        let xmax =
            self.series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).chain(self.markers.iter().map(|m| m.x)).filter(|v| v.is_finite()).fold(0.0, f64::max);
        let ymax = self.series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).filter(|v| v.is_finite()).fold(0.0, f64::max);
        let (xmax, ymax) = self.extent.unwrap_or((xmax, ymax));
        let xt = nice_ticks(xmax, if self.width < 600.0 { 5 } else { 8 });
        let yt = nice_ticks(ymax, if self.height < 260.0 { 4 } else { 5 });
        let plot_bottom = self.height - BOTTOM - self.legend_height();
        let xs = Scale::new(0.0, *xt.last().unwrap(), LEFT, self.width - RIGHT);
        let ys = Scale::new(0.0, *yt.last().unwrap(), plot_bottom, TOP);
        (xs, ys, xt, yt)
    }

    fn legend_height(&self) -> f64 {
        legend_height(self.width, self.series.len() + usize::from(!self.markers.is_empty()))
    }

    pub fn render(&self) -> String {
        let (xs, ys, xt, yt) = self.scales();
        let (w, h) = (self.width, self.height);
        let mut s = open_chart(w, h, &self.title, yt.iter().map(|v| (ys.px(*v), *v)));
        for v in &xt {
            let x = xs.px(*v);
            let _ = write!(
                s,
                r##"<line x1="{x:.1}" x2="{x:.1}" y1="{:.1}" y2="{:.1}" stroke="#888"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                ys.p0,
                ys.p0 + 4.0,
                ys.p0 + 15.0,
                fmt_tick(*v)
            );
        }
        let _ = write!(
            s,
            r##"<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{:.1}" stroke="#444"/><line x1="{LEFT}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#444"/>"##,
            ys.p0,
            w - RIGHT,
            ys.p0,
            ys.p0
        );
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text><text transform="translate(14 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
            (LEFT + w - RIGHT) / 2.0,
            ys.p0 + 30.0,
            esc(&self.x_label),
            (TOP + ys.p0) / 2.0,
            esc(&self.y_label)
        );
        // markers under the lines, so the data stays readable
        for m in &self.markers {
            let x = xs.px(m.x);
            let _ = write!(
                s,
                r##"<line class="fault-marker" x1="{x:.1}" x2="{x:.1}" y1="{TOP}" y2="{:.1}" stroke="#d00" stroke-opacity="0.45" stroke-width="1"><title>{}</title></line><line x1="{x:.1}" x2="{x:.1}" y1="{:.1}" y2="{TOP}" stroke="{}" stroke-width="3"/>"##,
                ys.p0,
                esc(&m.title),
                TOP - 6.0,
                esc(&m.color)
            );
        }
        for se in &self.series {
            if se.points.is_empty() {
                continue;
            }
            let pts: Vec<String> =
                se.points.iter().filter(|p| p.0.is_finite() && p.1.is_finite()).map(|p| format!("{:.1},{:.1}", xs.px(p.0), ys.px(p.1))).collect();
            let dash = if se.dashed { r#" stroke-dasharray="5 3""# } else { "" };
            let _ = write!(
                s,
                r#"<polyline class="series" fill="none" stroke="{}" stroke-width="1.5"{dash} points="{}"><title>{}</title></polyline>"#,
                esc(&se.color),
                pts.join(" "),
                esc(&se.name)
            );
        }
        let mut items: Vec<(String, String, bool)> = self.series.iter().map(|se| (se.name.clone(), se.color.clone(), se.dashed)).collect();
        if !self.markers.is_empty() {
            items.push((format!("injected fault ({})", self.markers.len()), "#d00".into(), false));
        }
        legend(&mut s, w, ys.p0 + BOTTOM, &items);
        s.push_str("</svg>");
        s
    }
}

fn legend_height(width: f64, items: usize) -> f64 {
    let per_row = ((width - LEFT) / 150.0).floor().max(1.0) as usize;
    items.div_ceil(per_row) as f64 * LEGEND_ROW
}

/// Legend rows starting at y0: (name, colour, dashed) per item, 150 px apart.
fn legend(s: &mut String, width: f64, y0: f64, items: &[(String, String, bool)]) {
    let per_row = ((width - LEFT) / 150.0).floor().max(1.0) as usize;
    for (i, (name, color, dashed)) in items.iter().enumerate() {
        let x = LEFT + (i % per_row) as f64 * 150.0;
        let y = y0 + (i / per_row) as f64 * LEGEND_ROW;
        let dash = if *dashed { r#" stroke-dasharray="5 3""# } else { "" };
        let _ = write!(
            s,
            r#"<line x1="{x:.1}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="{}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}">{}</text>"#,
            x + 18.0,
            y - 4.0,
            y - 4.0,
            esc(color),
            x + 22.0,
            y,
            esc(name)
        );
    }
}

/// Log10 map from a data interval (both ends > 0) to pixels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogScale {
    pub lo: f64,
    pub hi: f64,
    pub p0: f64,
    pub p1: f64,
}

impl LogScale {
    pub fn px(&self, v: f64) -> f64 {
        let (a, b) = (self.lo.log10(), self.hi.log10());
        let t = (v.max(self.lo).min(self.hi).log10() - a) / (b - a);
        self.p0 + t * (self.p1 - self.p0)
    }
}

/// Powers of ten from the one at or below `min` to the one at or above `max` (at least two).
/// Non-positive or non-finite values are ignored; none left gives [1, 10].
pub fn decade_ticks(values: &[f64]) -> Vec<f64> {
    let pos: Vec<f64> = values.iter().copied().filter(|v| v.is_finite() && *v > 0.0).collect();
    if pos.is_empty() {
        return vec![1.0, 10.0];
    }
    let lo = pos.iter().copied().fold(f64::INFINITY, f64::min).log10().floor() as i32;
    let mut hi = pos.iter().copied().fold(0.0, f64::max).log10().ceil() as i32;
    if hi <= lo {
        hi = lo + 1;
    }
    (lo..=hi).map(|e| 10f64.powi(e)).collect()
}

pub struct BarSeries {
    pub name: String,
    pub color: String,
    /// One value per group; values <= 0 draw no bar.
    pub values: Vec<f64>,
}

/// Grouped bars on a log-scale y axis (latency percentiles span decades).
pub struct BarChart {
    pub title: String,
    pub y_label: String,
    pub groups: Vec<String>,
    pub series: Vec<BarSeries>,
    pub width: f64,
    pub height: f64,
}

/// `<svg>` opening, the title, and one horizontal grid line with its label per (pixel y, value).
fn open_chart(w: f64, h: f64, title: &str, grid: impl Iterator<Item = (f64, f64)>) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(s, r#"<text x="{}" y="16" font-size="13" font-weight="bold">{}</text>"#, LEFT, esc(title));
    for (y, v) in grid {
        let _ = write!(
            s,
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            w - RIGHT,
            LEFT - 4.0,
            y + 4.0,
            fmt_tick(v)
        );
    }
    s
}

impl BarChart {
    pub fn scale(&self) -> (LogScale, Vec<f64>) {
        let all: Vec<f64> = self.series.iter().flat_map(|s| s.values.iter().copied()).collect();
        let ticks = decade_ticks(&all);
        let bottom = self.height - BOTTOM - legend_height(self.width, self.series.len());
        (LogScale { lo: ticks[0], hi: *ticks.last().unwrap(), p0: bottom, p1: TOP }, ticks)
    }

    pub fn render(&self) -> String {
        let (ys, ticks) = self.scale();
        let (w, h) = (self.width, self.height);
        let mut s = open_chart(w, h, &self.title, ticks.iter().map(|v| (ys.px(*v), *v)));
        let _ = write!(
            s,
            r##"<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{:.1}" stroke="#444"/><line x1="{LEFT}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#444"/><text transform="translate(14 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"##,
            ys.p0,
            w - RIGHT,
            ys.p0,
            ys.p0,
            (TOP + ys.p0) / 2.0,
            esc(&self.y_label)
        );
        let gw = (w - RIGHT - LEFT) / self.groups.len().max(1) as f64;
        let bw = gw * 0.8 / self.series.len().max(1) as f64;
        for (g, name) in self.groups.iter().enumerate() {
            let gx = LEFT + g as f64 * gw;
            let _ = write!(s, r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#, gx + gw / 2.0, ys.p0 + 15.0, esc(name));
            for (k, se) in self.series.iter().enumerate() {
                let v = se.values.get(g).copied().unwrap_or(0.0);
                if !(v.is_finite() && v > 0.0) {
                    continue;
                }
                let top = ys.px(v);
                let _ = write!(
                    s,
                    r#"<rect class="bar" x="{:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{} {}: {}</title></rect>"#,
                    gx + gw * 0.1 + k as f64 * bw,
                    bw.max(1.0),
                    (ys.p0 - top).max(0.0),
                    esc(&se.color),
                    esc(&se.name),
                    esc(name),
                    fmt_tick(v)
                );
            }
        }
        let items: Vec<(String, String, bool)> = self.series.iter().map(|se| (se.name.clone(), se.color.clone(), false)).collect();
        legend(&mut s, w, ys.p0 + BOTTOM - 14.0, &items);
        s.push_str("</svg>");
        s
    }
}

/// One row of an interval chart: a point estimate with its interval.
pub struct IntervalRow {
    pub label: String,
    pub value: f64,
    /// None: no interval (fewer than two pairs).
    pub interval: Option<(f64, f64)>,
    /// Drawn solid when the interval excludes zero, pale otherwise.
    pub strong: bool,
}

/// Horizontal bars from zero to each value with its interval as a whisker; a linear axis in
/// percent that always holds zero (slowdowns of setups and op types).
pub struct IntervalChart {
    pub title: String,
    pub x_label: String,
    pub rows: Vec<IntervalRow>,
    pub width: f64,
    /// Room for the row labels on the left.
    pub label_width: f64,
}

const ROW: f64 = 16.0;

impl IntervalChart {
    /// The x scale: from the smallest value or interval end (at most 0) to the largest (at least 0).
    pub fn scale(&self) -> Scale {
        let vals = self.rows.iter().flat_map(|r| [Some(r.value), r.interval.map(|i| i.0), r.interval.map(|i| i.1)]).flatten().filter(|v| v.is_finite());
        let (lo, hi) = vals.fold((0.0f64, 0.0f64), |(a, b), v| (a.min(v), b.max(v)));
        let hi = if hi <= lo { lo + 1.0 } else { hi };
        let pad = (hi - lo) * 0.05;
        Scale::new(lo - if lo < 0.0 { pad } else { 0.0 }, hi + pad, self.label_width, self.width - RIGHT)
    }

    pub fn render(&self) -> String {
        let xs = self.scale();
        let h = TOP + self.rows.len() as f64 * ROW + BOTTOM;
        let w = self.width;
        let mut s = open_chart(w, h, &self.title, std::iter::empty());
        let bottom = TOP + self.rows.len() as f64 * ROW;
        // ticks: nice steps across the domain, both sides of zero
        let span = xs.d1 - xs.d0;
        let step = nice_ticks(span, 6).get(1).copied().unwrap_or(1.0);
        let mut t = (xs.d0 / step).ceil() * step;
        while t <= xs.d1 + 1e-12 {
            let x = xs.px(t);
            let _ = write!(
                s,
                r##"<line x1="{x:.1}" x2="{x:.1}" y1="{TOP}" y2="{bottom:.1}" stroke="#eee"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                bottom + 14.0,
                fmt_tick((t * 1e6).round() / 1e6)
            );
            t += step;
        }
        let zero = xs.px(0.0);
        let _ = write!(
            s,
            r##"<line x1="{zero:.1}" x2="{zero:.1}" y1="{TOP}" y2="{bottom:.1}" stroke="#444"/><text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            (self.label_width + w - RIGHT) / 2.0,
            bottom + 32.0,
            esc(&self.x_label)
        );
        for (i, r) in self.rows.iter().enumerate() {
            let y = TOP + i as f64 * ROW;
            let _ = write!(s, r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#, self.label_width - 4.0, y + ROW * 0.75, esc(&r.label));
            if !r.value.is_finite() {
                continue;
            }
            let (a, b) = (xs.px(0.0), xs.px(r.value));
            let ci =
                r.interval.map(|(lo, hi)| format!(" [{}, {}]", fmt_tick((lo * 10.0).round() / 10.0), fmt_tick((hi * 10.0).round() / 10.0))).unwrap_or_default();
            let _ = write!(
                s,
                r##"<rect class="sd-bar" x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#0072B2" fill-opacity="{}"><title>{}: {}{ci}</title></rect>"##,
                a.min(b),
                y + 3.0,
                (a - b).abs().max(1.0),
                ROW - 6.0,
                if r.strong { "0.9" } else { "0.3" },
                esc(&r.label),
                fmt_tick((r.value * 10.0).round() / 10.0)
            );
            if let Some((lo, hi)) = r.interval {
                let (l, hx, m) = (xs.px(lo), xs.px(hi), y + ROW / 2.0);
                let _ = write!(
                    s,
                    r##"<path class="sd-ci" d="M{l:.1},{m:.1}H{hx:.1}M{l:.1},{:.1}V{:.1}M{hx:.1},{:.1}V{:.1}" stroke="#222" fill="none"/>"##,
                    m - 4.0,
                    m + 4.0,
                    m - 4.0,
                    m + 4.0
                );
            }
        }
        s.push_str("</svg>");
        s
    }
}

/// Latency CDFs: x is latency on a log scale, y the fraction of ops at or below it.
/// Each series' points are (latency, quantile).
pub struct CdfChart {
    pub title: String,
    pub series: Vec<Series>,
    pub width: f64,
    pub height: f64,
}

impl CdfChart {
    pub fn render(&self) -> String {
        let all: Vec<f64> = self.series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).collect();
        let ticks = decade_ticks(&all);
        let (w, h) = (self.width, self.height);
        let bottom = h - BOTTOM - legend_height(w, self.series.len());
        let xs = LogScale { lo: ticks[0], hi: *ticks.last().unwrap(), p0: LEFT, p1: w - RIGHT };
        let ys = Scale::new(0.0, 1.0, bottom, TOP);
        let mut s = open_chart(w, h, &self.title, [0.0, 0.25, 0.5, 0.75, 1.0].into_iter().map(|v| (ys.px(v), v)));
        for t in &ticks {
            let x = xs.px(*t);
            let _ = write!(
                s,
                r##"<line x1="{x:.1}" x2="{x:.1}" y1="{TOP}" y2="{bottom:.1}" stroke="#eee"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                bottom + 14.0,
                fmt_tick(*t)
            );
        }
        let _ = write!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">latency µs (log)</text><text transform="translate(14 {:.1}) rotate(-90)" text-anchor="middle">fraction of ops</text>"##,
            (LEFT + w - RIGHT) / 2.0,
            bottom + 30.0,
            (TOP + bottom) / 2.0
        );
        for se in &self.series {
            let pts: Vec<String> = se.points.iter().filter(|p| p.0 > 0.0 && p.0.is_finite()).map(|p| format!("{:.1},{:.1}", xs.px(p.0), ys.px(p.1))).collect();
            if pts.is_empty() {
                continue;
            }
            let dash = if se.dashed { r#" stroke-dasharray="5 3""# } else { "" };
            let _ = write!(
                s,
                r#"<polyline class="cdf" fill="none" stroke="{}" stroke-width="1.5"{dash} points="{}"><title>{}</title></polyline>"#,
                esc(&se.color),
                pts.join(" "),
                esc(&se.name)
            );
        }
        let items: Vec<(String, String, bool)> = self.series.iter().map(|se| (se.name.clone(), se.color.clone(), se.dashed)).collect();
        legend(&mut s, w, bottom + BOTTOM + 4.0, &items);
        s.push_str("</svg>");
        s
    }
}

/// One point of a scatter chart.
pub struct ScatterPoint {
    pub x: f64,
    pub y: f64,
    /// Index into the chart's groups (its colour and legend entry).
    pub group: usize,
    pub title: String,
    /// The y value's interval, drawn as a vertical whisker; None: no interval.
    pub interval: Option<(f64, f64)>,
}

/// Points with x on a log scale (baseline latency) and y linear (slowdown %), a line at y = 0.
pub struct ScatterChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub groups: Vec<String>,
    pub points: Vec<ScatterPoint>,
    pub width: f64,
    pub height: f64,
}

impl ScatterChart {
    pub fn render(&self) -> String {
        let pts: Vec<&ScatterPoint> = self.points.iter().filter(|p| p.x > 0.0 && p.x.is_finite() && p.y.is_finite()).collect();
        let ticks = decade_ticks(&pts.iter().map(|p| p.x).collect::<Vec<_>>());
        let (w, h) = (self.width, self.height);
        let bottom = h - BOTTOM - legend_height(w, self.groups.len());
        let ends = pts.iter().flat_map(|p| [Some(p.y), p.interval.map(|i| i.0), p.interval.map(|i| i.1)]).flatten().filter(|v| v.is_finite());
        let (lo, hi) = ends.fold((0.0f64, 0.0f64), |(a, b), v| (a.min(v), b.max(v)));
        let step = nice_ticks((hi - lo).max(1e-9), 5).get(1).copied().unwrap_or(1.0);
        let (y0, y1) = ((lo / step).floor() * step, ((hi / step).ceil() * step).max(step));
        let ys = Scale::new(y0, y1, bottom, TOP);
        let xs = LogScale { lo: ticks[0], hi: *ticks.last().unwrap(), p0: LEFT, p1: w - RIGHT };
        let n = ((y1 - y0) / step).round() as usize;
        let grid: Vec<(f64, f64)> = (0..=n).map(|i| y0 + i as f64 * step).map(|v| (ys.px(v), (v * 1e6).round() / 1e6)).collect();
        let mut s = open_chart(w, h, &self.title, grid.into_iter());
        for t in &ticks {
            let x = xs.px(*t);
            let _ = write!(s, r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#, bottom + 14.0, fmt_tick(*t));
        }
        let z = ys.px(0.0);
        let _ = write!(
            s,
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{z:.1}" y2="{z:.1}" stroke="#444"/><text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text><text transform="translate(14 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"##,
            w - RIGHT,
            (LEFT + w - RIGHT) / 2.0,
            bottom + 30.0,
            esc(&self.x_label),
            (TOP + bottom) / 2.0,
            esc(&self.y_label)
        );
        for p in pts {
            if let Some((a, b)) = p.interval.filter(|(a, b)| a.is_finite() && b.is_finite()) {
                let x = xs.px(p.x);
                let _ = write!(
                    s,
                    r#"<path class="pt-ci" d="M{x:.1},{:.1}V{:.1}M{:.1},{:.1}H{:.1}M{:.1},{:.1}H{:.1}" stroke="{}" stroke-opacity="0.6" fill="none"/>"#,
                    ys.px(a),
                    ys.px(b),
                    x - 3.0,
                    ys.px(a),
                    x + 3.0,
                    x - 3.0,
                    ys.px(b),
                    x + 3.0,
                    PALETTE[p.group % PALETTE.len()]
                );
            }
            let _ = write!(
                s,
                r#"<circle class="pt" cx="{:.1}" cy="{:.1}" r="3.5" fill="{}" fill-opacity="0.8"><title>{}</title></circle>"#,
                xs.px(p.x),
                ys.px(p.y),
                PALETTE[p.group % PALETTE.len()],
                esc(&p.title)
            );
        }
        let items: Vec<(String, String, bool)> =
            self.groups.iter().enumerate().map(|(i, g)| (g.clone(), PALETTE[i % PALETTE.len()].to_string(), false)).collect();
        legend(&mut s, w, bottom + BOTTOM + 4.0, &items);
        s.push_str("</svg>");
        s
    }
}

/// A shaded time band on a line chart (a fault window), `to: None` = to the right edge.
pub struct Band {
    pub from: f64,
    pub to: Option<f64>,
    pub title: String,
    pub color: String,
}

impl LineChart {
    /// The chart with `bands` shaded behind its lines (hover text: their titles).
    pub fn render_with_bands(&self, bands: &[Band]) -> String {
        let (xs, ys, _, _) = self.scales();
        let mut rects = String::new();
        for b in bands {
            let x0 = xs.px(b.from.max(xs.d0));
            let x1 = xs.px(b.to.unwrap_or(xs.d1).min(xs.d1));
            let _ = write!(
                rects,
                r#"<rect class="fault-window" x="{x0:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}" fill-opacity="0.18"><title>{}</title></rect>"#,
                ys.p1,
                (x1 - x0).max(1.0),
                ys.p0 - ys.p1,
                esc(&b.color),
                esc(&b.title)
            );
        }
        let s = self.render();
        match s.find(r#"<polyline class="series""#) {
            Some(i) => format!("{}{rects}{}", &s[..i], &s[i..]),
            None => s.replacen("</svg>", &format!("{rects}</svg>"), 1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_maps_ends_and_clamps() {
        let x = Scale::new(0.0, 10.0, 64.0, 584.0);
        assert_eq!(x.px(0.0), 64.0);
        assert_eq!(x.px(10.0), 584.0);
        assert_eq!(x.px(5.0), 324.0);
        assert_eq!(x.px(-3.0), 64.0);
        assert_eq!(x.px(99.0), 584.0);
        // y runs upwards: bigger values, smaller pixel coordinates
        let y = Scale::new(0.0, 100.0, 300.0, 28.0);
        assert_eq!(y.px(0.0), 300.0);
        assert_eq!(y.px(100.0), 28.0);
        assert!(y.px(75.0) < y.px(25.0));
        // empty domain does not divide by zero
        let z = Scale::new(0.0, 0.0, 0.0, 100.0);
        assert!(z.px(0.0).is_finite());
    }

    #[test]
    fn nice_ticks_cover_the_maximum() {
        assert_eq!(nice_ticks(97.0, 5), vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
        assert_eq!(nice_ticks(100.0, 5), vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
        assert_eq!(nice_ticks(4.2, 8), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(nice_ticks(0.0, 5), vec![0.0, 0.2, 0.4, 0.6000000000000001, 0.8, 1.0]);
        assert_eq!(nice_ticks(f64::NAN, 5).last(), Some(&1.0));
        let t = nice_ticks(465.3, 5);
        assert_eq!(t.last(), Some(&500.0));
        assert_eq!(t[1], 100.0);
    }

    #[test]
    fn tick_labels_have_no_float_noise() {
        assert_eq!(fmt_tick(0.6000000000000001), "0.6");
        assert_eq!(fmt_tick(20.0), "20");
        assert_eq!(fmt_tick(0.25), "0.25");
    }

    #[test]
    fn chart_axes_follow_data_and_markers() {
        let c = LineChart {
            title: "t".into(),
            x_label: "s".into(),
            y_label: "MiB/s".into(),
            series: vec![Series { name: "a".into(), color: "#000".into(), dashed: false, points: vec![(0.0, 0.0), (9.0, 460.0)] }],
            markers: vec![Marker { x: 12.5, title: "m".into(), color: "#000".into() }],
            width: 640.0,
            height: 320.0,
            extent: None,
        };
        let (xs, ys, xt, yt) = c.scales();
        assert_eq!(xt.last(), Some(&14.0)); // the marker at 12.5 extends the axis past the data
        assert_eq!(yt.last(), Some(&500.0));
        assert_eq!(xs.px(0.0), LEFT);
        assert_eq!(ys.px(500.0), TOP);
        let svg = c.render();
        assert_eq!(svg.matches("class=\"fault-marker\"").count(), 1);
        assert_eq!(svg.matches("<polyline").count(), 1);
        // the point (9, 460) lands inside the plot area
        let (px, py) = (xs.px(9.0), ys.px(460.0));
        assert!(svg.contains(&format!("{px:.1},{py:.1}")));
        assert!(px > LEFT && px < 640.0 - RIGHT && py > TOP && py < ys.p0);
    }

    #[test]
    fn small_multiples_share_the_extent_they_are_given() {
        let chart = |y: f64, extent| LineChart {
            title: "t".into(),
            x_label: "s".into(),
            y_label: "MiB/s".into(),
            series: vec![Series { name: "a".into(), color: "#000".into(), dashed: false, points: vec![(1.0, y), (4.0, y)] }],
            markers: vec![],
            width: 360.0,
            height: 200.0,
            extent,
        };
        // on their own: each its data's scale; given one extent: the same scale, the lower line lower
        assert_ne!(chart(3.0, None).scales().3, chart(300.0, None).scales().3);
        let (a, b) = (chart(3.0, Some((12.0, 300.0))).scales(), chart(300.0, Some((12.0, 300.0))).scales());
        assert_eq!((a.0, a.1), (b.0, b.1));
        assert!(a.1.px(3.0) > b.1.px(300.0));
    }

    #[test]
    fn decades_and_log_scale() {
        assert_eq!(decade_ticks(&[7.5, 25.3, 1023.0]), vec![1.0, 10.0, 100.0, 1000.0, 10000.0]);
        assert_eq!(decade_ticks(&[10.0, 100.0]), vec![10.0, 100.0]);
        assert_eq!(decade_ticks(&[50.0]), vec![10.0, 100.0]);
        assert_eq!(decade_ticks(&[100.0]), vec![100.0, 1000.0]);
        assert_eq!(decade_ticks(&[0.0, -1.0, f64::NAN]), vec![1.0, 10.0]);
        let y = LogScale { lo: 1.0, hi: 1000.0, p0: 300.0, p1: 0.0 };
        assert_eq!(y.px(1.0), 300.0);
        assert_eq!(y.px(1000.0), 0.0);
        assert!((y.px(10.0) - 200.0).abs() < 1e-9);
        assert!((y.px(100.0) - 100.0).abs() < 1e-9);
        assert_eq!(y.px(0.0), 300.0); // clamped, never -inf
    }

    #[test]
    fn bar_chart_draws_positive_values_only() {
        let c = BarChart {
            title: "lat".into(),
            y_label: "us".into(),
            groups: vec!["p50".into(), "max".into()],
            series: vec![
                BarSeries { name: "a".into(), color: "#000".into(), values: vec![8.0, 1000.0] },
                BarSeries { name: "b".into(), color: "#111".into(), values: vec![0.0, 500.0] },
            ],
            width: 400.0,
            height: 240.0,
        };
        let svg = c.render();
        assert_eq!(svg.matches("class=\"bar\"").count(), 3);
        let (ys, ticks) = c.scale();
        assert_eq!(ticks, vec![1.0, 10.0, 100.0, 1000.0]);
        assert_eq!(ys.px(1000.0), TOP);
    }

    #[test]
    fn interval_chart_holds_zero_and_draws_whiskers_where_given() {
        let row = |v: f64, i: Option<(f64, f64)>| IntervalRow { label: "x".into(), value: v, interval: i, strong: true };
        let c = IntervalChart {
            title: "t".into(),
            x_label: "%".into(),
            rows: vec![row(12.0, Some((4.0, 20.0))), row(3.0, None)],
            width: 600.0,
            label_width: 200.0,
        };
        let x = c.scale();
        assert_eq!(x.d0, 0.0, "all positive: the axis starts at zero");
        assert!(x.d1 >= 20.0);
        let svg = c.render();
        assert_eq!(svg.matches("class=\"sd-bar\"").count(), 2);
        assert_eq!(svg.matches("class=\"sd-ci\"").count(), 1);
        let neg = IntervalChart { rows: vec![row(-5.0, Some((-9.0, -1.0)))], ..c };
        assert!(neg.scale().d0 < -9.0 && neg.scale().d1 >= 0.0);
    }

    #[test]
    fn cdf_and_scatter_draw_what_they_are_given() {
        let se = |d| Series { name: "w".into(), color: "#000".into(), dashed: d, points: vec![(10.0, 0.5), (100.0, 1.0)] };
        let svg = CdfChart { title: "c".into(), series: vec![se(true), se(false)], width: 500.0, height: 260.0 }.render();
        assert_eq!(svg.matches("class=\"cdf\"").count(), 2);
        assert_eq!(svg.matches("stroke-dasharray").count(), 2, "one dashed line and its legend entry");
        let p = |x: f64, y: f64| ScatterPoint { x, y, group: 0, title: "p".into(), interval: (y == 0.1).then_some((-0.5, 0.7)) };
        let svg = ScatterChart {
            title: "s".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            groups: vec!["write".into()],
            points: vec![p(10.0, 0.1), p(1000.0, -0.2), p(0.0, 1.0)],
            width: 500.0,
            height: 300.0,
        }
        .render();
        assert_eq!(svg.matches("class=\"pt\"").count(), 2, "a zero baseline has no place on a log axis");
        assert_eq!(svg.matches("class=\"pt-ci\"").count(), 1, "one point has an interval");
    }
}
