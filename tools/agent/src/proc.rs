//! Processes as `/proc` shows them: identity, liveness, trees, signals.
//!
//! A pid alone does not name a process for long: after it exits the kernel
//! may hand the number to someone else. Every process the agent keeps track
//! of is therefore a [`ProcessIdentity`], the pid *and* its start time from
//! `/proc/<pid>/stat`, and a process is alive only while both match and it is
//! not a zombie. Trees are found by scanning every `/proc/<pid>/stat` for
//! parent links, and tasks that left the tree (reparented after their parent
//! died) by the `PELOTON_SANDBOX=<dir>` entry the agent puts in every task's
//! environment.

use std::collections::HashMap;
use std::fs;
use std::path::Path;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

/// One line of `/proc/<pid>/stat`, the fields the agent needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcStat {
    pub(crate) pid: u32,
    pub(crate) ppid: u32,
    pub(crate) pgid: u32,
    /// `R`, `S`, `Z`, ... (see proc(5)).
    pub(crate) state: char,
    /// Clock ticks since boot when the process started.
    pub(crate) start_ticks: u64,
}

impl ProcStat {
    fn is_dead(&self) -> bool {
        // A zombie has exited; only its parent's wait is missing. `X` is
        // "dead" (never normally visible).
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) is in parentheses
/// and may itself contain spaces and parentheses, so fields are counted from
/// the *last* `)`.
pub(crate) fn parse_stat(text: &str) -> Option<ProcStat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let pid = text[..open].trim().parse().ok()?;
    // Fields after the name start at field 3 (state).
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    let field = |n: usize| rest.get(n - 3).copied();
    Some(ProcStat {
        pid,
        state: field(3)?.chars().next()?,
        ppid: field(4)?.parse().ok()?,
        pgid: field(5)?.parse().ok()?,
        start_ticks: field(22)?.parse().ok()?,
    })
}

pub(crate) fn read_stat(pid: u32) -> Option<ProcStat> {
    let mut buffer = [0u8; SMALL_PROC_FILE];
    let text = read_small(Path::new(&format!("/proc/{pid}/stat")), &mut buffer).ok()?;
    parse_stat(std::str::from_utf8(text).ok()?)
}

/// CLOCK_BOOTTIME now, in nanoseconds: the clock the kernel stamps a new
/// process with (see [`start_ticks_between`]).
pub(crate) fn boottime_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).map_or(0, |t| {
        u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000
            + u64::try_from(t.tv_nsec()).unwrap_or(0)
    })
}

/// The start time that `/proc/<pid>/stat` shows (in clock ticks since
/// boot) for a process created between two readings of [`boottime_ns`],
/// when both fall in the same tick; `None` otherwise (read it from `/proc`
/// then). The kernel stamps a process with CLOCK_BOOTTIME as it creates it
/// and shows that stamp in whole ticks, rounded down; a clone and exec take
/// well under a tick (10 ms), so this saves the launcher the `/proc` lookup of
/// nearly every task it starts (its largest single cost per task).
pub(crate) fn start_ticks_between(before_ns: u64, after_ns: u64) -> Option<u64> {
    static NS_PER_TICK: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let ns_per_tick = *NS_PER_TICK.get_or_init(|| {
        match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
            Ok(Some(hz)) if hz > 0 && 1_000_000_000 % hz == 0 => {
                1_000_000_000 / u64::try_from(hz).unwrap_or(1)
            }
            // The kernel's conversion is not a plain division then.
            _ => 0,
        }
    });
    if ns_per_tick == 0 || before_ns == 0 || after_ns < before_ns {
        return None;
    }
    let tick = before_ns / ns_per_tick;
    (after_ns / ns_per_tick == tick).then_some(tick)
}

/// Room for a `/proc/<pid>/stat` line, whose longest is about 700 bytes.
const SMALL_PROC_FILE: usize = 2048;

/// The contents of a single-record `/proc` file (such as `stat`) that fits
/// in `buffer` (else an error): the kernel renders such a file whole and
/// hands all of it that fits to one `read`, so a short read is the whole
/// file. Three system calls instead of the five of `fs::read_to_string`,
/// which asks for the size first and reads until a read returns nothing.
/// Not for files of many records (`children`, `maps`, …): a read returns
/// only the records that fit in a page, so a short read is not the end.
fn read_small<'b>(path: &Path, buffer: &'b mut [u8]) -> std::io::Result<&'b [u8]> {
    use std::io::Read as _;
    let n = fs::File::open(path)?.read(buffer)?;
    if n == buffer.len() {
        return Err(std::io::Error::other(format!(
            "{} is longer than {n} bytes",
            path.display()
        )));
    }
    Ok(&buffer[..n])
}

/// A process named so that pid reuse is detected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct ProcessIdentity {
    pub(crate) pid: u32,
    pub(crate) start_ticks: u64,
}

impl ProcessIdentity {
    /// The identity of the process `pid` now, if it exists.
    pub(crate) fn of(pid: u32) -> Option<ProcessIdentity> {
        read_stat(pid).map(|stat| ProcessIdentity {
            pid,
            start_ticks: stat.start_ticks,
        })
    }

    /// Still the same process, and not yet exited.
    pub(crate) fn is_alive(&self) -> bool {
        match read_stat(self.pid) {
            Some(stat) => stat.start_ticks == self.start_ticks && !stat.is_dead(),
            None => false,
        }
    }

    /// Sends `signal` to the process group this process leads (the agent
    /// starts every task as a group leader), if it is still this process.
    pub(crate) fn signal_group(&self, signal: Signal) {
        if self.is_alive() {
            // ESRCH (already gone) is the outcome we wanted anyway.
            let _ = killpg(to_pid(self.pid), signal);
        }
    }
}

fn to_pid(pid: u32) -> Pid {
    Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX))
}

/// Every process on the machine (those that vanish while being read are
/// skipped).
fn all_processes() -> Vec<ProcStat> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let name = entry.ok()?.file_name();
            let pid: u32 = name.to_str()?.parse().ok()?;
            read_stat(pid)
        })
        .collect()
}

/// The processes of the machine at one moment, indexed for the questions
/// a kill asks. One snapshot serves every run handled in one pass, so
/// killing many runs at once costs one scan of `/proc`, not one per run.
#[derive(Debug)]
pub(crate) struct ProcSnapshot {
    /// Live (not zombie) processes by parent.
    children: HashMap<u32, Vec<u32>>,
    live: Vec<u32>,
    /// Live pids by their `PELOTON_SANDBOX=...` entry; built on first use
    /// (it reads every process's environment).
    by_marker: Option<HashMap<Vec<u8>, Vec<u32>>>,
}

impl ProcSnapshot {
    pub(crate) fn take() -> ProcSnapshot {
        ProcSnapshot::from_stats(all_processes())
    }

    fn from_stats(procs: Vec<ProcStat>) -> ProcSnapshot {
        let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
        let mut live = Vec::with_capacity(procs.len());
        for proc in procs.iter().filter(|p| !p.is_dead()) {
            children.entry(proc.ppid).or_default().push(proc.pid);
            live.push(proc.pid);
        }
        ProcSnapshot {
            children,
            live,
            by_marker: None,
        }
    }

    /// Every live descendant of `root` (not `root` itself).
    pub(crate) fn descendants(&self, root: u32) -> Vec<u32> {
        let mut found = Vec::new();
        let mut frontier = vec![root];
        // A tree has no cycles: each pid is reached once, from its parent.
        while let Some(parent) = frontier.pop() {
            for &child in self.children.get(&parent).map_or(&[][..], Vec::as_slice) {
                if child != root {
                    found.push(child);
                    frontier.push(child);
                }
            }
        }
        found
    }

    /// Live processes whose environment holds `marker` (a whole
    /// `PELOTON_SANDBOX=<dir>` entry), except the calling process.
    pub(crate) fn marked(&mut self, marker: &[u8]) -> Vec<u32> {
        let live = &self.live;
        let index = self.by_marker.get_or_insert_with(|| {
            let me = std::process::id();
            let mut index: HashMap<Vec<u8>, Vec<u32>> = HashMap::new();
            for &pid in live.iter().filter(|&&pid| pid != me) {
                let Ok(environ) = fs::read(format!("/proc/{pid}/environ")) else {
                    continue;
                };
                if let Some(entry) = environ
                    .split(|&b| b == 0)
                    .find(|entry| entry.starts_with(MARKER_PREFIX.as_bytes()))
                {
                    index.entry(entry.to_vec()).or_default().push(pid);
                }
            }
            index
        });
        index.get(marker).cloned().unwrap_or_default()
    }
}

const MARKER_PREFIX: &str = "PELOTON_SANDBOX=";

/// The environment entry that marks a run's processes.
pub(crate) fn sandbox_marker(sandbox: &Path) -> Vec<u8> {
    format!("{MARKER_PREFIX}{}", sandbox.display()).into_bytes()
}

/// A snapshot taken on first use, shared by everything one pass does.
#[derive(Debug, Default)]
pub(crate) struct LazySnapshot(Option<ProcSnapshot>);

impl LazySnapshot {
    pub(crate) fn get(&mut self) -> &mut ProcSnapshot {
        self.0.get_or_insert_with(ProcSnapshot::take)
    }
}

/// `signal` to each pid; already-gone ones are fine.
pub(crate) fn signal_all(pids: &[u32], signal: Signal) {
    for &pid in pids {
        let _ = kill(to_pid(pid), signal);
    }
}

/// Memory these processes really hold, in bytes: the sum of their
/// proportional set sizes (`Pss` of `/proc/PID/smaps_rollup`, so pages
/// shared between them — a forked worker's copy-on-write pages — count
/// once), or their resident sizes where the kernel has no rollup.
/// Processes gone meanwhile count nothing.
pub(crate) fn resident_bytes(pids: &[u32]) -> u64 {
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| u64::try_from(p).ok())
        .unwrap_or(4096);
    pids.iter()
        .map(|pid| {
            if let Ok(rollup) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) {
                let pss_kb = rollup
                    .lines()
                    .find_map(|l| l.strip_prefix("Pss:"))
                    .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok());
                if let Some(kb) = pss_kb {
                    return kb.saturating_mul(1024);
                }
            }
            std::fs::read_to_string(format!("/proc/{pid}/statm"))
                .ok()
                .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<u64>().ok())
                .map_or(0, |pages| pages.saturating_mul(page))
        })
        .sum()
}

/// SIGKILL to each pid.
pub(crate) fn kill_all(pids: &[u32]) {
    signal_all(pids, Signal::SIGKILL);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The start time worked out from the clock around a process's
    /// creation is the one `/proc` shows, whenever it is worked out.
    #[test]
    fn start_ticks_from_the_clock_match_proc() {
        let mut known = 0;
        for _ in 0..300 {
            let before = boottime_ns();
            let mut child = std::process::Command::new("true")
                .spawn()
                .expect("spawn true");
            let after = boottime_ns();
            let from_proc = ProcessIdentity::of(child.id())
                .expect("unreaped child")
                .start_ticks;
            child.wait().expect("wait");
            if let Some(ticks) = start_ticks_between(before, after) {
                assert_eq!(ticks, from_proc, "before {before} after {after}");
                known += 1;
            }
        }
        // A spawn takes far less than a tick: most fall inside one.
        assert!(known > 150, "only {known} of 300 within one tick");
        assert_eq!(start_ticks_between(25_000_000, 5_000_000), None);
        assert_eq!(start_ticks_between(19_000_000, 21_000_000), None);
        assert_eq!(start_ticks_between(21_000_000, 29_000_000), Some(2));
    }

    #[test]
    fn small_proc_files_are_read_whole_or_refused() {
        let path = Path::new("/proc/self/stat");
        let mut buffer = [0u8; SMALL_PROC_FILE];
        let text = read_small(path, &mut buffer).expect("stat fits");
        let whole = fs::read(path).expect("stat");
        // The same line (its times may have moved on: compare up to them).
        assert_eq!(text[..20], whole[..20]);
        assert_eq!(text.last(), Some(&b'\n'));
        let mut tiny = [0u8; 8];
        assert!(read_small(path, &mut tiny).is_err());
        assert!(read_small(Path::new("/proc/self/no-such-file"), &mut buffer).is_err());
    }

    #[test]
    fn stat_with_odd_command_names() {
        let text =
            "4242 (a (b) c) S 17 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100";
        let stat = parse_stat(text).expect("parses");
        assert_eq!(
            stat,
            ProcStat {
                pid: 4242,
                ppid: 17,
                pgid: 4242,
                state: 'S',
                start_ticks: 987654,
            }
        );
        assert_eq!(parse_stat("12 (x) S 1"), None);
    }

    #[test]
    fn own_process_is_alive_and_reuse_is_detected() {
        let me = ProcessIdentity::of(std::process::id()).expect("self exists");
        assert!(me.is_alive());
        let other = ProcessIdentity {
            start_ticks: me.start_ticks + 1,
            ..me
        };
        assert!(!other.is_alive());
    }

    #[test]
    fn descendants_follow_parent_links() {
        let p = |pid, ppid, state| ProcStat {
            pid,
            ppid,
            pgid: 1,
            state,
            start_ticks: 0,
        };
        let snapshot = ProcSnapshot::from_stats(vec![
            p(1, 0, 'S'),
            p(10, 1, 'S'),
            p(11, 10, 'S'),
            p(12, 11, 'R'),
            p(13, 11, 'Z'),
            p(20, 1, 'S'),
        ]);
        let mut found = snapshot.descendants(10);
        found.sort_unstable();
        assert_eq!(found, vec![11, 12]);
        assert_eq!(snapshot.descendants(20), Vec::<u32>::new());
    }

    #[test]
    fn this_process_is_never_marked() {
        let mut snapshot = ProcSnapshot::take();
        assert!(
            snapshot
                .descendants(std::process::id())
                .iter()
                .all(|&p| p != std::process::id())
        );
        assert_eq!(
            snapshot.marked(b"PELOTON_SANDBOX=/nowhere"),
            Vec::<u32>::new()
        );
    }
}
