//! The partitions `projector publish` picks are the Java client's: librdkafka's
//! `murmur2_random`, seen through a real broker, agrees with `partition_for_account`, whose
//! hash is checked against Apache Kafka's own murmur2 vectors in the unit tests.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::support::broker::Broker;
use projector_devkit::partitioner::{murmur2, partition_for_account};
use projector_devkit::publish::{publish_lines, PublishConfig};

const PARTITIONS: i32 = 7;
const READ: Duration = Duration::from_secs(30);

fn event(n: usize, account: i64) -> String {
    format!(
        r#"{{"event_id":"p-{n}","type":"cash_adjusted","account_id":{account},"seq":1,"occurred_at":"2026-11-29T10:15:00Z","data":{{"amount":"1.00","reason":"test"}}}}"#
    )
}

/// Small, large and negative ids, so keys of every length modulo 4 are hashed.
fn accounts() -> Vec<i64> {
    let mut ids: Vec<i64> = (0..400).collect();
    ids.extend([
        1_000,
        12_345,
        987_654_321,
        4_294_967_296,
        i64::from(i32::MAX),
        i64::MAX,
        -1,
        -42,
        i64::MIN,
    ]);
    ids
}

fn lines(accounts: &[i64]) -> String {
    accounts
        .iter()
        .enumerate()
        .map(|(n, &a)| event(n, a) + "\n")
        .collect()
}

#[tokio::test]
async fn every_account_lands_where_the_java_client_puts_it() {
    let broker = Broker::start(&[("accounts", PARTITIONS)]);
    let topic = broker.topic("accounts");
    let accounts = accounts();
    let report = publish_lines(
        lines(&accounts).as_bytes(),
        &PublishConfig::new(broker.bootstrap_servers(), &topic),
    )
    .await
    .expect("publish");
    assert_eq!(report.sent, accounts.len() as u64);

    let messages = broker.read_topic(&topic, READ).expect("read back");
    assert_eq!(messages.len(), accounts.len());
    let mut per_partition: BTreeMap<i32, u64> = BTreeMap::new();
    for m in &messages {
        let key = String::from_utf8(m.key.clone().expect("every message is keyed")).expect("utf-8");
        let account: i64 = key.parse().expect("the key is the account id in decimal");
        let payload: serde_json::Value = serde_json::from_slice(&m.payload).expect("json");
        assert_eq!(payload["account_id"].as_i64(), Some(account));
        assert_eq!(
            m.partition,
            partition_for_account(account, PARTITIONS),
            "account {account} is on partition {} but the Java client would put it on {}",
            m.partition,
            partition_for_account(account, PARTITIONS)
        );
        *per_partition.entry(m.partition).or_default() += 1;
    }
    assert_eq!(
        per_partition, report.partitions,
        "the report counts deliveries"
    );
    assert_eq!(
        per_partition.len(),
        usize::try_from(PARTITIONS).expect("small"),
        "400 accounts spread over every partition"
    );

    // Kafka's UtilsTest vector: murmur2("21") = -973932308, and toPositive masks the sign
    // bit: 1173551340 % 7 = 3.
    assert_eq!(murmur2(b"21"), -973_932_308);
    let account_21 = messages
        .iter()
        .find(|m| m.key.as_deref() == Some(&b"21"[..]))
        .expect("account 21 was published");
    assert_eq!(account_21.partition, 3);
}

/// Without `partitioner=murmur2_random` librdkafka hashes keys with CRC32, and accounts land
/// elsewhere. This also shows the test above would catch a producer left on the default.
#[tokio::test]
async fn the_librdkafka_default_would_split_accounts_from_java_producers() {
    let broker = Broker::start(&[("crc", PARTITIONS)]);
    let topic = broker.topic("crc");
    let accounts = accounts();
    let mut config = PublishConfig::new(broker.bootstrap_servers(), &topic);
    config
        .properties
        .push(("partitioner".to_owned(), "consistent_random".to_owned()));
    publish_lines(lines(&accounts).as_bytes(), &config)
        .await
        .expect("publish");

    let messages = broker.read_topic(&topic, READ).expect("read back");
    assert_eq!(messages.len(), accounts.len());
    let moved: BTreeSet<i64> = messages
        .iter()
        .filter_map(|m| {
            let account: i64 = std::str::from_utf8(m.key.as_deref()?).ok()?.parse().ok()?;
            (m.partition != partition_for_account(account, PARTITIONS)).then_some(account)
        })
        .collect();
    assert!(
        moved.len() > accounts.len() / 2,
        "CRC32 and murmur2 should disagree on most accounts, disagreed on {}",
        moved.len()
    );
}
