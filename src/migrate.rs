//! `projector migrate`.

use anyhow::Context;
use projector_engine::Registry;

/// Applies the engine's schema and the tables of every view of `registry` to the database
/// of `database_url`, and says what it did on standard output.
pub async fn run(database_url: &str, registry: &Registry) -> anyhow::Result<()> {
    let pool = projector_engine::db::pool(database_url, 1)?;
    let mut client = pool
        .get()
        .await
        .context("cannot connect to PostgreSQL (check --database-url / DATABASE_URL)")?;
    let report = projector_engine::migrate(&mut client, registry).await?;
    if report.applied.is_empty()
        && report.registered.is_empty()
        && report.read_names.is_empty()
        && report.skipped.is_empty()
    {
        println!("schema up to date; nothing to do");
    }
    for m in &report.applied {
        println!("applied migration {m}");
    }
    for (consumer, state) in &report.registered {
        println!("registered {consumer} as {state}");
    }
    for name in &report.read_names {
        println!("created read name {name}");
    }
    for (_, reason) in &report.skipped {
        eprintln!("projector: left alone: {reason}");
    }
    Ok(())
}
