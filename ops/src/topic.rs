//! What operations ask of the Kafka brokers about a topic besides its log: how long they keep
//! its messages. The log itself (partitions, watermarks, the time of the oldest message a
//! view version has not consumed yet) is read by the engine's groupless
//! [`LogReader`](projector_engine::kafka::log::LogReader), which rebuilds ask too.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::KafkaError;

use super::error::{kafka, OpsError};
use crate::kafka::source::KafkaConfig;

/// How long the brokers keep a topic's messages: its `retention.ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    /// Messages older than this are deleted (a whole segment at a time, so some stay up to a
    /// segment's span longer).
    For(Duration),
    /// `retention.ms = -1`: never for their age.
    Forever,
}

/// `topic`'s `retention.ms`, asked with DescribeConfigs (Kafka's admin API) on the brokers
/// of `config`, waiting at most `timeout`. Fails where the brokers do not answer it:
/// librdkafka's mock cluster, for one, has no admin API.
pub async fn retention(
    config: &KafkaConfig,
    topic: &str,
    timeout: Duration,
) -> Result<Retention, OpsError> {
    let admin: AdminClient<DefaultClientContext> = config
        .plain_client_config()
        .create()
        .map_err(kafka("creating a Kafka admin client"))?;
    let options = AdminOptions::new().request_timeout(Some(timeout));
    let asked = [ResourceSpecifier::Topic(topic)];
    // librdkafka times the request out itself; this bounds a client that never connects.
    let answers = tokio::time::timeout(
        timeout + Duration::from_secs(1),
        admin.describe_configs(&asked, &options),
    )
    .await
    .map_err(|_| OpsError::Unanswered(format!("no answer within {}s", timeout.as_secs())))?
    .map_err(kafka("describing the topic's configuration"))?;
    let resource = answers
        .into_iter()
        .next()
        .ok_or_else(|| OpsError::Unanswered("no configuration in the answer".to_owned()))?
        .map_err(|code| OpsError::Kafka {
            doing: "describing the topic's configuration",
            source: KafkaError::AdminOp(code),
        })?;
    let value = resource
        .get("retention.ms")
        .and_then(|e| e.value.as_deref())
        .ok_or_else(|| OpsError::Unanswered("the answer has no retention.ms".to_owned()))?;
    match value.trim().parse::<i64>() {
        Ok(ms) if ms < 0 => Ok(Retention::Forever),
        Ok(ms) => Ok(Retention::For(Duration::from_millis(ms.unsigned_abs()))),
        Err(_) => Err(OpsError::Unanswered(format!(
            "retention.ms is {value:?}, not a number"
        ))),
    }
}
