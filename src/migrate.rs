//! `projector migrate`.

use anyhow::Context;

pub async fn run(database_url: &str) -> anyhow::Result<()> {
    let registry = crate::registry()?;
    let pool = projector_engine::db::pool(database_url, 1)?;
    let mut client = pool
        .get()
        .await
        .context("cannot connect to PostgreSQL (check --database-url / DATABASE_URL)")?;
    let report = projector_engine::migrate(&mut client, &registry).await?;
    if report.applied.is_empty() && report.registered.is_empty() && report.read_names.is_empty() {
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
    Ok(())
}
