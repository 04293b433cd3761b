//! A view's SQL file: statements under `-- name: <name>` headers, compiled into the binary.

use projector_engine::projection::named_sql;

/// One `.sql` file beside a view module, embedded with `include_str!`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SqlFile {
    /// Path from the workspace root, for the message below.
    path: &'static str,
    text: &'static str,
}

impl SqlFile {
    pub(crate) const fn new(path: &'static str, text: &'static str) -> Self {
        Self { path, text }
    }

    /// The statement under `-- name: <name>`.
    ///
    /// The text is compiled in, so a missing section is a defect of this crate, not of its
    /// input; every view's unit test reads every section it uses, so a build whose tests pass
    /// cannot get here. Panicking names the file and the section, which an empty statement
    /// (the silent alternative) would not: empty DDL "succeeds" and creates nothing.
    pub(crate) fn section(&self, name: &str) -> &'static str {
        named_sql(self.text, name)
            .unwrap_or_else(|| panic!("{} has no `-- name: {name}` section", self.path))
    }
}
