//! `projector demo`: a database, the schema, and the bundled sample events applied to every
//! view, as if they were read from one Kafka partition. Running it again applies nothing
//! twice: offsets live in PostgreSQL.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use anyhow::Context;
use projector_engine::{account_key, Applier, Batch, Counts, Message, Registry, SourceOrdering};

/// The sample: three accounts, two trading days, a bust, cash in and out, one redelivered
/// duplicate and one poison message.
const SAMPLE: &str = include_str!("demo/events.jsonl");

/// The simulated partition the demo reads.
const TOPIC: &str = "demo-events";
const BATCH_LEN: usize = 8;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A JSON-lines file of events to apply instead of the bundled sample.
    #[arg(long)]
    events: Option<PathBuf>,
}

/// Creates the database of `database_url` when it does not exist, migrates it, and applies
/// the sample (or `--events`) to every view of `registry`.
pub async fn run(database_url: &str, registry: &Registry, args: Args) -> anyhow::Result<()> {
    let text = match &args.events {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?,
        None => SAMPLE.to_owned(),
    };
    create_database(database_url).await?;
    let pool = projector_engine::db::pool(database_url, 2)?;
    let mut client = pool
        .get()
        .await
        .context("cannot connect to the demo database")?;
    projector_engine::migrate(&mut client, registry).await?;

    let log: Vec<Message> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, line)| {
            Message::new(
                i as i64,
                account_key(line.as_bytes()),
                line.as_bytes().to_vec(),
            )
        })
        .collect();
    println!("{} events in partition {TOPIC}/0\n", log.len());

    for view in registry.all() {
        let applier = Applier::new(Arc::clone(view), SourceOrdering::PerAccount)?;
        let mut start = applier.stored_offset(&client, TOPIC, 0).await?.unwrap_or(0);
        let mut total = Counts::default();
        while let Some(rest) = log
            .get(usize::try_from(start).unwrap_or(usize::MAX)..)
            .filter(|r| !r.is_empty())
        {
            let batch = Batch {
                topic: TOPIC.to_owned(),
                partition: 0,
                start_offset: start,
                messages: rest.iter().take(BATCH_LEN).cloned().collect(),
            };
            let outcome = applier.apply(&mut client, &batch).await?;
            total += &outcome.counts;
            start = outcome.next_offset;
        }
        println!(
            "{:<12} applied {:>3}  ignored {:>3}  duplicates {:>3}  dead-lettered {:>3}  waiting {:>3}",
            applier.consumer(),
            total.applied,
            total.ignored,
            total.duplicates(),
            total.dead_lettered(),
            total.waiting
        );
    }

    for name in registry.names() {
        print_read_name(&client, &name).await?;
    }
    let dead: i64 = client
        .query_one(
            "SELECT count(DISTINCT \"offset\") FROM projector.dead_letters",
            &[],
        )
        .await?
        .get(0);
    println!("\n{dead} message(s) in projector.dead_letters, with their raw bytes.");
    Ok(())
}

/// Creates the URL's database when it does not exist, through the server's `postgres`
/// database, connecting as the URL says (credentials, `sslmode` and all).
async fn create_database(database_url: &str) -> anyhow::Result<()> {
    let config =
        tokio_postgres::Config::from_str(database_url).context("the database URL is not valid")?;
    let name = config.get_dbname().unwrap_or("postgres").to_owned();
    let admin = projector_engine::db::url_for_database(database_url, "postgres")?;
    let pool = projector_engine::db::pool(&admin, 1)?;
    let client = pool
        .get()
        .await
        .context("cannot connect to PostgreSQL (check --database-url / DATABASE_URL)")?;
    let exists = client
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
        .await?
        .is_some();
    if !exists {
        let quoted = format!("\"{}\"", name.replace('"', "\"\""));
        client
            .batch_execute(&format!("CREATE DATABASE {quoted}"))
            .await?;
        println!("created database {name}");
    }
    Ok(())
}

/// Prints a stable read name as a table, every value as PostgreSQL's exact text.
async fn print_read_name(client: &deadpool_postgres::Client, name: &str) -> anyhow::Result<()> {
    let columns: Vec<String> = client
        .prepare(&format!("SELECT * FROM {name}"))
        .await?
        .columns()
        .iter()
        .map(|c| c.name().to_owned())
        .collect();
    let select = columns
        .iter()
        .map(|c| format!("coalesce({c}::text, '')"))
        .collect::<Vec<_>>()
        .join(", ");
    // Sort by the real values (numbers as numbers), not by their text.
    let order = columns
        .iter()
        .take(2)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    let rows = client
        .query(
            &format!("SELECT {select} FROM {name} ORDER BY {order}"),
            &[],
        )
        .await?;
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| (0..columns.len()).map(|i| r.get::<_, String>(i)).collect())
        .collect();
    let widths: Vec<usize> = (0..columns.len())
        .map(|i| {
            cells
                .iter()
                .map(|r| r[i].len())
                .chain([columns[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    println!("\n{name}");
    let line = |values: &[String]| {
        values
            .iter()
            .zip(&widths)
            .map(|(v, w)| format!("{v:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
    };
    println!("{}", line(&columns));
    for r in &cells {
        println!("{}", line(r));
    }
    Ok(())
}
