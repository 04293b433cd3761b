//! `migrate` is repeatable, registers views, and the engine refuses configurations it cannot
//! keep exactly-once with a one-line reason: views it cannot apply safely, and a database
//! whose encoding cannot hold what events carry.

use std::sync::Arc;

use crate::support::variant::Variant;
use crate::support::Trail;
use projector_engine::testkit::TestDb;
use projector_engine::{migrate, Applier, DedupMode, Registry, SourceOrdering, ViewError};

/// Everything `migrate` could change: tables and columns, indexes, constraints, views, the
/// migration history and the view registry.
async fn schema_fingerprint(client: &deadpool_postgres::Client) -> Vec<String> {
    let queries = [
        "SELECT table_schema || '.' || table_name || '.' || column_name || ':' || data_type \
         FROM information_schema.columns WHERE table_schema IN ('public', 'projector') ORDER BY 1",
        "SELECT schemaname || '.' || indexname || ':' || indexdef FROM pg_indexes \
         WHERE schemaname IN ('public', 'projector') ORDER BY 1",
        "SELECT conname || ':' || pg_get_constraintdef(oid) FROM pg_constraint \
         WHERE connamespace IN (SELECT oid FROM pg_namespace WHERE nspname IN ('public', 'projector')) ORDER BY 1",
        "SELECT c.oid::text || ':' || c.relname || ':' || pg_get_viewdef(c.oid) FROM pg_class c \
         JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'v' AND n.nspname = 'public' ORDER BY 1",
        "SELECT version::text || ':' || name || ':' || checksum FROM projector.schema_history ORDER BY 1",
        "SELECT name || ':' || version || ':' || state || ':' || created_at::text FROM projector.views ORDER BY 1",
    ];
    let mut out = Vec::new();
    for q in queries {
        for row in client.query(q, &[]).await.expect(q) {
            out.push(row.get::<_, String>(0));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_twice_changes_nothing() {
    let registry = Registry::new()
        .register(Trail::new(1))
        .and_then(|r| r.register(Trail::new(2)))
        .expect("registry");
    let db = TestDb::new(&registry).await;
    let mut client = db.client().await;
    let before = schema_fingerprint(&client).await;
    assert!(before
        .iter()
        .any(|l| l.starts_with("projector.inbox.consumer")));
    assert!(
        before.iter().any(|l| l.contains(":trail:")),
        "the stable read name exists"
    );

    let report = migrate(&mut client, &registry)
        .await
        .expect("second migrate");
    assert!(report.applied.is_empty(), "{report:?}");
    assert!(report.registered.is_empty(), "{report:?}");
    assert!(report.read_names.is_empty(), "{report:?}");
    assert_eq!(schema_fingerprint(&client).await, before);

    // The first version of a view goes live and readers see it; later ones wait for a rebuild.
    let states: Vec<(i32, String)> = client
        .query(
            "SELECT version, state FROM projector.views WHERE name = 'trail' ORDER BY version",
            &[],
        )
        .await
        .expect("registry rows")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(states, [(1, "live".to_owned()), (2, "building".to_owned())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrations_take_turns() {
    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let db = TestDb::new(&Registry::new()).await;
    let mut runs = Vec::new();
    for _ in 0..3 {
        let (pool, registry) = (db.pool().clone(), registry.clone());
        runs.push(tokio::spawn(async move {
            let mut client = pool.get().await.expect("connection");
            migrate(&mut client, &registry)
                .await
                .map(|r| r.registered.len())
        }));
    }
    let mut registered = 0;
    for r in runs {
        registered += r.await.expect("task").expect("migrate");
    }
    assert_eq!(registered, 1, "exactly one run registers the view");
}

#[test]
fn a_version_filter_without_per_account_ordering_is_refused() {
    let mut view = Trail::new(1);
    view.dedup = DedupMode::Both;
    let err = Applier::new(Arc::new(view), SourceOrdering::Unordered).expect_err("refused");
    assert!(matches!(err, ViewError::VersionFilterNeedsOrdering(_)));
    let line = err.to_string();
    assert!(!line.contains('\n'));
    assert!(
        line.contains("trail_v1") && line.contains("per-account ordering"),
        "{line}"
    );

    // An order-dependent view is refused too: without order its fold is wrong.
    let err =
        Applier::new(Arc::new(Trail::new(1)), SourceOrdering::Unordered).expect_err("refused");
    assert!(matches!(err, ViewError::OrderNeedsOrdering(_)), "{err}");
}

#[test]
fn the_registry_refuses_bad_views() {
    let twice = Registry::new()
        .register(Trail::new(1))
        .and_then(|r| r.register(Trail::new(1)));
    assert!(matches!(twice, Err(ViewError::Duplicate(c)) if c == "trail_v1"));
    let zero = Registry::new().register(Trail::new(0));
    assert!(matches!(zero, Err(ViewError::BadVersion { .. })));
    let registry = Registry::new().register(Trail::new(1)).expect("registry");
    let unknown = registry
        .select(&["portfolio".to_owned()])
        .err()
        .expect("unknown view refused");
    assert_eq!(
        unknown.to_string(),
        "no view named \"portfolio\"; registered views: trail"
    );
}

/// A view whose statement takes many events per account may also have the version filter:
/// the filter drops each event of a run at or below the row's version, and the write returns
/// one row per event applied, so the filter's count holds (portfolio does both;
/// tests/it/portfolio_fold.rs).
#[test]
fn many_events_per_account_with_the_version_filter_are_accepted() {
    let many = || Variant::of(Trail::new(1)).many_per_account(true);
    Applier::new(
        Arc::new(many().dedup(DedupMode::Both)),
        SourceOrdering::PerAccount,
    )
    .expect("accepted");
    Applier::new(Arc::new(many()), SourceOrdering::PerAccount).expect("accepted");
}

/// A database of its own in LATIN1, dropped when the test passes, kept when it fails.
struct Latin1 {
    name: String,
    url: String,
}

impl Latin1 {
    async fn create() -> Self {
        let admin = projector_engine::testkit::admin_url();
        let name = format!(
            "projector_test_latin1_{}_{}",
            std::process::id(),
            chrono::Utc::now().timestamp_micros() % 1_000_000
        );
        let pool = projector_engine::db::pool(&admin, 1).expect("admin url");
        pool.get()
            .await
            .expect("the test server")
            .batch_execute(&format!(
                "CREATE DATABASE {name} ENCODING 'LATIN1' TEMPLATE template0 \
                 LC_COLLATE 'C' LC_CTYPE 'C'"
            ))
            .await
            .expect("a LATIN1 database");
        let url = projector_engine::db::url_for_database(&admin, &name).expect("its url");
        Self { name, url }
    }
}

impl Drop for Latin1 {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("test failed: database {} kept for debugging", self.name);
            return;
        }
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                let pool =
                    projector_engine::db::pool(&projector_engine::testkit::admin_url(), 1).ok()?;
                pool.get()
                    .await
                    .ok()?
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await
                    .ok()
            })
        })
        .join();
    }
}

/// The one line a refused command ends with.
fn only_error_line(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line expected:\n{stderr}");
    lines[0].to_owned()
}

/// A character outside LATIN1 fails every statement that carries it (SQLSTATE 22P05), batch
/// after batch: the engine refuses such a database before it writes or consumes anything,
/// at `migrate` and at `run` (with `--no-migrate` too), saying what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_not_in_utf8_is_refused_at_migrate_and_run_in_one_line() {
    let db = Latin1::create().await;
    let pool = projector_engine::db::pool(&db.url, 1).expect("pool");
    let mut client = pool.get().await.expect("connect");
    // What the refusal spares: an event id with a character LATIN1 lacks cannot be stored.
    let e = client
        .query_one("SELECT $1::text", &[&"fill-ş"])
        .await
        .expect_err("LATIN1 cannot hold ş");
    assert_eq!(
        e.code(),
        Some(&tokio_postgres::error::SqlState::UNTRANSLATABLE_CHARACTER)
    );

    let registry = projector_views::registry().expect("registry");
    let e = migrate(&mut client, &registry)
        .await
        .expect_err("migrate refuses LATIN1");
    let text = e.to_string();
    assert!(
        text.contains("encoded in LATIN1")
            && text.contains("ENCODING 'UTF8'")
            && !text.contains('\n'),
        "{text}"
    );
    let schema = client
        .query_opt(
            "SELECT 1 FROM pg_namespace WHERE nspname = 'projector'",
            &[],
        )
        .await
        .expect("namespaces");
    assert!(schema.is_none(), "nothing was created");

    let cli = tokio::task::spawn_blocking({
        let url = db.url.clone();
        move || crate::support::process::run_to_end(&["migrate", "--database-url", &url])
    })
    .await
    .expect("migrate's thread");
    assert!(!cli.0.success());
    let line = only_error_line(&cli.1);
    assert!(
        line.contains("encoded in LATIN1") && line.contains("ENCODING 'UTF8'"),
        "{line}"
    );

    // `run`, with and without its migration: refused before it consumes, and it exits.
    let broker = projector_devkit::devbroker::DevBroker::start(1, &[("fills", 1)]).expect("broker");
    let bootstrap = broker.bootstrap_servers();
    for extra in [None, Some("--no-migrate")] {
        let mut args = vec![
            "run",
            "--brokers",
            &bootstrap,
            "--topic",
            "fills",
            "--metrics-addr",
            "off",
            "--database-url",
            &db.url,
        ];
        args.extend(extra);
        let mut run = crate::support::process::Projector::spawn(&args, "off");
        let status = tokio::task::spawn_blocking(move || {
            let status = run.wait_exit(std::time::Duration::from_secs(60));
            (status, run.log_all())
        })
        .await
        .expect("run's thread");
        assert!(!status.0.success(), "{args:?}");
        let line = only_error_line(&status.1);
        assert!(
            line.contains("encoded in LATIN1") && line.contains("ENCODING 'UTF8'"),
            "{args:?}: {line}"
        );
    }
}
