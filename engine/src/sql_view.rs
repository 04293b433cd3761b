//! Views written as `.sql` files, loaded at start without compiling anything.
//!
//! A SQL view is a directory entry of a views directory: one `.sql` file, or a subdirectory
//! whose `.sql` files (read in name order) together make one view version. Its text is a
//! header of `-- key: value` lines, then `-- name: <section>` sections holding exactly the
//! parts a Rust view hands the engine ([`Projection`]):
//!
//! ```sql
//! -- view: cash_by_day
//! -- version: 1
//! -- subscribes: cash_adjusted
//! -- fields: amount decimal, reason text
//! -- dedup: inbox
//! -- order_independent: true
//!
//! -- name: ddl
//! CREATE TABLE IF NOT EXISTS cash_by_day_v{v} (...);
//! -- name: ctes
//! ...
//! -- name: write
//! INSERT INTO cash_by_day_v{v} ... RETURNING 1;
//! -- name: read
//! SELECT ... FROM cash_by_day_v{v};
//! ```
//!
//! `docs/sql-views.md` describes every key and section. [`load_dir`] and [`load_path`] parse
//! and check what the text alone can tell (keys, values, sections, tables, undeclared `ev.`
//! columns); [`check`] prepares every statement against a database and compares the files
//! with the code that registered each version (issue 14's fingerprint). Every error is one
//! line, `<file>:<line>: <what is wrong and what to do>` ([`SqlViewError`]).
//!
//! A view's code fingerprint ([`crate::fingerprint::of`]) covers its files' whole content:
//! its DDL starts with a comment carrying the SHA-256 of the files, so an edit anywhere in
//! them (a comment included) is other code, and a version registered by other files is
//! refused at start ([`check`]). [`SqlView::at_version`] gives the same files at another
//! version, so `projector rebuild` can rebuild unchanged files into a new version; changed
//! logic is a new file (or directory) with its own `-- version:`, beside the old one until the
//! new version is cut over.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use sha2::{Digest, Sha256};

use crate::projection::{
    render, ApplySql, DedupMode, Field, Projection, UnknownVersion, ENVELOPE_COLUMNS,
};
use crate::upcast::Upcaster;

/// The sections a SQL view may have, in the order they are documented.
pub const SECTIONS: [&str; 6] = ["ddl", "ctes", "write", "notices", "read", "snapshot"];

/// The header keys, in the order they are documented.
pub const KEYS: [&str; 10] = [
    "view",
    "version",
    "subscribes",
    "fields",
    "dedup",
    "order_independent",
    "many_per_account",
    "unknown_version",
    "replaces",
    "description",
];

/// Why a SQL view cannot be loaded: one line, naming the file and the line to fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqlViewError {
    /// Something in a file: a key, a value, a section, a statement.
    #[error("{file}:{line}: {message}")]
    At {
        /// The file, as found under the directory given.
        file: String,
        /// Its line, from 1.
        line: usize,
        /// What is wrong and what to do.
        message: String,
    },
    /// A file or directory could not be read.
    #[error("{path}: cannot read it: {source}")]
    Io {
        /// The path.
        path: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The database could not be asked.
    #[error("while checking the SQL views against the database: {0}")]
    Database(String),
}

/// Where a part of the text starts.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Origin {
    file: String,
    line: usize,
}

/// A view version declared in `.sql` files.
#[derive(Clone)]
pub struct SqlView {
    name: String,
    version: i32,
    subscribes: Vec<&'static str>,
    fields: Vec<Field>,
    dedup: DedupMode,
    order_independent: bool,
    many_per_account: bool,
    unknown_version: UnknownVersion,
    replaces: Vec<String>,
    upcasters: Vec<Upcaster>,
    /// Per subscribed type, a compiled view of the binary that reads it: its
    /// [`Projection::check_data`] holds the type's rules ([`SqlView::with_rules_of`]).
    rules: BTreeMap<&'static str, Arc<dyn Projection>>,
    tables: Vec<String>,
    ddl: String,
    ctes: String,
    write: String,
    notices: Option<String>,
    read: String,
    snapshot: Option<String>,
    /// The SHA-256 of the files' content, in the DDL's first line: the fingerprint's share.
    files_hash: String,
    /// Where each section's body starts, and the header's `version` line.
    origins: BTreeMap<&'static str, Origin>,
    version_line: Origin,
    view_line: Origin,
}

impl std::fmt::Debug for SqlView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SqlView({} v{} from {})",
            self.name, self.version, self.version_line.file
        )
    }
}

impl SqlView {
    /// The file (and line) that declares the version: where errors about the whole view
    /// point.
    pub fn file(&self) -> &str {
        &self.version_line.file
    }

    /// The same files at another version (what [`Projection::at_version`] shares).
    pub fn with_version(&self, version: i32) -> SqlView {
        Self {
            version,
            ..self.clone()
        }
    }

    /// The same view, checking each subscribed type's `data` by the rules of the compiled
    /// views of `views` that read the type (the first that subscribes to it): the engine
    /// knows no type's rules, the binary's views do (`projector_views::events::check_rules`
    /// for the built-in types), and an event that is poison for a compiled view of its type
    /// must be poison for a SQL view too. A type no compiled view reads has no rules beyond
    /// the engine's envelope and storage checks.
    pub fn with_rules_of<'a>(
        mut self,
        views: impl IntoIterator<Item = &'a Arc<dyn Projection>>,
    ) -> SqlView {
        for v in views {
            for t in v.subscribes() {
                if let Some(ours) = self.subscribes.iter().find(|s| **s == *t) {
                    self.rules.entry(ours).or_insert_with(|| Arc::clone(v));
                }
            }
        }
        self
    }

    /// `<file>:<line>` of the header's `-- view:` line, for errors about the view as a whole.
    pub fn declared_at(&self) -> String {
        format!("{}:{}", self.view_line.file, self.view_line.line)
    }

    /// The SHA-256 of the view's files, in hex.
    pub fn files_hash(&self) -> &str {
        &self.files_hash
    }

    fn at(&self, origin: &Origin, offset: usize, message: String) -> SqlViewError {
        SqlViewError::At {
            file: origin.file.clone(),
            line: origin.line + offset,
            message,
        }
    }

    fn section_origin(&self, section: &str) -> &Origin {
        self.origins.get(section).unwrap_or(&self.version_line)
    }
}

impl Projection for SqlView {
    fn name(&self) -> &str {
        &self.name
    }
    fn version(&self) -> i32 {
        self.version
    }
    fn subscribes(&self) -> &[&str] {
        &self.subscribes
    }
    fn dedup(&self) -> DedupMode {
        self.dedup
    }
    fn order_independent(&self) -> bool {
        self.order_independent
    }
    fn many_per_account(&self) -> bool {
        self.many_per_account
    }
    fn fields(&self) -> Vec<Field> {
        self.fields.clone()
    }
    fn ddl(&self) -> String {
        // The files' hash rides in the DDL, which the fingerprint covers: the fingerprint of
        // a SQL view is its files' content.
        format!(
            "-- projector sql view, files sha256 {}\n{}",
            self.files_hash, self.ddl
        )
    }
    fn tables(&self) -> Vec<String> {
        self.tables.clone()
    }
    fn apply_sql(&self) -> ApplySql {
        ApplySql {
            ctes: self.ctes.clone(),
            write: self.write.clone(),
        }
    }
    fn read_sql(&self) -> String {
        self.read.clone()
    }
    fn notices_sql(&self) -> Option<String> {
        self.notices.clone()
    }
    fn snapshot_sql(&self) -> Option<String> {
        self.snapshot.clone()
    }
    fn upcasters(&self) -> Vec<Upcaster> {
        self.upcasters.clone()
    }
    fn check_data(&self, event: &crate::event::Event) -> Result<(), crate::event::DecodeError> {
        match self.rules.get(event.event_type.as_str()) {
            Some(compiled) => compiled.check_data(event),
            None => Ok(()),
        }
    }
    fn unknown_version(&self) -> UnknownVersion {
        self.unknown_version
    }
    fn at_version(&self, version: i32) -> Option<Arc<dyn Projection>> {
        (version >= 1).then(|| {
            Arc::new(Self {
                version,
                ..self.clone()
            }) as Arc<dyn Projection>
        })
    }
    fn replaces(&self) -> Vec<String> {
        self.replaces.clone()
    }
}

/// Interns a name for the `&'static str` the [`Projection`] trait hands out: each distinct
/// name is leaked once per process, however often views are loaded.
fn intern(s: &str) -> &'static str {
    static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut names = NAMES
        .get_or_init(|| Mutex::new(HashSet::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(n) = names.get(s) {
        return n;
    }
    let leaked: &'static str = Box::leak(s.to_owned().into_boxed_str());
    names.insert(leaked);
    leaked
}

/// Loads every SQL view of `dir`: each `.sql` file directly in it is one view version, and
/// each subdirectory holding `.sql` files is one view version made of them. Entries are read
/// in name order; other files are ignored. `upcasters` are those the binary has (the
/// compiled views' upcasters): a view that reads a type at version N takes that type's
/// upcasters from them.
pub fn load_dir(dir: &Path, upcasters: &[Upcaster]) -> Result<Vec<SqlView>, SqlViewError> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| SqlViewError::Io { path, source }
    };
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(io(dir))?;
    entries.sort();
    let mut out: Vec<SqlView> = Vec::new();
    for path in entries {
        let view = if path.is_dir() {
            if sql_files(&path)?.is_empty() {
                continue;
            }
            load_path(&path, upcasters)?
        } else if path.extension().is_some_and(|e| e == "sql") {
            load_path(&path, upcasters)?
        } else {
            continue;
        };
        if let Some(other) = out
            .iter()
            .find(|v| v.name == view.name && v.version == view.version)
        {
            return Err(view.at(
                &view.version_line,
                0,
                format!(
                    "{} v{} is declared twice (also in {}); give one of them another version",
                    view.name,
                    view.version,
                    other.file()
                ),
            ));
        }
        out.push(view);
    }
    Ok(out)
}

fn sql_files(dir: &Path) -> Result<Vec<PathBuf>, SqlViewError> {
    let io = |source| SqlViewError::Io {
        path: dir.display().to_string(),
        source,
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(io)?
        .into_iter()
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "sql"))
        .collect();
    files.sort();
    Ok(files)
}

/// Loads one SQL view: a `.sql` file, or a directory whose `.sql` files make one view.
pub fn load_path(path: &Path, upcasters: &[Upcaster]) -> Result<SqlView, SqlViewError> {
    let files = if path.is_dir() {
        sql_files(path)?
    } else {
        vec![path.to_path_buf()]
    };
    let mut texts = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).map_err(|source| SqlViewError::Io {
            path: f.display().to_string(),
            source,
        })?;
        texts.push((f.display().to_string(), text));
    }
    if texts.is_empty() {
        return Err(SqlViewError::At {
            file: path.display().to_string(),
            line: 1,
            message: "no .sql file here; a SQL view is a .sql file or a directory of them"
                .to_owned(),
        });
    }
    parse(&texts, upcasters)
}

/// Parses a view from its files' texts (`(file name, text)`, in order).
pub fn parse(texts: &[(String, String)], upcasters: &[Upcaster]) -> Result<SqlView, SqlViewError> {
    let mut hasher = Sha256::new();
    let mut header: BTreeMap<&'static str, (String, Origin)> = BTreeMap::new();
    let mut sections: BTreeMap<&'static str, (String, Origin)> = BTreeMap::new();
    for (file, text) in texts {
        let text = text.replace("\r\n", "\n");
        hasher.update(format!("{} {}\n", text.len(), file_name(file)).as_bytes());
        hasher.update(text.as_bytes());
        let err = |line: usize, message: String| SqlViewError::At {
            file: file.clone(),
            line,
            message,
        };
        // (section, first line of its body, body lines)
        let mut current: Option<(&'static str, usize, Vec<&str>)> = None;
        let finish =
            |current: Option<(&'static str, usize, Vec<&str>)>,
             sections: &mut BTreeMap<&'static str, (String, Origin)>| {
                if let Some((name, start, lines)) = current {
                    // The body's origin is its first line that is not blank.
                    let skip = lines.iter().take_while(|l| l.trim().is_empty()).count();
                    let body = lines[skip..].join("\n");
                    let body = body.trim_end().trim_end_matches(';').trim_end().to_owned();
                    sections.insert(
                        name,
                        (
                            body,
                            Origin {
                                file: file.clone(),
                                line: start + skip,
                            },
                        ),
                    );
                }
            };
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            let trimmed = line.trim();
            if let Some(rest) = trimmed.strip_prefix("-- name:") {
                let name = rest.trim();
                let Some(section) = SECTIONS.iter().find(|s| **s == name) else {
                    return Err(err(
                        n,
                        format!(
                            "unknown section {name:?}; sections are {}",
                            SECTIONS.join(", ")
                        ),
                    ));
                };
                if let Some((_, o)) = sections.get(section) {
                    return Err(err(
                        n,
                        format!(
                            "section {name:?} appears twice (first at {}:{}); keep one",
                            o.file,
                            o.line.saturating_sub(1).max(1)
                        ),
                    ));
                }
                if current.as_ref().is_some_and(|c| c.0 == *section) {
                    return Err(err(n, format!("section {name:?} appears twice; keep one")));
                }
                finish(current.take(), &mut sections);
                current = Some((section, n + 1, Vec::new()));
                continue;
            }
            if let Some((_, _, lines)) = current.as_mut() {
                lines.push(line);
                continue;
            }
            // The header: blank lines, comments, and `-- key: value`.
            if trimmed.is_empty() {
                continue;
            }
            let Some(comment) = trimmed.strip_prefix("--") else {
                return Err(err(
                    n,
                    "SQL before the first section; start it with a `-- name: <section>` line (sections are ddl, ctes, write, notices, read, snapshot)".to_owned(),
                ));
            };
            let comment = comment.trim();
            let Some((key, value)) = comment.split_once(':') else {
                continue;
            };
            let key = key.trim();
            let is_key = !key.is_empty()
                && key
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit());
            if !is_key {
                continue;
            }
            let Some(known) = KEYS.iter().find(|k| **k == key) else {
                return Err(err(
                    n,
                    format!("unknown header key {key:?}; keys are {}", KEYS.join(", ")),
                ));
            };
            if let Some((_, o)) = header.get(known) {
                return Err(err(
                    n,
                    format!(
                        "header key {key:?} appears twice (first at {}:{}); keep one",
                        o.file, o.line
                    ),
                ));
            }
            header.insert(
                known,
                (
                    value.trim().to_owned(),
                    Origin {
                        file: file.clone(),
                        line: n,
                    },
                ),
            );
        }
        finish(current.take(), &mut sections);
    }
    let first = Origin {
        file: texts[0].0.clone(),
        line: 1,
    };
    let at = |o: &Origin, message: String| SqlViewError::At {
        file: o.file.clone(),
        line: o.line,
        message,
    };
    let required = |key: &str, example: &str| {
        header.get(key).ok_or_else(|| {
            at(
                &first,
                format!(
                    "the header has no `-- {key}:` line; add one, such as `-- {key}: {example}`"
                ),
            )
        })
    };

    let (name, o) = required("view", "cash_by_day")?;
    let valid = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !valid {
        return Err(at(
            o,
            format!("view name {name:?} must be lower-case letters, digits and '_', starting with a letter"),
        ));
    }
    let name = name.clone();
    let view_line = o.clone();

    let (v, version_line) = required("version", "1")?;
    let version = match v.parse::<i32>() {
        Ok(v) if v >= 1 => v,
        _ => {
            return Err(at(
                version_line,
                format!("version {v:?} must be a whole number, 1 or more"),
            ))
        }
    };
    let version_line = version_line.clone();

    let (subs, o) = required("subscribes", "cash_adjusted, fill_executed v2")?;
    let mut subscribes = Vec::new();
    let mut chosen = Vec::new();
    for item in subs.split(',').map(str::trim) {
        let mut words = item.split_whitespace();
        let (Some(ty), reads, None) = (words.next(), words.next(), words.next()) else {
            return Err(at(
                o,
                format!("subscribes: {item:?} is not `<type>` or `<type> v<N>`; list event types separated by commas, such as `cash_adjusted, fill_executed v2`"),
            ));
        };
        let reads = match reads {
            None => 1,
            Some(r) => match r.strip_prefix('v').and_then(|n| n.parse::<i32>().ok()) {
                Some(n) if n >= 1 => n,
                _ => {
                    return Err(at(
                        o,
                        format!("subscribes: {r:?} after {ty} is not a version; write `{ty} v2` to read {ty} at version 2"),
                    ))
                }
            },
        };
        if subscribes.contains(&ty) {
            return Err(at(o, format!("subscribes: {ty} is listed twice")));
        }
        for from in 1..reads {
            let Some(u) = upcasters
                .iter()
                .find(|u| u.event_type() == ty && u.from() == from)
            else {
                return Err(at(
                    o,
                    format!("subscribes: this binary has no upcaster of {ty} from version {from} to {}, so it cannot read {ty} at v{reads}; read an older version", from + 1),
                ));
            };
            chosen.push(u.clone());
        }
        subscribes.push(intern(ty));
    }

    let (f, o) = required("fields", "amount decimal, reason text")?;
    let mut fields = Vec::new();
    let mut seen = HashSet::new();
    for item in f.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let words: Vec<&str> = item.split_whitespace().collect();
        let field = match words.as_slice() {
            ["data"] => Field::Data,
            [n, "text"] => Field::Text(intern(n)),
            [n, "decimal"] => Field::Decimal(intern(n)),
            _ => {
                return Err(at(
                    o,
                    format!("fields: {item:?} is not `<name> text`, `<name> decimal` or `data`"),
                ))
            }
        };
        let col = field.column();
        let ident = col.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            && col
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !ident {
            return Err(at(
                o,
                format!(
                    "fields: {col:?} must be lower-case letters, digits and '_' (a column of ev)"
                ),
            ));
        }
        if ENVELOPE_COLUMNS.contains(&col) || !seen.insert(col) {
            return Err(at(
                o,
                format!(
                    "fields: {col:?} clashes with a column of ev ({}) or is declared twice",
                    ENVELOPE_COLUMNS.join(", ")
                ),
            ));
        }
        fields.push(field);
    }

    let (d, o) = required("dedup", "inbox")?;
    let dedup = match d.as_str() {
        "inbox" => DedupMode::Inbox,
        "version_filter" => DedupMode::VersionFilter,
        "both" => DedupMode::Both,
        _ => {
            return Err(at(
                o,
                format!("dedup {d:?} must be inbox, version_filter or both"),
            ))
        }
    };
    if dedup == DedupMode::VersionFilter {
        // The identifier `seq` anywhere in the statement, outside comments.
        let reads_seq = ["ctes", "write"].iter().any(|s| {
            sections.get(s).is_some_and(|(body, _)| {
                body.lines().any(|l| {
                    l.split("--")
                        .next()
                        .unwrap_or("")
                        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .any(|w| w.eq_ignore_ascii_case("seq"))
                })
            })
        });
        if !reads_seq {
            return Err(at(
                o,
                "dedup version_filter: the statement never reads seq, so it cannot tell an event it applied from a new one (without the inbox, a redelivered event is applied twice); store ev.seq in a version column and write only `WHERE <table>.version < EXCLUDED.version`, or use `dedup: inbox`".to_owned(),
            ));
        }
    }
    let flag = |key: &str| -> Result<bool, SqlViewError> {
        match header.get(key) {
            None => Ok(false),
            Some((v, o)) => match v.as_str() {
                "true" => Ok(true),
                "false" => Ok(false),
                _ => Err(at(o, format!("{key} {v:?} must be true or false"))),
            },
        }
    };
    let order_independent = flag("order_independent")?;
    let many_per_account = flag("many_per_account")?;
    if order_independent && many_per_account {
        let o = &header["many_per_account"].1;
        return Err(at(
            o,
            "many_per_account is for order-dependent views; an order-independent view already takes whole batches: drop one of them".to_owned(),
        ));
    }
    let unknown_version = match header.get("unknown_version") {
        None => UnknownVersion::Park,
        Some((v, o)) => match v.as_str() {
            "park" => UnknownVersion::Park,
            "dead_letter" => UnknownVersion::DeadLetter,
            _ => {
                return Err(at(
                    o,
                    format!("unknown_version {v:?} must be park or dead_letter"),
                ))
            }
        },
    };
    let replaces = match header.get("replaces") {
        None => Vec::new(),
        Some((v, o)) => {
            let list: Vec<String> = v
                .split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect();
            if let Some(bad) = list
                .iter()
                .find(|s| s.len() != 16 || !s.chars().all(|c| c.is_ascii_hexdigit()))
            {
                return Err(at(
                    o,
                    format!("replaces: {bad:?} is not a fingerprint (16 hex digits, as `projector views` and the refusal print them)"),
                ));
            }
            list
        }
    };

    let section = |s: &'static str| sections.get(s).cloned();
    let need = |s: &'static str, what: &str| {
        section(s).ok_or_else(|| {
            at(
                &version_line,
                format!("no `-- name: {s}` section; add one with {what}"),
            )
        })
    };
    let (ddl, ddl_o) = need("ddl", "the CREATE TABLE IF NOT EXISTS statements")?;
    let (write, write_o) = need("write", "the data-modifying statement ending in RETURNING")?;
    let (read, read_o) = need("read", "the SELECT readers see under the view's name")?;
    let mut origins = BTreeMap::new();
    origins.insert("ddl", ddl_o.clone());
    origins.insert("write", write_o.clone());
    origins.insert("read", read_o);
    let mut optional = |s: &'static str| {
        section(s).map(|(body, o)| {
            origins.insert(s, o);
            body
        })
    };
    let ctes = optional("ctes").unwrap_or_default();
    let notices = optional("notices");
    let snapshot = optional("snapshot");
    for (s, (body, o)) in &sections {
        if body.is_empty() {
            return Err(at(
                o,
                format!("section {s:?} is empty; write its SQL or remove the section"),
            ));
        }
    }

    if let Some((verb, offset)) = row_changes_in(&ddl) {
        return Err(SqlViewError::At {
            file: ddl_o.file.clone(),
            line: ddl_o.line + offset,
            message: format!("ddl: {verb} runs at every start (the ddl runs each time migrate or run starts), so it would change the live version's rows each time; the ddl only creates (CREATE ... IF NOT EXISTS), and rows come from events"),
        });
    }
    let created = created_by(&ddl);
    for c in &created {
        let line = ddl_o.line + c.line;
        let problem = match &c.name {
            None => Some("an index without a name is made again, under another name, each time the ddl runs (at every start); name it, with IF NOT EXISTS and `{v}`: `CREATE INDEX IF NOT EXISTS <table>_<column>_v{v} ON ...`".to_owned()),
            Some(n) if c.kind != "table" && !n.contains("{v}") => Some(format!(
                "{} {n:?} has no `{{v}}` in its name, so every version would share it (and one version's ddl would skip or replace another's); name it {n}_v{{v}}",
                c.kind
            )),
            _ => None,
        };
        if let Some(message) = problem {
            return Err(SqlViewError::At {
                file: ddl_o.file.clone(),
                line,
                message,
            });
        }
    }
    let tables: Vec<(String, usize)> = created
        .into_iter()
        .filter(|c| c.kind == "table")
        .filter_map(|c| c.name.map(|n| (n, c.line)))
        .collect();
    if tables.is_empty() {
        return Err(at(
            &ddl_o,
            format!(
                "the ddl creates no table; write `CREATE TABLE IF NOT EXISTS {name}_v{{v}} (...)`"
            ),
        ));
    }
    for (t, offset) in &tables {
        if !t.contains("{v}") {
            return Err(SqlViewError::At {
                file: ddl_o.file.clone(),
                line: ddl_o.line + offset,
                message: format!("table {t:?} has no `{{v}}` in its name, so two versions would share it; name it {t}_v{{v}}"),
            });
        }
    }

    // A table of the view named at a fixed version (`cash_by_day_v1` for `cash_by_day_v{v}`):
    // right at that version, and at any other (a rebuild of the same files into v2) a write
    // into, or a read of, the other version's rows.
    for (s, (body, o)) in &sections {
        for (offset, line) in body.lines().enumerate() {
            let code = line.split("--").next().unwrap_or("");
            for (t, _) in &tables {
                if let Some(found) = fixed_version_of(code, t) {
                    return Err(SqlViewError::At {
                        file: o.file.clone(),
                        line: o.line + offset,
                        message: format!("{s}: {found:?} is the table {t} at a fixed version, so the view at any other version (a rebuild into a new one) would use that version's rows; write {t}"),
                    });
                }
            }
        }
    }

    // `ev.<column>` read but not declared: caught here with its line; other references
    // (a bare column, another alias) fail when the statement is prepared ([`check`]).
    let declared: HashSet<&str> = ENVELOPE_COLUMNS
        .iter()
        .copied()
        .chain(fields.iter().map(|f| f.column()))
        .collect();
    for s in ["ctes", "write", "notices"] {
        let Some((body, o)) = sections.get(s) else {
            continue;
        };
        for (offset, line) in body.lines().enumerate() {
            let code = line.split("--").next().unwrap_or("");
            for col in ev_columns(code) {
                if !declared.contains(col.as_str()) {
                    return Err(SqlViewError::At {
                        file: o.file.clone(),
                        line: o.line + offset,
                        message: format!("ev.{col} is read but {col:?} is not a declared field; add it to the header's `-- fields:` (`{col} decimal` or `{col} text`)"),
                    });
                }
            }
        }
    }

    let digest = hasher.finalize();
    let mut files_hash = String::with_capacity(64);
    for b in digest.iter() {
        let _ = write!(files_hash, "{b:02x}");
    }
    Ok(SqlView {
        name,
        version,
        subscribes,
        fields,
        dedup,
        order_independent,
        many_per_account,
        unknown_version,
        replaces,
        upcasters: chosen,
        rules: BTreeMap::new(),
        tables: tables.into_iter().map(|(t, _)| t).collect(),
        ddl,
        ctes,
        write,
        notices,
        read,
        snapshot,
        files_hash,
        origins,
        version_line,
        view_line,
    })
}

/// The file's name without its directory: the hash follows the files, not where they sit.
fn file_name(path: &str) -> &str {
    path.rsplit(['/', '\\']).next().unwrap_or(path)
}

/// An object the DDL creates: its kind (`table`, `index`, `sequence`, `view`, `function`,
/// `procedure`, `type`), its name (`None`: an index without one) and its line offset.
struct Created {
    kind: &'static str,
    name: Option<String>,
    line: usize,
}

/// The objects `CREATE [OR REPLACE] [UNIQUE | UNLOGGED | TEMP | ...] <kind> [CONCURRENTLY]
/// [IF NOT EXISTS] <name>` statements of `ddl` create, outside comments.
fn created_by(ddl: &str) -> Vec<Created> {
    const KINDS: [&str; 7] = [
        "table",
        "index",
        "sequence",
        "view",
        "function",
        "procedure",
        "type",
    ];
    const MODIFIERS: [&str; 9] = [
        "or",
        "replace",
        "unique",
        "unlogged",
        "temp",
        "temporary",
        "global",
        "local",
        "materialized",
    ];
    let mut out = Vec::new();
    let words: Vec<(usize, &str)> = ddl
        .lines()
        .enumerate()
        .flat_map(|(i, l)| {
            l.split("--")
                .next()
                .unwrap_or("")
                .split_whitespace()
                .map(move |w| (i, w))
        })
        .collect();
    let is = |j: usize, w: &str| words.get(j).is_some_and(|(_, x)| x.eq_ignore_ascii_case(w));
    let mut i = 0;
    while i < words.len() {
        if !is(i, "create") {
            i += 1;
            continue;
        }
        let mut j = i + 1;
        while MODIFIERS.iter().any(|m| is(j, m)) {
            j += 1;
        }
        let Some(kind) = KINDS.iter().find(|k| is(j, k)) else {
            i = j;
            continue;
        };
        j += 1;
        if *kind == "index" && is(j, "concurrently") {
            j += 1;
        }
        if is(j, "if") && is(j + 1, "not") && is(j + 2, "exists") {
            j += 3;
        }
        let Some((line, w)) = words.get(j) else {
            break;
        };
        let name = w.split('(').next().unwrap_or(w).trim_matches('"');
        if *kind == "index" && (name.is_empty() || w.eq_ignore_ascii_case("on")) {
            out.push(Created {
                kind,
                name: None,
                line: *line,
            });
        } else if !name.is_empty() {
            out.push(Created {
                kind,
                name: Some(name.to_owned()),
                line: *line,
            });
        }
        i = j + 1;
    }
    out
}

/// The first statement of `ddl` that changes rows or drops (`DROP`, `TRUNCATE`, `DELETE`,
/// `INSERT`, `UPDATE`, `MERGE`), with its line offset: statements start at the beginning and
/// after each `;` outside comments, strings and dollar-quoted bodies.
fn row_changes_in(ddl: &str) -> Option<(String, usize)> {
    const VERBS: [&str; 6] = ["drop", "truncate", "delete", "insert", "update", "merge"];
    let mut at_start = true;
    let mut quote: Option<String> = None;
    for (offset, line) in ddl.lines().enumerate() {
        let mut rest = line;
        loop {
            if let Some(q) = &quote {
                match rest.find(q.as_str()) {
                    Some(k) => {
                        rest = &rest[k + q.len()..];
                        quote = None;
                    }
                    None => break,
                }
                continue;
            }
            let trimmed = rest.trim_start();
            if trimmed.is_empty() || trimmed.starts_with("--") {
                break;
            }
            if at_start {
                let word: String = trimmed
                    .chars()
                    .take_while(|c| c.is_ascii_alphabetic())
                    .collect();
                if VERBS.iter().any(|v| word.eq_ignore_ascii_case(v)) {
                    return Some((word.to_ascii_uppercase(), offset));
                }
                at_start = false;
            }
            // To the next `;`, quote or comment.
            let Some(k) = trimmed.find([';', '\'', '$', '-']) else {
                break;
            };
            let c = trimmed.as_bytes()[k];
            rest = &trimmed[k + 1..];
            match c {
                b';' => at_start = true,
                b'\'' => quote = Some("'".to_owned()),
                b'$' => {
                    // `$tag$ ... $tag$` (a `$1` parameter has no closing `$`).
                    if let Some(end) = rest.find('$') {
                        let tag = &rest[..end];
                        if tag.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                            quote = Some(format!("${tag}$"));
                            rest = &rest[end + 1..];
                        }
                    }
                }
                _ => {
                    if rest.starts_with('-') {
                        break;
                    }
                }
            }
        }
    }
    None
}

/// The first name in `code` (one line of SQL) that is `table` (a name with `{v}`) with a
/// version number in place of `{v}`.
fn fixed_version_of(code: &str, table: &str) -> Option<String> {
    let (pre, post) = table.split_once("{v}")?;
    let pre = pre.rsplit('.').next().unwrap_or(pre).to_ascii_lowercase();
    let lower = code.to_ascii_lowercase();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let bytes = lower.as_bytes();
    let mut from = 0;
    while let Some(k) = lower[from..].find(&pre) {
        let start = from + k;
        from = start + 1;
        if pre.is_empty() || (start > 0 && ident(bytes[start - 1])) {
            continue;
        }
        let digits = lower[start + pre.len()..]
            .bytes()
            .take_while(u8::is_ascii_digit)
            .count();
        if digits == 0 {
            continue;
        }
        let end = start + pre.len() + digits;
        if !lower[end..].starts_with(&post.to_ascii_lowercase()) {
            continue;
        }
        let end = end + post.len();
        if bytes.get(end).is_some_and(|c| ident(*c)) {
            continue;
        }
        return Some(code[start..end].to_owned());
    }
    None
}

/// The column names read as `ev.<name>` in one line of SQL (outside string literals).
fn ev_columns(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = line.as_bytes();
    let mut in_string = false;
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c == b'\'' {
            in_string = !in_string;
        } else if !in_string
            && line[i..].starts_with("ev.")
            && (i == 0
                || !(bytes[i - 1].is_ascii_alphanumeric()
                    || bytes[i - 1] == b'_'
                    || bytes[i - 1] == b'.'))
        {
            let rest = &line[i + 3..];
            let col: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !col.is_empty() && col != "*" {
                out.push(col.to_ascii_lowercase());
            }
            i += 3;
            continue;
        }
        i += 1;
    }
    out
}

/// Every upcaster the views of `views` read through, each once: what a binary's compiled
/// views offer the SQL views it loads.
pub fn upcasters_of<'a>(views: impl IntoIterator<Item = &'a Arc<dyn Projection>>) -> Vec<Upcaster> {
    let mut out: Vec<Upcaster> = Vec::new();
    for v in views {
        for u in v.upcasters() {
            if !out
                .iter()
                .any(|o| o.event_type() == u.event_type() && o.from() == u.from())
            {
                out.push(u);
            }
        }
    }
    out
}

/// Checks loaded SQL views against a database with the engine's schema, changing nothing:
///
/// - a version registered by other files (its recorded fingerprint is not these files', and
///   they do not declare it in `-- replaces:`) is refused, with the way forward;
/// - in a transaction rolled back at the end, each view's DDL runs, its apply statement (as
///   the engine composes it, with its inbox guard, its `ev` and its notices) and its read
///   statement are prepared. A statement that does not prepare is refused with the line the
///   server points at.
///
/// The snapshot statement reads the write side's tables and is prepared when a rebuild takes
/// it, not here.
pub async fn check(
    client: &mut deadpool_postgres::Client,
    views: &[SqlView],
) -> Result<(), SqlViewError> {
    for view in views {
        let row = crate::versions::recorded_and_dropped(&*client, &view.name, view.version)
            .await
            .map_err(|e| SqlViewError::Database(e.to_string()))?;
        if let Some((recorded, dropped)) = row {
            if let (Some(recorded), false) = (recorded, dropped) {
                if crate::fingerprint::judge(view, Some(&recorded)).is_err() {
                    let ours = crate::fingerprint::of(view);
                    let next = next_version(client, views, &view.name).await?;
                    return Err(view.at(
                        &view.version_line,
                        0,
                        format!(
                            "{} v{} was registered by other files (fingerprint {recorded}; these files' is {ours}): its files changed since. Restore them, or give the changed files a new version (`-- version: {next}`, the v{} files kept beside them until the cutover) and `projector rebuild {} --to-version {next}`",
                            view.name,
                            view.version,
                            view.version,
                            view.name,
                        ),
                    ));
                }
            }
        }
    }
    // A live version with no files of its own, served by older files at its version (a
    // rebuild of unchanged files into it): those files are its code, and an edit of them is
    // an edit of the live version's code. (A version with newer files beside it is the way to
    // a new version: rebuilding needs them loaded, so they are not refused here.)
    let mut names: Vec<&str> = views.iter().map(|v| v.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        let Some(newest) = views
            .iter()
            .filter(|v| v.name == name)
            .max_by_key(|v| v.version)
        else {
            continue;
        };
        let live = crate::versions::live_fingerprint(&*client, name)
            .await
            .map_err(|e| SqlViewError::Database(e.to_string()))?;
        let Some((version, recorded)) = live else {
            continue;
        };
        if version <= newest.version {
            continue;
        }
        let code = newest.with_version(version);
        if let Some(recorded) = recorded {
            if crate::fingerprint::judge(&code, Some(&recorded)).is_err() {
                let ours = crate::fingerprint::of(&code);
                let next = next_version(client, views, name).await?;
                return Err(newest.at(
                    &newest.version_line,
                    0,
                    format!(
                        "{name} v{version} is live with no files of its own, so these files (v{}) are its code, but they are not the files that registered it (fingerprint {recorded}; these files' at v{version} is {ours}): they changed since, or v{version} was built from other files. Restore the files that registered it (a file with `-- version: {version}`), or give the changed files version {next} and `projector rebuild {name} --to-version {next}`",
                        newest.version,
                    ),
                ));
            }
        }
    }
    for view in views {
        let tx = client
            .transaction()
            .await
            .map_err(|e| SqlViewError::Database(e.to_string()))?;
        let result = prepare(&tx, view).await;
        tx.rollback()
            .await
            .map_err(|e| SqlViewError::Database(e.to_string()))?;
        result?;
    }
    Ok(())
}

/// The version a changed view's files can take: above every version registered (dropped
/// ones included) and every version of its files loaded.
async fn next_version(
    client: &deadpool_postgres::Client,
    views: &[SqlView],
    name: &str,
) -> Result<i32, SqlViewError> {
    let registered = crate::versions::highest(client, name)
        .await
        .map_err(|e| SqlViewError::Database(e.to_string()))?;
    let loaded = views
        .iter()
        .filter(|v| v.name == name)
        .map(|v| v.version)
        .max();
    Ok(registered.max(loaded).unwrap_or(0) + 1)
}

async fn prepare(
    tx: &deadpool_postgres::Transaction<'_>,
    view: &SqlView,
) -> Result<(), SqlViewError> {
    let ddl = render(view, &view.ddl);
    if let Err(e) = tx.batch_execute(&ddl).await {
        return Err(located(view, &e, &[("ddl", render(view, &view.ddl))], &ddl));
    }
    // The DDL runs at every start (migrate, run): it must run again over what it made.
    if let Err(e) = tx.batch_execute(&ddl).await {
        return Err(
            match located(view, &e, &[("ddl", render(view, &view.ddl))], &ddl) {
                SqlViewError::At {
                    file,
                    line,
                    message,
                } => SqlViewError::At {
                    file,
                    line,
                    message: format!("{message}, when the ddl runs a second time (it runs at every start); make it idempotent: CREATE TABLE IF NOT EXISTS, CREATE INDEX IF NOT EXISTS"),
                },
                other => other,
            },
        );
    }
    let statement = crate::apply::compose_statement(view);
    if let Err(e) = tx.prepare(&statement).await {
        let mut parts = vec![("write", render(view, &view.write))];
        if !view.ctes.is_empty() {
            // As the statement holds them: without a trailing comma.
            parts.push(("ctes", render(view, view.ctes.trim().trim_end_matches(','))));
        }
        if let Some(n) = &view.notices {
            parts.push(("notices", render(view, n)));
        }
        return Err(located(view, &e, &parts, &statement));
    }
    let read = render(view, &view.read);
    if let Err(e) = tx.prepare(&read).await {
        return Err(located(view, &e, &[("read", read.clone())], &read));
    }
    Ok(())
}

/// A server error on `statement`, pointed at the section (of `parts`, each rendered as it
/// appears in the statement) and line the server's position falls in.
fn located(
    view: &SqlView,
    e: &tokio_postgres::Error,
    parts: &[(&'static str, String)],
    statement: &str,
) -> SqlViewError {
    let Some(db) = e.as_db_error() else {
        return SqlViewError::Database(e.to_string());
    };
    let mut message = db.message().to_owned();
    // A column no relation has, the way an undeclared field of `ev` shows (a column missing
    // from one of the view's own tables says `of relation`).
    let missing = message
        .strip_prefix("column ")
        .and_then(|m| m.strip_suffix(" does not exist"));
    if missing.is_some_and(|m| !m.contains('.') && !m.contains(" of relation ")) {
        message.push_str("; if it is a field of the event's data, declare it in the header's `-- fields:` (`<name> decimal` or `<name> text`) and read it as ev.<name>");
    }
    if let Some(hint) = db.hint() {
        let _ = write!(message, " (hint: {hint})");
    }
    let position = match db.position() {
        Some(tokio_postgres::error::ErrorPosition::Original(p)) => Some(*p as usize),
        _ => None,
    };
    if let Some(p) = position {
        let byte = statement
            .char_indices()
            .nth(p.saturating_sub(1))
            .map_or(statement.len(), |(b, _)| b);
        for (section, text) in parts {
            if let Some(start) = statement.find(text.as_str()) {
                if byte >= start && byte <= start + text.len() {
                    let offset = statement[start..byte].matches('\n').count();
                    return view.at(
                        view.section_origin(section),
                        offset,
                        format!("{section}: {message}"),
                    );
                }
            }
        }
    }
    let section = parts.first().map_or("write", |p| p.0);
    view.at(
        view.section_origin(section),
        0,
        format!("{section}: {message}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "-- Cash per account and day.\n\
-- view: cash_by_day\n\
-- version: 1\n\
-- subscribes: cash_adjusted\n\
-- fields: amount decimal, reason text\n\
-- dedup: inbox\n\
-- order_independent: true\n\
\n\
-- name: ddl\n\
CREATE TABLE IF NOT EXISTS cash_by_day_v{v} (account_id bigint, day date, reason text, total numeric, PRIMARY KEY (account_id, day, reason));\n\
-- name: write\n\
INSERT INTO cash_by_day_v{v} AS c\n\
SELECT account_id, (occurred_at AT TIME ZONE 'UTC')::date, ev.reason, sum(ev.amount) FROM ev GROUP BY 1, 2, 3\n\
ON CONFLICT (account_id, day, reason) DO UPDATE SET total = c.total + EXCLUDED.total\n\
RETURNING 1;\n\
-- name: read\n\
SELECT * FROM cash_by_day_v{v};\n";

    fn parse_one(text: &str) -> Result<SqlView, SqlViewError> {
        parse(
            &[("views/cash_by_day.sql".to_owned(), text.to_owned())],
            &[],
        )
    }

    #[test]
    fn a_good_file_gives_the_view_it_declares() {
        let v = parse_one(GOOD).expect("parses");
        assert_eq!(v.name(), "cash_by_day");
        assert_eq!(v.version(), 1);
        assert_eq!(v.subscribes(), &["cash_adjusted"]);
        assert_eq!(
            v.fields(),
            vec![Field::Decimal("amount"), Field::Text("reason")]
        );
        assert!(v.order_independent());
        assert_eq!(v.tables(), vec!["cash_by_day_v{v}".to_owned()]);
        assert!(v.apply_sql().write.ends_with("RETURNING 1"));
        let v2 = v.at_version(2).expect("any version");
        assert_eq!(v2.version(), 2);
        assert_ne!(
            crate::fingerprint::of(&v),
            crate::fingerprint::of(&*v2),
            "another version"
        );
    }

    #[test]
    fn editing_a_comment_changes_the_fingerprint() {
        let a = parse_one(GOOD).expect("parses");
        let b = parse_one(&GOOD.replace("Cash per account", "Cash by account")).expect("parses");
        assert_ne!(crate::fingerprint::of(&a), crate::fingerprint::of(&b));
        let c = parse_one(GOOD).expect("parses");
        assert_eq!(crate::fingerprint::of(&a), crate::fingerprint::of(&c));
    }

    fn error(text: &str) -> String {
        parse_one(text).expect_err("refused").to_string()
    }

    #[test]
    fn mistakes_are_one_line_with_the_file_and_line() {
        assert_eq!(
            error(&GOOD.replace("-- name: write", "-- name: wirte")),
            "views/cash_by_day.sql:11: unknown section \"wirte\"; sections are ddl, ctes, write, notices, read, snapshot"
        );
        assert_eq!(
            error(&GOOD.replace("-- dedup: inbox", "-- dedup: sometimes")),
            "views/cash_by_day.sql:6: dedup \"sometimes\" must be inbox, version_filter or both"
        );
        assert!(
            error(&GOOD.replace("-- dedup: inbox", "-- dedupe: inbox")).starts_with(
                "views/cash_by_day.sql:6: unknown header key \"dedupe\"; keys are view, version,"
            )
        );
        assert_eq!(
            error(&GOOD.replace("amount decimal, reason text", "amount decimal")),
            "views/cash_by_day.sql:13: ev.reason is read but \"reason\" is not a declared field; add it to the header's `-- fields:` (`reason decimal` or `reason text`)"
        );
        assert_eq!(
            error(&GOOD.replace("-- version: 1\n", "")),
            "views/cash_by_day.sql:1: the header has no `-- version:` line; add one, such as `-- version: 1`"
        );
        assert!(
            error(&GOOD.replace("cash_by_day_v{v} (", "cash_by_day (")).starts_with(
                "views/cash_by_day.sql:10: table \"cash_by_day\" has no `{v}` in its name"
            )
        );
        assert_eq!(
            error(&GOOD.replace("-- version: 1", "-- version: 0")),
            "views/cash_by_day.sql:3: version \"0\" must be a whole number, 1 or more"
        );
        for e in [
            error(&GOOD.replace("-- name: read\n", "")),
            error(&GOOD.replace("order_independent: true", "order_independent: yes")),
        ] {
            assert_eq!(e.lines().count(), 1, "{e}");
        }
    }

    #[test]
    fn a_directory_of_files_is_one_view_and_errors_name_the_file_they_are_in() {
        let root = std::env::temp_dir().join(format!(
            "projector-sql-view-unit-{}-{}",
            std::process::id(),
            line!()
        ));
        let view = root.join("cash_by_day");
        std::fs::create_dir_all(&view).expect("dir");
        let (header, body) = GOOD.split_at(GOOD.find("-- name: ddl").expect("ddl"));
        let (ddl, rest) = body.split_at(body.find("-- name: write").expect("write"));
        std::fs::write(view.join("0_header.sql"), header).expect("write");
        std::fs::write(view.join("1_ddl.sql"), ddl).expect("write");
        std::fs::write(view.join("2_statements.sql"), rest).expect("write");
        std::fs::write(root.join("README.txt"), "not a view").expect("write");
        let views = load_dir(&root, &[]).expect("loads");
        assert_eq!(views.len(), 1);
        assert_eq!(views[0].name(), "cash_by_day");
        assert_eq!(views[0].tables(), vec!["cash_by_day_v{v}".to_owned()]);

        std::fs::write(
            view.join("2_statements.sql"),
            rest.replace("-- name: read", "-- name: reed"),
        )
        .expect("write");
        let e = load_dir(&root, &[]).expect_err("refused").to_string();
        let file = view.join("2_statements.sql").display().to_string();
        assert!(
            e.starts_with(&format!("{file}:6: unknown section \"reed\"")),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_statement_naming_a_table_at_a_fixed_version_is_refused() {
        // Written for v1, `cash_by_day_v1` works; rebuilt into v2 (the same files at
        // another version) it would write into, or read from, the live v1's table.
        let e = error(&GOOD.replace(
            "INSERT INTO cash_by_day_v{v} AS c",
            "INSERT INTO cash_by_day_v1 AS c",
        ));
        assert!(
            e.starts_with("views/cash_by_day.sql:12: write: \"cash_by_day_v1\" is the table cash_by_day_v{v} at a fixed version"),
            "{e}"
        );
        let e = error(&GOOD.replace(
            "SELECT * FROM cash_by_day_v{v};",
            "SELECT * FROM public.cash_by_day_v1;",
        ));
        assert!(e.starts_with("views/cash_by_day.sql:17: read: "), "{e}");
        // Another table whose name merely starts alike is not it.
        parse_one(&GOOD.replace(
            "SELECT * FROM cash_by_day_v{v};",
            "SELECT * FROM cash_by_day_v{v} JOIN cash_by_day_v1_notes USING (account_id);",
        ))
        .expect("another table");
    }

    #[test]
    fn every_table_the_ddl_creates_is_the_views_and_carries_the_version() {
        // An unlogged table is a table: without `{v}` two versions share it, and with it,
        // it is dropped with the version (retire --drop, rebuild --cancel).
        let two = GOOD.replace(
            "-- name: write",
            "CREATE UNLOGGED TABLE IF NOT EXISTS cash_by_day_seen (account_id bigint);\n-- name: write",
        );
        let e = error(&two);
        assert!(
            e.starts_with("views/cash_by_day.sql:11: table \"cash_by_day_seen\" has no `{v}`"),
            "{e}"
        );
        let v =
            parse_one(&two.replace("cash_by_day_seen", "cash_by_day_seen_v{v}")).expect("parses");
        assert_eq!(
            v.tables(),
            vec![
                "cash_by_day_v{v}".to_owned(),
                "cash_by_day_seen_v{v}".to_owned()
            ]
        );
        // A named index, a sequence, a function: one name for every version, so v2's
        // `IF NOT EXISTS` skips it, or its `OR REPLACE` changes v1's under it.
        for (ddl, line) in [
            ("CREATE INDEX IF NOT EXISTS cash_by_day_day ON cash_by_day_v{v} (day);", 11),
            ("CREATE UNIQUE INDEX cash_by_day_day ON cash_by_day_v{v} (day);", 11),
            ("CREATE SEQUENCE IF NOT EXISTS cash_by_day_ids;", 11),
            (
                "CREATE OR REPLACE FUNCTION cash_by_day_f(x numeric) RETURNS numeric\nLANGUAGE sql AS 'SELECT x';",
                11,
            ),
        ] {
            let e = error(&GOOD.replace("-- name: write", &format!("{ddl}\n-- name: write")));
            assert!(
                e.starts_with(&format!("views/cash_by_day.sql:{line}: ")) && e.contains("has no `{v}` in its name"),
                "{ddl}: {e}"
            );
        }
        // An index without a name is made again, under a new name, at every start.
        let e = error(&GOOD.replace(
            "-- name: write",
            "CREATE INDEX ON cash_by_day_v{v} (day);\n-- name: write",
        ));
        assert!(
            e.starts_with("views/cash_by_day.sql:11: an index without a name"),
            "{e}"
        );
        parse_one(&GOOD.replace(
            "-- name: write",
            "CREATE INDEX IF NOT EXISTS cash_by_day_v{v}_day ON cash_by_day_v{v} (day);\n-- name: write",
        ))
        .expect("an index named with the version");
    }

    #[test]
    fn a_version_filter_that_never_reads_seq_is_refused() {
        // Without the inbox, a redelivered event is skipped only by the statement's own
        // filter on the seq it stored: a statement that never reads seq applies it twice.
        let e = error(&GOOD.replace("-- dedup: inbox", "-- dedup: version_filter"));
        assert!(
            e.starts_with(
                "views/cash_by_day.sql:6: dedup version_filter: the statement never reads seq"
            ),
            "{e}"
        );
        let filtered = GOOD
            .replace("-- dedup: inbox", "-- dedup: version_filter")
            .replace("-- order_independent: true\n", "")
            .replace(
                "total numeric, PRIMARY KEY",
                "total numeric, version bigint, PRIMARY KEY",
            )
            .replace(
                "SELECT account_id, (occurred_at AT TIME ZONE 'UTC')::date, ev.reason, sum(ev.amount) FROM ev GROUP BY 1, 2, 3",
                "SELECT account_id, (occurred_at AT TIME ZONE 'UTC')::date, ev.reason, ev.amount, ev.seq FROM ev",
            )
            .replace(
                "SET total = c.total + EXCLUDED.total",
                "SET total = c.total + EXCLUDED.total, version = EXCLUDED.version WHERE c.version < EXCLUDED.version",
            );
        parse_one(&filtered).expect("a statement that filters on seq");
    }

    #[test]
    fn a_ddl_that_changes_rows_at_every_start_is_refused() {
        // The DDL runs at every start: a DROP or TRUNCATE there runs twice without failing
        // and empties the live version's tables each time; an INSERT adds its rows again.
        for (statement, verb) in [
            ("DROP TABLE IF EXISTS cash_by_day_v{v};", "DROP"),
            ("truncate cash_by_day_v{v};", "TRUNCATE"),
            (
                "INSERT INTO cash_by_day_v{v} VALUES (0, '2026-01-01', '', 0);",
                "INSERT",
            ),
            ("DELETE FROM cash_by_day_v{v};", "DELETE"),
            ("UPDATE cash_by_day_v{v} SET total = 0;", "UPDATE"),
        ] {
            let e = error(&GOOD.replace("-- name: write", &format!("{statement}\n-- name: write")));
            assert!(
                e.starts_with(&format!(
                    "views/cash_by_day.sql:11: ddl: {verb} runs at every start"
                )),
                "{statement}: {e}"
            );
        }
        // The words inside a string or a function's body are not statements of the DDL.
        parse_one(&GOOD.replace(
            "-- name: write",
            "COMMENT ON TABLE cash_by_day_v{v} IS 'rows; delete nothing';\nCREATE OR REPLACE FUNCTION cash_by_day_f_v{v}() RETURNS void LANGUAGE sql AS $$ SELECT 1; DELETE FROM cash_by_day_v{v} WHERE false $$;\n-- name: write",
        ))
        .expect("a comment and a function body");
    }

    #[test]
    fn ev_columns_skip_strings_and_other_aliases() {
        assert_eq!(
            ev_columns("SELECT ev.a, prev.b, 'ev.c', ev.d"),
            vec!["a", "d"]
        );
    }
}
