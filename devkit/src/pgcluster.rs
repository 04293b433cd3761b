//! A throwaway PostgreSQL cluster for the demo, and for tests that crash PostgreSQL under the
//! engine ([`PgCluster::crash`]) without touching a shared server: made with the PostgreSQL
//! binaries found on the machine, reachable only through a Unix socket in a private directory,
//! and removed when dropped.
//!
//! Why this shape: a newcomer's machine may have PostgreSQL installed but not running, or
//! running with password authentication. Making a server answer without a password by
//! editing the system's `pg_hba.conf` would open it to every local user. A cluster of our
//! own needs no such change: it trusts connections on its own socket only, the socket lives
//! in a directory only its owner can enter (mode 0700), and it listens on no TCP port at all.
//!
//! `initdb` refuses to run as root; when this process is root the cluster is made and run
//! as the `postgres` system user (created by every distribution's package), else `nobody`.
//! Root can still connect: permissions on the socket directory do not apply to it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

/// Why a throwaway cluster could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgClusterError {
    /// Neither `initdb` and `pg_ctl` on the `PATH` nor under the usual install directories.
    #[error("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")]
    NotInstalled,
    /// The process is root and there is no unprivileged user to run the server as.
    #[error(
        "running as root, and neither a `postgres` nor a `nobody` user exists to run PostgreSQL as"
    )]
    NoUser,
    /// A file system operation failed.
    #[error("{doing}: {source}")]
    Io {
        /// What was being done.
        doing: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// `initdb` or `pg_ctl` failed; `output` is the end of what it printed.
    #[error("{program} failed: {output}")]
    Command {
        /// The program.
        program: String,
        /// Its last lines of output.
        output: String,
    },
}

fn io(doing: impl Into<String>) -> impl FnOnce(std::io::Error) -> PgClusterError {
    let doing = doing.into();
    move |source| PgClusterError::Io { doing, source }
}

/// A running throwaway cluster. Dropping it stops the server and removes its directory.
#[derive(Debug)]
pub struct PgCluster {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    run_as: Option<(u32, u32)>,
    version: String,
}

impl PgCluster {
    /// The directory of `initdb` and `pg_ctl`: the `PATH` first, then the install
    /// directories of the Debian/Ubuntu (`/usr/lib/postgresql/<v>/bin`), Red Hat
    /// (`/usr/pgsql-<v>/bin`) and source (`/usr/local/pgsql/bin`) packages, newest first.
    pub fn find_binaries() -> Option<PathBuf> {
        let has_both = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
        if let Some(path) = std::env::var_os("PATH") {
            if let Some(dir) = std::env::split_paths(&path).find(|d| has_both(d)) {
                return Some(dir);
            }
        }
        let mut candidates: Vec<(u32, PathBuf)> = Vec::new();
        for (parent, prefix, suffix) in [
            ("/usr/lib/postgresql", "", "bin"),
            ("/usr", "pgsql-", "bin"),
        ] {
            let Ok(entries) = std::fs::read_dir(parent) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let Some(version) = name.strip_prefix(prefix) else {
                    continue;
                };
                let major: u32 = version
                    .split('.')
                    .next()
                    .and_then(|m| m.parse().ok())
                    .unwrap_or(0);
                let dir = entry.path().join(suffix);
                if major > 0 && has_both(&dir) {
                    candidates.push((major, dir));
                }
            }
        }
        candidates.sort();
        candidates
            .pop()
            .map(|(_, dir)| dir)
            .or_else(|| Some(PathBuf::from("/usr/local/pgsql/bin")).filter(|d| has_both(d)))
    }

    /// Makes and starts a cluster with the binaries in `bin`, in a new private directory
    /// under the system's temporary directory. Returns once the server accepts connections.
    pub fn start(bin: &Path) -> Result<Self, PgClusterError> {
        let run_as = unprivileged_user()?;
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir =
            std::env::temp_dir().join(format!("projector-demo-pg-{}-{stamp}", std::process::id()));
        {
            use std::os::unix::fs::DirBuilderExt as _;
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&dir)
                .map_err(io(format!("creating {}", dir.display())))?;
        }
        // From here on, dropping the value removes the directory whatever fails next.
        let mut cluster = Self {
            bin: bin.to_owned(),
            dir,
            port: 0,
            run_as,
            version: String::new(),
        };
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(&cluster.dir, Some(uid), Some(gid)).map_err(io(format!(
                "handing {} to uid {uid}",
                cluster.dir.display()
            )))?;
        }
        // Only the socket's file name depends on the port (no TCP listener); a port nobody
        // uses keeps the name unsurprising for anyone looking.
        cluster.port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(io("choosing a port"))?;
        let data = cluster.data_dir();
        cluster.run(
            "initdb",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-U".as_ref(),
                "postgres".as_ref(),
                // The socket is the only way in, and only the directory's owner (and root)
                // can reach it; TCP is refused even if someone turned it on.
                "--auth-local=trust".as_ref(),
                "--auth-host=reject".as_ref(),
                "--encoding=UTF8".as_ref(),
                "--locale=C".as_ref(),
                "--no-sync".as_ref(),
            ],
        )?;
        cluster.start_server()?;
        cluster.version = std::fs::read_to_string(data.join("PG_VERSION"))
            .map(|v| v.trim().to_owned())
            .unwrap_or_default();
        Ok(cluster)
    }

    /// A connection string for `dbname` as user `postgres`, through the socket.
    pub fn url(&self, dbname: &str) -> String {
        format!(
            "host={} port={} user=postgres dbname={dbname}",
            self.dir.display(),
            self.port
        )
    }

    /// The server's major version, e.g. `16`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The cluster's directory (data, socket, log), removed on drop.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Crashes the server: `pg_ctl stop -m immediate`, which ends the postmaster and every
    /// backend at once, without a checkpoint and without flushing the WAL still in shared
    /// memory (what a commit with `synchronous_commit = off` may have left there is lost, as in
    /// a crash of the machine's PostgreSQL). [`PgCluster::restart`] then recovers from the WAL.
    /// Returns once the server is down.
    pub fn crash(&self) -> Result<(), PgClusterError> {
        let data = self.data_dir();
        self.run(
            "pg_ctl",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-m".as_ref(),
                "immediate".as_ref(),
                "-w".as_ref(),
                "stop".as_ref(),
            ],
        )
    }

    /// Starts the server again after [`PgCluster::crash`] (crash recovery first), with the
    /// same socket and settings. Returns once it accepts connections.
    pub fn restart(&self) -> Result<(), PgClusterError> {
        self.start_server()
    }

    fn start_server(&self) -> Result<(), PgClusterError> {
        let data = self.data_dir();
        let options = format!(
            "-c listen_addresses='' -c unix_socket_directories='{}' -p {} \
             -c fsync=off -c full_page_writes=off -c max_connections=200",
            self.dir.display(),
            self.port
        );
        let log = self.dir.join("server.log");
        self.run(
            "pg_ctl",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-l".as_ref(),
                log.as_os_str(),
                "-o".as_ref(),
                options.as_ref(),
                "-w".as_ref(),
                "-t".as_ref(),
                "60".as_ref(),
                "start".as_ref(),
            ],
        )
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn run(&self, program: &str, args: &[&std::ffi::OsStr]) -> Result<(), PgClusterError> {
        let mut command = Command::new(self.bin.join(program));
        command
            .args(args)
            .current_dir(&self.dir)
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        {
            use std::os::unix::process::CommandExt as _;
            if let Some((uid, gid)) = self.run_as {
                command.uid(uid).gid(gid);
            }
            // Its own process group: a Ctrl-C in the terminal reaches the demo, which stops
            // the server itself, instead of killing the server under it.
            command.process_group(0);
        }
        let output = command
            .output()
            .map_err(io(format!("running {}", self.bin.join(program).display())))?;
        if output.status.success() {
            return Ok(());
        }
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        Err(PgClusterError::Command {
            program: program.to_owned(),
            output: lines[lines.len().saturating_sub(3)..].join(" / "),
        })
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if self.data_dir().join("postmaster.pid").exists() {
            let data = self.data_dir();
            let _ = self.run(
                "pg_ctl",
                &[
                    "-D".as_ref(),
                    data.as_os_str(),
                    "-m".as_ref(),
                    "immediate".as_ref(),
                    "-w".as_ref(),
                    "stop".as_ref(),
                ],
            );
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `None` when this process is not root; else the ids of `postgres`, or of `nobody`.
fn unprivileged_user() -> Result<Option<(u32, u32)>, PgClusterError> {
    use std::os::unix::fs::MetadataExt as _;
    // The owner of /proc/self is this process's effective user. Without /proc (macOS),
    // assume a normal user: initdb then says itself if it is root.
    let me = std::fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid());
    if me != 0 {
        return Ok(None);
    }
    let passwd = std::fs::read_to_string("/etc/passwd").map_err(io("reading /etc/passwd"))?;
    for wanted in ["postgres", "nobody"] {
        if let Some(ids) = passwd.lines().find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            match fields.as_slice() {
                [name, _, uid, gid, ..] if *name == wanted => {
                    Some((uid.parse().ok()?, gid.parse().ok()?))
                }
                _ => None,
            }
        }) {
            return Ok(Some(ids));
        }
    }
    Err(PgClusterError::NoUser)
}
