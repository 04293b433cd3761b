//! Logs: text or JSON lines on standard error, filtered by `PROJECTOR_LOG`, and never a
//! secret.
//!
//! Connection strings are never logged on purpose anywhere in the workspace; on top of that,
//! every log line passes through a redacting writer that replaces each known secret (the
//! password of `--database-url`, of a config file's `database_url`, and any `-X` property
//! whose name says password or secret) with `***`, so that a library's trace line cannot
//! leak one either.

use std::io::Write;
use std::sync::RwLock;

use tracing_subscriber::fmt::MakeWriter;

/// `--log-format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object a line, for a log shipper.
    Json,
}

static SECRETS: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Keeps `secret` out of every later log line. Secrets shorter than 4 characters are not
/// redacted: replacing every `a` would make the logs unreadable and protect nothing.
pub fn redact(secret: &str) {
    if secret.len() < 4 {
        return;
    }
    if let Ok(mut secrets) = SECRETS.write() {
        if !secrets.iter().any(|s| s == secret) {
            secrets.push(secret.to_owned());
            // Longest first: a secret that contains another is replaced whole.
            secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        }
    }
}

/// Keeps the password of a PostgreSQL connection string (URL or key=value form) out of the
/// logs, in its written and its percent-decoded form.
pub fn redact_url(url: &str) {
    if let Ok(config) = url.parse::<tokio_postgres::Config>() {
        if let Some(password) = config.get_password() {
            redact(&String::from_utf8_lossy(password));
        }
    }
    // The URL form as written (percent-encoded): user:PASSWORD@
    if let Some(rest) = url.split_once("://").map(|(_, r)| r) {
        if let Some((userinfo, _)) = rest.split_once('@') {
            if let Some((_, password)) = userinfo.split_once(':') {
                redact(password);
            }
        }
    }
}

/// Keeps librdkafka properties that hold secrets out of the logs.
pub fn redact_properties<'a>(properties: impl IntoIterator<Item = (&'a String, &'a String)>) {
    for (key, value) in properties {
        let key = key.to_ascii_lowercase();
        if key.contains("password") || key.contains("secret") || key.contains("jaas") {
            redact(value);
        }
    }
}

/// `text` with every known secret replaced.
pub fn scrub(text: &str) -> String {
    let secrets = SECRETS.read().map(|s| s.clone()).unwrap_or_default();
    let mut out = text.to_owned();
    for s in &secrets {
        if out.contains(s.as_str()) {
            out = out.replace(s.as_str(), "***");
        }
    }
    out
}

/// Installs the subscriber: `PROJECTOR_LOG` filters (default `warn`), `format` shapes.
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PROJECTOR_LOG")
        .unwrap_or_else(|_| "warn".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(RedactingStderr);
    // A program that embeds the command line may have set a subscriber of its own.
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
    };
}

/// Makes a [`Redacting`] writer per log line.
#[derive(Debug, Clone, Copy)]
struct RedactingStderr;

impl<'a> MakeWriter<'a> for RedactingStderr {
    type Writer = Redacting;

    fn make_writer(&'a self) -> Self::Writer {
        Redacting { line: Vec::new() }
    }
}

/// Gathers one formatted line and writes it, scrubbed, when dropped: the formatter writes a
/// line in pieces, and a secret could straddle two of them.
struct Redacting {
    line: Vec<u8>,
}

impl Write for Redacting {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.line.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Redacting {
    fn drop(&mut self) {
        if self.line.is_empty() {
            return;
        }
        let text = scrub(&String::from_utf8_lossy(&self.line));
        let _ = std::io::stderr().lock().write_all(text.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_password_is_scrubbed_in_both_spellings() {
        redact_url("postgres://app:pa%40ss-w0rd-xyz@db:5432/x");
        let line = "connecting to postgres://app:pa%40ss-w0rd-xyz@db with pa@ss-w0rd-xyz";
        let out = scrub(line);
        assert!(!out.contains("w0rd-xyz"), "{out}");
        assert!(out.contains("postgres://app:***@db"), "{out}");
    }

    #[test]
    fn secret_properties_are_scrubbed_and_others_are_not() {
        let props = [
            ("sasl.password".to_owned(), "kafka-secret-123".to_owned()),
            ("client.id".to_owned(), "visible-client".to_owned()),
        ];
        redact_properties(props.iter().map(|(k, v)| (k, v)));
        let out = scrub("sasl kafka-secret-123 as visible-client");
        assert_eq!(out, "sasl *** as visible-client");
    }
}
