//! The table and the JSON: rows of bridge figure, baseline figure and ratio.

use super::*;

#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    name: String,
    unit: String,
    bridge: Stats,
    baseline_name: String,
    baseline: Stats,
    /// bridge median / baseline median.
    ratio: f64,
    higher_is_better: bool,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Stats {
    median: f64,
    min: f64,
    max: f64,
    n: usize,
}

impl Stats {
    fn of(mut v: Vec<f64>) -> Self {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Self { median, min: v[0], max: v[n - 1], n }
    }
}

/// The `p` quantile (0..=1) of `v`, nearest rank.
pub fn percentile(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[((s.len() - 1) as f64 * p).round() as usize]
}

/// A duration in milliseconds, as the setup rows report it.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A row from samples: medians, min–max and the ratio of the medians.
pub fn row(
    name: &str,
    unit: &str,
    bridge: Vec<f64>,
    baseline_name: &str,
    baseline: Vec<f64>,
    higher: bool,
) -> Row {
    let bridge = Stats::of(bridge);
    let baseline = Stats::of(baseline);
    let ratio = bridge.median / baseline.median;
    let r = Row {
        name: name.into(),
        unit: unit.into(),
        bridge,
        baseline_name: baseline_name.into(),
        baseline,
        ratio,
        higher_is_better: higher,
    };
    eprintln!(
        "bench: {} bridge {:.2} vs {:.2} {} (ratio {:.2})",
        r.name, r.bridge.median, r.baseline.median, unit, ratio
    );
    r
}

/// A row from single figures (percentiles, aggregates).
pub fn row_stats(name: &str, unit: &str, bridge: f64, baseline: f64, higher: bool) -> Row {
    row(name, unit, vec![bridge], "raw iroh echo", vec![baseline], higher)
}

impl Row {
    pub fn named_baseline(mut self, name: &str) -> Row {
        self.baseline_name = name.into();
        self
    }
}

/// The markdown table docs/performance.md quotes.
pub fn print_table(rows: &[Row]) {
    println!("| measure | bridge median (min–max) | baseline | baseline median (min–max) | ratio |");
    println!("|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {:.2} {} ({:.2}–{:.2}) | {} | {:.2} {} ({:.2}–{:.2}) | {:.2}× |",
            r.name,
            r.bridge.median,
            r.unit,
            r.bridge.min,
            r.bridge.max,
            r.baseline_name,
            r.baseline.median,
            r.unit,
            r.baseline.min,
            r.baseline.max,
            r.ratio
        );
    }
}
