//! A small deterministic generator (SplitMix64), so that a run is reproducible from its seed
//! as far as concurrency allows, without a dependency.

/// SplitMix64.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// A number in `0..n` as `i64`.
    pub(crate) fn int(&mut self, n: i64) -> i64 {
        i64::try_from(self.below(n.unsigned_abs())).unwrap_or(0)
    }

    /// True `percent` times in a hundred.
    pub(crate) fn chance(&mut self, percent: u8) -> bool {
        self.below(100) < u64::from(percent)
    }

    /// True `basis_points` times in ten thousand.
    pub(crate) fn chance_bp(&mut self, basis_points: u16) -> bool {
        self.below(10_000) < u64::from(basis_points)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_numbers() {
        let a: Vec<u64> = {
            let mut r = Rng::new(7);
            (0..5).map(|_| r.below(1000)).collect()
        };
        let mut r = Rng::new(7);
        let b: Vec<u64> = (0..5).map(|_| r.below(1000)).collect();
        assert_eq!(a, b);
        assert!(a.iter().all(|&n| n < 1000));
        assert_ne!(a, vec![a[0]; 5], "not constant");
    }

    #[test]
    fn chances_are_near_their_percent() {
        let mut r = Rng::new(1);
        let hits = (0..10_000).filter(|_| r.chance(30)).count();
        assert!((2_700..3_300).contains(&hits), "{hits}");
        assert!(!Rng::new(1).chance(0));
        assert!(Rng::new(1).chance(100));
        assert_eq!(Rng::new(1).below(0), 0);
    }
}
