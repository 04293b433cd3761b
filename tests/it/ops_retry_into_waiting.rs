//! A dead letter retried while its account waits for an earlier `seq` goes to the waiting
//! events, and is resolved as retried ("waiting"). If it then fails again when the account
//! drains, the failure must leave an open dead letter, which `dlq retry` can retry, and the
//! park must name it: resolved, it would hide the one event the account waits on.

use crate::support::{trail_db, Trail};
use projector_engine::event::Event;
use projector_engine::testkit::{fill, EventSpec, Partition};
use projector_engine::{Applier, ApplySql, DedupMode, Disposition, Projection, SourceOrdering};

fn f(seq: i64, qty: &str) -> EventSpec {
    fill(
        1,
        seq,
        "2026-11-29T10:15:00Z",
        "EURUSD",
        "buy",
        qty,
        "1.5",
        "0",
    )
}

/// [`Trail`] v1 with a check of its own that refuses quantities of a million or more (the
/// same limit as the table's CHECK): such an event is poison for it, never sent.
#[derive(Debug, Clone)]
struct Strict(Trail);

impl Projection for Strict {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn version(&self) -> i32 {
        self.0.version()
    }
    fn subscribes(&self) -> &[&str] {
        self.0.subscribes()
    }
    fn check_data(
        &self,
        event: &projector_engine::Event,
    ) -> Result<(), projector_engine::DecodeError> {
        self.0.check_data(event)
    }
    fn dedup(&self) -> DedupMode {
        self.0.dedup()
    }
    fn ddl(&self) -> String {
        self.0.ddl()
    }
    fn tables(&self) -> Vec<String> {
        self.0.tables()
    }
    fn apply_sql(&self) -> ApplySql {
        self.0.apply_sql()
    }
    fn read_sql(&self) -> String {
        self.0.read_sql()
    }
    fn validate(&self, event: &Event) -> Result<(), projector_engine::Rejected> {
        let data: serde_json::Value = serde_json::from_str(&event.data)
            .map_err(|e| projector_engine::Rejected::rule(e.to_string()))?;
        match data["qty"].as_str() {
            Some(q) if q.len() >= 7 => Err(projector_engine::Rejected::rule(format!(
                "qty {q} is too large"
            ))),
            _ => Ok(()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_dead_letter_that_fails_again_as_it_drains_stays_open() {
    let (db, plain) = trail_db().await;
    let strict = Applier::new(
        std::sync::Arc::new(Strict(Trail::new(1))),
        SourceOrdering::PerAccount,
    )
    .expect("applier");
    let mut client = db.client().await;
    // Seq 1 applied; seq 2 lost for now; seq 3 refused by the strict code: a dead letter.
    let mut log = Partition::from_events("fills", 0, &[f(1, "1"), f(3, "2000000")]);
    strict
        .apply(&mut client, &log.batch(0, 10))
        .await
        .expect("batch");
    let id: i64 = client
        .query_one("SELECT id FROM projector.dead_letters", &[])
        .await
        .expect("dead letter")
        .get(0);

    // The check is lifted and the dead letter retried: it decodes now, and waits for seq 2.
    let (retried, _) = plain
        .retry_dead_letter(&mut client, id, "alice")
        .await
        .expect("retry");
    assert_eq!(retried, Disposition::Waiting);

    // Seq 2 arrives, with seq 4: the account drains, seq 3 breaks the table's CHECK, and
    // seq 4 waits behind it.
    log.push_event(&f(2, "2"));
    log.push_event(&f(4, "4"));
    let out = plain
        .apply(&mut client, &log.batch(2, 10))
        .await
        .expect("batch");
    assert_eq!(out.counts.failed, 1, "seq 3 failed as it drained");
    let open: Vec<(i64, String)> = client
        .query(
            "SELECT id, kind FROM projector.dead_letters WHERE resolved_at IS NULL",
            &[],
        )
        .await
        .expect("dead letters")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        open,
        [(id, "apply_failed".to_owned())],
        "the dead letter is open again, with the new failure"
    );
    let park: (String, Option<i64>, i64) = client
        .query_one(
            "SELECT reason, dead_letter_id, blocked_seq FROM projector.parked_accounts",
            &[],
        )
        .await
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .expect("parked");
    assert_eq!(park, ("dead_letter".to_owned(), Some(id), 3));

    // And it can be retried again.
    let (again, _) = plain
        .retry_dead_letter(&mut client, id, "alice")
        .await
        .expect("a retry, not a refusal");
    assert_eq!(again, Disposition::DeadLettered);
}
