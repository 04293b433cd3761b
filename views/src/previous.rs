//! The built-in views as earlier releases wrote them, where the current code keeps their
//! results: a version registered by that code goes on running with this one, because each
//! view declares the earlier code's fingerprint at its version (`Projection::replaces`,
//! `projector_engine::fingerprint`).
//!
//! Until event versions, the views read `fill_executed` and `fill_busted` with `data.side`
//! and a positive `data.qty`. Now they read version 2 (a signed `qty`, no `side`) and version
//! 1 is upcast to it ([`crate::upcast`]): from the same events, the same rows, to the digit
//! (`abs` keeps a quantity's scale). So the earlier code is the current one but for its
//! declared fields and its `ctes` statement, kept in `previous.sql`, and without upcasters.
//! Nothing runs it in production; tests run it to show the results are kept.
//!
//! Portfolio changed once more: it folds each account's run of a batch in one statement
//! (`many_per_account`) where it was applied in rounds of one event per account, with the
//! same arithmetic and rounding, so the same rows and notices. [`PortfolioInRounds`] is the
//! code in rounds (its `ctes`, `write` and `notices` kept in `previous.sql`); the code before
//! event versions is `BeforeEventVersions::new(PortfolioInRounds::new(v))`. Portfolio
//! declares both fingerprints.

use projector_engine::projection::named_sql;
use std::sync::Arc;

use projector_engine::{ApplySql, DedupMode, Field, Projection, Upcaster};

use crate::Portfolio;

const SQL: &str = include_str!("previous.sql");

/// A built-in view as it was before event versions: the current view `inner` with the
/// declared fields and `ctes` of then.
#[derive(Debug, Clone)]
pub struct BeforeEventVersions<P> {
    inner: P,
}

impl<P: Projection + Clone> BeforeEventVersions<P> {
    /// The code before event versions of the view `inner` is (portfolio, risk or eod).
    pub fn new(inner: P) -> Self {
        Self { inner }
    }
}

/// The fingerprint of the code before event versions of a built-in view, at its version.
pub(crate) fn fingerprint<P: Projection + Clone>(view: &P) -> String {
    projector_engine::fingerprint::of(&BeforeEventVersions::new(view.clone()))
}

impl<P: Projection + Clone> Projection for BeforeEventVersions<P> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn version(&self) -> i32 {
        self.inner.version()
    }
    fn subscribes(&self) -> &[&str] {
        self.inner.subscribes()
    }
    fn dedup(&self) -> DedupMode {
        self.inner.dedup()
    }
    fn order_independent(&self) -> bool {
        self.inner.order_independent()
    }
    fn many_per_account(&self) -> bool {
        self.inner.many_per_account()
    }
    fn fields(&self) -> Vec<Field> {
        // `side` was read right before `qty`.
        let mut fields = self.inner.fields();
        if let Some(at) = fields.iter().position(|f| *f == Field::Decimal("qty")) {
            fields.insert(at, Field::Text("side"));
        }
        fields
    }
    fn check_data(
        &self,
        event: &projector_engine::Event,
    ) -> Result<(), projector_engine::DecodeError> {
        crate::events::check_rules(event)
    }
    fn ddl(&self) -> String {
        self.inner.ddl()
    }
    fn tables(&self) -> Vec<String> {
        self.inner.tables()
    }
    fn apply_sql(&self) -> ApplySql {
        let name = format!("{}_ctes_before_event_versions", self.inner.name());
        ApplySql {
            ctes: named_sql(SQL, &name)
                .unwrap_or_else(|| {
                    panic!("views/src/previous.sql has no `-- name: {name}` section")
                })
                .to_owned(),
            write: self.inner.apply_sql().write,
        }
    }
    fn read_sql(&self) -> String {
        self.inner.read_sql()
    }
    fn notices_sql(&self) -> Option<String> {
        self.inner.notices_sql()
    }
    fn snapshot_sql(&self) -> Option<String> {
        self.inner.snapshot_sql()
    }
}

/// Portfolio as it was before it folded each account's run (applied in rounds of one event
/// per account), reading fills and busts at version 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortfolioInRounds {
    inner: Portfolio,
}

impl PortfolioInRounds {
    /// The code in rounds at `version`.
    pub fn new(version: i32) -> Self {
        Self {
            inner: Portfolio::new(version),
        }
    }

    fn section(name: &str) -> String {
        named_sql(SQL, name)
            .unwrap_or_else(|| panic!("views/src/previous.sql has no `-- name: {name}` section"))
            .to_owned()
    }
}

impl Projection for PortfolioInRounds {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn version(&self) -> i32 {
        self.inner.version()
    }
    fn at_version(&self, version: i32) -> Option<Arc<dyn Projection>> {
        Some(Arc::new(Self::new(version)))
    }
    fn subscribes(&self) -> &[&str] {
        self.inner.subscribes()
    }
    fn dedup(&self) -> DedupMode {
        self.inner.dedup()
    }
    fn many_per_account(&self) -> bool {
        false
    }
    fn fields(&self) -> Vec<Field> {
        self.inner.fields()
    }
    fn upcasters(&self) -> Vec<Upcaster> {
        self.inner.upcasters()
    }
    fn check_data(
        &self,
        event: &projector_engine::Event,
    ) -> Result<(), projector_engine::DecodeError> {
        crate::events::check_rules(event)
    }
    fn ddl(&self) -> String {
        self.inner.ddl()
    }
    fn tables(&self) -> Vec<String> {
        self.inner.tables()
    }
    fn apply_sql(&self) -> ApplySql {
        ApplySql {
            ctes: Self::section("portfolio_ctes_in_rounds"),
            write: Self::section("portfolio_write_in_rounds"),
        }
    }
    fn read_sql(&self) -> String {
        self.inner.read_sql()
    }
    fn notices_sql(&self) -> Option<String> {
        Some(Self::section("portfolio_notices_in_rounds"))
    }
    fn snapshot_sql(&self) -> Option<String> {
        self.inner.snapshot_sql()
    }
}
