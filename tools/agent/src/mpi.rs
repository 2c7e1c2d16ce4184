//! `peloton-agent mpirun -- PROGRAM ARGS...`: an MPICH job across a gang,
//! with no ssh. Every member of the gang runs the same command; the
//! rendezvous environment (`PELOTON_GANG_*`) says what each one does.
//!
//! - Rank 0 runs hydra's `mpiexec -launcher manual` with its control port
//!   fixed to the gang leader's port (`PELOTON_GANG_LEADER_PORT_MPI`, the
//!   task's port `mpi`; `--port` names another), one host label per rank,
//!   and starts its own rank's proxy. The job's output, every rank's, comes
//!   out of `mpiexec` and so out of rank 0.
//! - Every other rank runs one `hydra_pmi_proxy` that connects to it. The
//!   proxy gives up at once when `mpiexec` is not listening yet, and
//!   `mpiexec` dies from a connection that is not a proxy's, so the agent
//!   cannot probe for it: the proxy connects to a relay here, which keeps
//!   trying rank 0's port (bounded by `--connect-timeout-secs`) and then
//!   passes the bytes through.
//! - Rank 0 waits at most as long for all proxies to connect (it counts
//!   the established connections on its port) before it gives up.
//!
//! Each rank's process has its own member's environment and runs in its
//! own sandbox. The exit status is `mpiexec`'s on rank 0 (the job's: the
//! highest of the ranks'), the proxy's on the others. The pure parts are in
//! `plan`; this module only runs processes and moves bytes, on plain
//! threads (no async runtime, no logging: errors go to stderr).

mod plan;

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use clap::Parser;

use self::plan::{Gang, LAUNCH_END, LaunchLine, WDIR_VAR};

/// The arguments of `peloton-agent mpirun`.
#[derive(Debug, Parser)]
#[command(
    name = "peloton-agent mpirun",
    about = "Runs an MPICH job across the gang this task belongs to (every member runs the same \
             command): rank 0 runs mpiexec, the others the hydra proxy that connects to it; no ssh"
)]
pub struct MpirunArgs {
    /// The task's port that rank 0's mpiexec listens on for the other
    /// members' proxies (read from PELOTON_GANG_LEADER_PORT_<NAME>).
    #[arg(long, default_value = "mpi")]
    pub port: String,
    /// MPICH's hydra mpiexec (Debian: package mpich).
    #[arg(long, default_value = "mpiexec.hydra")]
    pub mpiexec: PathBuf,
    /// Hydra's proxy, run by ranks other than 0.
    #[arg(long, default_value = "hydra_pmi_proxy")]
    pub proxy: PathBuf,
    /// How long rank 0 waits for every member's proxy, and the others for
    /// rank 0's mpiexec, before giving up.
    #[arg(
        long,
        default_value_t = 300,
        value_parser = clap::value_parser!(u64).range(1..=86_400)
    )]
    pub connect_timeout_secs: u64,
    /// The MPI program and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "PROGRAM")]
    pub command: Vec<String>,
}

/// How many other lines `mpiexec` may print before its proxy commands.
const LAUNCH_LINES_MAX: usize = 16;
/// The longest line read while looking for the proxy commands.
const LAUNCH_LINE_MAX_BYTES: u64 = 64 * 1024;
/// How long a proxy may take to connect to its relay once started.
const PROXY_START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long rank 0's own proxy may outlive `mpiexec` before it is killed.
const PROXY_EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// The pause between attempts to reach rank 0's port.
const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// How long one attempt to reach rank 0's port may take.
const CONNECT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often rank 0 looks at its `mpiexec` and the connections to it.
const WATCH_INTERVAL: Duration = Duration::from_millis(100);

/// Runs `peloton-agent mpirun` and returns its exit code: the MPI job's,
/// or 1 with a message on stderr when it could not run.
pub fn run_mpirun(args: MpirunArgs) -> i32 {
    match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("peloton-agent mpirun: {e}");
            1
        }
    }
}

fn run(args: &MpirunArgs) -> Result<i32, String> {
    let gang =
        Gang::from_env(|name| std::env::var(name).ok(), &args.port).map_err(|e| e.to_string())?;
    let wdir =
        std::env::current_dir().map_err(|e| format!("cannot read the current directory: {e}"))?;
    let timeout = Duration::from_secs(args.connect_timeout_secs);
    if gang.rank == 0 {
        lead(&gang, args, &wdir, timeout)
    } else {
        follow(&gang, args, &wdir, timeout)
    }
}

/// Rank 0: `mpiexec`, and the proxy of rank 0.
fn lead(gang: &Gang, args: &MpirunArgs, wdir: &Path, timeout: Duration) -> Result<i32, String> {
    let (mpiexec_args, mpiexec_env) = plan::mpiexec_command(gang, &args.command);
    let mut mpiexec = Command::new(&args.mpiexec)
        .args(&mpiexec_args)
        .envs(mpiexec_env)
        .env(WDIR_VAR, wdir)
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| cannot_run(&args.mpiexec, "MPICH's hydra mpiexec", &e))?;
    let Some(stdout) = mpiexec.stdout.take() else {
        return Err("mpiexec's output was not captured".to_owned());
    };
    let mut output = BufReader::new(stdout);
    let mut own_proxy = read_launch_lines(&mut output, gang)
        .and_then(|lines| {
            // Rank 0's proxy reaches mpiexec on this host, whatever host
            // name hydra printed.
            let mine = &lines[0];
            Command::new(&mine.program)
                .args(mine.with_control_host("127.0.0.1"))
                .env(WDIR_VAR, wdir)
                .stdin(Stdio::null())
                .spawn()
                .map_err(|e| cannot_run(Path::new(&mine.program), "hydra's proxy", &e))
        })
        .map_err(|e| {
            let ended = kill_and_wait(&mut mpiexec);
            format!("{e} (mpiexec {ended})")
        })?;
    let copier = thread::spawn(move || forward_output(output));
    let status = watch_mpiexec(&mut mpiexec, gang, timeout);
    // mpiexec has ended (or been killed): its output is complete.
    let _ = copier.join();
    if wait_for(&mut own_proxy, PROXY_EXIT_TIMEOUT).is_none() {
        kill_and_wait(&mut own_proxy);
    }
    status.map(|status| exit_code(&status))
}

/// Reads `mpiexec`'s proxy commands up to `HYDRA_LAUNCH_END` and checks
/// them; other lines before it pass through to stdout.
fn read_launch_lines(
    output: &mut BufReader<ChildStdout>,
    gang: &Gang,
) -> Result<Vec<LaunchLine>, String> {
    let mut lines = Vec::new();
    let mut other = 0;
    loop {
        let mut line = String::new();
        let n = output
            .by_ref()
            .take(LAUNCH_LINE_MAX_BYTES)
            .read_line(&mut line)
            .map_err(|e| format!("cannot read mpiexec's output: {e}"))?;
        if n == 0 {
            return Err(
                "mpiexec ended before printing its proxy commands (its error is above)".to_owned(),
            );
        }
        if line.trim_end() == LAUNCH_END {
            break;
        }
        match plan::parse_launch_line(&line) {
            Some(Ok(launch)) => lines.push(launch),
            Some(Err(e)) => {
                return Err(format!(
                    "mpiexec printed a proxy command we cannot read: {e}"
                ));
            }
            None => {
                other += 1;
                if other > LAUNCH_LINES_MAX {
                    return Err(format!(
                        "mpiexec printed more than {LAUNCH_LINES_MAX} lines and no proxy command \
                         (is it MPICH's hydra?)"
                    ));
                }
                print!("{line}");
            }
        }
        if lines.len() > gang.size as usize {
            break;
        }
    }
    plan::check_launch(&lines, gang)?;
    Ok(lines)
}

/// Copies the rest of `mpiexec`'s output (the ranks' output) to stdout.
fn forward_output(mut output: BufReader<ChildStdout>) {
    let stdout = io::stdout();
    let mut out = stdout.lock();
    let _ = io::copy(&mut output, &mut out);
    let _ = out.flush();
}

/// Waits for `mpiexec` to end; kills it if not every member's proxy has
/// connected within `timeout`.
fn watch_mpiexec(
    mpiexec: &mut Child,
    gang: &Gang,
    timeout: Duration,
) -> Result<ExitStatus, String> {
    let deadline = Instant::now() + timeout;
    let mut all_connected = false;
    loop {
        match mpiexec.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) => {}
            Err(e) => return Err(format!("cannot wait for mpiexec: {e}")),
        }
        if !all_connected {
            match connected_proxies(gang.leader_port) {
                // /proc/net unreadable: no bound but the gang's own.
                None => all_connected = true,
                Some(n) if n >= gang.size as usize => all_connected = true,
                Some(n) if Instant::now() >= deadline => {
                    kill_and_wait(mpiexec);
                    return Err(format!(
                        "{n} of the gang's {} proxies reached mpiexec on port {} within {}s; \
                         every member must run `peloton-agent mpirun` too",
                        gang.size,
                        gang.leader_port,
                        timeout.as_secs()
                    ));
                }
                Some(_) => {}
            }
        }
        thread::sleep(WATCH_INTERVAL);
    }
}

/// The connections established on local port `port` (IPv4 and IPv6), or
/// `None` when `/proc/net` cannot be read.
fn connected_proxies(port: u16) -> Option<usize> {
    let mut n = 0;
    let mut read_any = false;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(table) {
            read_any = true;
            n += plan::established_on_port(&text, port);
        }
    }
    read_any.then_some(n)
}

/// Ranks other than 0: one hydra proxy, connected to rank 0's `mpiexec`
/// through a relay that waits for it.
fn follow(gang: &Gang, args: &MpirunArgs, wdir: &Path, timeout: Duration) -> Result<i32, String> {
    let relay = TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|e| format!("cannot listen on 127.0.0.1 for the proxy: {e}"))?;
    let relay_port = relay
        .local_addr()
        .map_err(|e| format!("cannot read the relay's port: {e}"))?
        .port();
    let mut proxy = Command::new(&args.proxy)
        .args(plan::proxy_args("127.0.0.1", relay_port, gang.rank))
        .env(WDIR_VAR, wdir)
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| cannot_run(&args.proxy, "hydra's proxy", &e))?;
    let connected = accept_proxy(&relay, &mut proxy).and_then(|from_proxy| {
        drop(relay);
        let to_leader = connect_to_leader(gang, &mut proxy, timeout)?;
        Ok((from_proxy, to_leader))
    });
    let (from_proxy, to_leader) = match connected {
        Ok(pair) => pair,
        Err(e) => {
            kill_and_wait(&mut proxy);
            return Err(e);
        }
    };
    let upstream = relay_bytes(&from_proxy, &to_leader)
        .and_then(|upstream| relay_bytes(&to_leader, &from_proxy).map(|_| upstream))
        .map_err(|e| format!("cannot relay the proxy's connection: {e}"))?;
    let status = proxy
        .wait()
        .map_err(|e| format!("cannot wait for the proxy: {e}"))?;
    // The proxy's last words (its ranks' exit statuses) may still be on
    // their way to mpiexec, which fails the whole job without them.
    let deadline = Instant::now() + PROXY_EXIT_TIMEOUT;
    while !upstream.is_finished() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
    Ok(exit_code(&status))
}

/// The proxy's connection to the relay, within `PROXY_START_TIMEOUT`.
fn accept_proxy(relay: &TcpListener, proxy: &mut Child) -> Result<TcpStream, String> {
    let deadline = Instant::now() + PROXY_START_TIMEOUT;
    loop {
        match relay.accept() {
            Ok((stream, _)) => {
                stream
                    .set_nonblocking(false)
                    .map_err(|e| format!("cannot use the proxy's connection: {e}"))?;
                return Ok(stream);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(format!("cannot accept the proxy's connection: {e}")),
        }
        if let Ok(Some(status)) = proxy.try_wait() {
            return Err(format!("the proxy ended before connecting ({status})"));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the proxy did not connect within {}s",
                PROXY_START_TIMEOUT.as_secs()
            ));
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// A connection to rank 0's port, tried until `timeout` has passed (rank
/// 0's `mpiexec` may start after this member).
fn connect_to_leader(
    gang: &Gang,
    proxy: &mut Child,
    timeout: Duration,
) -> Result<TcpStream, String> {
    let deadline = Instant::now() + timeout;
    let target = (gang.leader_addr.as_str(), gang.leader_port);
    loop {
        let attempt = target.to_socket_addrs().and_then(|addrs| {
            let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
            for addr in addrs {
                match TcpStream::connect_timeout(&addr, CONNECT_ATTEMPT_TIMEOUT) {
                    Ok(stream) => return Ok(stream),
                    Err(e) => last = e,
                }
            }
            Err(last)
        });
        let error = match attempt {
            Ok(stream) => return Ok(stream),
            Err(e) => e,
        };
        if let Ok(Some(status)) = proxy.try_wait() {
            return Err(format!("the proxy ended ({status})"));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "rank 0's mpiexec at {}:{} could not be reached within {}s: {error}",
                gang.leader_addr,
                gang.leader_port,
                timeout.as_secs()
            ));
        }
        thread::sleep(RETRY_PAUSE);
    }
}

/// Copies `from` to `to` on a thread of its own until `from` ends, then
/// ends `to`'s sending side.
fn relay_bytes(from: &TcpStream, to: &TcpStream) -> io::Result<thread::JoinHandle<()>> {
    let (mut from, mut to) = (from.try_clone()?, to.try_clone()?);
    // Hydra's control messages are small and waited for.
    to.set_nodelay(true)?;
    Ok(thread::spawn(move || {
        let _ = io::copy(&mut from, &mut to);
        let _ = to.shutdown(Shutdown::Write);
    }))
}

fn cannot_run(program: &Path, what: &str, e: &io::Error) -> String {
    let hint = if e.kind() == io::ErrorKind::NotFound {
        " (not found; on Debian: apt-get install mpich)"
    } else {
        ""
    };
    format!("cannot run {what} {}: {e}{hint}", program.display())
}

/// Kills `child` (SIGKILL: `mpiexec` waiting for proxies does not end on
/// SIGTERM) and says how it ended.
fn kill_and_wait(child: &mut Child) -> String {
    let _ = child.kill();
    match child.wait() {
        Ok(status) => status.to_string(),
        Err(e) => format!("cannot be waited for: {e}"),
    }
}

/// Waits at most `timeout` for `child` to end.
fn wait_for(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// A process's exit status as a shell reports it (128 + a signal).
fn exit_code(status: &ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}
