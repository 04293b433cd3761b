//! The partition an account's events land on, computed exactly as Apache Kafka's Java
//! producer computes it.
//!
//! Per-account ordering holds only if every event of an account lands
//! on one partition, whoever produced it. librdkafka's default partitioner is
//! `consistent_random` (CRC32 of the key), which sends the same key to a *different*
//! partition than the Java client's murmur2 partitioner. A deployment where a Java service
//! and `projector publish` both write the topic would then split an account over two
//! partitions, and two consumers could apply its events out of order. `projector publish`
//! therefore sets librdkafka's `partitioner=murmur2_random`, and this module is the
//! reference it is tested against: the same hash as `org.apache.kafka.common.utils.Utils`,
//! checked with the vectors from Kafka's own `UtilsTest`.
//!
//! Changing a topic's partition count moves keys; see the migration procedure in the docs.

/// Apache Kafka's `Utils.murmur2`: MurmurHash2 (32-bit) with Kafka's seed, returning the
/// hash as the Java `int` it is, negative values included.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;

    // Java computes with wrapping `int` arithmetic and `>>>`; on `u32` the bit patterns are
    // the same and `>>` is the unsigned shift. Java's length is an `int`, hence the truncation.
    let mut h: u32 = SEED ^ (data.len() as u32);

    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }

    let tail = chunks.remainder();
    if !tail.is_empty() {
        // Java's switch falls through from case 3 to case 1.
        if let Some(&b) = tail.get(2) {
            h ^= u32::from(b) << 16;
        }
        if let Some(&b) = tail.get(1) {
            h ^= u32::from(b) << 8;
        }
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }

    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    i32::from_ne_bytes(h.to_ne_bytes())
}

/// The partition Kafka's Java producer picks for a non-null key:
/// `Utils.toPositive(Utils.murmur2(key)) % partitions`.
///
/// `toPositive` masks the sign bit rather than taking the absolute value, so `i32::MIN`
/// maps to 0 instead of overflowing.
///
/// # Panics
///
/// When `partitions` is not positive: a topic always has at least one partition.
pub fn partition_for_key(key: &[u8], partitions: i32) -> i32 {
    assert!(partitions > 0, "a topic has at least one partition");
    (murmur2(key) & 0x7fff_ffff) % partitions
}

/// The partition of an account's events: the key is the account id as a decimal UTF-8
/// string (the wire format's message key), hashed as [`partition_for_key`] does.
///
/// # Panics
///
/// When `partitions` is not positive.
pub fn partition_for_account(account_id: i64, partitions: i32) -> i32 {
    partition_for_key(account_id.to_string().as_bytes(), partitions)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `org.apache.kafka.common.utils.UtilsTest#testMurmur2`.
    const KAFKA_VECTORS: [(&str, i32); 6] = [
        ("21", -973_932_308),
        ("foobar", -790_332_482),
        ("a-little-bit-long-string", -985_981_536),
        ("a-little-bit-longer-string", -1_486_304_829),
        (
            "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
            -58_897_971,
        ),
        ("abc", 479_470_107),
    ];

    #[test]
    fn murmur2_matches_the_java_client() {
        for (key, expected) in KAFKA_VECTORS {
            assert_eq!(murmur2(key.as_bytes()), expected, "murmur2({key:?})");
        }
    }

    #[test]
    fn every_tail_length_is_hashed() {
        // Keys of length 0..=3 mod 4 take different tail paths; none may collide trivially.
        let hashes: Vec<i32> = ["", "a", "ab", "abc", "abcd", "abcde"]
            .iter()
            .map(|k| murmur2(k.as_bytes()))
            .collect();
        let mut unique = hashes.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), hashes.len(), "{hashes:?}");
    }

    #[test]
    fn partitions_follow_to_positive() {
        for (key, hash) in KAFKA_VECTORS {
            for partitions in [1, 2, 3, 7, 12, 100] {
                let expected = (hash & 0x7fff_ffff) % partitions;
                let p = partition_for_key(key.as_bytes(), partitions);
                assert_eq!(p, expected, "{key:?} over {partitions}");
                assert!((0..partitions).contains(&p));
            }
        }
        // A negative hash is masked, not negated: abs() would pick another partition.
        let h = murmur2(b"21");
        assert!(h < 0);
        assert_ne!(
            partition_for_key(b"21", 7),
            i32::try_from(h.unsigned_abs() % 7).unwrap_or(-1)
        );
    }

    #[test]
    fn accounts_are_keyed_by_their_decimal_id() {
        assert_eq!(
            partition_for_account(21, 7),
            partition_for_key(b"21", 7),
            "account 21 is the key \"21\""
        );
        assert_eq!(partition_for_account(-5, 4), partition_for_key(b"-5", 4));
    }
}
