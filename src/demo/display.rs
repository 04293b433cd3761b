//! The demo's progress: on a terminal, a live bar over the load's duration with the figures
//! that move; elsewhere (a CI log, a pipe), a plain line every five seconds. Story lines
//! ("engine B joins") print above the bar, or as plain lines, with the time they happened.

use std::io::IsTerminal as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// Plain progress lines this often when standard error is not a terminal.
const PLAIN_EVERY: Duration = Duration::from_secs(5);

pub struct Display {
    started: Instant,
    bar: Option<ProgressBar>,
    last_plain: Mutex<Option<Instant>>,
}

impl Display {
    /// A display whose bar spans `load` (the clients' duration).
    pub fn new(load: Duration) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(load.as_secs().max(1));
            bar.set_style(
                ProgressStyle::with_template("{prefix:>7} [{bar:24}] {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Self {
            started: Instant::now(),
            bar,
            last_plain: Mutex::new(None),
        }
    }

    /// Time since the demo started.
    pub fn wall(&self) -> Duration {
        self.started.elapsed()
    }

    /// Time since the demo started, as `12.3s`.
    pub fn elapsed(&self) -> String {
        seconds(self.started.elapsed())
    }

    /// A step of the story, with its time.
    pub fn say(&self, line: &str) {
        let line = format!("{:>7}  {line}", self.elapsed());
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }

    /// The figures of the moment; `done` is the seconds of load so far.
    pub fn figures(&self, done: u64, line: &str) {
        match &self.bar {
            Some(bar) => {
                bar.set_prefix(self.elapsed());
                bar.set_position(done);
                bar.set_message(line.to_owned());
            }
            None => {
                let Ok(mut last) = self.last_plain.lock() else {
                    return;
                };
                if last.is_none_or(|t| t.elapsed() >= PLAIN_EVERY) {
                    *last = Some(Instant::now());
                    eprintln!("{:>7}  {line}", self.elapsed());
                }
            }
        }
    }

    /// Removes the bar before the report.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// A duration as seconds with one decimal, without floating point.
pub fn seconds(d: Duration) -> String {
    let ms = d.as_millis();
    format!("{}.{}s", ms / 1000, ms % 1000 / 100)
}
