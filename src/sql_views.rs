//! `--views-dir`: views written as `.sql` files (docs/sql-views.md), loaded beside the
//! compiled ones and checked against the database before a command does anything; and
//! `projector views check DIR`, the conformance suite for a directory of them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use projector_engine::sql_view::{self, SqlView};
use projector_engine::testkit::conformance::{self, Factory};
use projector_engine::testkit::{bust, cash, fill, EventSpec, TestDb};
use projector_engine::{Projection, Registry};

/// The compiled views of `base`, with the SQL views of `dir` beside them. Every SQL view is
/// parsed, compared with the code that registered its version, and has its statements
/// prepared against the database of `url` (in a transaction rolled back: nothing changes but
/// the engine's own schema, created when the database has none yet). Any mistake is one
/// line naming the file and the line.
pub async fn registry(base: Registry, dir: Option<&Path>, url: &str) -> anyhow::Result<Registry> {
    let Some(dir) = dir else {
        return Ok(base);
    };
    let views = load(&base, dir)?;
    let pool = projector_engine::db::pool(url, 1)?;
    let mut client = pool.get().await.context(
        "cannot connect to PostgreSQL to check the SQL views (check --database-url / DATABASE_URL)",
    )?;
    if !projector_engine::schema::has_schema(&client).await? {
        // The apply statement writes the engine's inbox: it prepares only where it exists.
        projector_engine::migrate(&mut client, &Registry::new()).await?;
    }
    sql_view::check(&mut client, &views).await?;
    let mut registry = base;
    for view in views {
        registry.add(Arc::new(view))?;
    }
    Ok(registry)
}

/// Parses the SQL views of `dir`, refusing a name the compiled views already use.
fn load(base: &Registry, dir: &Path) -> anyhow::Result<Vec<SqlView>> {
    let upcasters = sql_view::upcasters_of(base.all());
    let views: Vec<SqlView> = sql_view::load_dir(dir, &upcasters)?
        .into_iter()
        .map(|v| v.with_rules_of(base.all()))
        .collect();
    let compiled = base.names();
    for v in &views {
        if compiled.contains(v.name()) {
            anyhow::bail!(
                "{}: view {} is also compiled into this binary; give the SQL view another name",
                v.declared_at(),
                v.name()
            );
        }
    }
    Ok(views)
}

/// The flags of `projector views check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// The directory of SQL views (or one view's `.sql` file).
    pub dir: PathBuf,
    /// The events to deliver, JSON lines as `projector publish` reads them (each account's
    /// events with seq 1, 2, 3, ...). Default: a small stream of fills, busts and cash
    /// movements of three accounts over two days.
    #[arg(long)]
    pub events: Option<PathBuf>,
}

/// Runs every SQL view of `args.dir` through the engine's conformance suite, each on a
/// scratch database of the `url` server, dropped at the end. Prints what passed and what
/// failed; `Ok(false)` when a view failed.
pub async fn check_dir(base: &Registry, args: CheckArgs, url: &str) -> anyhow::Result<bool> {
    let views = if args.dir.is_dir() {
        load(base, &args.dir)?
    } else {
        let upcasters = sql_view::upcasters_of(base.all());
        vec![sql_view::load_path(&args.dir, &upcasters)?.with_rules_of(base.all())]
    };
    if views.is_empty() {
        anyhow::bail!(
            "{}: no SQL view here (a view is a .sql file or a directory of them)",
            args.dir.display()
        );
    }
    let events = match &args.events {
        Some(path) => read_events(path)?,
        None => sample_stream(),
    };
    // The testkit's scratch databases are made on the server tests use.
    std::env::set_var("PROJECTOR_TEST_DATABASE_URL", url);
    let result = check_views(&views, &events).await;
    projector_engine::testkit::drop_databases_of_this_process(url).await;
    result
}

/// The development write side's `positions` and `account_seq`, which a view's `snapshot`
/// section reads (docs/views.md): with them the suite also rebuilds the view from a snapshot
/// taken part-way through the stream and tails the rest, and the rows must equal live ones.
fn write_side() -> conformance::WriteSide {
    conformance::WriteSide {
        schema: projector_devkit::writeside::snapshot_schema_sql().to_owned(),
        book: projector_devkit::writeside::book_trade_sql().to_owned(),
        books: vec!["fill_executed".to_owned(), "fill_busted".to_owned()],
    }
}

async fn check_views(views: &[SqlView], events: &[EventSpec]) -> anyhow::Result<bool> {
    // Statements first: a view that does not prepare is one line, as at start.
    {
        let db = TestDb::new(&Registry::new()).await;
        let mut client = db.client().await;
        sql_view::check(&mut client, views).await?;
    }
    let mut all_passed = true;
    // The suite reports a failure by panicking; its message is the report, printed below.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for view in views {
        let factory: Factory = {
            let view = view.clone();
            Arc::new(move |v| Arc::new(view.with_version(v)) as Arc<dyn Projection>)
        };
        let events = events.to_vec();
        let write_side = write_side();
        let run = async move { conformance::run_with(factory, &events, Some(&write_side)).await };
        match tokio::spawn(run).await {
            Ok(report) => println!(
                "ok: {} v{} ({}): {} schedules, the same rows in each ({} rows)",
                view.name(),
                view.version(),
                view.file(),
                report.schedules.len(),
                report.rows.iter().map(Vec::len).sum::<usize>()
            ),
            Err(e) => {
                all_passed = false;
                let reason = match e.try_into_panic() {
                    Ok(p) => p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                        .unwrap_or_else(|| "the suite failed".to_owned()),
                    Err(e) => e.to_string(),
                };
                println!(
                    "FAILED: {} v{} ({}): {}",
                    view.name(),
                    view.version(),
                    view.file(),
                    reason.replace('\n', " ")
                );
            }
        }
    }
    std::panic::set_hook(hook);
    Ok(all_passed)
}

/// JSON lines of events, the envelope `projector publish` reads.
fn read_events(path: &Path) -> anyhow::Result<Vec<EventSpec>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |what: &str| anyhow::anyhow!("{}:{}: {what}", path.display(), i + 1);
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| bad(&format!("not JSON: {e}")))?;
        let text = |k: &str| {
            v.get(k)
                .and_then(|x| x.as_str())
                .map(str::to_owned)
                .ok_or_else(|| bad(&format!("no {k:?} string")))
        };
        let int = |k: &str| {
            v.get(k)
                .and_then(serde_json::Value::as_i64)
                .ok_or_else(|| bad(&format!("no {k:?} integer")))
        };
        let mut e = EventSpec::new(
            &text("type")?,
            int("account_id")?,
            int("seq")?,
            &text("occurred_at")?,
            v.get("data").cloned().unwrap_or(serde_json::Value::Null),
        )
        .with_id(&text("event_id")?);
        if let Some(tv) = v.get("type_version").and_then(serde_json::Value::as_i64) {
            e = e.with_version(i32::try_from(tv).map_err(|_| bad("type_version too large"))?);
        }
        out.push(e);
    }
    Ok(out)
}

/// Fills (with and without a fee), a bust and cash movements of three accounts over two
/// days: every built-in event type, enough for each schedule to mean something.
pub fn sample_stream() -> Vec<EventSpec> {
    let f1 = fill(
        1,
        1,
        "2026-11-02T09:00:00Z",
        "EURUSD",
        "buy",
        "100",
        "1.08",
        "0.50",
    );
    vec![
        f1.clone(),
        cash(1, 2, "2026-11-02T10:00:00Z", "250.00", "deposit"),
        fill(
            2,
            1,
            "2026-11-02T11:00:00Z",
            "XAUUSD",
            "buy",
            "2",
            "2650",
            "1.25",
        ),
        fill(
            1,
            3,
            "2026-11-02T23:59:00Z",
            "EURUSD",
            "sell",
            "40",
            "1.09",
            "0.20",
        ),
        cash(2, 2, "2026-11-03T08:00:00Z", "-75.5", "withdrawal"),
        bust(&f1, 4, "2026-11-03T09:00:00Z"),
        cash(3, 1, "2026-11-03T09:30:00Z", "1000", "deposit"),
        fill(
            3,
            2,
            "2026-11-03T10:00:00Z",
            "GBPUSD",
            "sell",
            "1000",
            "1.25",
            "0",
        ),
        cash(1, 5, "2026-11-03T12:00:00Z", "-20", "fee"),
        cash(1, 6, "2026-11-03T13:00:00Z", "-30", "fee"),
        fill(
            2,
            3,
            "2026-11-03T13:00:00Z",
            "XAUUSD",
            "sell",
            "1",
            "2660",
            "0.75",
        ),
        cash(3, 3, "2026-11-03T14:00:00Z", "0.125", "interest"),
    ]
}
