//! Repairs on call: a dead letter retried from its stored bytes once its cause is fixed ends
//! applied exactly once; a parked account whose lost event is skipped resumes and ends
//! equal to the fold without that event; both recorded with who and why, through the
//! library and through `projector dlq` / `projector parked`.

use crate::support::{lock_waiters, trail_db, trail_fold, trail_of};
use projector_engine::testkit::{fill, EventSpec, Partition, TestDb};
use projector_engine::{Applier, ApplyError, Disposition, SourceOrdering};

const AT: &str = "2026-11-29T10:15:00Z";

fn f(account: i64, seq: i64, qty: &str) -> EventSpec {
    fill(account, seq, AT, "EURUSD", "buy", qty, "1.5", "0")
}

async fn one(client: &deadpool_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.expect(sql).get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_retried_after_its_cause_is_fixed_is_applied_exactly_once() {
    let (db, applier) = trail_db().await;
    let mut client = db.client().await;
    // qty 2000000 breaks the view's CHECK: seq 2 is dead-lettered, 3 and 4 wait behind it.
    let events = [f(1, 1, "1"), f(1, 2, "2000000"), f(1, 3, "3"), f(1, 4, "4")];
    let mut log = Partition::from_events("fills", 0, &events);
    let first = applier
        .apply(&mut client, &log.batch(0, 10))
        .await
        .expect("batch");
    assert_eq!(first.counts.failed, 1);
    let id = one(&client, "SELECT id FROM projector.dead_letters").await;

    // Retrying before the fix fails again: the dead letter stays open, nothing moves.
    let (again, _) = applier
        .retry_dead_letter(&mut client, id, "alice")
        .await
        .expect("retry");
    assert_eq!(again, Disposition::DeadLettered);
    assert_eq!(trail_of(&client, 1).await.as_deref(), Some("1"));
    assert_eq!(
        one(
            &client,
            "SELECT count(*) FROM projector.dead_letters WHERE resolved_at IS NULL"
        )
        .await,
        1
    );

    // The cause is fixed (the view's limit is raised); the retry applies it, and what
    // waited follows in seq order, in the same transaction.
    client
        .batch_execute(
            "ALTER TABLE trail_v1 DROP CONSTRAINT trail_v1_total_qty_check; \
             ALTER TABLE trail_v1 ADD CHECK (total_qty < 10000000)",
        )
        .await
        .expect("fix");
    let (done, counts) = applier
        .retry_dead_letter(&mut client, id, "alice")
        .await
        .expect("retry");
    assert_eq!(done, Disposition::Applied);
    assert_eq!((counts.applied, counts.drained), (3, 2));
    assert_eq!(trail_of(&client, 1).await.as_deref(), Some("1,2,3,4"));
    let (resolution, by): (String, String) = client
        .query_one(
            "SELECT resolution, resolved_by FROM projector.dead_letters WHERE id = $1",
            &[&id],
        )
        .await
        .map(|r| (r.get(0), r.get(1)))
        .expect("resolved");
    assert_eq!((resolution.as_str(), by.as_str()), ("retried", "alice"));
    assert_eq!(
        one(&client, "SELECT count(*) FROM projector.parked_accounts").await,
        0
    );

    // Exactly once: a second retry is refused, and the stream redelivering the message is a
    // duplicate.
    assert!(matches!(
        applier.retry_dead_letter(&mut client, id, "alice").await,
        Err(ApplyError::Refused { .. })
    ));
    log.push_event(&events[1]);
    let redelivered = applier
        .apply(&mut client, &log.batch(4, 10))
        .await
        .expect("redelivery");
    assert_eq!(redelivered.dispositions, [(4, Disposition::Duplicate)]);
    assert_eq!(trail_of(&client, 1).await.as_deref(), Some("1,2,3,4"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_account_whose_lost_event_is_skipped_resumes_without_it() {
    let (db, applier) = trail_db().await;
    let mut client = db.client().await;
    // Seq 3 of account 1 never reaches the log; 4 and 5 wait for it. Account 2 is untouched.
    let all = [
        f(1, 1, "1"),
        f(1, 2, "2"),
        f(1, 3, "3"),
        f(1, 4, "4"),
        f(1, 5, "5"),
        f(2, 1, "10"),
    ];
    let delivered: Vec<EventSpec> = all
        .iter()
        .filter(|e| e.seq != 3 || e.account_id != 1)
        .cloned()
        .collect();
    let log = Partition::from_events("fills", 0, &delivered);
    applier
        .apply(&mut client, &log.batch(0, 10))
        .await
        .expect("batch");
    assert_eq!(
        one(
            &client,
            "SELECT blocked_seq FROM projector.parked_accounts WHERE account_id = 1"
        )
        .await,
        3
    );

    // Only the seq the account waits for can be skipped.
    let wrong = applier.skip_seq(&mut client, 1, 4, "bob", "typo").await;
    assert!(
        matches!(&wrong, Err(ApplyError::Refused { reason, .. }) if reason.contains("waits for seq 3")),
        "{wrong:?}"
    );
    let counts = applier
        .skip_seq(
            &mut client,
            1,
            3,
            "bob",
            "lost before it reached Kafka (ticket 123)",
        )
        .await
        .expect("skip");
    assert_eq!((counts.applied, counts.drained), (2, 2));
    let client2 = db.client().await;
    let rows = crate::support::rows(&client2, "trail_v1").await;
    assert_eq!(
        rows,
        trail_fold(&delivered),
        "equal to the fold without the lost event"
    );
    let (seq, by, reason): (i64, String, String) = client
        .query_one(
            "SELECT seq, skipped_by, reason FROM projector.skips WHERE consumer = 'trail_v1'",
            &[],
        )
        .await
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .expect("recorded");
    assert_eq!(seq, 3);
    assert_eq!(by, "bob");
    assert!(reason.contains("ticket 123"));
    assert_eq!(
        one(&client, "SELECT count(*) FROM projector.parked_accounts").await,
        0
    );
    assert_eq!(
        one(&client, "SELECT count(*) FROM projector.waiting_events").await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_commands_list_show_retry_and_skip() {
    let registry = projector_views::registry().expect("registry");
    let db = TestDb::new(&registry).await;
    let view = registry
        .select(&["portfolio".to_owned()])
        .expect("portfolio")[0]
        .clone();
    let applier = Applier::new(view, SourceOrdering::PerAccount).expect("applier");
    let mut client = db.client().await;
    let fp = |account, seq, qty: &str| fill(account, seq, AT, "EURUSD", "buy", qty, "1.1", "0");
    let mut log = Partition::new("fills", 0);
    log.push_event(&fp(7, 1, "1"));
    // A poison fill (side "hold") at seq 2 of account 7; seq 3 waits behind it.
    let mut bad = fp(7, 2, "2");
    bad.data["side"] = serde_json::json!("hold");
    log.push_event(&bad);
    log.push_event(&fp(7, 3, "3"));
    // Account 8 lost its seq 2.
    log.push_event(&fp(8, 1, "1"));
    log.push_event(&fp(8, 3, "3"));
    applier
        .apply(&mut client, &log.batch(0, 10))
        .await
        .expect("batch");
    let id = one(&client, "SELECT id FROM projector.dead_letters").await;
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_projector"))
            .args(args)
            .args(["--database-url", db.url()])
            .output()
            .expect("run projector");
        (
            out.status,
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (_, listed, _) = cli(&["dlq", "list"]);
    assert!(
        listed.contains("portfolio_v1") && listed.contains("account 7 seq 2"),
        "{listed}"
    );
    let (_, shown, _) = cli(&["dlq", "show", &id.to_string()]);
    assert!(
        shown.contains("\"side\":\"hold\"") && shown.contains("data.side"),
        "{shown}"
    );
    let (_, listed, _) = cli(&["parked", "list"]);
    assert!(
        listed.contains("account 7") && listed.contains("dead_letter"),
        "{listed}"
    );
    assert!(
        listed.contains("account 8") && listed.contains("gap"),
        "{listed}"
    );

    // A poison message cannot be retried into anything but poison: the command says so
    // and exits 1; skipping it resumes account 7 after seq 2.
    let (status, _, stderr) = cli(&["dlq", "retry", &id.to_string(), "--by", "carol"]);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("failed again"), "{stderr}");
    let (status, _, stderr) = cli(&[
        "dlq",
        "skip",
        &id.to_string(),
        "--reason",
        "bad side",
        "--by",
        "carol",
    ]);
    assert!(status.success(), "{stderr}");
    let (status, _, stderr) = cli(&[
        "parked",
        "skip",
        "8",
        "--view",
        "portfolio",
        "--seq",
        "2",
        "--reason",
        "lost",
        "--by",
        "dan",
    ]);
    assert!(status.success(), "{stderr}");
    let (status, _, stderr) = cli(&[
        "parked",
        "skip",
        "8",
        "--view",
        "portfolio",
        "--seq",
        "2",
        "--reason",
        "again",
    ]);
    assert_eq!(status.code(), Some(1));
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    let versions: Vec<(i64, i64)> = client
        .query("SELECT account_id, version FROM portfolio ORDER BY 1", &[])
        .await
        .expect("portfolio")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        versions,
        [(7, 3), (8, 3)],
        "both accounts resumed past the skipped seq"
    );
    assert_eq!(
        one(&client, "SELECT count(*) FROM projector.skips").await,
        2,
        "each skip recorded"
    );
}

/// `projector dlq skip <id>` against the test database: exit status, stdout, stderr.
fn dlq_skip(db: &TestDb, id: i64) -> (std::process::ExitStatus, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_projector"))
        .args([
            "dlq",
            "skip",
            &id.to_string(),
            "--reason",
            "bad",
            "--by",
            "carol",
        ])
        .args(["--database-url", db.url()])
        .output()
        .expect("run projector");
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A portfolio applier over a fresh database, and a fill of account 9 (`side "hold"`:
/// poison).
async fn portfolio_db() -> (TestDb, Applier) {
    let registry = projector_views::registry().expect("registry");
    let db = TestDb::new(&registry).await;
    let view = registry
        .select(&["portfolio".to_owned()])
        .expect("portfolio")[0]
        .clone();
    (
        db,
        Applier::new(view, SourceOrdering::PerAccount).expect("applier"),
    )
}

fn f9(seq: i64, side: &str) -> EventSpec {
    fill(9, seq, AT, "EURUSD", side, "1", "1.1", "0")
}

async fn open_dead_letters(client: &deadpool_postgres::Client) -> i64 {
    one(
        client,
        "SELECT count(*) FROM projector.dead_letters WHERE resolved_at IS NULL",
    )
    .await
}

async fn version_of_9(client: &deadpool_postgres::Client) -> i64 {
    one(client, "SELECT version FROM portfolio WHERE account_id = 9").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_ahead_of_its_account_is_not_skipped_until_the_account_reaches_it() {
    let (db, applier) = portfolio_db().await;
    let mut client = db.client().await;
    // Account 9: seq 1, seq 2 lost (a gap), seq 3 poison.
    let mut log = Partition::new("fills", 0);
    log.push_event(&f9(1, "buy"));
    log.push_event(&f9(3, "hold"));
    applier
        .apply(&mut client, &log.batch(0, 10))
        .await
        .expect("batch");
    let id = one(&client, "SELECT id FROM projector.dead_letters").await;

    // The account waits for seq 2: skipping seq 3 now would record nothing, and the account
    // would stop at it later. Refused in one line, the dead letter left open.
    let (status, _, stderr) = dlq_skip(&db, id);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("waits for seq 2 first"), "{stderr}");
    assert_eq!(open_dead_letters(&client).await, 1);

    // Seq 2 arrives: applied, and the account parks at seq 3, its dead letter. Now the skip
    // goes through, recorded, and the account resumes past it.
    log.push_event(&f9(2, "buy"));
    log.push_event(&f9(4, "buy"));
    applier
        .apply(&mut client, &log.batch(2, 10))
        .await
        .expect("batch");
    let (status, _, stderr) = dlq_skip(&db, id);
    assert!(status.success(), "{stderr}");
    assert_eq!(
        one(
            &client,
            "SELECT count(*) FROM projector.skips WHERE account_id = 9 AND seq = 3"
        )
        .await,
        1,
        "the skip is recorded"
    );
    assert_eq!(version_of_9(&client).await, 4, "resumed past seq 3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_at_the_seq_a_quiet_account_waits_for_is_skipped_and_recorded() {
    // Seq 2 is poison and nothing follows: the account is not parked (nothing waits), it
    // simply waits for seq 2. The skip records seq 2, and seq 3 then applies at once.
    let (db, applier) = portfolio_db().await;
    let mut client = db.client().await;
    let mut log = Partition::new("fills", 0);
    log.push_event(&f9(1, "buy"));
    log.push_event(&f9(2, "hold"));
    applier
        .apply(&mut client, &log.batch(0, 10))
        .await
        .expect("batch");
    let id = one(&client, "SELECT id FROM projector.dead_letters").await;
    assert_eq!(
        one(&client, "SELECT count(*) FROM projector.parked_accounts").await,
        0
    );
    let (status, stdout, stderr) = dlq_skip(&db, id);
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains("resumes after seq 2"), "{stdout}");
    assert_eq!(open_dead_letters(&client).await, 0);
    assert_eq!(
        one(
            &client,
            "SELECT count(*) FROM projector.skips WHERE account_id = 9 AND seq = 2"
        )
        .await,
        1
    );
    log.push_event(&f9(3, "buy"));
    applier
        .apply(&mut client, &log.batch(2, 10))
        .await
        .expect("batch");
    assert_eq!(version_of_9(&client).await, 3, "seq 3 applied, no park");
    assert_eq!(
        one(&client, "SELECT count(*) FROM projector.parked_accounts").await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_ahead_of_its_account_is_resolved_and_skips_nothing() {
    // Parked at a gap (seq 2); seq 3 waits, and a second event claiming seq 3 is a
    // conflict. Its seq belongs to the waiting event: skipping the conflict resolves it and
    // records no skip, and the account applies seq 2 and 3 when seq 2 comes.
    let (db, applier) = portfolio_db().await;
    let mut client = db.client().await;
    let mut log = Partition::new("fills", 0);
    log.push_event(&f9(1, "buy"));
    log.push_event(&f9(3, "buy"));
    log.push_event(&f9(3, "sell").with_id("another-3"));
    applier
        .apply(&mut client, &log.batch(0, 10))
        .await
        .expect("batch");
    let id = one(
        &client,
        "SELECT id FROM projector.dead_letters WHERE kind = 'conflict'",
    )
    .await;
    let (status, stdout, stderr) = dlq_skip(&db, id);
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains("blocks no account"), "{stdout}");
    assert_eq!(open_dead_letters(&client).await, 0);
    assert_eq!(
        one(&client, "SELECT count(*) FROM projector.skips").await,
        0
    );
    log.push_event(&f9(2, "buy"));
    applier
        .apply(&mut client, &log.batch(3, 10))
        .await
        .expect("batch");
    assert_eq!(
        version_of_9(&client).await,
        3,
        "seq 2 and the waiting seq 3 applied"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seq_whose_sound_event_waits_is_not_skipped() {
    // Seq 1003 was poison, then republished corrected (same id) while account 9 was behind
    // a gap at seq 2: the correction waits. Seq 2 arrives; the drain stops after a thousand
    // events and the account parks at 1003, naming the poison's dead letter. Skipping it
    // would drop the waiting correction as a stale duplicate: refused, pointing at
    // `parked retry`, which applies it and resolves the dead letter.
    let (db, applier) = portfolio_db().await;
    let mut client = db.client().await;
    let mut log = Partition::new("fills", 0);
    log.push_event(&f9(1, "buy"));
    for seq in 3..=1002 {
        log.push_event(&f9(seq, "buy"));
    }
    log.push_event(&f9(1003, "hold").with_id("e-1003"));
    log.push_event(&f9(1003, "buy").with_id("e-1003"));
    let first = log.log.len() as i64;
    applier
        .apply(&mut client, &log.batch(0, 2000))
        .await
        .expect("batch");
    log.push_event(&f9(2, "buy"));
    let outcome = applier
        .apply(&mut client, &log.batch(first, 10))
        .await
        .expect("batch");
    assert!(!outcome.more_to_drain.is_empty(), "the drain stopped short");
    assert_eq!(
        one(
            &client,
            "SELECT blocked_seq FROM projector.parked_accounts WHERE account_id = 9"
        )
        .await,
        1003
    );
    let id = one(&client, "SELECT id FROM projector.dead_letters").await;
    let (status, _, stderr) = dlq_skip(&db, id);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("parked retry 9"), "{stderr}");
    assert_eq!(
        one(&client, "SELECT count(*) FROM projector.skips").await,
        0
    );

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_projector"))
        .args([
            "parked",
            "retry",
            "9",
            "--view",
            "portfolio",
            "--by",
            "carol",
        ])
        .args(["--database-url", db.url()])
        .output()
        .expect("run projector");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(version_of_9(&client).await, 1003, "the correction applied");
    assert_eq!(open_dead_letters(&client).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_gone_while_its_skip_waits_for_the_account_is_reported_as_gone() {
    // The skip reads the dead letter's account, then waits for the account's lock (a batch
    // holds it); meanwhile the dead letter goes (`retire --drop` deletes a version's dead
    // letters). Once it has the lock the skip must say so in its own words, not fail with
    // the database error of a row that is no longer there.
    let (db, applier) = portfolio_db().await;
    let applier = std::sync::Arc::new(applier);
    let mut client = db.client().await;
    let mut log = Partition::new("fills", 0);
    log.push_event(&f9(1, "buy"));
    log.push_event(&f9(2, "hold"));
    applier
        .apply(&mut client, &log.batch(0, 10))
        .await
        .expect("batch");
    let id = one(&client, "SELECT id FROM projector.dead_letters").await;

    // A batch of account 9 holds the account's lock.
    let mut holder = db.client().await;
    let tx = holder.transaction().await.expect("begin");
    tx.execute(
        "SELECT 1 FROM projector.account_progress WHERE account_id = 9 FOR UPDATE",
        &[],
    )
    .await
    .expect("lock");
    let skip = {
        let (applier, pool) = (applier.clone(), db.pool().clone());
        tokio::spawn(async move {
            let mut c = pool.get().await.expect("client");
            applier.skip_dead_letter(&mut c, id, "carol", "bad").await
        })
    };
    // The skip waits for the account's lock.
    lock_waiters(&db.client().await, 1).await;
    client
        .execute("DELETE FROM projector.dead_letters WHERE id = $1", &[&id])
        .await
        .expect("delete");
    tx.commit().await.expect("release");

    let err = skip.await.expect("task").expect_err("nothing to skip");
    assert!(
        matches!(&err, ApplyError::Refused { reason, .. } if reason.contains(&format!("no dead letter {id}"))),
        "{err}"
    );
    assert_eq!(
        one(&client, "SELECT count(*) FROM projector.skips").await,
        0,
        "nothing recorded"
    );
}
