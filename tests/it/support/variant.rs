//! A view with some of its parts replaced and everything else its own: old SQL to continue
//! from or compare with, SQL broken on purpose to show a comparison has teeth, another
//! batching or dedup mode.

use std::sync::Arc;

use projector_engine::{ApplySql, DedupMode, Field, Projection};

/// `inner`, but for the parts set here. A variant cannot be built at another version
/// (`at_version` is `None`): that would be `inner`'s code, not the variant's.
pub struct Variant {
    pub inner: Arc<dyn Projection>,
    pub dedup: Option<DedupMode>,
    pub many_per_account: Option<bool>,
    pub apply_sql: Option<ApplySql>,
    pub replaces: Vec<String>,
}

impl Variant {
    /// `inner` unchanged so far.
    pub fn of(inner: impl Projection + 'static) -> Self {
        Self {
            inner: Arc::new(inner),
            dedup: None,
            many_per_account: None,
            apply_sql: None,
            replaces: Vec::new(),
        }
    }

    pub fn dedup(mut self, dedup: DedupMode) -> Self {
        self.dedup = Some(dedup);
        self
    }

    pub fn many_per_account(mut self, many: bool) -> Self {
        self.many_per_account = Some(many);
        self
    }

    /// Declares that this code keeps the results of the code with these fingerprints.
    pub fn replacing_code(mut self, fingerprints: &[String]) -> Self {
        self.replaces = fingerprints.to_vec();
        self
    }

    pub fn apply_sql(mut self, sql: ApplySql) -> Self {
        self.apply_sql = Some(sql);
        self
    }

    /// The inner view's statement with each `(from, to)` replaced; each `from` must occur.
    pub fn replacing(self, replacements: &[(&str, &str)]) -> Self {
        let mut sql = self.inner.apply_sql();
        for (from, to) in replacements {
            assert!(sql.ctes.contains(from), "{from}");
            sql.ctes = sql.ctes.replace(from, to);
        }
        self.apply_sql(sql)
    }
}

impl Projection for Variant {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn version(&self) -> i32 {
        self.inner.version()
    }
    fn subscribes(&self) -> &[&str] {
        self.inner.subscribes()
    }
    fn check_data(
        &self,
        event: &projector_engine::Event,
    ) -> Result<(), projector_engine::DecodeError> {
        self.inner.check_data(event)
    }
    fn dedup(&self) -> DedupMode {
        self.dedup.unwrap_or_else(|| self.inner.dedup())
    }
    fn order_independent(&self) -> bool {
        self.inner.order_independent()
    }
    fn many_per_account(&self) -> bool {
        self.many_per_account
            .unwrap_or_else(|| self.inner.many_per_account())
    }
    fn fields(&self) -> Vec<Field> {
        self.inner.fields()
    }
    fn ddl(&self) -> String {
        self.inner.ddl()
    }
    fn tables(&self) -> Vec<String> {
        self.inner.tables()
    }
    fn apply_sql(&self) -> ApplySql {
        self.apply_sql
            .clone()
            .unwrap_or_else(|| self.inner.apply_sql())
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
    fn validate(&self, event: &projector_engine::Event) -> Result<(), projector_engine::Rejected> {
        self.inner.validate(event)
    }
    fn upcasters(&self) -> Vec<projector_engine::Upcaster> {
        self.inner.upcasters()
    }
    fn unknown_version(&self) -> projector_engine::UnknownVersion {
        self.inner.unknown_version()
    }
    fn replaces(&self) -> Vec<String> {
        self.replaces.clone()
    }
}
