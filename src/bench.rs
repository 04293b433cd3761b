//! `projector bench`: the flags of the benchmark in `projector-bench`, and its output. The
//! flags and the JSON keys are a contract (`docs/benchmarks.md`, scripts that compare runs).

use projector_bench::Options;

/// The flags of `projector bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Events in the stream (each throughput phase applies all of them).
    #[arg(long, default_value_t = Options::new().events, value_parser = clap::value_parser!(u64).range(1..=50_000_000))]
    events: u64,
    /// Accounts the events are spread over.
    #[arg(long, default_value_t = Options::new().accounts, value_parser = clap::value_parser!(i64).range(1..=10_000_000))]
    accounts: i64,
    /// Print the figures as JSON on standard output (the table then goes to standard error).
    #[arg(long)]
    json: bool,
    /// Partitions of each topic.
    #[arg(long, default_value_t = Options::new().partitions, value_parser = clap::value_parser!(i32).range(1..=64))]
    partitions: i32,
    /// Seconds the naive consumer runs; it stops earlier if it reaches the end of the topic.
    #[arg(long, default_value_t = Options::new().naive_seconds, value_parser = clap::value_parser!(u64).range(1..=3600))]
    naive_seconds: u64,
    /// Events per second of the latency phase.
    #[arg(long, default_value_t = Options::new().latency_rate, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    latency_rate: u64,
    /// Seconds the latency phase publishes for.
    #[arg(long, default_value_t = Options::new().latency_seconds, value_parser = clap::value_parser!(u64).range(1..=3600))]
    latency_seconds: u64,
    /// Rounds of the engine, ceiling and catch-up phases; each figure is the best round.
    #[arg(long, default_value_t = Options::new().repeat, value_parser = clap::value_parser!(u8).range(1..=9))]
    repeat: u8,
    /// Keep the scratch database afterwards (it is named on standard error).
    #[arg(long)]
    keep_db: bool,
    /// Rows loaded into the inbox (untimed, with COPY) before the full-inbox phase runs the
    /// engine phase again; 0 skips that phase.
    #[arg(long, default_value_t = Options::new().inbox_rows, value_parser = clap::value_parser!(u64).range(0..=1_000_000_000))]
    inbox_rows: u64,
    /// PostgreSQL connections of the rebuild phases (`projector rebuild --max-connections`).
    #[arg(long, default_value_t = Options::new().rebuild_connections, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    rebuild_connections: usize,
    /// Messages per batch of the rebuild phases (`projector rebuild --batch-messages`).
    #[arg(long, default_value_t = Options::new().rebuild_batch_messages, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    rebuild_batch_messages: usize,
}

/// Runs the benchmark on the server of `database_url` and prints its figures: the table, or
/// with `--json` the JSON on standard output and the table on standard error.
pub async fn run(args: Args, database_url: &str) -> anyhow::Result<()> {
    let mut options = Options::new();
    options.events = args.events;
    options.accounts = args.accounts;
    options.partitions = args.partitions;
    options.naive_seconds = args.naive_seconds;
    options.latency_rate = args.latency_rate;
    options.latency_seconds = args.latency_seconds;
    options.repeat = args.repeat;
    options.keep_db = args.keep_db;
    options.inbox_rows = args.inbox_rows;
    options.rebuild_connections = args.rebuild_connections;
    options.rebuild_batch_messages = args.rebuild_batch_messages;
    let figures = projector_bench::run(&options, database_url).await?;
    let table = figures.table();
    if args.json {
        eprint!("{table}");
        println!("{}", figures.json());
    } else {
        print!("{table}");
    }
    Ok(())
}
