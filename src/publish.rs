//! `projector publish`: JSON-lines events from a file or standard input to a Kafka topic,
//! keyed by account and partitioned like the Java client.

use std::io::Read;
use std::path::PathBuf;

use anyhow::Context as _;
use bytes::Bytes;
use projector_devkit::publish::{publish_lines, PublishConfig};
use tokio::io::AsyncBufRead;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::io::StreamReader;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Kafka bootstrap servers, e.g. `localhost:9092`.
    #[arg(long, env = "KAFKA_BROKERS")]
    brokers: String,
    /// The topic to publish to.
    #[arg(long)]
    topic: String,
    /// A librdkafka property, applied last; repeat for more
    /// (e.g. `-X security.protocol=ssl -X message.timeout.ms=30000`).
    #[arg(short = 'X', value_name = "KEY=VALUE", value_parser = crate::config::parse_property)]
    properties: Vec<(String, String)>,
    /// A file of JSON lines, one event per line; `-` or nothing reads standard input.
    #[arg(value_name = "FILE")]
    file: Option<PathBuf>,
}

/// Publishes the file (or standard input) and says how many events went to each partition.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let (source, name): (Box<dyn Read + Send>, String) = match &args.file {
        Some(path) if path.as_os_str() != "-" => {
            let file = std::fs::File::open(path)
                .with_context(|| format!("cannot open {}", path.display()))?;
            (Box::new(file), path.display().to_string())
        }
        _ => (Box::new(std::io::stdin()), "standard input".to_owned()),
    };
    let config = PublishConfig {
        brokers: args.brokers,
        topic: args.topic,
        properties: args.properties,
    };
    let report = publish_lines(input_reader(source)?, &config)
        .await
        .with_context(|| format!("publishing {name} to {}", config.topic))?;
    let partitions: Vec<String> = report
        .partitions
        .iter()
        .map(|(p, n)| format!("{p}:{n}"))
        .collect();
    println!(
        "published {} event{} from {name} to {} (partition:events {})",
        report.sent,
        if report.sent == 1 { "" } else { "s" },
        config.topic,
        if partitions.is_empty() {
            "none".to_owned()
        } else {
            partitions.join(" ")
        }
    );
    Ok(())
}

/// Streams a blocking reader into async code. A plain thread reads, so a terminal or pipe
/// that never ends cannot hold up the runtime's shutdown (a `spawn_blocking` task would).
fn input_reader(mut source: Box<dyn Read + Send>) -> anyhow::Result<impl AsyncBufRead + Unpin> {
    const CHUNK: usize = 64 * 1024;
    let (tx, rx) = mpsc::channel::<std::io::Result<Bytes>>(4);
    std::thread::Builder::new()
        .name("publish-input".to_owned())
        .spawn(move || loop {
            let mut buf = vec![0; CHUNK];
            let chunk = match source.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    buf.truncate(n);
                    Ok(Bytes::from(buf))
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => Err(e),
            };
            let failed = chunk.is_err();
            // An error here means publishing stopped (a bad line) and nobody reads on.
            if tx.blocking_send(chunk).is_err() || failed {
                return;
            }
        })
        .context("cannot start the input thread")?;
    Ok(StreamReader::new(ReceiverStream::new(rx)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_input_reader_streams_lines() {
        use tokio::io::AsyncBufReadExt as _;
        let text = "a\n\nbc\n".repeat(30_000);
        let mut reader =
            input_reader(Box::new(std::io::Cursor::new(text.clone().into_bytes()))).expect("spawn");
        let mut got = String::new();
        let mut line = String::new();
        while reader.read_line(&mut line).await.expect("read") > 0 {
            got.push_str(&line);
            line.clear();
        }
        assert_eq!(got, text);
    }
}
