//! `projector dlq list|show|retry|skip` and `projector parked list|retry|skip`: what an
//! engineer on call does with dead letters and parked accounts. Retries and skips go through
//! the engine's apply path (`Applier::retry_dead_letter`, `skip_seq`, `drain_account`), in
//! one transaction each, recorded with who and why.

use std::sync::Arc;

use anyhow::{bail, Context};
use deadpool_postgres::Client;
use projector_engine::apply::DeadLetterSkip;
use projector_engine::dead_letters::{self, Skipped};
use projector_engine::event::safe_text;
use projector_engine::parked;
use projector_engine::versions;
use projector_engine::{Applier, Registry, SourceOrdering};

/// `projector dlq ...`
#[derive(Debug, clap::Subcommand)]
pub enum Dlq {
    /// Open dead letters, newest first.
    List {
        /// Only this view (every version of it).
        #[arg(long)]
        view: Option<String>,
        /// Resolved ones too.
        #[arg(long)]
        all: bool,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
    /// One dead letter in full: its source, error and raw bytes.
    Show {
        /// The dead letter's id.
        id: i64,
    },
    /// Apply a dead letter again from its stored bytes (after the producer or the view was
    /// fixed); what waited behind it follows in seq order.
    Retry {
        /// The dead letter's id.
        id: i64,
        /// Who retries (recorded); default: $USER.
        #[arg(long)]
        by: Option<String>,
    },
    /// Give a dead letter up, recorded with who and why; its account resumes after its seq.
    /// Refused while the account waits for a lower seq (it would stop at this one later).
    Skip {
        /// The dead letter's id.
        id: i64,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
        /// Who skips (recorded); default: $USER.
        #[arg(long)]
        by: Option<String>,
    },
}

/// `projector parked ...`
#[derive(Debug, clap::Subcommand)]
pub enum Parked {
    /// Parked accounts: why, the seq they wait for, how many events wait behind it.
    List {
        /// Only this view (every version of it).
        #[arg(long)]
        view: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
    /// Try a parked account again: its blocking dead letter from its bytes, then whatever
    /// can follow, in seq order.
    Retry {
        /// The account.
        account: i64,
        /// The view.
        #[arg(long)]
        view: String,
        /// The version (default: the live one).
        #[arg(long)]
        version: Option<i32>,
        /// Who retries (recorded); default: $USER.
        #[arg(long)]
        by: Option<String>,
    },
    /// Skip the seq an account waits for (it will never arrive), recorded with who and why;
    /// the account resumes with the events after it.
    Skip {
        /// The account.
        account: i64,
        /// The view.
        #[arg(long)]
        view: String,
        /// The version (default: the live one).
        #[arg(long)]
        version: Option<i32>,
        /// The seq to skip: the one the account waits for (explicit, so nothing is skipped
        /// by accident).
        #[arg(long)]
        seq: i64,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
        /// Who skips (recorded); default: $USER.
        #[arg(long)]
        by: Option<String>,
    },
}

fn who(by: Option<String>) -> String {
    by.or_else(|| std::env::var("USER").ok())
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

async fn connect(url: &str, registry: &Registry) -> anyhow::Result<Client> {
    let pool = projector_engine::db::pool(url, 1)?;
    let mut client = pool
        .get()
        .await
        .context("cannot connect to PostgreSQL (check --database-url / DATABASE_URL)")?;
    projector_engine::migrate(&mut client, registry).await?;
    Ok(client)
}

/// The applier of a view version, by consumer name: refused unless this binary's code for
/// the version is the code that registered it (a repair applies the view's statement).
async fn applier_of(
    client: &Client,
    registry: &Registry,
    consumer: &str,
) -> anyhow::Result<Applier> {
    let Some((name, version)) = consumer
        .rsplit_once("_v")
        .and_then(|(n, v)| v.parse::<i32>().ok().map(|v| (n, v)))
    else {
        bail!("{consumer:?} is not a view version's consumer name");
    };
    let code = registry.code_for(name, version)?;
    projector_engine::fingerprint::check(client, &*code).await?;
    Ok(Applier::new(code, SourceOrdering::PerAccount)?)
}

async fn consumer_of(client: &Client, view: &str, version: Option<i32>) -> anyhow::Result<String> {
    if let Some(v) = version {
        return Ok(format!("{view}_v{v}"));
    }
    match versions::live_version(client, view).await? {
        Some(v) => Ok(format!("{view}_v{v}")),
        None => bail!("{view} has no live version; pass --version"),
    }
}

/// Runs `projector dlq ...`.
pub async fn run_dlq(url: &str, registry: &Registry, command: Dlq) -> anyhow::Result<()> {
    let mut client = connect(url, registry).await?;
    match command {
        Dlq::List { view, all, limit } => {
            let rows = dead_letters::list(&client, view.as_deref(), all, limit).await?;
            if rows.is_empty() {
                println!("no dead letters");
            }
            for r in rows {
                let at = match (r.account, r.seq) {
                    (Some(a), Some(s)) => format!("account {a} seq {s}"),
                    (Some(a), None) => format!("account {a}"),
                    _ => "no account".to_owned(),
                };
                println!(
                    "{:>6}  {:<14} {:<12} {}/{}@{}  {at}  {}{}",
                    r.id,
                    r.consumer,
                    r.kind,
                    r.topic,
                    r.partition,
                    r.offset,
                    safe_text(&r.error, 100),
                    if r.resolution.is_empty() {
                        String::new()
                    } else {
                        format!("  [{}]", r.resolution)
                    }
                );
            }
        }
        Dlq::Show { id } => {
            let Some(r) = dead_letters::show(&client, id).await? else {
                bail!("no dead letter {id}");
            };
            println!("dead letter {id} of {}: {}", r.consumer, r.kind);
            println!(
                "  from      {}/{} offset {}",
                r.topic, r.partition, r.offset
            );
            println!(
                "  event     {}  account {}  seq {}",
                r.event_id.as_deref().unwrap_or("-"),
                r.account.map_or("-".to_owned(), |v| v.to_string()),
                r.seq.map_or("-".to_owned(), |v| v.to_string())
            );
            println!("  at        {}", r.created_at);
            println!("  error     {}", r.error);
            if let Some(resolved) = &r.resolved_at {
                println!(
                    "  resolved  {resolved}: {} by {} ({})",
                    r.resolution.unwrap_or_default(),
                    r.resolved_by.unwrap_or_default(),
                    r.resolution_note.unwrap_or_default()
                );
            }
            println!(
                "  key       {}",
                r.key.as_deref().map_or("-".to_owned(), render_bytes)
            );
            println!("  payload   {} bytes", r.payload.len());
            println!("{}", render_bytes(&r.payload));
        }
        Dlq::Retry { id, by } => {
            let consumer = consumer_of_dead_letter(&client, id).await?;
            let applier = applier_of(&client, registry, &consumer).await?;
            let (disposition, mut counts) =
                applier.retry_dead_letter(&mut client, id, &who(by)).await?;
            // One repair step drains a bounded number of the events that waited behind it;
            // the rest follow here, as after `parked retry` and `dlq skip`.
            if disposition != projector_engine::Disposition::DeadLettered
                && !applier.projection().order_independent()
            {
                let account = dead_letters::account(&client, id).await?;
                if let Some(account) = account {
                    counts += &drain(&applier, &mut client, account).await?;
                }
            }
            match disposition {
                projector_engine::Disposition::DeadLettered => {
                    let error = dead_letters::error(&client, id).await?;
                    bail!("dead letter {id} failed again and stays open: {error}");
                }
                d => println!(
                    "dead letter {id} retried: {}; {} event(s) applied, {} that waited drained",
                    format!("{d:?}").to_lowercase(),
                    counts.applied,
                    counts.drained
                ),
            }
        }
        Dlq::Skip { id, reason, by } => {
            let consumer = consumer_of_dead_letter(&client, id).await?;
            let by = who(by);
            match applier_of(&client, registry, &consumer).await {
                Ok(applier) => match applier
                    .skip_dead_letter(&mut client, id, &by, &reason)
                    .await?
                {
                    DeadLetterSkip::Resumed {
                        account,
                        seq,
                        mut counts,
                    } => {
                        counts += &drain(&applier, &mut client, account).await?;
                        println!(
                            "dead letter {id} skipped; account {account} resumes after seq {seq}: {} event(s) applied",
                            counts.applied
                        );
                    }
                    DeadLetterSkip::Resolved => {
                        println!("dead letter {id} skipped (it blocks no account)");
                    }
                },
                // A retired version this binary cannot build (its code is gone): nothing of
                // it runs any more, so the dead letter is only resolved. Any other version
                // needs its code to decide (an older binary, say): an error.
                Err(e) => {
                    let retired = versions::is_retired(&client, &consumer).await?;
                    if !retired {
                        return Err(e);
                    }
                    let resolved =
                        dead_letters::skip(&client, Skipped::One(id), &by, &reason).await?;
                    if resolved == 0 {
                        bail!("dead letter {id} is resolved already");
                    }
                    println!("dead letter {id} skipped (resolved only: {e})");
                }
            }
        }
    }
    Ok(())
}

async fn consumer_of_dead_letter(client: &Client, id: i64) -> anyhow::Result<String> {
    match dead_letters::consumer(client, id).await? {
        Some(consumer) => Ok(consumer),
        None => bail!("no dead letter {id}"),
    }
}

/// Drains an account step by step until nothing more can follow.
async fn drain(
    applier: &Applier,
    client: &mut Client,
    account: i64,
) -> anyhow::Result<projector_engine::Counts> {
    let mut total = projector_engine::Counts::default();
    loop {
        let (counts, more) = applier.drain_account(client, account).await?;
        total += &counts;
        if !more {
            return Ok(total);
        }
    }
}

/// Bytes as text when they are printable UTF-8, else as hex.
fn render_bytes(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text)
            if !text
                .chars()
                .any(|c| c.is_control() && c != '\n' && c != '\t') =>
        {
            text.to_owned()
        }
        _ => bytes
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// Runs `projector parked ...`.
pub async fn run_parked(url: &str, registry: &Registry, command: Parked) -> anyhow::Result<()> {
    let mut client = connect(url, registry).await?;
    match command {
        Parked::List { view, limit } => {
            let rows = parked::list(&client, view.as_deref(), limit).await?;
            if rows.is_empty() {
                println!("no parked accounts");
            }
            for r in rows {
                println!(
                    "{:<14} account {:<10} {:<11} waits for seq {} ({} waiting){}  since {}",
                    r.consumer,
                    r.account,
                    r.reason,
                    r.blocked_seq,
                    r.waiting,
                    r.dead_letter
                        .map_or(String::new(), |d| format!(", dead letter {d}")),
                    r.parked_at,
                );
            }
        }
        Parked::Retry {
            account,
            view,
            version,
            by,
        } => {
            let consumer = consumer_of(&client, &view, version).await?;
            let applier = Arc::new(applier_of(&client, registry, &consumer).await?);
            // What waits and can go first: the seq the account is parked at may wait sound
            // (a corrected republish the last bounded drain stopped short of) while the
            // park still names the original's dead letter, which would only fail again.
            let mut counts = drain(&applier, &mut client, account).await?;
            let dead = parked::dead_letter(&client, &consumer, account).await?;
            if let Some(id) = dead {
                let (disposition, retried) =
                    applier.retry_dead_letter(&mut client, id, &who(by)).await?;
                counts += &retried;
                if disposition == projector_engine::Disposition::DeadLettered {
                    bail!("account {account}: dead letter {id} failed again; see `projector dlq show {id}`");
                }
                counts += &drain(&applier, &mut client, account).await?;
            }
            let still = parked::blocked_seq(&client, &consumer, account).await?;
            match still {
                Some(seq) => println!(
                    "account {account}: {} event(s) applied; still waits for seq {seq}",
                    counts.applied
                ),
                None => println!(
                    "account {account}: resumed; {} event(s) applied",
                    counts.applied
                ),
            }
        }
        Parked::Skip {
            account,
            view,
            version,
            seq,
            reason,
            by,
        } => {
            let consumer = consumer_of(&client, &view, version).await?;
            let applier = applier_of(&client, registry, &consumer).await?;
            let mut counts = applier
                .skip_seq(&mut client, account, seq, &who(by), &reason)
                .await?;
            counts += &drain(&applier, &mut client, account).await?;
            println!(
                "account {account}: seq {seq} skipped (recorded); {} event(s) that waited applied",
                counts.applied
            );
        }
    }
    Ok(())
}
