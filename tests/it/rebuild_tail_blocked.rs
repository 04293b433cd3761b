//! A rebuild whose tail cannot start (its table locked past the statement timeout) is
//! started again with backoff, and an engineer's pause meanwhile pauses it: the rebuild goes
//! on, paused, and finishes once resumed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::kafka::{config, publish};
use crate::support::variant::Variant;
use crate::support::{eventually, fills, offsets, with_options, within};
use projector_devkit::devbroker::DevBroker;
use projector_engine::testkit::TestDb;
use projector_engine::{ApplySql, Projection, Registry};
use projector_rebuild::state::{set_paused, Cutover, Source};
use projector_rebuild::tail::{Progress, Status};
use projector_rebuild::{Options, Outcome};
use projector_views::Portfolio;
use tokio_util::sync::CancellationToken;

const TOPIC: &str = "fills";

/// Portfolio at `version` whose statement also names `portfolio_gate`: a lock on that table
/// keeps the version's tail from starting and touches nothing else.
fn gated(version: i32) -> Variant {
    let inner = Portfolio::new(version);
    let sql = inner.apply_sql();
    Variant::of(inner).apply_sql(ApplySql {
        ctes: format!(
            "gate AS (SELECT 1 FROM portfolio_gate WHERE false){}{}",
            if sql.ctes.trim().is_empty() { "" } else { ", " },
            sql.ctes
        ),
        write: sql.write,
    })
}

/// The rebuild's messages, kept.
#[derive(Default)]
struct Lines(Mutex<Vec<String>>);

impl Lines {
    fn any(&self, needle: &str) -> bool {
        self.0
            .lock()
            .map(|l| l.iter().any(|m| m.contains(needle)))
            .unwrap_or(false)
    }
}

impl Progress for Lines {
    fn message(&self, line: &str) {
        if let Ok(mut l) = self.0.lock() {
            l.push(line.to_owned());
        }
    }
    fn status(&self, _: &Status) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_paused_while_its_tail_cannot_start_stays_paused_and_resumes() {
    let broker = DevBroker::start(1, &[(TOPIC, 2)]).expect("broker");
    let bootstrap = broker.bootstrap_servers();
    let registry = Registry::new()
        .register(Portfolio::new(1))
        .and_then(|r| r.register(gated(2)))
        .expect("registry");
    let db = TestDb::new(&registry).await;
    let setup = db.client().await;
    setup
        .batch_execute("CREATE TABLE portfolio_gate (x int)")
        .await
        .expect("gate");
    publish(&bootstrap, TOPIC, &fills(8, 3)).await;
    let held = projector_engine::db::pool(
        &with_options(db.url(), &[("idle_in_transaction_session_timeout", "0")]),
        1,
    )
    .expect("pool")
    .get()
    .await
    .expect("holder");
    held.batch_execute("BEGIN; LOCK TABLE portfolio_gate IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("lock");

    let mut options = Options::new("portfolio");
    options.source = Source::Earliest;
    options.cutover = Cutover::Manual;
    options.tick = Duration::from_millis(100);
    let lines = Arc::new(Lines::default());
    let stop = CancellationToken::new();
    let rebuild = {
        let (registry, lines, stop) = (registry.clone(), lines.clone(), stop.clone());
        // Each start waits five seconds on the lock before it fails.
        let url = with_options(db.url(), &[("statement_timeout", "5000")]);
        let kafka = config(&bootstrap, TOPIC);
        tokio::spawn(async move {
            projector_rebuild::rebuild(&registry, &url, kafka, &options, &*lines, stop).await
        })
    };
    eventually(
        "the tail's start to wait on the lock",
        || async {
            setup
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE datname = current_database() AND wait_event_type = 'Lock'",
                    &[],
                )
                .await
                .expect("pg_stat_activity")
                .get::<_, i64>(0)
        },
        |n| *n >= 1,
    )
    .await;

    // `projector rebuild portfolio --pause` while the start waits.
    set_paused(&setup, "portfolio", true).await.expect("pause");
    within(
        "the rebuild to pause",
        Duration::from_secs(30),
        || async { (lines.any("paused; resume with"), rebuild.is_finished()) },
        |(paused, ended)| *paused || *ended,
    )
    .await;
    assert!(
        !rebuild.is_finished(),
        "the rebuild ended instead of pausing: {:?}",
        rebuild.await.expect("join")
    );

    held.batch_execute("ROLLBACK").await.expect("unlock");
    set_paused(&setup, "portfolio", false)
        .await
        .expect("resume");
    eventually(
        "v2 to consume everything once resumed",
        || async {
            offsets(&setup, "portfolio_v2")
                .await
                .next
                .values()
                .sum::<i64>()
        },
        |n| *n == 24,
    )
    .await;
    stop.cancel();
    let outcome = rebuild.await.expect("join").expect("rebuild");
    assert_eq!(outcome, Outcome::Stopped { version: 2 });
}
