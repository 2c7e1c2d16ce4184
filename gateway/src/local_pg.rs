//! A throwaway PostgreSQL server from the system's packages, for tests and
//! benchmarks: `initdb` in a temporary directory, `postgres` on a free
//! port of 127.0.0.1, stopped when dropped (and killed with the process
//! that started it, if that dies first).
//!
//! The binaries are found in `$PELOTON_PG_BIN`, then beside `pg_config
//! --bindir`, then in the newest `/usr/lib/postgresql/*/bin` (Debian's
//! place), then on `PATH`. PostgreSQL refuses to run as root: as root the
//! server runs as the `postgres` user, which owns its directory.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A running throwaway server. Dropping it stops it.
#[derive(Debug)]
pub struct LocalPostgres {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    /// The running server: its pid and the thread that started it and
    /// waits for it (the server dies with that thread: see `run`).
    child: Option<(i32, std::thread::JoinHandle<()>)>,
    /// Run as this user (root only).
    user: Option<(u32, u32)>,
    fsync: bool,
}

/// Where the PostgreSQL binaries are, if anywhere.
pub fn find_bin_dir() -> Option<PathBuf> {
    let has = |d: &Path| d.join("initdb").is_file() && d.join("postgres").is_file();
    if let Some(d) = std::env::var_os("PELOTON_PG_BIN").map(PathBuf::from) {
        return has(&d).then_some(d);
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let d = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && has(&d) {
            return Some(d);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let d = e.path().join("bin");
            has(&d).then_some((v, d))
        })
        .collect();
    versions.sort();
    if let Some((_, d)) = versions.pop() {
        return Some(d);
    }
    std::env::var_os("PATH").and_then(|path| std::env::split_paths(&path).find(|d| has(d)))
}

const PREFIX: &str = "peloton-pg-";
/// The pid of the process that owns a server's directory.
const OWNER: &str = "owner";

/// Removes the directories of servers whose owner died without dropping
/// them (a test binary keeps its server in a static, never dropped): the
/// server died with its owner (parent-death signal), its files stay.
fn sweep_abandoned() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        if !e.file_name().to_string_lossy().starts_with(PREFIX) {
            continue;
        }
        let owner = std::fs::read_to_string(e.path().join(OWNER))
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok());
        let abandoned = match owner {
            Some(pid) => {
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
                    == Err(nix::errno::Errno::ESRCH)
            }
            // Being created: leave it unless it is old.
            None => e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > Duration::from_secs(600)),
        };
        if abandoned {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl LocalPostgres {
    /// Starts a server. `fsync` off is for tests (faster, still crash-safe
    /// for a process crash; not for a machine crash).
    pub fn start(fsync: bool) -> anyhow::Result<LocalPostgres> {
        let bin = find_bin_dir().ok_or_else(|| {
            anyhow::anyhow!(
                "PostgreSQL is not installed (no initdb/postgres found in $PELOTON_PG_BIN, \
                 pg_config --bindir, /usr/lib/postgresql/*/bin or PATH): \
                 apt-get install postgresql"
            )
        })?;
        let user = if nix::unistd::geteuid().is_root() {
            let pg = nix::unistd::User::from_name("postgres")?.ok_or_else(|| {
                anyhow::anyhow!(
                    "running as root, and there is no `postgres` user to run PostgreSQL as"
                )
            })?;
            Some((pg.uid.as_raw(), pg.gid.as_raw()))
        } else {
            None
        };
        sweep_abandoned();
        let dir = tempfile::Builder::new().prefix(PREFIX).tempdir()?;
        std::fs::write(dir.path().join(OWNER), std::process::id().to_string())?;
        if let Some((uid, gid)) = user {
            nix::unistd::chown(dir.path(), Some(uid.into()), Some(gid.into()))?;
        }
        let data = dir.path().join("data");
        let out = Self::command(&bin, "initdb", user)
            .args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-locale",
                "-D",
            ])
            .arg(&data)
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            anyhow::bail!(
                "initdb failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let mut pg = LocalPostgres {
            bin,
            dir,
            port: free_port()?,
            child: None,
            user,
            fsync,
        };
        pg.run()?;
        Ok(pg)
    }

    fn command(bin: &Path, name: &str, user: Option<(u32, u32)>) -> Command {
        let mut c = Command::new(bin.join(name));
        // The caller's directory may be unreadable by the `postgres` user.
        c.current_dir(std::env::temp_dir());
        if let Some((uid, gid)) = user {
            c.uid(uid).gid(gid);
        }
        c
    }

    /// Starts `postgres` on the data directory and waits until it accepts
    /// connections.
    fn run(&mut self) -> anyhow::Result<()> {
        let data = self.dir.path().join("data");
        let log = std::fs::File::create(self.dir.path().join("postgres.log"))?;
        let mut c = Self::command(&self.bin, "postgres", self.user);
        c.arg("-D")
            .arg(&data)
            .args(["-p", &self.port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!(
                "unix_socket_directories={}",
                self.dir.path().display()
            ))
            .args([
                "-c",
                &format!("fsync={}", if self.fsync { "on" } else { "off" }),
            ])
            .args(["-c", "max_connections=200"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // SAFETY: prctl is async-signal-safe. The server gets SIGQUIT
        // when the thread that forked it ends: that thread is one of its
        // own, which waits for the server, so the server lives until it is
        // stopped or this process dies (a thread of a pool, such as
        // `spawn_blocking`'s, would end while the server is still needed).
        #[allow(unsafe_code)]
        unsafe {
            c.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGQUIT)
                    .map_err(std::io::Error::from)
            });
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::Builder::new()
            .name("postgres-waiter".into())
            .spawn(move || match c.spawn() {
                Ok(mut child) => {
                    let _ = tx.send(Ok(child.id() as i32));
                    let _ = child.wait();
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            })?;
        let pid = rx
            .recv()
            .map_err(|_| anyhow::anyhow!("the postgres starter thread died"))??;
        self.child = Some((pid, waiter));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if postgres::Client::connect(&self.url_of("postgres"), postgres::NoTls).is_ok() {
                return Ok(());
            }
            if self.child.as_ref().is_some_and(|c| c.1.is_finished()) {
                self.child = None;
                anyhow::bail!(
                    "postgres exited: {}",
                    std::fs::read_to_string(self.dir.path().join("postgres.log"))
                        .unwrap_or_default()
                );
            }
            if Instant::now() > deadline {
                anyhow::bail!("postgres did not accept connections within 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of database `db` (user `postgres`, no password).
    pub fn url_of(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Creates database `db` (if new) and returns its URL.
    pub fn create_db(&self, db: &str) -> anyhow::Result<String> {
        let mut c = postgres::Client::connect(&self.url_of("postgres"), postgres::NoTls)?;
        let exists = c
            .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&db])?
            .is_some();
        if !exists {
            c.batch_execute(&format!("CREATE DATABASE \"{}\"", db.replace('"', "")))?;
        }
        Ok(self.url_of(db))
    }

    /// Stops the server at once (SIGQUIT: immediate shutdown, as a crash
    /// of the database would) and waits for it.
    pub fn kill(&mut self) {
        self.stop(nix::sys::signal::Signal::SIGQUIT);
    }

    fn stop(&mut self, signal: nix::sys::signal::Signal) {
        if let Some((pid, waiter)) = self.child.take() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
            let _ = waiter.join();
        }
    }

    /// Starts the server again on the same data and port.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.run()
    }
}

impl Drop for LocalPostgres {
    fn drop(&mut self) {
        // SIGINT: fast shutdown.
        self.stop(nix::sys::signal::Signal::SIGINT);
    }
}
