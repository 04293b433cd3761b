//! The figures' arithmetic and text: rates, ratios, milliseconds and percentiles, in integer
//! arithmetic (the workspace denies floating point), never shown better than they are.

use std::time::Duration;

/// Events per second, whole.
pub(crate) fn eps(events: u64, elapsed: Duration) -> u64 {
    let nanos = elapsed.as_nanos().max(1);
    u64::try_from(u128::from(events) * 1_000_000_000 / nanos).unwrap_or(u64::MAX)
}

/// `a / b` with one decimal, truncated (never shown better than it is), as text: no floating
/// point, the workspace denies it.
pub(crate) fn ratio(a: u64, b: u64) -> String {
    if b == 0 {
        return "0.0".to_owned();
    }
    let tenths = u128::from(a) * 10 / u128::from(b);
    format!("{}.{}", tenths / 10, tenths % 10)
}

/// `a / b` with two decimals, truncated.
pub(crate) fn ratio2(a: u64, b: u64) -> String {
    if b == 0 {
        return "0.00".to_owned();
    }
    let hundredths = u128::from(a) * 100 / u128::from(b);
    format!("{}.{:02}", hundredths / 100, hundredths % 100)
}

/// Milliseconds with one decimal.
pub(crate) fn millis(d: Duration) -> String {
    let tenths = tenths_of_ms(d);
    format!("{}.{}", tenths / 10, tenths % 10)
}

/// Tenths of a millisecond, rounded up: a latency is never shown better than it is.
pub(crate) fn tenths_of_ms(d: Duration) -> u128 {
    d.as_micros().div_ceil(100)
}

/// Nearest-rank percentile of sorted durations.
pub(crate) fn percentile(sorted: &[Duration], pct: u64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let n = sorted.len() as u64;
    let rank = (n * pct).div_ceil(100).max(1);
    sorted[usize::try_from(rank - 1).unwrap_or(0).min(sorted.len() - 1)]
}

/// Thousands separators, for the table.
pub(crate) fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The best of several samples, and the samples. Interference on a shared machine only ever
/// slows a run down, so the fastest sample is the least disturbed one.
pub(crate) fn best(samples: &[u64]) -> u64 {
    samples.iter().copied().max().unwrap_or(0)
}

/// An integer in millions or thousands where that is exact enough to read: `20M`.
pub(crate) fn short(n: u64) -> String {
    if n >= 1_000_000 && n % 1_000_000 == 0 {
        format!("{}M", n / 1_000_000)
    } else if n >= 1000 && n % 1000 == 0 {
        format!("{}k", n / 1000)
    } else {
        grouped(n)
    }
}

/// `a >= b * num / den`, exactly.
pub(crate) fn at_least(a: u64, b: u64, num: u64, den: u64) -> bool {
    u128::from(a) * u128::from(den) >= u128::from(b) * u128::from(num)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_formatting() {
        assert_eq!(ratio(25, 10), "2.5");
        assert_eq!(ratio(2, 3), "0.6");
        assert_eq!(ratio2(2, 3), "0.66");
        assert_eq!(ratio2(39_655, 79_685), "0.49");
        assert_eq!(millis(Duration::from_micros(12_345)), "12.4");
        assert_eq!(millis(Duration::from_micros(12_300)), "12.3");
        assert_eq!(grouped(1_234_567), "1,234,567");
        assert_eq!(grouped(999), "999");
        let d: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&d, 50), Duration::from_millis(50));
        assert_eq!(percentile(&d, 99), Duration::from_millis(99));
        assert_eq!(eps(1000, Duration::from_millis(500)), 2000);
    }
}
