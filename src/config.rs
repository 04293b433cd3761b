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
    /// Where `run` serves `/metrics` and `/health` (`"off"`: nowhere).
    pub metrics_addr: Option<String>,
    /// The health rule's `stall_after`, as `"2m"`.
    pub stall_after: Option<String>,
    #[serde(default)]
    pub inbox: InboxFile,
    /// A directory of SQL views loaded beside the compiled ones (`--views-dir` wins).
    pub views_dir: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InboxFile {
    /// The shortest window `projector inbox prune` accepts, as `"7d"`: the broker's retention
    /// plus the time a dead letter may wait for its replay.
    pub min_window: Option<String>,
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
        let file: Self = toml::from_str(&text).map_err(|e| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].lines().count().max(1))
                .map_or(String::new(), |l| format!(" line {l}:"));
            anyhow!(
                "config file {}:{line} {}",
                path.display(),
                e.message().trim()
            )
        })?;
        // A file may hold secrets the command line never saw: keep them out of the logs.
        if let Some(url) = &file.database_url {
            crate::logging::redact_url(url);
        }
        crate::logging::redact_properties(&file.kafka);
        Ok(file)
    }

    /// The file named by `--config`, or an empty one.
    pub fn load_opt(path: Option<&Path>) -> anyhow::Result<Self> {
        match path {
            Some(path) => Self::load(path),
            None => Ok(Self::default()),
        }
    }
}

/// A duration flag: `7d`, `2m`, `500ms`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("expected a duration such as 7d, 5m or 500ms, got {s:?}: {e}"))
}

/// Where to serve metrics: `host:port`, or `off`.
pub fn parse_metrics_addr(s: &str) -> Result<MetricsAddr, String> {
    if s.trim().eq_ignore_ascii_case("off") {
        return Ok(MetricsAddr::Off);
    }
    s.trim()
        .parse::<std::net::SocketAddr>()
        .map(MetricsAddr::At)
        .map_err(|_| format!("expected host:port (such as 127.0.0.1:9187) or off, got {s:?}"))
}

/// `--metrics-addr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsAddr {
    /// Serve `/metrics` and `/health` here.
    At(std::net::SocketAddr),
    /// Serve nothing.
    Off,
}

/// Loopback: the endpoint is for the host's scraper (or a sidecar); exposing it further is a
/// decision (`--metrics-addr 0.0.0.0:9187`).
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9187";

/// The default `stall_after` of the health rule.
pub const DEFAULT_STALL_AFTER: Duration = Duration::from_secs(120);

/// The Kafka side every command that reads the topic shares: flags first, then the
/// environment (through clap), then the file.
pub fn kafka_config(
    brokers: Option<String>,
    topic: Option<String>,
    group_prefix: Option<String>,
    properties: Vec<(String, String)>,
    file: &File,
) -> anyhow::Result<projector_engine::kafka::source::KafkaConfig> {
    let Some(brokers) = brokers.or(file.brokers.clone()) else {
        bail!("no Kafka brokers: pass --brokers, set KAFKA_BROKERS, or put brokers = \"host:9092\" in --config");
    };
    let Some(topic) = topic.or(file.topic.clone()) else {
        bail!("no topic: pass --topic, set PROJECTOR_TOPIC, or put topic = \"events\" in --config");
    };
    let mut kafka = projector_engine::kafka::source::KafkaConfig::new(brokers, topic);
    if let Some(prefix) = group_prefix.or(file.group_prefix.clone()) {
        kafka.group_prefix = prefix;
    }
    crate::logging::redact_properties(properties.iter().map(|(k, v)| (k, v)));
    // File properties first, flags after them: librdkafka keeps the last value set.
    kafka.properties = file
        .kafka
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .chain(properties)
        .collect();
    Ok(kafka)
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
    /// Do not ring the read-your-writes bells after each batch: readers waiting in
    /// `projector.wait_applied` then check every 50 ms (docs/consistency.md).
    #[arg(long)]
    pub no_notify: bool,
    /// Serve Prometheus metrics at /metrics and the health check at /health here;
    /// `off` to serve nothing. [default: 127.0.0.1:9187]
    #[arg(long, value_parser = parse_metrics_addr)]
    pub metrics_addr: Option<MetricsAddr>,
    /// Health: a live view's partition that has not committed for this long while its
    /// oldest waiting message is at least this old is stalled (unhealthy). [default: 2m]
    #[arg(long, value_parser = parse_duration)]
    pub stall_after: Option<Duration>,
    /// How often the process takes its status snapshot (lag gauges, health).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub monitor_interval: Duration,
}

/// Everything `run` needs, resolved.
#[derive(Debug)]
pub struct Resolved {
    pub kafka: projector_engine::kafka::source::KafkaConfig,
    pub views: Vec<String>,
    pub database_url: String,
    pub pool_size: usize,
    pub metrics_addr: MetricsAddr,
    pub stall_after: Duration,
    pub monitor_interval: Duration,
}

pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/projector";

pub fn resolve(args: RunArgs, database_url: Option<String>) -> anyhow::Result<Resolved> {
    let file = File::load_opt(args.config.as_deref())?;
    let mut kafka = kafka_config(
        args.brokers,
        args.topic,
        args.group_prefix,
        args.properties,
        &file,
    )?;
    kafka.instance_id = args.instance_id.or(file.instance_id.clone());
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
    let metrics_addr = match (args.metrics_addr, &file.metrics_addr) {
        (Some(a), _) => a,
        (None, Some(text)) => {
            parse_metrics_addr(text).map_err(|e| anyhow!("config file: metrics_addr: {e}"))?
        }
        (None, None) => parse_metrics_addr(DEFAULT_METRICS_ADDR).map_err(|e| anyhow!(e))?,
    };
    let stall_after = stall_after(args.stall_after, &file)?;
    if args.monitor_interval.is_zero() {
        bail!("--monitor-interval must be longer than 0");
    }
    Ok(Resolved {
        kafka,
        views: if args.views.is_empty() {
            file.views.clone().unwrap_or_default()
        } else {
            args.views
        },
        database_url: database_url
            .or(file.database_url)
            .unwrap_or_else(|| DEFAULT_DATABASE_URL.to_owned()),
        pool_size,
        metrics_addr,
        stall_after,
        monitor_interval: args.monitor_interval,
    })
}

/// The health rule's `stall_after`: the flag, else the file, else the default.
pub fn stall_after(flag: Option<Duration>, file: &File) -> anyhow::Result<Duration> {
    let d = match (flag, &file.stall_after) {
        (Some(d), _) => d,
        (None, Some(text)) => {
            parse_duration(text).map_err(|e| anyhow!("config file: stall_after: {e}"))?
        }
        (None, None) => DEFAULT_STALL_AFTER,
    };
    if d.is_zero() {
        bail!("--stall-after must be longer than 0");
    }
    Ok(d)
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
