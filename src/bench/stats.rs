//! Latency percentiles from sorted samples, and a fairness measure.
//!
//! Runs are short (seconds to minutes at a few thousand ops/s), so keeping
//! every sample and sorting once is exact and cheaper to trust than a
//! bucketed histogram.

use std::time::Duration;

/// Percentiles of one run's latencies.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Latency {
    pub p50: Duration,
    pub p99: Duration,
    pub p999: Duration,
    pub max: Duration,
}

impl Latency {
    /// Nearest-rank percentiles; `samples` need not be sorted.
    pub fn of(samples: &mut [Duration]) -> Self {
        samples.sort_unstable();
        Self {
            p50: percentile(samples, 500),
            p99: percentile(samples, 990),
            p999: percentile(samples, 999),
            max: samples.last().copied().unwrap_or_default(),
        }
    }
}

/// The nearest-rank quantile of sorted `samples`, in thousandths (integer
/// arithmetic: `0.999 * 1000` in floating point rounds up a rank).
fn percentile(sorted: &[Duration], permille: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (permille * sorted.len()).div_ceil(1000);
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Jain's fairness index over per-client counts: 1.0 when every client got
/// the same share, 1/n when one client got everything.
pub fn jain_index(counts: &[u64]) -> f64 {
    let sum: f64 = counts.iter().map(|&c| c as f64).sum();
    let squares: f64 = counts.iter().map(|&c| (c as f64) * (c as f64)).sum();
    if counts.is_empty() || squares == 0.0 {
        return 0.0;
    }
    sum * sum / (counts.len() as f64 * squares)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn nearest_rank_percentiles() {
        let mut samples: Vec<Duration> = (1..=1000).rev().map(ms).collect();
        let lat = Latency::of(&mut samples);
        assert_eq!(lat.p50, ms(500));
        assert_eq!(lat.p99, ms(990));
        assert_eq!(lat.p999, ms(999));
        assert_eq!(lat.max, ms(1000));
    }

    #[test]
    fn empty_and_single_samples() {
        assert_eq!(Latency::of(&mut []), Latency::default());
        let lat = Latency::of(&mut [ms(7)]);
        assert_eq!((lat.p50, lat.p999, lat.max), (ms(7), ms(7), ms(7)));
    }

    #[test]
    fn jain_index_bounds() {
        assert!((jain_index(&[5, 5, 5, 5]) - 1.0).abs() < 1e-9);
        assert!((jain_index(&[8, 0, 0, 0]) - 0.25).abs() < 1e-9);
        assert_eq!(jain_index(&[]), 0.0);
    }
}
