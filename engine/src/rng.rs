//! The one small random generator of the project: reproducible from a seed, without a
//! dependency. The conformance suite and the integration tests (which know it as
//! `testkit::Lcg`), the bench's event streams and the development write side's load, relay
//! crashes and quote feed all draw from it, so a seed means one thing everywhere.
//!
//! A 64-bit linear congruential generator (Knuth's MMIX constants) of which each draw keeps
//! the high bits, the random ones: good enough to shuffle tests and workloads, not for
//! statistics or secrets. The algorithm is the one the suite and the bench always had; their
//! seeds give the streams they gave.

/// A deterministic generator: the same seed gives the same numbers.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 31 random bits.
    fn step(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.step() % n.max(1) as u64) as usize
    }

    /// A number in `0..n`, signed, for building decimals and ids (0 when `n` is 0 or
    /// negative).
    pub fn int(&mut self, n: impl TryInto<usize>) -> i64 {
        let n = n.try_into().unwrap_or(0);
        i64::try_from(self.below(n)).unwrap_or(i64::MAX)
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    /// True `basis_points` times in ten thousand.
    pub fn chance_bp(&mut self, basis_points: u16) -> bool {
        self.below(10_000) < usize::from(basis_points)
    }

    /// 64 random bits, from two draws.
    pub fn next_u64(&mut self) -> u64 {
        (self.step() << 33) ^ self.step()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_numbers() {
        let a: Vec<usize> = {
            let mut r = Rng::new(7);
            (0..5).map(|_| r.below(1000)).collect()
        };
        let mut r = Rng::new(7);
        let b: Vec<usize> = (0..5).map(|_| r.below(1000)).collect();
        assert_eq!(a, b);
        assert!(a.iter().all(|&n| n < 1000));
        assert_ne!(a, vec![a[0]; 5], "not constant");
    }

    /// The streams the suite's and the bench's seeds have always given: the integration tests
    /// and the bench's event shapes were written against them.
    #[test]
    fn the_stream_is_the_one_it_always_was() {
        let mut r = Rng(7);
        let first: Vec<usize> = (0..6).map(|_| r.below(1000)).collect();
        let mut state = 7u64;
        let expected: Vec<usize> = (0..6)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((state >> 33) % 1000) as usize
            })
            .collect();
        assert_eq!(first, expected);
    }

    #[test]
    fn chances_are_near_their_percent() {
        let mut r = Rng::new(1);
        let hits = (0..10_000).filter(|_| r.chance(30)).count();
        assert!((2_700..3_300).contains(&hits), "{hits}");
        let hits = (0..100_000).filter(|_| r.chance_bp(250)).count();
        assert!((2_200..2_800).contains(&hits), "{hits}");
        assert!(!Rng::new(1).chance(0));
        assert!(Rng::new(1).chance(100));
        assert_eq!(Rng::new(1).below(0), 0);
        assert_eq!(Rng::new(1).int(-5), 0);
        assert!((0..100).all(|_| r.int(3_i64) < 3));
    }

    #[test]
    fn wide_draws_use_the_high_bits() {
        let mut r = Rng::new(3);
        let draws: Vec<u64> = (0..64).map(|_| r.next_u64()).collect();
        assert!(draws.iter().any(|d| d >> 62 != 0), "the top bits vary");
        assert!(draws.iter().any(|d| d & 1 == 1) && draws.iter().any(|d| d & 1 == 0));
    }
}
