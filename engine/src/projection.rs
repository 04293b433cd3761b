//! The `Projection` trait every view implements, and the registry of views.
//!
//! A view is data, not code that runs per event: it hands the engine its DDL and one
//! set-based statement, and the engine wraps that statement in the inbox guard. That keeps
//! the dedup check inside the statement for every view, built in or plugin, without relying
//! on each author to remember it.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::event::Event;
pub use crate::field::Field;
use crate::upcast::{Upcaster, Upcasters};

/// How a view drops duplicates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DedupMode {
    /// The `(consumer, event_id)` inbox, inserted by the statement itself.
    Inbox,
    /// Only the view's own `WHERE row.version < EXCLUDED.version` on its upsert. Free, but
    /// correct only with per-account ordering, and only for views that write one row per event.
    VersionFilter,
    /// Both: the inbox guards, the version filter backs it up.
    Both,
}

impl DedupMode {
    /// Whether the engine puts the inbox CTE in front of the view's statement.
    pub fn uses_inbox(self) -> bool {
        matches!(self, DedupMode::Inbox | DedupMode::Both)
    }

    /// Whether the view's upsert carries a version filter.
    pub fn uses_version_filter(self) -> bool {
        matches!(self, DedupMode::VersionFilter | DedupMode::Both)
    }

    /// Lower-case name for listings and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            DedupMode::Inbox => "inbox",
            DedupMode::VersionFilter => "version_filter",
            DedupMode::Both => "inbox+version_filter",
        }
    }
}

/// What the event source promises about order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SourceOrdering {
    /// All events of an account arrive through one partition, in `seq` order, read by one
    /// consumer at a time (Kafka with key = account id). The engine tracks `seq` per account:
    /// duplicates at or below the last applied `seq` are dropped, gaps park the account.
    PerAccount,
    /// No ordering promise. Only order-independent views without a version filter can run;
    /// the inbox alone drops duplicates.
    Unordered,
}

/// What a view does with an event of a type it reads, at a version newer than the one it
/// reads (a producer upgraded before the consumers): it cannot read it, and there is no way
/// down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum UnknownVersion {
    /// The event waits, with its raw bytes, and its account with it: nothing of the account
    /// after it is applied (in an order-independent view, only the event waits). The account
    /// is parked with reason `unknown_version`, and drains as soon as a build of the view that
    /// reads the version runs (it looks at start).
    #[default]
    Park,
    /// The event is dead-lettered (poison) with its raw bytes; in an order-dependent view its
    /// account parks at it, as behind any dead letter. `projector dlq retry` applies it once a
    /// build that reads the version runs.
    DeadLetter,
}

impl UnknownVersion {
    /// Lower-case name for listings.
    pub fn as_str(self) -> &'static str {
        match self {
            UnknownVersion::Park => "park",
            UnknownVersion::DeadLetter => "dead_letter",
        }
    }
}

/// The columns every `ev` has, whatever fields a view declares.
pub const ENVELOPE_COLUMNS: [&str; 6] = [
    "event_id",
    "account_id",
    "seq",
    "type",
    "occurred_at",
    "emit",
];

/// A view's apply statement, in two parts the engine composes into one SQL statement:
///
/// ```sql
/// WITH batch AS (...), fresh AS (INSERT INTO projector.inbox ... RETURNING event_id),
///      ev AS (SELECT batch.* FROM batch JOIN fresh USING (event_id)),
///      <ctes>,
///      written AS (<write>)
/// SELECT (SELECT count(*) FROM ev), (SELECT count(*) FROM written)
/// ```
///
/// `ev` has the columns `event_id text, account_id bigint, seq bigint, type text,
/// occurred_at timestamptz, emit boolean` and one column per [`Field`] the view declares
/// ([`Projection::fields`]), and holds only events that are new to this view version and of
/// a type it subscribes to (`emit`: see [`Projection::notices_sql`]). Unless the view is
/// order-independent or takes many events per account ([`Projection::many_per_account`]),
/// `ev` holds at most one event per account. `{v}` in either part is replaced by the view's
/// version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplySql {
    /// Extra CTEs, comma separated, written after `ev` (may be empty).
    pub ctes: String,
    /// The final statement: a data-modifying one ending in `RETURNING`, or a `SELECT` over
    /// the `RETURNING` rows of data-modifying CTEs. It returns one row per row written; with
    /// a version filter, one row per event applied (one event writes one row, or, with
    /// [`Projection::many_per_account`], one row per event of the runs it wrote), so the
    /// engine counts events the filter dropped as `|ev| - |written|`.
    pub write: String,
}

/// A named read model maintained by the engine: one trait, one registry line.
///
/// Table names in SQL text carry `{v}` for the version (`portfolio_v{v}`), so one
/// implementation can serve several versions and each version owns its own tables.
pub trait Projection: Send + Sync + 'static {
    /// The view's name: lower case letters, digits and `_`, starting with a letter.
    fn name(&self) -> &str;

    /// The schema and logic version. `name` v1 and v2 are independent consumers.
    fn version(&self) -> i32;

    /// Event types this view applies. Other types are ignored (counted, not an error) but
    /// still advance the account's `seq`.
    fn subscribes(&self) -> &[&str];

    /// How duplicates are dropped.
    fn dedup(&self) -> DedupMode;

    /// True when the statement's effect does not depend on the order of events (commutative
    /// sums aggregated with `GROUP BY`): the engine then sends a whole batch in one statement
    /// instead of splitting it into key-disjoint rounds.
    fn order_independent(&self) -> bool {
        false
    }

    /// True when an order-dependent view's statement takes several events of one account
    /// at once and applies them in `seq` order itself (its SQL folds an account's run of
    /// events: sums, the last value by `seq`). The engine then sends a batch in one
    /// statement instead of rounds of one event per account; sequencing stays as it is (gaps
    /// park, nothing after a failed event is applied). The statement must fail wherever
    /// applying the same events one at a time would fail on one of them: after a failure
    /// the engine runs rounds of one event per account, to find that event. With the version
    /// filter, the filter applies to each event of the run (an event at or below the stored
    /// row's version is dropped, the rest are folded), and `write` returns one row per event
    /// applied, not per row written, so that `|ev| - |written|` still counts the events the
    /// filter dropped (portfolio does both). An account with more than
    /// [`RUN_CAP`](crate::apply::RUN_CAP) events in a batch is sent in rounds of that many,
    /// in `seq` order, in the batch's transaction: the statement must fold a run from the
    /// row an earlier round wrote, as it does from any stored row.
    fn many_per_account(&self) -> bool {
        false
    }

    /// The fields of `data` the view reads, each a column of `ev`. The default is the whole
    /// object as `jsonb` (`Field::Data`); declaring typed fields spares PostgreSQL the JSON.
    /// A subscribed event whose field has the wrong JSON type is poison for the view.
    fn fields(&self) -> Vec<Field> {
        vec![Field::Data]
    }

    /// DDL creating the view's tables; must be idempotent (`IF NOT EXISTS`).
    fn ddl(&self) -> String;

    /// The tables this version owns, in the order they should be compared and dropped. The
    /// default reads them off the DDL: every `CREATE TABLE [IF NOT EXISTS] <name>`, in the
    /// order written, `{v}` kept ([`tables_in`]).
    fn tables(&self) -> Vec<String> {
        tables_in(&self.ddl())
    }

    /// The apply statement.
    fn apply_sql(&self) -> ApplySql;

    /// Body of the stable read name: a `SELECT` over this version's tables. The engine
    /// creates `CREATE VIEW <name> AS <read_sql>` for the live version.
    fn read_sql(&self) -> String;

    /// Side effects: a data-modifying statement that inserts notices into `projector.notices`
    /// for a relay to publish, composed after `written` (which it may read, with the
    /// view's CTEs and `ev`) as `notified AS (<notices_sql>)`. It must insert only for events
    /// whose `ev.emit` is true, only from rows the write really created (read them from
    /// `written`'s `RETURNING`, never from the attempt), end in `ON CONFLICT (view_name,
    /// kind, event_id) DO NOTHING RETURNING 1`. The engine sets `emit` only in the live
    /// version, and only past the events the version it replaced had applied: a rebuild
    /// replaying a year of history emits nothing. Supported for order-dependent views (the
    /// hand-over at cutover is per account and `seq`). `None` (the default): no notices.
    fn notices_sql(&self) -> Option<String> {
        None
    }

    /// A query over the write side's authoritative state, for rebuilds from a snapshot.
    fn snapshot_sql(&self) -> Option<String> {
        None
    }

    /// The rules of the `data` of the types this view subscribes to, at the event's
    /// `type_version`: the fields a type must have and their values (a fill's quantity, a
    /// cash movement's reason). An error makes the message poison for this view. The engine
    /// runs it on the event as it came and again once upcast ([`Projection::upcasters`]),
    /// each time before checking that the data can be stored
    /// ([`crate::event::check_storable`]). The engine knows no type's rules: none by default;
    /// the built-in views return `projector_views::events::check_rules(event)`, and a view
    /// that wraps another passes them on.
    fn check_data(&self, _event: &Event) -> Result<(), crate::event::DecodeError> {
        Ok(())
    }

    /// Extra checks on events of the types this view subscribes to, beyond the wire format.
    /// An error makes the message poison for this view. The event is upcast already: its
    /// `data` is at the version the view reads ([`Projection::upcasters`]).
    fn validate(&self, _event: &Event) -> Result<(), Rejected> {
        Ok(())
    }

    /// The upcasters this view reads events through: each turns one type's `data` from
    /// version `n` into `n + 1` ([`Upcaster`]), and per type they chain from version 1
    /// without a gap. The view reads each type at the newest version its upcasters reach, and
    /// at version 1 when it has none (the default: a view written before event versions
    /// existed sees what it always saw, and an event of a newer version is unknown to it).
    /// The engine runs them for every event of a type the view subscribes to, on every path,
    /// before `validate` and the statement. A view that wraps another must pass them on.
    fn upcasters(&self) -> Vec<Upcaster> {
        Vec::new()
    }

    /// What becomes of an event of a subscribed type at a version newer than the one the view
    /// reads: parked (the default) or dead-lettered ([`UnknownVersion`]).
    fn unknown_version(&self) -> UnknownVersion {
        UnknownVersion::Park
    }

    /// The same code at another version, so that `projector rebuild` can build the
    /// registered code into version N (its tables `<name>_v<N>`, its own consumer). `None`
    /// (the default) when the code is tied to its version: then only registered versions
    /// can be built.
    fn at_version(&self, _version: i32) -> Option<Arc<dyn Projection>> {
        None
    }

    /// Fingerprints ([`crate::fingerprint::of`]) of earlier code for this same version whose
    /// results this code keeps (a faster statement, a reformatted DDL): a version registered
    /// by that code goes on running with this one. Code that changes a version's results is
    /// a new version instead. Empty by default.
    fn replaces(&self) -> Vec<String> {
        Vec::new()
    }

    /// The key of everything this version owns: inbox rows, offsets, dead letters.
    fn consumer(&self) -> String {
        format!("{}_v{}", self.name(), self.version())
    }
}

/// Why a view's own checks ([`Projection::validate`]) refuse an event: the message is poison
/// for the view, and the dead letter's error says `rejected by view <consumer>: <this>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Rejected {
    /// A rule of the view, in its own words.
    #[error("{0}")]
    Rule(String),
    /// A field the view read itself (with [`crate::event::exact_decimal`], say) is not what
    /// the wire format allows.
    #[error(transparent)]
    Data(#[from] crate::event::DecodeError),
}

impl Rejected {
    /// A rule of the view, in its own words: `Rejected::rule("symbol XAUUSD is not traded")`.
    pub fn rule(reason: impl Into<String>) -> Self {
        Rejected::Rule(reason.into())
    }
}

/// The tables a DDL text creates: the name after every `CREATE [UNLOGGED | TEMP] TABLE` (and
/// `IF NOT EXISTS`), in the order written, as written (`{v}` kept, a quoted name with its
/// quotes, a schema-qualified name whole), outside `--` and `/* */` comments, string
/// literals and dollar-quoted bodies (a function's `CREATE TABLE` is not run by the DDL).
/// What [`Projection::tables`] returns by default.
pub fn tables_in(ddl: &str) -> Vec<String> {
    let words = ddl_words(ddl);
    let mut tables = Vec::new();
    let is = |w: Option<&String>, k: &str| w.is_some_and(|w| w.eq_ignore_ascii_case(k));
    let mut i = 0;
    while i < words.len() {
        // `CREATE [UNLOGGED | TEMP | TEMPORARY | GLOBAL TEMP | LOCAL TEMP ...] TABLE`.
        let mut kind = i + 1;
        while is(words.get(i), "create")
            && ["unlogged", "temp", "temporary", "global", "local"]
                .iter()
                .any(|k| is(words.get(kind), k))
        {
            kind += 1;
        }
        if is(words.get(i), "create") && is(words.get(kind), "table") {
            let mut at = kind + 1;
            if is(words.get(at), "if")
                && is(words.get(at + 1), "not")
                && is(words.get(at + 2), "exists")
            {
                at += 3;
            }
            if let Some(name) = words.get(at) {
                tables.push(name.clone());
            }
            i = at;
        }
        i += 1;
    }
    tables
}

/// The index names a DDL text gives: the name after every `CREATE [UNIQUE] INDEX
/// [CONCURRENTLY] [IF NOT EXISTS]`, read as [`tables_in`] reads tables. An index without a
/// name (`CREATE INDEX ON t (a)`) is named by PostgreSQL after its table, and is not listed.
pub fn indexes_in(ddl: &str) -> Vec<String> {
    let words = ddl_words(ddl);
    let is = |w: Option<&String>, k: &str| w.is_some_and(|w| w.eq_ignore_ascii_case(k));
    let mut indexes = Vec::new();
    for i in 0..words.len() {
        if !is(words.get(i), "create") {
            continue;
        }
        let mut at = i + 1;
        if is(words.get(at), "unique") {
            at += 1;
        }
        if !is(words.get(at), "index") {
            continue;
        }
        at += 1;
        if is(words.get(at), "concurrently") {
            at += 1;
        }
        if is(words.get(at), "if")
            && is(words.get(at + 1), "not")
            && is(words.get(at + 2), "exists")
        {
            at += 3;
        }
        if let Some(name) = words.get(at).filter(|w| !w.eq_ignore_ascii_case("on")) {
            indexes.push(name.clone());
        }
    }
    indexes
}

/// The words of a DDL text, outside comments, string literals and dollar-quoted bodies; a
/// quoted identifier is one word, quotes kept.
fn ddl_words(ddl: &str) -> Vec<String> {
    let mut words: Vec<String> = Vec::new();
    let mut word = String::new();
    let mut chars = ddl.chars().peekable();
    let end_word = |word: &mut String, words: &mut Vec<String>| {
        if !word.is_empty() {
            words.push(std::mem::take(word));
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '-' if chars.peek() == Some(&'-') => {
                end_word(&mut word, &mut words);
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                end_word(&mut word, &mut words);
                chars.next();
                let mut last = ' ';
                for c in chars.by_ref() {
                    if last == '*' && c == '/' {
                        break;
                    }
                    last = c;
                }
            }
            '\'' => {
                end_word(&mut word, &mut words);
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                }
            }
            // A quoted identifier is part of the word, spaces and all (`""` is a quote).
            '"' => {
                word.push('"');
                while let Some(c) = chars.next() {
                    word.push(c);
                    if c == '"' {
                        if chars.peek() == Some(&'"') {
                            chars.next();
                            word.push('"');
                        } else {
                            break;
                        }
                    }
                }
            }
            // A dollar-quoted string (`$$...$$`, `$body$...$body$`): a function's body,
            // which running the DDL does not run. `$` inside a word (`a$1`) is no quote.
            '$' if word.is_empty() => {
                let mut tag = String::from("$");
                let mut closed = false;
                while let Some(&c) = chars.peek() {
                    if c == '$' {
                        chars.next();
                        tag.push('$');
                        closed = true;
                        break;
                    }
                    if c.is_alphanumeric() || c == '_' {
                        chars.next();
                        tag.push(c);
                    } else {
                        break;
                    }
                }
                if closed {
                    let mut body = String::new();
                    for c in chars.by_ref() {
                        body.push(c);
                        if body.ends_with(tag.as_str()) {
                            break;
                        }
                    }
                } else {
                    word.push_str(&tag);
                }
            }
            c if c.is_whitespace() || c == '(' || c == ';' || c == ',' || c == ')' => {
                end_word(&mut word, &mut words);
            }
            c => word.push(c),
        }
    }
    end_word(&mut word, &mut words);
    words
}

/// A view's SQL file: statements under `-- name: <name>` headers ([`named_sql`]), compiled
/// into the binary with `include_str!`:
///
/// ```
/// use projector_engine::SqlFile;
///
/// const SQL: SqlFile = SqlFile::new(
///     "cash_balance.sql",
///     "-- name: ddl\nCREATE TABLE IF NOT EXISTS cash_balance_v{v} (account_id bigint);\n",
/// );
/// assert_eq!(SQL.section("ddl"), "CREATE TABLE IF NOT EXISTS cash_balance_v{v} (account_id bigint)");
/// assert_eq!(SQL.get("read"), None);
/// ```
///
/// In a view's module: `const SQL: SqlFile = SqlFile::new("src/cash_balance.sql",
/// include_str!("cash_balance.sql"));`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqlFile {
    /// The file's path, for the message of a missing section.
    path: &'static str,
    text: &'static str,
}

impl SqlFile {
    /// The file at `path` (named in messages only) whose text is `text`.
    pub const fn new(path: &'static str, text: &'static str) -> Self {
        Self { path, text }
    }

    /// The file's path, as given.
    pub fn path(&self) -> &'static str {
        self.path
    }

    /// The statement under `-- name: <name>`, when there is one.
    pub fn get(&self, name: &str) -> Option<&'static str> {
        named_sql(self.text, name)
    }

    /// The statement under `-- name: <name>` without the comment lines that open its
    /// section, found at compile time: for a `const` of a statement the engine sends often (the
    /// hot path's, `queries.rs`), whose why stays in the file and off the wire. A missing or
    /// empty section fails the build (the constant's definition names it).
    pub const fn statement(&self, name: &str) -> &'static str {
        let t = self.text.as_bytes();
        let name = name.as_bytes();
        // 0: looking for the header; 1: in the comments that open the section; 2: in the body.
        let mut state = 0;
        let (mut start, mut end) = (0, t.len());
        let mut at = 0;
        while at < t.len() {
            let eol = line_end(t, at);
            let (a, b) = trimmed(t, at, eol);
            let header = has_prefix(t, a, b, b"-- name:");
            let next = if eol < t.len() { eol + 1 } else { eol };
            if state == 0 {
                if header && b - a == 9 + name.len() && has_prefix(t, a + 9, b, name) {
                    state = 1;
                    start = next;
                }
            } else if header {
                end = at;
                break;
            } else if state == 1 {
                if a == b || has_prefix(t, a, b, b"--") {
                    start = next;
                } else {
                    state = 2;
                }
            }
            at = next;
        }
        if state != 2 {
            panic!("an SQL file has no statement under a `-- name:` section a constant names");
        }
        let (a, mut b) = trimmed(t, start, end);
        while b > a && t[b - 1] == b';' {
            b -= 1;
        }
        let (a, b) = trimmed(t, a, b);
        let (_, rest) = t.split_at(a);
        let (body, _) = rest.split_at(b - a);
        match core::str::from_utf8(body) {
            Ok(body) => body,
            Err(_) => panic!("a statement is cut inside a character"),
        }
    }

    /// The statement under `-- name: <name>`.
    ///
    /// The text is compiled in, so a missing section is a defect of the build, not of its
    /// input: test that every section a view uses is there (reading each once is enough).
    /// Panicking names the file and the section, which an empty statement (the silent
    /// alternative) would not: empty DDL "succeeds" and creates nothing.
    pub fn section(&self, name: &str) -> &'static str {
        self.get(name)
            .unwrap_or_else(|| panic!("{} has no `-- name: {name}` section", self.path))
    }
}

/// Where the line starting at `at` ends (its `\n`, or the end of the text).
const fn line_end(t: &[u8], mut at: usize) -> usize {
    while at < t.len() && t[at] != b'\n' {
        at += 1;
    }
    at
}

/// `a..b` without the ASCII whitespace at either end.
const fn trimmed(t: &[u8], mut a: usize, mut b: usize) -> (usize, usize) {
    while a < b && t[a].is_ascii_whitespace() {
        a += 1;
    }
    while b > a && t[b - 1].is_ascii_whitespace() {
        b -= 1;
    }
    (a, b)
}

/// Whether `t[a..b]` starts with `prefix`.
const fn has_prefix(t: &[u8], a: usize, b: usize, prefix: &[u8]) -> bool {
    if b - a < prefix.len() {
        return false;
    }
    let mut i = 0;
    while i < prefix.len() {
        if t[a + i] != prefix[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Replaces `{v}` with the version in a view's SQL text.
pub fn render(projection: &dyn Projection, sql: &str) -> String {
    sql.replace("{v}", &projection.version().to_string())
}

/// Extracts the statement named `name` from SQL text with `-- name: <name>` headers, the
/// convention view SQL files follow so that every statement a view runs is in one file.
pub fn named_sql<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let header = format!("-- name: {name}");
    let mut offset = 0;
    let mut start = None;
    let mut end = text.len();
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim();
        match start {
            None if trimmed == header => start = Some(offset + line.len()),
            Some(_) if trimmed.starts_with("-- name:") => {
                end = offset;
                break;
            }
            _ => {}
        }
        offset += line.len();
    }
    let body = text[start?..end].trim().trim_end_matches(';').trim_end();
    (!body.is_empty()).then_some(body)
}

/// Why a view cannot be registered or run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ViewError {
    /// The name is not a valid SQL identifier part.
    #[error("view name {0:?} must be lower-case letters, digits and '_', starting with a letter")]
    BadName(String),
    /// Versions start at 1.
    #[error("view {name}: version {version} must be 1 or more")]
    BadVersion {
        /// The view.
        name: String,
        /// The version given.
        version: i32,
    },
    /// The same name and version twice.
    #[error("view {0} is registered twice")]
    Duplicate(String),
    /// Subscribes to nothing.
    #[error("view {0} subscribes to no event type")]
    NoSubscriptions(String),
    /// A table of the view's whose name has no `{v}`: every version of the view would own
    /// it, so a rebuild into the next version writes into the rows the live one serves, and
    /// dropping a retired version drops the table the live one reads.
    #[error("view {consumer}: table {table} has no `{{v}}` in its name, so every version would share it; name it {table}_v{{v}}")]
    SharedTable {
        /// The view version.
        consumer: String,
        /// The table, as its DDL (or `Projection::tables`) names it.
        table: String,
    },
    /// An index the view's DDL names without `{v}`: the first version's table takes the
    /// name, and `CREATE INDEX IF NOT EXISTS` gives the next version none (a rebuild into it
    /// without its unique index fails its `ON CONFLICT` on every batch).
    #[error("view {consumer}: index {index} has no `{{v}}` in its name, so only the first version would get it; name it {index}_v{{v}}")]
    SharedIndex {
        /// The view version.
        consumer: String,
        /// The index, as the DDL names it.
        index: String,
    },
    /// A table another view's versions own: both would write into it, and dropping a
    /// retired version of one drops the table the other serves.
    #[error(
        "view {consumer}: table {table} is view {owner}'s; name the tables of each view after it"
    )]
    TableOfAnotherView {
        /// The view version being registered.
        consumer: String,
        /// The table, as written (`{v}` kept).
        table: String,
        /// The registered view that owns it.
        owner: String,
    },
    /// A version filter without per-account ordering would drop late events as stale.
    #[error("view {0} asks for the version filter, but the source does not declare per-account ordering; use DedupMode::Inbox or an ordered source")]
    VersionFilterNeedsOrdering(String),
    /// A declared field is named like a column every `ev` has, or declared twice.
    #[error("view {0}: field {1:?} clashes with a column of ev; rename it")]
    BadField(String, String),
    /// An order-dependent fold over unordered events gives wrong rows.
    #[error("view {0} depends on event order, but the source does not declare per-account ordering; only order-independent views can read an unordered source")]
    OrderNeedsOrdering(String),
    /// The view's upcasters do not chain ([`crate::upcast::ChainError`]).
    #[error("view {0}: {1}")]
    Upcasters(String, crate::upcast::ChainError),
    /// No view of that name.
    #[error("no view named {0:?}; registered views: {1}")]
    Unknown(String, String),
    /// The view's code cannot be built into a version that is not registered.
    #[error("view {name} cannot build version {version}: its code is tied to version(s) {registered}; register version {version}, or implement Projection::at_version")]
    NoCodeForVersion {
        /// The view.
        name: String,
        /// The version asked for.
        version: i32,
        /// The registered versions.
        registered: String,
    },
}

/// Checks that a view can run against a source with the given ordering.
pub fn check_compatible(
    projection: &dyn Projection,
    ordering: SourceOrdering,
) -> Result<(), ViewError> {
    let mut seen = std::collections::HashSet::new();
    for f in projection.fields() {
        if ENVELOPE_COLUMNS.contains(&f.column()) || !seen.insert(f.column()) {
            return Err(ViewError::BadField(
                projection.consumer(),
                f.column().to_owned(),
            ));
        }
    }
    Upcasters::new(projection.upcasters())
        .map_err(|e| ViewError::Upcasters(projection.consumer(), e))?;
    if ordering == SourceOrdering::Unordered {
        if projection.dedup().uses_version_filter() {
            return Err(ViewError::VersionFilterNeedsOrdering(projection.consumer()));
        }
        if !projection.order_independent() {
            return Err(ViewError::OrderNeedsOrdering(projection.consumer()));
        }
    }
    Ok(())
}

/// The views compiled into this binary. Adding a view is one `register` line.
#[derive(Default, Clone)]
pub struct Registry {
    views: Vec<Arc<dyn Projection>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.views.iter().map(|v| v.consumer()))
            .finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a view version; refuses bad names, duplicates and views that subscribe to nothing.
    pub fn register(mut self, projection: impl Projection) -> Result<Self, ViewError> {
        self.add(Arc::new(projection))?;
        Ok(self)
    }

    /// Adds an already shared view version.
    pub fn add(&mut self, projection: Arc<dyn Projection>) -> Result<(), ViewError> {
        let name = projection.name();
        let valid = name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !valid {
            return Err(ViewError::BadName(name.to_owned()));
        }
        if projection.version() < 1 {
            return Err(ViewError::BadVersion {
                name: name.to_owned(),
                version: projection.version(),
            });
        }
        if projection.subscribes().is_empty() {
            return Err(ViewError::NoSubscriptions(projection.consumer()));
        }
        Upcasters::new(projection.upcasters())
            .map_err(|e| ViewError::Upcasters(projection.consumer(), e))?;
        let tables = projection.tables();
        if let Some(table) = tables.iter().find(|t| !t.contains("{v}")) {
            return Err(ViewError::SharedTable {
                consumer: projection.consumer(),
                table: table.clone(),
            });
        }
        if let Some(index) = indexes_in(&projection.ddl())
            .into_iter()
            .find(|i| !i.contains("{v}"))
        {
            return Err(ViewError::SharedIndex {
                consumer: projection.consumer(),
                index,
            });
        }
        for other in self.views.iter().filter(|v| v.name() != name) {
            let theirs = other.tables();
            if let Some(table) = tables.iter().find(|t| theirs.contains(t)) {
                return Err(ViewError::TableOfAnotherView {
                    consumer: projection.consumer(),
                    table: table.clone(),
                    owner: other.name().to_owned(),
                });
            }
        }
        if self
            .views
            .iter()
            .any(|v| v.consumer() == projection.consumer())
        {
            return Err(ViewError::Duplicate(projection.consumer()));
        }
        self.views.push(projection);
        Ok(())
    }

    /// Every registered view version, in registration order.
    pub fn all(&self) -> &[Arc<dyn Projection>] {
        &self.views
    }

    /// The distinct view names.
    pub fn names(&self) -> BTreeSet<String> {
        self.views.iter().map(|v| v.name().to_owned()).collect()
    }

    /// The code for version `version` of view `name`: the registered version if there is
    /// one, else the newest registered version's code at that version
    /// ([`Projection::at_version`]).
    pub fn code_for(&self, name: &str, version: i32) -> Result<Arc<dyn Projection>, ViewError> {
        let versions: Vec<&Arc<dyn Projection>> =
            self.views.iter().filter(|v| v.name() == name).collect();
        if let Some(v) = versions.iter().find(|v| v.version() == version) {
            return Ok(Arc::clone(v));
        }
        let Some(newest) = versions.iter().max_by_key(|v| v.version()) else {
            let list = self.names().into_iter().collect::<Vec<_>>().join(", ");
            return Err(ViewError::Unknown(name.to_owned(), list));
        };
        newest
            .at_version(version)
            .filter(|v| v.version() == version && v.name() == name)
            .ok_or_else(|| ViewError::NoCodeForVersion {
                name: name.to_owned(),
                version,
                registered: versions
                    .iter()
                    .map(|v| v.version().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// The registered versions of the named views (all when `names` is empty).
    pub fn select(&self, names: &[String]) -> Result<Vec<Arc<dyn Projection>>, ViewError> {
        if names.is_empty() {
            return Ok(self.views.clone());
        }
        let known = self.names();
        let mut out = Vec::new();
        for name in names {
            if !known.contains(name) {
                let list = known.iter().cloned().collect::<Vec<_>>().join(", ");
                return Err(ViewError::Unknown(name.clone(), list));
            }
            out.extend(self.views.iter().filter(|v| v.name() == name).cloned());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_sql_finds_sections() {
        let text = "-- name: ddl\nCREATE TABLE a ();\n\n-- name: write\n-- comment\nINSERT INTO a\nSELECT 1;\n";
        assert_eq!(named_sql(text, "ddl"), Some("CREATE TABLE a ()"));
        assert_eq!(
            named_sql(text, "write"),
            Some("-- comment\nINSERT INTO a\nSELECT 1")
        );
        assert_eq!(named_sql(text, "missing"), None);
    }

    #[test]
    fn a_statement_is_its_section_without_the_comments_that_open_it() {
        const SQL: SqlFile = SqlFile::new(
            "t.sql",
            "-- file\n\n-- name: ddl\nCREATE TABLE a ();\n\n-- name: write\n-- why\n--\n-- more\n\nINSERT INTO a\n  SELECT 1; \n\n-- name: last\n-- x\nSELECT 'é'",
        );
        const DDL: &str = SQL.statement("ddl");
        const WRITE: &str = SQL.statement("write");
        assert_eq!(DDL, "CREATE TABLE a ()");
        assert_eq!(WRITE, "INSERT INTO a\n  SELECT 1");
        assert_eq!(SQL.statement("last"), "SELECT 'é'");
        assert_eq!(
            SQL.section("write"),
            "-- why\n--\n-- more\n\nINSERT INTO a\n  SELECT 1"
        );
    }

    #[test]
    #[should_panic]
    fn a_missing_statement_panics() {
        SqlFile::new("t.sql", "-- name: a\n-- only a comment\n").statement("a");
    }

    #[test]
    fn tables_are_read_off_the_ddl() {
        let ddl = "-- CREATE TABLE not_this (a int);
CREATE TABLE IF NOT EXISTS risk_positions_v{v} (
    account_id bigint NOT NULL, -- create table nor_this
    note text DEFAULT 'CREATE TABLE nor_that'
);
/* CREATE TABLE nor_these */
CREATE INDEX IF NOT EXISTS risk_idx_v{v} ON risk_positions_v{v} (account_id);
create table if not exists risk_v{v}(account_id bigint PRIMARY KEY);
CREATE TABLE plain_v{v} (a int)";
        assert_eq!(
            tables_in(ddl),
            ["risk_positions_v{v}", "risk_v{v}", "plain_v{v}"]
        );
        assert!(tables_in("CREATE INDEX i ON t (a)").is_empty());
    }

    #[test]
    fn an_unlogged_table_is_a_table_of_the_view() {
        // Missed, it would not be dropped with its version (`retire --drop`, `rebuild
        // --cancel`), and a rebuild into that version again would add onto its rows.
        assert_eq!(
            tables_in(
                "CREATE TABLE IF NOT EXISTS a_v{v} (x int);\n\
                 CREATE UNLOGGED TABLE IF NOT EXISTS b_v{v} (x int);\n\
                 create unlogged table c_v{v} (x int)"
            ),
            ["a_v{v}", "b_v{v}", "c_v{v}"]
        );
    }

    /// A table the default `tables()` misses is left behind by `retire --drop` (and a
    /// rebuild into the same version number starts from its rows) and never compared by
    /// `verify`; a name read wrong drops nothing, or the wrong table.
    #[test]
    fn tables_are_read_off_the_ddl_whatever_the_create_says_before_table() {
        let ddl = "CREATE UNLOGGED TABLE IF NOT EXISTS fast_v{v} (a int);
create unlogged table slow_v{v} (a int);
CREATE TABLE IF NOT EXISTS \"Cash Book_v{v}\" (a int);
CREATE TABLE IF NOT EXISTS \"odd(\"\"name\"\"\"_v{v} (a int);
CREATE TABLE IF NOT EXISTS public.qualified_v{v}(a int);";
        assert_eq!(
            tables_in(ddl),
            [
                "fast_v{v}",
                "slow_v{v}",
                "\"Cash Book_v{v}\"",
                "\"odd(\"\"name\"\"\"_v{v}",
                "public.qualified_v{v}",
            ]
        );
    }

    /// A function's body (dollar-quoted) is not run by the DDL: a `CREATE TABLE` in it is no
    /// table of the view's, and `retire --drop` must not drop what it names (a shared
    /// table the function writes, say).
    #[test]
    fn a_create_table_in_a_function_body_is_no_table_of_the_view() {
        let ddl = "CREATE TABLE IF NOT EXISTS audited_v{v} (a int);
CREATE OR REPLACE FUNCTION audit_v{v}() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
  CREATE TABLE IF NOT EXISTS audit_log (a int);
  RETURN NEW;
END $body$;
CREATE OR REPLACE FUNCTION nothing_v{v}() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$;
CREATE TABLE IF NOT EXISTS after_v{v} (a int);";
        assert_eq!(tables_in(ddl), ["audited_v{v}", "after_v{v}"]);
    }
}
