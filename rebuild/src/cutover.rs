//! Cutover, retirement and dropping: the registry changes that end a rebuild.
//!
//! **Cutover** is one transaction: the view's registry rows are locked (an emitting view's
//! batches hold them shared, so none is in flight), the new version learns, per account, the
//! `seq` up to which the old live version had applied events and emitted their notices (it
//! emits only past it), the old version becomes `retired`, the new one `live`, and the stable
//! read name is replaced. DDL is transactional in PostgreSQL: a reader blocked on the name
//! while it is replaced finds the new one, never a missing name or a half-built version,
//! even when the new version's columns differ.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Client;
use projector_engine::fingerprint;
use projector_engine::kafka::running;
use projector_engine::progress;
use projector_engine::projection::render;
use projector_engine::versions::{self, Version, VersionState};
use projector_engine::{Projection, Registry};

use crate::error::{db, RebuildError};
use crate::state;

/// What a cutover did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CutoverReport {
    /// The view.
    pub name: String,
    /// The version that was live before, if any.
    pub old: Option<i32>,
    /// The version live now.
    pub new: i32,
    /// Accounts the new version had applied further than the old one (it was healing them,
    /// say): notices for those events were never emitted, by either version.
    pub accounts_ahead: i64,
}

/// Makes `version` of `name` the live one. With `max_behind`, a version that trails the live
/// one by more than that many messages (summed over the partitions the live one reads) is
/// refused: readers would see a half-built view. `None` cuts over whatever the lag (the
/// automatic cutover has checked the lag to the log's end already).
pub async fn cutover(
    client: &mut Client,
    registry: &Registry,
    name: &str,
    version: i32,
    max_behind: Option<i64>,
) -> Result<CutoverReport, RebuildError> {
    let code = registry.code_for(name, version)?;
    // The read name is this code's read SQL: it must be the code that built the version.
    fingerprint::check(&*client, &*code).await?;
    let tx = client
        .transaction()
        .await
        .map_err(db("starting the cutover"))?;
    let registered = versions::lock_of_name(&tx, name)
        .await
        .map_err(db("locking the view registry"))?;
    let Some(row) = registered.iter().find(|v| v.version == version) else {
        return Err(RebuildError::Refused(format!(
            "{name} has no version {version}; versions: {}",
            list(&registered)
        )));
    };
    if row.dropped || row.state == VersionState::Retired {
        return Err(RebuildError::Refused(format!(
            "{name} v{version} is retired; rebuild it into a new version instead"
        )));
    }
    if row.state == VersionState::Live {
        return Err(RebuildError::Refused(format!(
            "{name} v{version} is already live"
        )));
    }
    // Under the registry's lock, which a cancel takes too before it marks the rebuild
    // cancelled: a version whose rebuild is cancelled is being dropped, and one still seeding
    // has nothing in its tables yet.
    let phase = state::phase(&tx, name, version)
        .await
        .map_err(db("reading the version's rebuild"))?;
    match phase.as_deref() {
        Some("cancelled") => {
            return Err(RebuildError::Refused(format!(
                "the rebuild of {name} into v{version} was cancelled; its version is being dropped"
            )))
        }
        Some("seeding") => {
            return Err(RebuildError::Refused(format!(
                "the rebuild of {name} into v{version} is still seeding; cut over once it tails"
            )))
        }
        _ => {}
    }
    let old = registered
        .iter()
        .find(|v| v.state == VersionState::Live)
        .map(|v| v.version);
    let new_consumer = code.consumer();
    let mut accounts_ahead = 0;
    if let Some(old) = old {
        let old_consumer = format!("{name}_v{old}");
        if let Some(max) = max_behind {
            let behind = progress::behind(&tx, &new_consumer, &old_consumer)
                .await
                .map_err(db("comparing the versions' offsets"))?;
            let total: i64 = behind.iter().map(|b| b.messages).sum();
            if total > max {
                let detail = behind
                    .iter()
                    .map(|b| format!("{}/{} {}", b.topic, b.partition, b.messages))
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(RebuildError::Refused(format!(
                    "{name} v{version} is {total} messages behind the live v{old} ({detail}); \
                     cut over once it has caught up, or pass --force to serve it as it is"
                )));
            }
        }
        accounts_ahead = progress::accounts_ahead(&tx, &new_consumer, &old_consumer)
            .await
            .map_err(db("comparing the versions"))?;
        // An old version that still trails the boundary its own cutover gave it has not
        // announced up to it, but the version before it has: the larger of the two goes on.
        progress::hand_over_notices(&tx, &new_consumer, &old_consumer)
            .await
            .map_err(db("handing the notices over"))?;
        versions::retire_replaced(&tx, name, old)
            .await
            .map_err(db("retiring the old version"))?;
    }
    versions::make_live(&tx, name, version)
        .await
        .map_err(db("making the new version live"))?;
    // Composed per view: its name and read statement.
    tx.batch_execute(&format!(
        "DROP VIEW IF EXISTS {name}; CREATE VIEW {name} AS {}",
        render(&*code, &code.read_sql())
    ))
    .await
    .map_err(db("replacing the stable read name"))?;
    state::done(&tx, &new_consumer)
        .await
        .map_err(db("closing the rebuild"))?;
    tx.commit().await.map_err(db("committing the cutover"))?;
    Ok(CutoverReport {
        name: name.to_owned(),
        old,
        new: version,
        accounts_ahead,
    })
}

fn list(registered: &[Version]) -> String {
    if registered.is_empty() {
        return "none".to_owned();
    }
    registered
        .iter()
        .map(|v| format!("v{} {}", v.version, v.state))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Retires `version` of `name` (a running service stops it within its refresh interval)
/// and, with `drop`, drops its tables and everything the engine keeps under its consumer
/// name. The live version cannot be retired: cut over to another first.
pub async fn retire(
    client: &mut Client,
    registry: &Registry,
    name: &str,
    version: i32,
    drop: bool,
) -> Result<(), RebuildError> {
    let registered = state::versions(client, name).await?;
    let Some(row) = registered.iter().find(|v| v.version == version) else {
        return Err(RebuildError::Refused(format!(
            "{name} has no version {version}"
        )));
    };
    if row.state == VersionState::Live {
        return Err(RebuildError::Refused(format!(
            "{name} v{version} is live; cut over to another version first"
        )));
    }
    if let Some(r) = state::unfinished(client, name).await? {
        if r.version == version {
            return Err(RebuildError::Refused(format!(
                "a rebuild is building {name} v{version}; stop it with `projector rebuild {name} --cancel`"
            )));
        }
    }
    // The tables dropped are the ones this code names: it must be the version's code, which
    // is checked before anything changes.
    let code = if drop && !row.dropped {
        let code = registry.code_for(name, version)?;
        fingerprint::check(&*client, &*code).await?;
        Some(code)
    } else {
        None
    };
    // The state read above is not locked: a cutover may have made the version live since.
    // The condition is in the statement, evaluated on the row as it is once locked.
    let retired = versions::retire(&*client, name, version)
        .await
        .map_err(db("retiring the version"))?;
    if !retired {
        return Err(RebuildError::Refused(format!(
            "{name} v{version} is live; cut over to another version first"
        )));
    }
    if let Some(code) = &code {
        drop_version(client, code).await?;
        versions::mark_dropped(&*client, name, version)
            .await
            .map_err(db("recording the drop"))?;
    }
    Ok(())
}

/// How long a drop waits for the processes that run the version to stop: `projector run`
/// stops a retired version within its refresh (2 s), a rebuild stops at its next look at the
/// registry (1 s), each after its batch in flight.
pub const DROP_WAIT: Duration = Duration::from_secs(60);

/// Drops a version's tables and deletes its inbox rows (in batches, never one long
/// DELETE), offsets, progress, waiting events, parks and dead letters, once no process runs
/// the version (its running lock, taken exclusively, see [`running`]): a batch committed
/// after the drop would leave offsets and progress behind, which a rebuild into the same
/// version number would resume from.
pub async fn drop_version(
    client: &mut Client,
    view: &Arc<dyn Projection>,
) -> Result<(), RebuildError> {
    let consumer = view.consumer();
    let deadline = tokio::time::Instant::now() + DROP_WAIT;
    while !running::try_take(client, &consumer)
        .await
        .map_err(db("waiting for the version's consumers to stop"))?
    {
        if tokio::time::Instant::now() >= deadline {
            return Err(RebuildError::Refused(format!(
                "{consumer} is still being consumed by a running process (`projector run` stops a retired version within seconds, a rebuild at its next look at the registry); if one is stuck, stop it, then run this command again"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let dropped = drop_taken(client, view).await;
    let given_back = running::give_back(client, &consumer)
        .await
        .map_err(db("giving the running lock back"));
    dropped.and(given_back)
}

async fn drop_taken(client: &mut Client, view: &Arc<dyn Projection>) -> Result<(), RebuildError> {
    let consumer = view.consumer();
    for table in view.tables().iter().rev() {
        client
            // Composed per table of the view.
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {} CASCADE",
                render(&**view, table)
            ))
            .await
            .map_err(db("dropping the version's tables"))?;
    }
    projector_engine::inbox::delete_consumer(client, &consumer)
        .await
        .map_err(db("deleting the version's inbox rows"))?;
    progress::forget(&*client, &consumer)
        .await
        .map_err(db("deleting the version's bookkeeping"))?;
    Ok(())
}

/// Cancels the rebuild of `name` under way: a running rebuild stops at its next look at
/// the registry, what it built is dropped once it has stopped, and its registry row with it,
/// so the version number is free again. A cancel that could not finish (the rebuild did not
/// stop in time) is finished by the next one. Returns the version.
pub async fn cancel(
    client: &mut Client,
    registry: &Registry,
    name: &str,
) -> Result<i32, RebuildError> {
    let Some(r) = state::cancellable(client, name).await? else {
        return Err(RebuildError::Refused(format!(
            "no rebuild of {name} is under way"
        )));
    };
    // A cancel drops the tables this code names: checked before the rebuild is marked, so a
    // binary with other code never stops another binary's rebuild half-way.
    let code = registry.code_for(name, r.version)?;
    fingerprint::check(&*client, &*code).await?;
    // Marked cancelled under the registry's lock, as the version is still building: a
    // cutover (which takes the same lock and refuses a cancelled rebuild) either made it
    // live before, and the cancel is refused, or cannot make it live after. Without it, a
    // cutover in between made the version live, and the drop below dropped the live version.
    let tx = client
        .transaction()
        .await
        .map_err(db("cancelling the rebuild"))?;
    versions::lock_name(&tx, name)
        .await
        .map_err(db("locking the view registry"))?;
    let marked = state::cancel(&tx, name, r.version)
        .await
        .map_err(db("cancelling the rebuild"))?;
    if !marked {
        return Err(RebuildError::Refused(format!(
            "the rebuild of {name} into v{} is no longer under way (it was cut over)",
            r.version
        )));
    }
    tx.commit().await.map_err(db("cancelling the rebuild"))?;
    drop_version(client, &code).await?;
    versions::unregister_building(&*client, name, r.version)
        .await
        .map_err(db("unregistering the cancelled version"))?;
    Ok(r.version)
}
