//! Running `projector` as a child process. Tests wait on what the process leaves in
//! PostgreSQL (committed offsets, who committed them); its log lines are kept only to show
//! when a test fails.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// A `projector` child process whose stderr lines arrive on a channel.
pub struct Projector {
    child: Child,
    lines: Receiver<String>,
    /// Every line seen so far, for failure messages.
    pub seen: Vec<String>,
}

impl Projector {
    /// Starts `projector <args>` with `PROJECTOR_LOG` set to `log`.
    pub fn spawn<S: AsRef<OsStr>>(args: &[S], log: &str) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_projector"))
            .args(args)
            .env("PROJECTOR_LOG", log)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn projector");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            lines: rx,
            seen: Vec::new(),
        }
    }

    /// Waits for a line for which `matches` holds; panics at the deadline or if the process
    /// exits first.
    pub fn wait_for(
        &mut self,
        what: &str,
        timeout: Duration,
        mut matches: impl FnMut(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if matches(&line) {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!("timed out waiting for {what}; log:\n{}", self.tail())
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("projector exited before {what}; log:\n{}", self.tail())
                }
            }
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the process logged so far (the last lines), for failure messages.
    pub fn log(&mut self) -> String {
        self.drain();
        self.tail()
    }

    /// Lines that arrived so far without waiting.
    pub fn drain(&mut self) -> Vec<String> {
        let new: Vec<String> = self.lines.try_iter().collect();
        self.seen.extend(new.iter().cloned());
        new
    }

    /// Everything the process wrote to stderr so far.
    pub fn log_all(&mut self) -> String {
        self.drain();
        self.seen.join("\n")
    }

    fn tail(&self) -> String {
        let from = self.seen.len().saturating_sub(30);
        self.seen[from..].join("\n")
    }

    /// SIGKILL: no chance to finish anything.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The exit status when the process has exited, without waiting.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.try_wait().expect("try_wait");
        if status.is_some() {
            self.drain();
        }
        status
    }

    /// Sends a signal by name (`TERM`, `INT`, `STOP`, `CONT`).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Waits for the process to exit, at most `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                self.drain();
                return status;
            }
            if Instant::now() > deadline {
                panic!("projector did not exit; log:\n{}", self.tail());
            }
            // The lines channel doubles as the wake-up: output or its end.
            let _ = self
                .lines
                .recv_timeout(Duration::from_millis(50))
                .map(|l| self.seen.push(l));
        }
    }
}

impl Drop for Projector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `projector <args>` to completion and returns (status, stderr).
pub fn run_to_end<S: AsRef<OsStr>>(args: &[S]) -> (ExitStatus, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_projector"))
        .args(args)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .expect("run projector");
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// What a finished `projector` run printed.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// The non-blank lines of standard error.
    pub fn error_lines(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect()
    }
}

/// Runs `projector <args>` to completion and returns its status and both outputs.
pub fn run_output<S: AsRef<OsStr>>(args: &[S]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_projector"))
        .args(args)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .expect("run projector");
    Output {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Polls until `done` holds for what `probe` reads, for the tests that drive processes;
/// panics after [`super::WAIT`] with their logs. The interval is a sampling rate, not a
/// guess at how long anything takes.
pub fn wait_until<T: std::fmt::Debug>(
    what: &str,
    processes: &mut [&mut Projector],
    mut probe: impl FnMut() -> T,
    done: impl Fn(&T) -> bool,
) -> T {
    let deadline = Instant::now() + super::WAIT;
    loop {
        let seen = probe();
        if done(&seen) {
            return seen;
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = processes.iter_mut().map(|p| p.log()).collect();
            panic!(
                "timed out waiting for {what}: last seen {seen:?}; logs:\n{}",
                logs.join("\n---\n")
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// GETs `path` from a process's HTTP endpoint; returns the status code and the body.
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to the endpoint");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    let (head, body) = response.split_once("\r\n\r\n").expect("headers");
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status code");
    (code, body.to_owned())
}
