//! `projector run`'s configuration: flags first, then the environment, then the TOML file
//! given with `--config`, then defaults. Every mistake is reported on one line that says
//! what to fix.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use serde::Deserialize;

/// The file form. Unknown keys are refused, so a typo never silently falls back to a default.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct File {
    pub brokers: Option<String>,
    pub topic: Option<String>,
    pub views: Option<Vec<String>>,
    pub database_url: Option<String>,
    pub group_prefix: Option<String>,
    pub instance_id: Option<String>,
    pub pool_size: Option<usize>,
    /// librdkafka properties, e.g. `"security.protocol" = "SASL_SSL"`.
    #[serde(default)]
    pub kafka: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub batch: BatchFile,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchFile {
    pub max_messages: Option<usize>,
    pub max_bytes: Option<usize>,
    pub linger_ms: Option<u64>,
}

impl File {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        toml::from_str(&text).map_err(|e| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].lines().count().max(1))
                .map_or(String::new(), |l| format!(" line {l}:"));
            anyhow!(
                "config file {}:{line} {}",
                path.display(),
                e.message().trim()
            )
        })
    }
}

/// `key=value`, for `-X`.
pub fn parse_property(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.to_owned())),
        _ => Err(format!(
            "expected key=value (a librdkafka property), got {s:?}"
        )),
    }
}

/// The flags of `projector run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Kafka bootstrap servers.
    #[arg(long, env = "KAFKA_BROKERS")]
    pub brokers: Option<String>,
    /// The topic of events.
    #[arg(long, env = "PROJECTOR_TOPIC")]
    pub topic: Option<String>,
    /// Comma-separated view names to run (default: every registered view).
    #[arg(long, value_delimiter = ',')]
    pub views: Vec<String>,
    /// A TOML configuration file; flags and environment take precedence over it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Consumer groups are named `<prefix>.<view>_v<version>`.
    #[arg(long)]
    pub group_prefix: Option<String>,
    /// Static group membership id, unique per process (`group.instance.id`).
    #[arg(long, env = "PROJECTOR_INSTANCE_ID")]
    pub instance_id: Option<String>,
    /// A librdkafka property, repeatable: `-X security.protocol=SASL_SSL`.
    #[arg(short = 'X', value_name = "KEY=VALUE", value_parser = parse_property)]
    pub properties: Vec<(String, String)>,
    /// PostgreSQL connections in the pool.
    #[arg(long)]
    pub pool_size: Option<usize>,
    /// Close a batch at this many messages.
    #[arg(long)]
    pub max_batch_messages: Option<usize>,
    /// Close a batch this long after its first message when no more arrive, in milliseconds.
    #[arg(long)]
    pub linger_ms: Option<u64>,
    /// Do not apply migrations at start.
    #[arg(long)]
    pub no_migrate: bool,
}

/// Everything `run` needs, resolved.
#[derive(Debug)]
pub struct Resolved {
    pub kafka: projector_engine::kafka::source::KafkaConfig,
    pub views: Vec<String>,
    pub database_url: String,
    pub pool_size: usize,
}

pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/projector";

pub fn resolve(args: RunArgs, database_url: Option<String>) -> anyhow::Result<Resolved> {
    let file = match &args.config {
        Some(path) => File::load(path)?,
        None => File::default(),
    };
    let Some(brokers) = args.brokers.or(file.brokers) else {
        bail!("no Kafka brokers: pass --brokers, set KAFKA_BROKERS, or put brokers = \"host:9092\" in --config");
    };
    let Some(topic) = args.topic.or(file.topic) else {
        bail!("no topic: pass --topic, set PROJECTOR_TOPIC, or put topic = \"events\" in --config");
    };
    let mut kafka = projector_engine::kafka::source::KafkaConfig::new(brokers, topic);
    if let Some(prefix) = args.group_prefix.or(file.group_prefix) {
        kafka.group_prefix = prefix;
    }
    kafka.instance_id = args.instance_id.or(file.instance_id);
    // File properties first, flags after them: librdkafka keeps the last value set.
    kafka.properties = file.kafka.into_iter().chain(args.properties).collect();
    if let Some(n) = args.max_batch_messages.or(file.batch.max_messages) {
        if n == 0 {
            bail!("--max-batch-messages must be at least 1");
        }
        kafka.max_batch_messages = n;
    }
    if let Some(n) = file.batch.max_bytes {
        kafka.max_batch_bytes = n;
    }
    if let Some(ms) = args.linger_ms.or(file.batch.linger_ms) {
        kafka.linger = Duration::from_millis(ms);
    }
    let pool_size = args.pool_size.or(file.pool_size).unwrap_or(16);
    if pool_size == 0 {
        bail!("--pool-size must be at least 1");
    }
    Ok(Resolved {
        kafka,
        views: if args.views.is_empty() {
            file.views.unwrap_or_default()
        } else {
            args.views
        },
        database_url: database_url
            .or(file.database_url)
            .unwrap_or_else(|| DEFAULT_DATABASE_URL.to_owned()),
        pool_size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_need_an_equals_sign() {
        assert_eq!(
            parse_property("acks=all"),
            Ok(("acks".to_owned(), "all".to_owned()))
        );
        assert_eq!(
            parse_property("sasl.jaas=a=b"),
            Ok(("sasl.jaas".to_owned(), "a=b".to_owned()))
        );
        let e = parse_property("acks").expect_err("no =");
        assert!(e.contains("key=value") && !e.contains('\n'), "{e}");
        assert!(parse_property("=x").is_err());
    }
}
