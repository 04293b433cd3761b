//! The adversarial review of SQL views (issue 26): files that load but would fail, or do
//! harm, only later, refused when they are loaded.

use std::path::Path;
use std::sync::Arc;

use projector_engine::sql_view::{self, SqlView};
use projector_engine::testkit::TestDb;
use projector_engine::Registry;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn example(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/sql_views")
        .join(file);
    std::fs::read_to_string(&path).expect("an example view")
}

fn parse(text: &str) -> SqlView {
    sql_view::parse(
        &[("views/cash_by_day.sql".to_owned(), text.to_owned())],
        &[],
    )
    .expect("the file parses")
}

#[test]
fn a_ddl_that_fails_when_it_runs_again_is_refused_before_anything_is_applied() {
    // The DDL runs at every start (migrate, run). Without IF NOT EXISTS it runs once, and the
    // second start fails on "already exists", when the file can no longer change (its
    // version is registered with its fingerprint).
    let rt = runtime();
    rt.block_on(async {
        let db = TestDb::new(&Registry::new()).await;
        let mut client = db.client().await;
        let good = example("cash_by_day.sql");
        sql_view::check(&mut client, &[parse(&good)])
            .await
            .expect("the example is idempotent");
        let once = good.replace(
            "CREATE TABLE IF NOT EXISTS cash_by_day_v{v}",
            "CREATE TABLE cash_by_day_v{v}",
        );
        assert_ne!(once, good);
        let e = sql_view::check(&mut client, &[parse(&once)])
            .await
            .expect_err("refused on a database where it never ran")
            .to_string();
        let ddl_line = good
            .lines()
            .position(|l| l.starts_with("CREATE TABLE"))
            .expect("the ddl")
            + 1;
        assert!(
            e.starts_with(&format!("views/cash_by_day.sql:{ddl_line}: ddl: "))
                && e.contains("already exists")
                && e.contains("IF NOT EXISTS")
                && e.lines().count() == 1,
            "{e}"
        );
    });
}

#[test]
fn edited_files_that_serve_the_live_version_at_another_version_are_refused_at_start() {
    // cash_by_day v1's file, rebuilt as it is into v2 (no v2 file: the newest files serve any
    // version), cut over, v1 retired and dropped. The v1 file is now v2's code: an edit of it
    // must be refused at start like any edit of a live version's files, not found out by a
    // run that leaves the live version alone.
    let rt = runtime();
    rt.block_on(async {
        let db = TestDb::new(&Registry::new()).await;
        let mut client = db.client().await;
        let good = example("cash_by_day.sql");
        let v1 = parse(&good);
        let mut registry = Registry::new();
        registry.add(Arc::new(v1.clone())).expect("v1");
        projector_engine::migrate(&mut client, &registry)
            .await
            .expect("v1 registered");
        let mut registry = Registry::new();
        registry.add(Arc::new(v1.with_version(2))).expect("v2");
        projector_engine::migrate(&mut client, &registry)
            .await
            .expect("v2 registered");
        client
            .batch_execute(
                "UPDATE projector.views SET state = 'retired', dropped_at = now() \
                 WHERE name = 'cash_by_day' AND version = 1; \
                 UPDATE projector.views SET state = 'live' \
                 WHERE name = 'cash_by_day' AND version = 2",
            )
            .await
            .expect("cut over, v1 dropped");

        sql_view::check(&mut client, std::slice::from_ref(&v1))
            .await
            .expect("the files that registered v2 serve it");

        let edited = parse(&good.replace(
            "-- Cash movements per account",
            "-- Cash movements (edited) per account",
        ));
        assert_ne!(edited.files_hash(), v1.files_hash());
        let e = sql_view::check(&mut client, &[edited])
            .await
            .expect_err("refused at start")
            .to_string();
        assert!(
            e.contains("cash_by_day v2") && e.contains("live") && e.lines().count() == 1,
            "{e}"
        );
    });
}

#[test]
fn a_version_being_built_by_other_files_leaves_the_older_files_running() {
    // A rolling rebuild: v2 is being built from a v2 file, v1 is live from the v1 file. A
    // process restarted with the v1 file alone keeps v1 running (it leaves v2 alone).
    let rt = runtime();
    rt.block_on(async {
        let db = TestDb::new(&Registry::new()).await;
        let mut client = db.client().await;
        let good = example("cash_by_day.sql");
        let v1 = parse(&good);
        let v2 = parse(
            &good
                .replace("-- version: 1", "-- version: 2")
                .replace("count(*) AS movements", "count(*) + 0 AS movements"),
        );
        let mut registry = Registry::new();
        registry.add(Arc::new(v1.clone())).expect("v1");
        registry.add(Arc::new(v2)).expect("v2");
        projector_engine::migrate(&mut client, &registry)
            .await
            .expect("registered");
        sql_view::check(&mut client, &[v1])
            .await
            .expect("v1's files still run v1");
    });
}

#[test]
fn the_refusal_of_edited_files_names_a_version_no_one_has_taken() {
    // v1 live from the file, v2 being built from the same files: the way forward for an
    // edit of the v1 file is version 3, not the v2 that exists.
    let rt = runtime();
    rt.block_on(async {
        let db = TestDb::new(&Registry::new()).await;
        let mut client = db.client().await;
        let good = example("cash_by_day.sql");
        let v1 = parse(&good);
        let mut registry = Registry::new();
        registry.add(Arc::new(v1.clone())).expect("v1");
        projector_engine::migrate(&mut client, &registry)
            .await
            .expect("v1 registered");
        let mut registry = Registry::new();
        registry.add(Arc::new(v1.with_version(2))).expect("v2");
        projector_engine::migrate(&mut client, &registry)
            .await
            .expect("v2 registered");
        let edited = parse(&good.replace("-- Cash movements", "-- Cash moves"));
        let e = sql_view::check(&mut client, &[edited])
            .await
            .expect_err("refused at start")
            .to_string();
        assert!(
            e.contains("cash_by_day v1 was registered by other files")
                && e.contains("`-- version: 3`")
                && e.contains("--to-version 3"),
            "{e}"
        );
    });
}

#[test]
fn a_mistake_in_ctes_that_end_in_a_comma_is_found_at_its_line() {
    let rt = runtime();
    rt.block_on(async {
        let db = TestDb::new(&Registry::new()).await;
        let mut client = db.client().await;
        let good = example("cash_by_day.sql");
        let bad = good
            .replace(
                "           sum(ev.amount) AS amount\n",
                "           abss(sum(ev.amount)) AS amount\n",
            )
            .replace("    GROUP BY 1, 2, 3\n)\n", "    GROUP BY 1, 2, 3\n),\n");
        assert_ne!(bad, good);
        let line = bad
            .lines()
            .position(|l| l.contains("abss("))
            .expect("the mistake")
            + 1;
        let e = sql_view::check(&mut client, &[parse(&bad)])
            .await
            .expect_err("refused")
            .to_string();
        assert!(
            e.starts_with(&format!(
                "views/cash_by_day.sql:{line}: ctes: function abss"
            )),
            "{e}"
        );
    });
}
