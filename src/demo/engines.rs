//! The demo's engine processes: `projector run`, this very binary (so a binary with views of
//! its own demonstrates its own views), as real child processes against the dev broker.

use std::collections::VecDeque;
use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;

/// Lines of a child's standard error kept to explain a failure.
const KEPT_LINES: usize = 20;

/// One `projector run` process. Dropping it kills the process if it still runs.
pub struct Engine {
    /// `A` or `B`, as the story calls it.
    pub label: &'static str,
    pid: u32,
    /// `None` once the process was waited for.
    child: Option<Child>,
    log: Arc<Mutex<VecDeque<String>>>,
}

impl Engine {
    /// Starts `projector run` on every view of the registry, against `brokers`/`topic`, with
    /// the database in the environment (not on the command line, where `ps` shows it).
    pub fn spawn(
        label: &'static str,
        brokers: &str,
        topic: &str,
        database_url: &str,
    ) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("cannot find this program to start engines")?;
        let mut command = Command::new(exe);
        command
            .args([
                "run",
                "--brokers",
                brokers,
                "--topic",
                topic,
                "--no-migrate",
                "--metrics-addr",
                "off",
                "--pool-size",
                "6",
                "--max-batch-messages",
                "500",
                // The dev broker's group coordinator accepts sessions from 3 s: a killed
                // process's partitions move to the survivor 3 s after its last heartbeat.
                "-X",
                "session.timeout.ms=3000",
                "-X",
                "heartbeat.interval.ms=300",
            ])
            // What the dev broker needs beyond the engine's real-broker defaults.
            .args(
                projector_devkit::devbroker::CONSUMER_PROPERTIES
                    .iter()
                    .flat_map(|(k, v)| ["-X".to_owned(), format!("{k}={v}")]),
            )
            .env("DATABASE_URL", database_url)
            .env("PROJECTOR_LOG", "warn")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        {
            use std::os::unix::process::CommandExt as _;
            // Its own process group: Ctrl-C reaches the demo, which stops its engines itself.
            command.process_group(0);
        }
        let mut child = command
            .spawn()
            .context("cannot start an engine process (projector run)")?;
        let log = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(stderr) = child.stderr.take() {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    if let Ok(mut kept) = log.lock() {
                        if kept.len() == KEPT_LINES {
                            kept.pop_front();
                        }
                        kept.push_back(line);
                    }
                }
            });
        }
        Ok(Self {
            label,
            pid: child.id(),
            child: Some(child),
            log,
        })
    }

    /// The process id; the engine commits offsets as `<host>:<pid>`.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether `committed_by` (of `projector.offsets`) names this process.
    pub fn committed(&self, committed_by: &str) -> bool {
        committed_by
            .rsplit_once(':')
            .is_some_and(|(_, pid)| pid == self.pid().to_string())
    }

    /// SIGKILL: the process gets no chance to finish a batch.
    pub fn kill(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            child
                .kill()
                .with_context(|| format!("cannot kill engine {}", self.label))?;
            let _ = child.wait();
        }
        Ok(())
    }

    /// SIGTERM, then waits for the exit: in-flight batches commit or roll back.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .context("cannot signal an engine process")?;
        anyhow::ensure!(status.success(), "cannot signal engine {}", self.label);
        let label = self.label;
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let waiting = tokio::task::spawn_blocking(move || {
            let status = child.wait();
            (child, status)
        });
        let exited =
            match tokio::time::timeout(std::time::Duration::from_secs(30), waiting).await {
                Ok(joined) => joined.context("the task waiting for an engine panicked")?.1,
                Err(_) => {
                    // The waiting thread holds the child; kill it by pid, which it then reaps.
                    let _ = Command::new("kill")
                        .args(["-KILL", &self.pid().to_string()])
                        .status();
                    anyhow::bail!("engine {label} did not stop within 30 s of SIGTERM; killed");
                }
            }
            .with_context(|| format!("cannot wait for engine {label}"))?;
        anyhow::ensure!(
            exited.success(),
            "engine {label} exited with {exited}: {}",
            self.last_lines()
        );
        Ok(())
    }

    /// An error when the process has exited on its own.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        let Some(child) = &mut self.child else {
            anyhow::bail!("engine {} was stopped", self.label);
        };
        match child.try_wait()? {
            None => Ok(()),
            Some(status) => anyhow::bail!(
                "engine {} (pid {}) exited with {status}: {}",
                self.label,
                self.pid(),
                self.last_lines()
            ),
        }
    }

    fn last_lines(&self) -> String {
        self.log
            .lock()
            .map(|l| l.iter().cloned().collect::<Vec<_>>().join(" / "))
            .unwrap_or_default()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
