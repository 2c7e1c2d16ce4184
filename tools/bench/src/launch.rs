//! `peloton-bench launch`: real tasks through the whole system.
//!
//! Starts `pelotond` and `--agents` local `peloton-agent`s (the release
//! binaries next to this one, on fresh temporary directories), waits for
//! every host, then submits one job of `--tasks` instances of `/bin/true`
//! and waits until it SUCCEEDS. The server is secure (the default): the
//! agents present certificates naming their hosts from its private CA, the
//! client uses TLS and the admin token; `--insecure` measures without.
//! Reports:
//! - `tasks_per_s`: instances launched and finished per second, from the
//!   submission to the job's success;
//! - `server_cpu_ms_per_task`: the server's CPU time (user + system, from
//!   /proc) spent in that window, per task;
//! - `agents_cpu_ms_per_task`: the same for the agent processes (not the
//!   launchers and tasks they start);
//! - `agents_children_cpu_ms_per_task`: the CPU time of the processes the
//!   agents started (each agent's launcher and the tasks it started and
//!   reaped), per task: what the agents' children and their reaped
//!   descendants used in that window;
//! - `launchers_cpu_ms_per_task`: the part of that used by the agents'
//!   launchers themselves (their own CPU time, not their children's): what
//!   starting and watching a task costs besides the task (a launcher that
//!   exits within the window drops out of it);
//! - `machine_cpu_ms_per_task`: every CPU's busy time (from /proc/stat) in
//!   that window, per task: the three above, and whatever else the
//!   machine ran meanwhile (so only meaningful on a quiet machine);
//! - `agents_dir_places_passed_over`: agent work dirs the file system put
//!   where this bench's runs of the last minutes deleted their files, and
//!   that were made again elsewhere (see `place_work_dir`);
//!   `agents_dirs_in_recent_places`: agents whose every try landed there;
//! - `client_cpu_ms_per_task`: this process's CPU in that window (its gRPC
//!   client polling the job, and the thread draining the server's output);
//!   `kernel_threads_cpu_ms_per_task`: the kernel's threads' (writeback,
//!   block I/O, deferred soft interrupts; a floor: a worker thread that
//!   ends in the window takes its time with it; null where the kernel's
//!   threads are not in this /proc): with the above, most of the machine's
//!   figure;
//! - `machine_steal_s`: of that busy time, the seconds the hypervisor gave
//!   to other guests (a VM's CPUs stolen during the run: its rate falls, and
//!   every CPU figure above rises, for reasons outside the machine);
//! - `bare_execs_per_s`: the machine's bound of the minute, for the same
//!   task: `/bin/true` started and waited for by a bare loop on every CPU
//!   at once (`posix_spawn`, nothing else per task), measured just before
//!   the job and just after it (both in `bare_execs_per_s_around`, whose
//!   arithmetic mean `bare_execs_per_s` is; the one after starts as the
//!   job succeeds, while the server and agents may still be finishing up
//!   its last reports and writes), and the machine's CPU per such exec
//!   (`bare_exec_machine_cpu_ms`). `of_bare_execs` is `tasks_per_s` over
//!   it: how close the whole system comes to a launcher that does nothing
//!   but exec. A VM's cost of an exec varies from one minute to the next
//!   (by a fifth within an hour here, and by more over a day), and the
//!   launch rate with it: this is what to read a rate against.

use std::collections::HashMap;
use std::io::BufRead;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use peloton_proto::v1 as pb;
use serde_json::{Value, json};

/// Options of one run.
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    /// Local agents to start.
    pub agents: u32,
    /// Instances of the job.
    pub tasks: u32,
    /// Where the agents' work dirs go (default: the run's temporary dir,
    /// next to the server's store).
    pub agents_dir: Option<std::path::PathBuf>,
    /// Further flags for the server.
    pub server_args: Vec<String>,
    /// Start the server with `--insecure` (plaintext, no tokens, agents
    /// without certificates).
    pub insecure: bool,
    /// Bare execs of `/bin/true` measured just before the job and again
    /// just after it (see [`bare_execs`]); 0: none.
    pub bare_execs: u32,
}

/// A child process stopped with SIGTERM (then SIGKILL after its patience)
/// when dropped.
pub(crate) struct Process(pub(crate) Child, pub(crate) Duration);

impl Drop for Process {
    fn drop(&mut self) {
        crate::e2e::stop_child(&mut self.0, self.1);
    }
}

/// How long a stopped child of `launch` may take before SIGKILL.
const PATIENCE: Duration = Duration::from_secs(10);

/// Starts a local `peloton-agent` of server `addr` on work dir `work`, its
/// output discarded; `extra` adds options (TLS ones for a secure server:
/// [`crate::e2e::agent_tls_args`]).
pub(crate) fn spawn_agent(
    bin: &std::path::Path,
    addr: &str,
    token: &str,
    work: &std::path::Path,
    host: &str,
    resources: &str,
    extra: &[String],
) -> Result<Child> {
    std::fs::create_dir_all(work)?;
    std::process::Command::new(bin)
        .args(["--server", addr, "--token", token])
        .arg("--work-dir")
        .arg(work)
        .args(["--host", host, "--resources", resources])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start peloton-agent")
}

/// Marks `dir` as the top of a directory hierarchy (`chattr +T`), so that
/// ext4 puts each of its subdirectories (the agents' work dirs) in a block
/// group of its own choosing, away from `dir`'s.
///
/// Why: ext4 without a journal (this machine's disk) does not reuse an
/// inode deleted in the last minutes; it steps over each such inode of a
/// block group, looking at its deletion time, every time it allocates one
/// there. A run creates four inodes per task and deletes them all when it
/// ends, next to where the following run would create its own: run back to
/// back, the second run's agents spent 2–3× the CPU per task in the
/// allocator (0.37–0.62 ms instead of 0.18–0.19) and launched at 1,087–1,380
/// tasks/s instead of 2,000. That measures the previous run's clean-up,
/// not launching; an agent on a real host deletes its sandboxes one by one
/// over days. Other file systems ignore or refuse the flag.
fn spread_subdirectories(dir: &std::path::Path) -> std::io::Result<()> {
    use nix::libc;
    use std::os::fd::AsRawFd;
    /// `FS_TOPDIR_FL` (linux/fs.h). The flags ioctls read and write an
    /// `int`, whatever their encoded size says.
    const TOPDIR: libc::c_int = 0x0002_0000;
    let dir = std::fs::File::open(dir)?;
    let mut flags: libc::c_int = 0;
    // SAFETY: an open descriptor and an int the call fills.
    #[allow(unsafe_code)]
    if unsafe { libc::ioctl(dir.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    flags |= TOPDIR;
    // SAFETY: as above; the call reads the int.
    #[allow(unsafe_code)]
    if unsafe { libc::ioctl(dir.as_raw_fd(), libc::FS_IOC_SETFLAGS, &flags) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Inode numbers (less one: they start at 1) that share their bits above
/// these are one neighbourhood: ext4's default flexible block group, 16
/// groups of 8,192 inodes, within which a directory's files and
/// subdirectories are allocated. Assumed, not read from the file system
/// (that takes its raw device): on another layout a neighbourhood is only
/// a coarser or finer range of inodes.
const NEIGHBOURHOOD_SHIFT: u32 = 17;

/// How long the neighbourhoods of a run's agents are avoided by later runs:
/// ext4 without a journal steps over an inode deleted in the last 60 s, or
/// the last 360 s (60 + 300) while its inode table block is not yet
/// written back.
const RECENT_S: u64 = 360;

/// Tries at placing one agent's work dir away from recent neighbourhoods.
const PLACEMENT_TRIES: u32 = 8;

/// Where this bench remembers its recent runs' neighbourhoods.
fn neighbourhoods_file() -> std::path::PathBuf {
    std::env::temp_dir().join("peloton-bench-launch-neighbourhoods")
}

fn unix_s() -> u64 {
    crate::e2e::wall_ms() / 1000
}

/// A neighbourhood: a file system (its device number) and a range of its
/// inode numbers.
type Place = (u64, u64);

fn place_of(device: u64, inode: u64) -> Place {
    (device, inode.saturating_sub(1) >> NEIGHBOURHOOD_SHIFT)
}

/// The neighbourhoods of the agents of this bench's runs that ended in the
/// last [`RECENT_S`] (lines `TIME DEVICE NEIGHBOURHOOD` in
/// [`neighbourhoods_file`]), with the lines still recent.
fn recent_neighbourhoods(now_s: u64) -> (std::collections::BTreeSet<Place>, Vec<String>) {
    let text = std::fs::read_to_string(neighbourhoods_file()).unwrap_or_default();
    recent_in(&text, now_s)
}

/// [`recent_neighbourhoods`] of the file's `text`.
fn recent_in(text: &str, now_s: u64) -> (std::collections::BTreeSet<Place>, Vec<String>) {
    let mut recent = std::collections::BTreeSet::new();
    let mut lines = Vec::new();
    for line in text.lines() {
        let fields: Vec<u64> = line
            .split_whitespace()
            .map_while(|f| f.parse().ok())
            .collect();
        if let [time, device, place] = fields[..]
            && time.saturating_add(RECENT_S) > now_s
        {
            recent.insert((device, place));
            lines.push(line.to_owned());
        }
    }
    (recent, lines)
}

/// Remembers this run's neighbourhoods, as its files go.
fn remember_neighbourhoods(places: &std::collections::BTreeSet<Place>) {
    use std::io::Write;
    let now = unix_s();
    let (_, mut lines) = recent_neighbourhoods(now);
    lines.extend(
        places
            .iter()
            .map(|(device, place)| format!("{now} {device} {place}")),
    );
    let file = neighbourhoods_file();
    // Staged under a name of its own, then renamed over the old file: a
    // reader sees one or the other whole. A lost update (two benches at
    // once) only costs a later run its care.
    let Some(dir) = file.parent() else {
        return;
    };
    if let Ok(mut staged) = tempfile::NamedTempFile::new_in(dir)
        && staged
            .write_all((lines.join("\n") + "\n").as_bytes())
            .is_ok()
    {
        let _ = staged.persist(&file);
    }
}

/// Creates an agent's work dir `root/name`, away from the neighbourhoods in
/// `avoid` if the file system lets it. Returns the dir, its neighbourhood
/// and how many places were passed over.
///
/// Why: a run deletes all of its agents' files when it ends (about four
/// inodes a task). ext4 without a journal (this machine's disk; a journaled
/// ext4 never does this) then steps over each of those inodes, one by one,
/// every time it allocates an inode in their block group, for one to six
/// minutes: creating a sandbox and its three files there cost 1.3 ms right
/// after 2,800 deletions, and 0.26 ms a minute later, against 0.065 ms on
/// fresh ground (measured with a C loop of `mkdir` and `open(O_CREAT)`).
/// [`spread_subdirectories`] has ext4 place each agent dir in a block group
/// of its own choosing, but it often chooses one the previous runs used (it
/// prefers the groups with the fewest directories, which theirs are once
/// emptied): in back-to-back runs without this care, four of sixteen spent
/// about twice the CPU per task in the agents and their launchers (0.135–0.185
/// ms each instead of 0.065–0.095) and launched 1,915–2,067 tasks/s instead
/// of 2,180–2,620. That measures this bench's own clean-up, not launching,
/// so the bench measures on fresh inode ground: a dir that lands in a recent
/// run's neighbourhood is left there (empty, removed with the run) and the
/// next is made; the allocator, counting the one left, places it elsewhere.
/// Deletions by anything else (a build, another program) are not known
/// here, and can still slow a run. (A host's own sandbox collection, once
/// it deletes as fast as it creates, would put a busy agent on a disk
/// without a journal on that slow path for good: see docs/performance.md.)
fn place_work_dir(
    root: &std::path::Path,
    name: &str,
    avoid: &std::collections::BTreeSet<Place>,
) -> Result<(std::path::PathBuf, Place, u32)> {
    use std::os::unix::fs::MetadataExt;
    let mut passed = 0;
    loop {
        let dir = root.join(match passed {
            0 => name.to_owned(),
            n => format!("{name}-{n}"),
        });
        std::fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let meta = std::fs::metadata(&dir)?;
        let place = place_of(meta.dev(), meta.ino());
        if !avoid.contains(&place) || passed + 1 >= PLACEMENT_TRIES {
            return Ok((dir, place, passed));
        }
        passed += 1;
    }
}

/// Every neighbourhood the entries under `dir` (not following links) are
/// in, `dir`'s own too.
fn neighbourhoods_under(dir: &std::path::Path) -> std::collections::BTreeSet<Place> {
    use std::os::unix::fs::{DirEntryExt, MetadataExt};
    let mut places = std::collections::BTreeSet::new();
    let Ok(meta) = std::fs::metadata(dir) else {
        return places;
    };
    let device = meta.dev();
    places.insert(place_of(device, meta.ino()));
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            places.insert(place_of(device, entry.ino()));
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                pending.push(entry.path());
            }
        }
    }
    places
}

/// The journals the kernel runs (`/proc/fs/jbd2`'s entries).
fn jbd2_journals() -> Vec<String> {
    std::fs::read_dir("/proc/fs/jbd2")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect()
}

/// Whether a file system of type `fs` on the block device the kernel
/// names `device` (`vda`, `vda1`, `dm-0`; `None`: no block device) steps
/// over recently deleted inodes: ext2/3/4 (driven by ext4) without a
/// journal, given the journals in `/proc/fs/jbd2` (named `DEVICE-INODE`
/// after the kernel's name of the device, whatever path it was mounted by).
fn journal_less_ext(device: Option<&str>, fs: &str, journals: &[String]) -> bool {
    let Some(device) = device else {
        return false;
    };
    let journaled = journals.iter().any(|name| {
        name.strip_prefix(device)
            .is_some_and(|rest| rest.starts_with('-'))
    });
    fs.starts_with("ext") && !journaled
}

/// The kernel's name of the block device holding `path` (from
/// `/sys/dev/block/MAJOR:MINOR`, which links to it: `vda1`, `dm-0`), or
/// `None` if it is on none (tmpfs, proc, …).
fn block_device_of(path: &std::path::Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path).ok()?.dev();
    let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
    let target = std::fs::read_link(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    Some(target.file_name()?.to_string_lossy().into_owned())
}

/// The agents' work dirs' root. Dropped (when a run ends, or fails), it
/// deletes them and, where the file system steps over recent deletions,
/// has the deletions written out (`syncfs`: the allocator then steps over
/// them for a minute, not up to six) and remembers every neighbourhood
/// they used, for [`place_work_dir`] to avoid.
struct AgentsGround {
    root: Option<tempfile::TempDir>,
    /// Its file system's type.
    fs: String,
    careful: bool,
}

impl AgentsGround {
    fn new(root: tempfile::TempDir) -> AgentsGround {
        let fs = fs_type_of(root.path()).unwrap_or_else(|| "unknown".into());
        let device = block_device_of(root.path());
        AgentsGround {
            root: Some(root),
            careful: journal_less_ext(device.as_deref(), &fs, &jbd2_journals()),
            fs,
        }
    }

    fn path(&self) -> &std::path::Path {
        self.root.as_ref().expect("held until dropped").path()
    }

    /// What this run's agents should stay away from.
    fn avoid(&self) -> std::collections::BTreeSet<Place> {
        match self.careful {
            true => recent_neighbourhoods(unix_s()).0,
            false => Default::default(),
        }
    }
}

impl Drop for AgentsGround {
    fn drop(&mut self) {
        let Some(root) = self.root.take() else {
            return;
        };
        if !self.careful {
            let _ = root.close();
            return;
        }
        let places = neighbourhoods_under(root.path());
        let parent = root.path().parent().map(std::path::Path::to_path_buf);
        let _ = root.close();
        if let Some(dir) = parent.and_then(|p| std::fs::File::open(p).ok()) {
            let _ = nix::unistd::syncfs(&dir);
        }
        remember_neighbourhoods(&places);
    }
}

pub(crate) fn sibling(name: &str) -> Result<std::path::PathBuf> {
    crate::e2e::sibling_binary(name, "-p peloton-gateway -p peloton-agent")
}

/// What a bare loop of `/bin/true` execs did: see [`bare_execs`].
#[derive(Debug, Clone, Copy, PartialEq)]
struct BareExecs {
    /// Execs started and waited for per second, by all loops together.
    per_s: f64,
    /// The machine's busy CPU time per exec, in milliseconds.
    machine_cpu_ms: f64,
}

impl BareExecs {
    /// The mean of the figures measured (None if neither was).
    fn mean(a: Option<BareExecs>, b: Option<BareExecs>) -> Option<BareExecs> {
        match (a, b) {
            (Some(a), Some(b)) => Some(BareExecs {
                per_s: (a.per_s + b.per_s) / 2.0,
                machine_cpu_ms: (a.machine_cpu_ms + b.machine_cpu_ms) / 2.0,
            }),
            (one, None) | (None, one) => one,
        }
    }
}

/// Runs `total` execs of `/bin/true`, split over `loops` threads that each
/// start one (`posix_spawn`, as `std::process::Command` does it with no
/// extra setup) and wait for it: the fastest a launcher that does nothing
/// else could go on this machine in this minute. None for `total` 0.
fn bare_execs(total: u32, loops: usize) -> Result<Option<BareExecs>> {
    if total == 0 {
        return Ok(None);
    }
    let (busy0, _) = machine_cpu_s();
    let start = Instant::now();
    std::thread::scope(|scope| {
        let workers: Vec<_> = split(total, loops)
            .into_iter()
            .map(|n| {
                scope.spawn(move || -> Result<()> {
                    for _ in 0..n {
                        // Standard streams inherited (`/bin/true` writes
                        // nothing): no open of /dev/null per exec.
                        let status = std::process::Command::new("/bin/true")
                            .status()
                            .context("cannot run /bin/true")?;
                        anyhow::ensure!(status.success(), "/bin/true exited {status}");
                    }
                    Ok(())
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| {
            w.join()
                .map_err(|_| anyhow::anyhow!("an exec loop panicked"))?
        })
    })?;
    let seconds = start.elapsed().as_secs_f64();
    let (busy1, _) = machine_cpu_s();
    Ok(Some(BareExecs {
        per_s: f64::from(total) / seconds,
        machine_cpu_ms: (busy1 - busy0) * 1000.0 / f64::from(total),
    }))
}

/// `total` execs split over at most `loops` loops (at least one): whole
/// execs each, none empty, the first loops taking the remainder.
fn split(total: u32, loops: usize) -> Vec<u32> {
    let loops = u32::try_from(loops.max(1)).unwrap_or(u32::MAX).min(total);
    (0..loops)
        .map(|i| total / loops + u32::from(i < total % loops))
        .collect()
}

/// CPU seconds (user + system) a process has used, from /proc/PID/stat.
pub(crate) fn cpu_s(pid: u32) -> f64 {
    stat_cpu_s(&format!("/proc/{pid}/stat"))
}

/// CPU seconds (user + system) of the children a process has waited for
/// (and theirs), from /proc/PID/stat.
fn children_cpu_s(pid: u32) -> f64 {
    stat_fields_s(&format!("/proc/{pid}/stat"), 16, 17)
}

/// CPU seconds of what process `pid` started: its reaped children (and
/// theirs), and its live children with what they have reaped (an agent's
/// launcher reaps its tasks, and is only reaped when the agent exits).
fn descendants_cpu_s(pid: u32) -> f64 {
    let live: f64 = children_of(pid)
        .into_iter()
        .map(|child| cpu_s(child) + children_cpu_s(child))
        .sum();
    children_cpu_s(pid) + live
}

/// CPU seconds of the launchers (`peloton-agent launcher`) among the live
/// children of `pid`, themselves, without the tasks they have reaped.
fn launchers_cpu_s(pid: u32) -> f64 {
    children_of(pid)
        .into_iter()
        .filter(|child| {
            std::fs::read(format!("/proc/{child}/cmdline"))
                .is_ok_and(|cmdline| cmdline.split(|&b| b == 0).nth(1) == Some(b"launcher"))
        })
        .map(cpu_s)
        .sum()
}

/// The kernel's own threads (kthreadd and its children: writeback, block
/// I/O, soft interrupts run late, RCU) as (pid, start time) → CPU seconds,
/// from /proc. None where pid 2 is not kthreadd (a PID namespace of its
/// own, as in a container: the kernel's threads are not in its /proc).
fn kernel_threads() -> Option<HashMap<(u32, u64), f64>> {
    let comm = std::fs::read_to_string("/proc/2/comm").ok()?;
    if comm.trim() != "kthreadd" {
        return None;
    }
    Some(
        std::iter::once(2)
            .chain(children_of(2))
            .filter_map(|pid| {
                let fields = stat_fields(&format!("/proc/{pid}/stat"))?;
                // Start time (22); utime (14) + stime (15).
                Some(((pid, stat_field(&fields, 22)), ticks_s(&fields, 14, 15)))
            })
            .collect(),
    )
}

/// CPU seconds the kernel's threads used between two [`kernel_threads`]
/// readings: of each thread alive at the end, what it used since the first
/// (all of it if it is new). A thread that ended in between is missed (its
/// time is gone with it), so this is a floor.
fn kernel_threads_cpu_s(
    before: Option<&HashMap<(u32, u64), f64>>,
    after: Option<&HashMap<(u32, u64), f64>>,
) -> Option<f64> {
    let (before, after) = (before?, after?);
    Some(
        after
            .iter()
            .map(|(key, &cpu)| (cpu - before.get(key).copied().unwrap_or(0.0)).max(0.0))
            .sum(),
    )
}

/// The live children of `pid` (from /proc/PID/task/*/children).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// Busy CPU seconds of the whole machine (every CPU; all but idle and
/// iowait), from /proc/stat, and the part of them stolen by the hypervisor.
pub(crate) fn machine_cpu_s() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return (0.0, 0.0);
    };
    // user nice system idle iowait irq softirq steal (guest time is
    // already in user).
    let ticks: Vec<f64> = cpu
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    let busy: f64 = ticks
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != 3 && i != 4)
        .map(|(_, t)| t)
        .sum();
    let steal = ticks.get(7).copied().unwrap_or(0.0);
    (busy / 100.0, steal / 100.0)
}

/// CPU seconds (user + system) of the thread of process `pid` named `name`
/// (from /proc/PID/task/TID/stat; 0 if there is none).
pub(crate) fn thread_cpu_s(pid: u32, name: &str) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    for t in tasks.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == name {
            return stat_cpu_s(&t.path().join("stat").to_string_lossy());
        }
    }
    0.0
}

pub(crate) fn stat_cpu_s(path: &str) -> f64 {
    // utime (14) + stime (15).
    stat_fields_s(path, 14, 15)
}

/// The fields of a /proc stat file from the third on (after the command,
/// which may hold spaces and parentheses), as numbers (0 where a field is
/// not one, as the state is not); None if it cannot be read.
fn stat_fields(path: &str) -> Option<Vec<u64>> {
    let stat = std::fs::read_to_string(path).ok()?;
    let rest = stat.rsplit(')').next()?;
    Some(
        rest.split_whitespace()
            .map(|v| v.parse().unwrap_or(0))
            .collect(),
    )
}

/// Field `n` (1-based, as in proc(5); 3 or more) of [`stat_fields`], 0 if
/// there is none.
fn stat_field(fields: &[u64], n: usize) -> u64 {
    fields.get(n - 3).copied().unwrap_or(0)
}

/// Fields `a` + `b` of [`stat_fields`] (clock ticks) in seconds: the
/// kernel's USER_HZ is 100 on Linux.
fn ticks_s(fields: &[u64], a: usize, b: usize) -> f64 {
    (stat_field(fields, a) + stat_field(fields, b)) as f64 / 100.0
}

/// Fields `a` + `b` (clock ticks) of a stat file, in seconds (0 if it
/// cannot be read).
fn stat_fields_s(path: &str, a: usize, b: usize) -> f64 {
    stat_fields(path).map_or(0.0, |fields| ticks_s(&fields, a, b))
}

/// The file system type of the mount holding `path` (from /proc/mounts:
/// the longest mount point that prefixes it; of mounts on one point, the
/// last, which hides the others).
fn fs_type_of(path: &std::path::Path) -> Option<String> {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    fs_type_in(&mounts, &path)
}

/// [`fs_type_of`] in the text of /proc/mounts.
fn fs_type_in(mounts: &str, path: &std::path::Path) -> Option<String> {
    mounts
        .lines()
        .enumerate()
        .filter_map(|(line, text)| {
            let mut f = text.split_whitespace();
            let (_source, at, fs) = (f.next()?, f.next()?, f.next()?);
            path.starts_with(at).then_some(((at.len(), line), fs))
        })
        .max_by_key(|&(rank, _)| rank)
        .map(|(_, fs)| fs.to_owned())
}

/// Starts `pelotond` on `data_dir` for local agents of `token` (with
/// further `flags`), and waits until it serves: the process and how to
/// reach it.
pub(crate) fn start_server(
    data_dir: &std::path::Path,
    token: &str,
    flags: &[String],
) -> Result<(Process, crate::e2e::Target)> {
    let mut server = std::process::Command::new(sibling("pelotond")?)
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--listen", "127.0.0.1:0", "--no-metrics"])
        .args(["--agent-token", token])
        .args(flags)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start pelotond")?;
    let stdout = server.stdout.take().context("no stdout")?;
    let server = Process(server, PATIENCE);
    let mut lines = std::io::BufReader::new(stdout).lines();
    let addr = loop {
        let Some(line) = lines.next() else {
            bail!("pelotond exited before serving");
        };
        if let Some(url) = line?.strip_prefix("pelotond: serving gRPC on ") {
            break url.to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let target = crate::e2e::Target::started(addr, data_dir)?;
    Ok((server, target))
}

/// Runs the benchmark.
pub async fn run(o: LaunchOptions) -> Result<Value> {
    anyhow::ensure!(o.agents >= 1, "--agents: at least 1");
    anyhow::ensure!(
        (1..=100_000).contains(&o.tasks),
        "--tasks: between 1 and 100000"
    );
    let dir = tempfile::tempdir()?;
    let data_dir = dir.path().join("server");
    let token = "bench-token";
    let mut flags: Vec<String> = o.server_args.clone();
    if o.insecure {
        flags.insert(0, "--insecure".into());
    }
    let (server, target) = start_server(&data_dir, token, &flags)?;
    let agent_bin = sibling("peloton-agent")?;
    let cores = std::thread::available_parallelism().map_or(2, |c| c.get());
    let agents_root = AgentsGround::new(match &o.agents_dir {
        Some(root) => tempfile::tempdir_in(root)
            .with_context(|| format!("--agents-dir {}", root.display()))?,
        None => tempfile::tempdir_in(dir.path())?,
    });
    // Each run's agents on fresh ground: see `spread_subdirectories`. The
    // names differ from run to run (the temporary directory's random part),
    // as ext4 starts its search for a group at a hash of the name.
    let _ = spread_subdirectories(agents_root.path());
    let run_tag = agents_root
        .path()
        .file_name()
        .map(|n| n.to_string_lossy().trim_start_matches('.').to_owned())
        .unwrap_or_default();
    let agents_fs = agents_root.fs.clone();
    // Empty where the file system does not step over recent deletions.
    let avoid = agents_root.avoid();
    let mut passed_over = 0;
    let mut left_in_recent = 0;
    let mut agents = Vec::new();
    for i in 0..o.agents {
        let host = format!("bench-{i}");
        let tls = crate::e2e::agent_tls_args(&target, &data_dir, &host, &dir.path().join("certs"))?;
        let (work, place, passed) =
            place_work_dir(agents_root.path(), &format!("agent-{i}-{run_tag}"), &avoid)?;
        passed_over += passed;
        left_in_recent += u32::from(avoid.contains(&place));
        let child = spawn_agent(
            &agent_bin,
            &target.url,
            token,
            &work,
            &host,
            &format!("cpu={cores},mem=4096,disk=100000"),
            &tls,
        )?;
        agents.push(Process(child, PATIENCE));
    }
    let channel = target.connect().await?;
    let mut hosts = pb::host_service_client::HostServiceClient::new(channel.clone());
    let mut jobs = pb::job_service_client::JobServiceClient::new(channel.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let up = hosts
            .list(pb::ListHostsRequest::default())
            .await?
            .into_inner()
            .hosts
            .iter()
            .filter(|h| h.connected && h.state() == pb::HostState::Up)
            .count();
        if up == o.agents as usize {
            break;
        }
        if Instant::now() > deadline {
            bail!("only {up} of {} agents registered within 60 s", o.agents);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    crate::e2e::create_pool(&channel, "/bench").await?;
    let spec = pb::JobSpec {
        name: "launch-bench".into(),
        owner: "peloton-bench".into(),
        pool: "/bench".into(),
        instance_count: o.tasks,
        default_task: Some(pb::TaskSpec {
            command: "/bin/true".into(),
            resources: Some(pb::Resources {
                cpu: 0.1,
                memory_mb: 32.0,
                ..Default::default()
            }),
            ..Default::default()
        }),
        sla: Some(pb::Sla {
            preemptible: true,
            ..Default::default()
        }),
        ..Default::default()
    };
    let bare_before = tokio::task::block_in_place(|| bare_execs(o.bare_execs, cores))?;
    let server_pid = server.0.id();
    let agent_pids: Vec<u32> = agents.iter().map(|a| a.0.id()).collect();
    let cpu0 = cpu_s(server_pid);
    let agents_cpu0: f64 = agent_pids.iter().map(|&p| cpu_s(p)).sum();
    let tasks_cpu0: f64 = agent_pids.iter().map(|&p| descendants_cpu_s(p)).sum();
    let launchers_cpu0: f64 = agent_pids.iter().map(|&p| launchers_cpu_s(p)).sum();
    let client_cpu0 = cpu_s(std::process::id());
    let kernel_threads0 = kernel_threads();
    let machine_cpu0 = machine_cpu_s();
    let start = Instant::now();
    let job = jobs
        .create(pb::CreateJobRequest { spec: Some(spec) })
        .await?
        .into_inner()
        .job
        .context("no job")?;
    let deadline = Instant::now() + Duration::from_secs(600);
    let state = loop {
        let j = jobs
            .get(pb::GetJobRequest { id: job.id.clone() })
            .await?
            .into_inner()
            .job
            .context("no job")?;
        let state = j.status.as_ref().map(|s| s.state()).unwrap_or_default();
        if matches!(
            state,
            pb::JobState::Succeeded | pb::JobState::Failed | pb::JobState::Killed
        ) {
            break state;
        }
        if Instant::now() > deadline {
            bail!("the job did not finish within 600 s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let elapsed = start.elapsed().as_secs_f64();
    let server_cpu = cpu_s(server_pid) - cpu0;
    let agents_cpu: f64 = agent_pids.iter().map(|&p| cpu_s(p)).sum::<f64>() - agents_cpu0;
    let tasks_cpu: f64 = agent_pids
        .iter()
        .map(|&p| descendants_cpu_s(p))
        .sum::<f64>()
        - tasks_cpu0;
    let launchers_cpu: f64 =
        agent_pids.iter().map(|&p| launchers_cpu_s(p)).sum::<f64>() - launchers_cpu0;
    let client_cpu = cpu_s(std::process::id()) - client_cpu0;
    let kernel_cpu = kernel_threads_cpu_s(kernel_threads0.as_ref(), kernel_threads().as_ref());
    let (machine_cpu, steal) = {
        let (busy, steal) = machine_cpu_s();
        (busy - machine_cpu0.0, steal - machine_cpu0.1)
    };
    // Before the agents stop: the same company as before the job.
    let bare_after = tokio::task::block_in_place(|| bare_execs(o.bare_execs, cores))?;
    drop(agents);
    drop(server);
    // The agents' dirs go now, before the figures are reported.
    drop(agents_root);
    anyhow::ensure!(
        state == pb::JobState::Succeeded,
        "the job ended {}",
        state.as_str_name()
    );
    let n = f64::from(o.tasks);
    // CPU seconds as milliseconds per task, to the microsecond.
    let per_task_ms = |seconds: f64| (seconds * 1000.0 / n * 1000.0).round() / 1000.0;
    let tasks_per_s = n / elapsed;
    let bare = BareExecs::mean(bare_before, bare_after);
    let rate = |r: Option<BareExecs>| r.map(|r| r.per_s.round());
    Ok(json!({
        "agents_dir_fs": agents_fs,
        "agents_dir_places_passed_over": passed_over,
        "agents_dirs_in_recent_places": left_in_recent,
        "server_args": o.server_args,
        "agents": o.agents,
        "tasks": o.tasks,
        "seconds": (elapsed * 1000.0).round() / 1000.0,
        "tasks_per_s": tasks_per_s.round(),
        "bare_execs_per_s": rate(bare),
        "bare_execs_per_s_around": [rate(bare_before), rate(bare_after)],
        "bare_exec_machine_cpu_ms": bare.map(|b| (b.machine_cpu_ms * 1000.0).round() / 1000.0),
        "of_bare_execs": bare.map(|b| (tasks_per_s / b.per_s * 100.0).round() / 100.0),
        "server_cpu_ms_per_task": per_task_ms(server_cpu),
        "agents_cpu_ms_per_task": per_task_ms(agents_cpu),
        "agents_children_cpu_ms_per_task": per_task_ms(tasks_cpu),
        "launchers_cpu_ms_per_task": per_task_ms(launchers_cpu),
        "machine_cpu_ms_per_task": per_task_ms(machine_cpu),
        "client_cpu_ms_per_task": per_task_ms(client_cpu),
        "kernel_threads_cpu_ms_per_task": kernel_cpu.map(per_task_ms),
        "machine_steal_s": (steal * 100.0).round() / 100.0,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_execs_run_every_exec_asked_for() {
        assert_eq!(bare_execs(0, 2).unwrap(), None);
        for (total, loops) in [(7, 3), (3, 8), (1000, 2), (5, 0), (4, 4)] {
            let parts = split(total, loops);
            assert_eq!(
                parts.iter().sum::<u32>(),
                total,
                "{total} over {loops}: {parts:?}"
            );
            assert!(
                parts.len() <= loops.max(1),
                "{total} over {loops}: {parts:?}"
            );
            let (least, most) = (parts.iter().min().unwrap(), parts.iter().max().unwrap());
            assert!(
                *least > 0 && most - least <= 1,
                "{total} over {loops}: {parts:?}"
            );
        }
        // More loops than execs: one exec a loop (each loop runs its part
        // of `split`, or fails).
        let measured = bare_execs(3, 8).unwrap().unwrap();
        assert!(
            measured.per_s > 0.0 && measured.per_s.is_finite(),
            "{measured:?}"
        );
        let a = BareExecs {
            per_s: 2000.0,
            machine_cpu_ms: 0.8,
        };
        let b = BareExecs {
            per_s: 2400.0,
            machine_cpu_ms: 0.6,
        };
        let mean = BareExecs::mean(Some(a), Some(b)).unwrap();
        assert!((mean.per_s - 2200.0).abs() < 1e-9 && (mean.machine_cpu_ms - 0.7).abs() < 1e-9);
        assert_eq!(BareExecs::mean(None, Some(b)), Some(b));
        assert_eq!(BareExecs::mean(None, None), None);
    }

    #[test]
    fn kernel_threads_count_what_the_live_ones_used_since() {
        let before = HashMap::from([((10, 5), 1.0), ((11, 6), 2.0), ((12, 7), 4.0)]);
        // 10 used 0.5 more; 11 ended; 12 is another thread on the same pid
        // (another start time): all its time is new; 13 is new.
        let after = HashMap::from([((10, 5), 1.5), ((12, 9), 0.25), ((13, 8), 0.125)]);
        let used = kernel_threads_cpu_s(Some(&before), Some(&after)).unwrap();
        assert!((used - 0.875).abs() < 1e-9, "{used}");
        assert_eq!(kernel_threads_cpu_s(None, Some(&after)), None);
        if let Some(now) = kernel_threads() {
            // kthreadd itself, alive for as long as the machine.
            assert!(now.keys().any(|&(pid, _)| pid == 2), "{now:?}");
        }
    }

    #[test]
    fn only_recent_well_formed_neighbourhoods_are_avoided() {
        let now = 10_000;
        let text = format!(
            "{} 7 1\n{} 7 2\n{} 8 1\nnot a line\n{} 7\n",
            now - RECENT_S,
            now - RECENT_S + 1,
            now,
            now
        );
        let (recent, kept) = recent_in(&text, now);
        assert_eq!(recent, [(7, 2), (8, 1)].into_iter().collect());
        assert_eq!(kept.len(), 2);
    }

    fn place_at(path: &std::path::Path) -> Place {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).unwrap();
        place_of(meta.dev(), meta.ino())
    }

    #[test]
    fn a_work_dir_is_not_placed_in_an_avoided_neighbourhood_while_tries_last() {
        // Not spread: the file system puts the dirs near their parent, so
        // tries tend to land where the first did.
        let root = tempfile::tempdir().unwrap();
        let none = std::collections::BTreeSet::new();
        let (first, place, passed) = place_work_dir(root.path(), "a", &none).unwrap();
        assert_eq!((first.clone(), passed), (root.path().join("a"), 0));
        assert_eq!(place_at(&first), place);
        let avoid = [place].into_iter().collect();
        let (dir, again, passed) = place_work_dir(root.path(), "b", &avoid).unwrap();
        let tries: Vec<std::path::PathBuf> = std::iter::once(root.path().join("b"))
            .chain((1..=passed).map(|n| root.path().join(format!("b-{n}"))))
            .collect();
        assert_eq!(&dir, tries.last().unwrap());
        assert_eq!(place_at(&dir), again);
        // Every try before the last landed in an avoided place, and was
        // left there, empty, for the allocator to count.
        for passed_over in &tries[..tries.len() - 1] {
            assert!(avoid.contains(&place_at(passed_over)), "{passed_over:?}");
        }
        assert!(
            !avoid.contains(&again) || passed == PLACEMENT_TRIES - 1,
            "{again:?} after {passed} tries"
        );
        let made = std::fs::read_dir(root.path()).unwrap().count();
        assert_eq!(made, 2 + passed as usize);
    }

    #[test]
    fn the_neighbourhoods_under_a_dir_are_its_own_and_its_entries() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("s/run")).unwrap();
        std::fs::write(root.path().join("s/run/stdout"), b"").unwrap();
        let places = neighbourhoods_under(root.path());
        for path in ["", "s", "s/run", "s/run/stdout"] {
            assert!(
                places.contains(&place_at(&root.path().join(path))),
                "{path}"
            );
        }
    }

    #[test]
    fn only_ext_without_a_journal_steps_over_recent_deletions() {
        let journals = |names: &[&str]| names.iter().map(|&n| n.to_owned()).collect::<Vec<_>>();
        assert!(journal_less_ext(Some("vda"), "ext4", &journals(&[])));
        assert!(journal_less_ext(Some("vda"), "ext2", &journals(&["vdb-8"])));
        // Another device's journal whose name starts like this one's.
        assert!(journal_less_ext(
            Some("vda"),
            "ext4",
            &journals(&["vda1-8"])
        ));
        assert!(journal_less_ext(
            Some("dm-1"),
            "ext4",
            &journals(&["dm-10-8"])
        ));
        assert!(!journal_less_ext(
            Some("vda"),
            "ext4",
            &journals(&["vda-8"])
        ));
        assert!(!journal_less_ext(
            Some("dm-0"),
            "ext4",
            &journals(&["dm-0-8"])
        ));
        assert!(!journal_less_ext(Some("vda"), "xfs", &journals(&[])));
        assert!(!journal_less_ext(None, "tmpfs", &journals(&[])));
        assert!(!journal_less_ext(None, "ext4", &journals(&[])));
    }

    #[test]
    fn the_block_device_is_the_kernels_name_for_it() {
        // Whatever holds the temporary directory: a device name the kernel
        // lists in /sys/block (a disk, or a partition of one), or none.
        let dir = tempfile::tempdir().unwrap();
        if let Some(name) = block_device_of(dir.path()) {
            let listed = std::path::Path::new("/sys/class/block").join(&name);
            assert!(listed.exists(), "{name}");
        }
        assert_eq!(block_device_of(std::path::Path::new("/proc")), None);
    }

    #[test]
    fn the_file_system_is_the_last_longest_mount_over_the_path() {
        let mounts = "/dev/vda / ext4 rw 0 0\n\
                      tmpfs /tmp tmpfs rw 0 0\n\
                      /dev/vdb /tmp xfs rw 0 0\n\
                      tmpfs /tmpx tmpfs rw 0 0\n";
        let at = |p: &str| fs_type_in(mounts, std::path::Path::new(p));
        assert_eq!(at("/tmp/a").as_deref(), Some("xfs"));
        assert_eq!(at("/tmpx").as_deref(), Some("tmpfs"));
        assert_eq!(at("/home").as_deref(), Some("ext4"));
        assert_eq!(fs_type_in("", std::path::Path::new("/")), None);
    }
}
