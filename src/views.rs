//! `projector views`: what is compiled in, and (when the database answers) each version's state.

use std::collections::HashMap;

use projector_engine::versions::{self, VersionState};
use projector_engine::Registry;

/// `projector views [check DIR]`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Check>,
}

/// `projector views check`.
#[derive(Debug, clap::Subcommand)]
pub enum Check {
    /// Run a directory of SQL views through the engine's conformance suite on a scratch
    /// database of the --database-url server; exits 1 when a view fails.
    Check(crate::sql_views::CheckArgs),
}

/// Lists the views of `registry` on standard output, with each version's state in the
/// database of `database_url` when it answers.
pub async fn run(database_url: &str, registry: &Registry) -> anyhow::Result<()> {
    let states = match states(database_url).await {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!("note: state unknown, the database did not answer: {e:#}");
            None
        }
    };
    println!(
        "{:<12} {:>7}  {:<10} {:<22} {:<17} SUBSCRIBES",
        "VIEW", "VERSION", "STATE", "DEDUP", "ORDER"
    );
    for view in registry.all() {
        let state = match &states {
            Some(s) => s
                .get(&(view.name().to_owned(), view.version()))
                .map_or("unmigrated", |s| s.as_str()),
            None => "unknown",
        };
        let order = if view.order_independent() {
            "independent"
        } else {
            "per account"
        };
        // Each type with the version of its shape the view reads, when above 1 (its
        // upcasters' reach): `fill_executed@2`.
        let upcasters = projector_engine::Upcasters::new(view.upcasters()).unwrap_or_default();
        let subscribes: Vec<String> = view
            .subscribes()
            .iter()
            .map(|t| match upcasters.reads(t) {
                1 => (*t).to_owned(),
                v => format!("{t}@{v}"),
            })
            .collect();
        println!(
            "{:<12} {:>7}  {:<10} {:<22} {:<17} {}",
            view.name(),
            view.version(),
            state,
            view.dedup().as_str(),
            order,
            subscribes.join(",")
        );
    }
    Ok(())
}

async fn states(database_url: &str) -> anyhow::Result<HashMap<(String, i32), VersionState>> {
    let pool = projector_engine::db::pool(database_url, 1)?;
    let client = pool.get().await?;
    Ok(versions::all_states(&client)
        .await?
        .into_iter()
        .map(|(name, version, state)| ((name, version), state))
        .collect())
}
