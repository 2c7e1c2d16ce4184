//! What runs use: CPU time and memory, measured for the server's usage
//! reports.
//!
//! A run with a cgroup (cgroup-v2 isolation) is measured from it:
//! `cpu.stat`'s `usage_usec`, and `memory.current` less the inactive file
//! cache of `memory.stat` (the pages the kernel reclaims first, as the
//! kubelet's "working set" counts them). A run without one is measured over
//! its process tree in `/proc`: `utime + stime + cutime + cstime` of each
//! process (children its processes reaped count with them), and the sum of
//! their PSS, as the memory watch measures it (`proc::resident_bytes`). The
//! tree's CPU time can go down when a process leaves it (reparented, or
//! reaped by a process outside it): the server takes a fall as no use.
//!
//! [`UsageMeter`] decides when a report is due: every interval, sooner when
//! a run's memory moved by a quarter since the last report (or runs came or
//! went), never more often than once per [`MIN_REPORT_SPACING_MS`]. It is
//! pure: the caller measures and passes the time in. Sandboxes' disk is not
//! measured (walking a sandbox is not cheap): reported as 0.

use std::fs;
use std::path::Path;

use crate::run::RunId;

/// Default of `--usage-interval`.
pub const DEFAULT_USAGE_INTERVAL_MS: u64 = 10_000;
/// Most runs in one report (the rest are left out: an agent holds at most
/// `--max-runs`, up to 100,000, but a report must stay a small message).
pub const MAX_USAGE_RUNS: usize = 10_000;
/// Reports never come closer together than this.
pub const MIN_REPORT_SPACING_MS: u64 = 1_000;
/// A run whose memory moved by more than this fraction (in per cent) of
/// what was last reported is reported again early.
const MEMORY_CHANGE_PERCENT: u64 = 25;

/// What one run uses at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunUsage {
    pub key: RunId,
    /// CPU time used since it started, µs (cumulative).
    pub cpu_usec: u64,
    /// Memory held now, bytes.
    pub memory_bytes: u64,
    /// Bytes in its sandbox (0: not measured).
    pub disk_bytes: u64,
}

/// Every live run's usage at `time_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UsageReport {
    pub time_ms: u64,
    pub runs: Vec<RunUsage>,
}

/// `usage_usec` of a cgroup v2 `cpu.stat`.
pub(crate) fn parse_cpu_stat(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse().ok())
}

/// A cgroup's working set: `memory.current` less `inactive_file` of its
/// `memory.stat` (never below zero).
pub(crate) fn working_set_bytes(current: &str, stat: &str) -> Option<u64> {
    let current: u64 = current.trim().parse().ok()?;
    let inactive: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("inactive_file "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    Some(current.saturating_sub(inactive))
}

/// `utime + stime + cutime + cstime` (fields 14 to 17) of a
/// `/proc/<pid>/stat` line, in clock ticks. Fields are counted from the
/// last `)`, as the command name may hold spaces and parentheses.
pub(crate) fn parse_stat_cpu_ticks(text: &str) -> Option<u64> {
    let close = text.rfind(')')?;
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // `rest[0]` is field 3 (state).
    (14..=17).try_fold(0u64, |sum, field| {
        let v: i64 = rest.get(field - 3)?.parse().ok()?;
        Some(sum.saturating_add(u64::try_from(v).unwrap_or(0)))
    })
}

/// Clock ticks per second (`CLK_TCK`).
fn ticks_per_second() -> u64 {
    static HZ: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *HZ.get_or_init(
        || match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
            Ok(Some(hz)) if hz > 0 => u64::try_from(hz).unwrap_or(100),
            _ => 100,
        },
    )
}

/// CPU time (µs) and memory (bytes) of a cgroup; `None` if it cannot be
/// read (gone).
pub(crate) fn measure_cgroup(dir: &Path) -> Option<(u64, u64)> {
    let cpu = parse_cpu_stat(&fs::read_to_string(dir.join("cpu.stat")).ok()?)?;
    let memory = working_set_bytes(
        &fs::read_to_string(dir.join("memory.current")).ok()?,
        &fs::read_to_string(dir.join("memory.stat")).unwrap_or_default(),
    )?;
    Some((cpu, memory))
}

/// CPU time (µs) and memory (bytes) of these processes; those gone
/// meanwhile count nothing.
pub(crate) fn measure_processes(pids: &[u32]) -> (u64, u64) {
    let ticks: u64 = pids
        .iter()
        .filter_map(|pid| {
            let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            parse_stat_cpu_ticks(&text)
        })
        .fold(0, u64::saturating_add);
    let cpu_usec = ticks.saturating_mul(1_000_000) / ticks_per_second();
    (cpu_usec, crate::proc::resident_bytes(pids))
}

/// When usage reports go out (see the module's documentation).
#[derive(Debug, Clone)]
pub struct UsageMeter {
    interval_ms: u64,
    /// When the last report went out (`None`: none yet on this session).
    sent_ms: Option<u64>,
    /// Memory of each run in the last report, by key.
    sent_memory: std::collections::HashMap<RunId, u64>,
}

impl UsageMeter {
    /// A meter that reports every `interval_ms` (at least
    /// [`MIN_REPORT_SPACING_MS`]).
    pub fn new(interval_ms: u64) -> UsageMeter {
        UsageMeter {
            interval_ms: interval_ms.max(MIN_REPORT_SPACING_MS),
            sent_ms: None,
            sent_memory: Default::default(),
        }
    }

    /// How often the runs should be measured to see early changes: a fifth
    /// of the interval, at least [`MIN_REPORT_SPACING_MS`].
    pub fn measure_every_ms(&self) -> u64 {
        (self.interval_ms / 5).max(MIN_REPORT_SPACING_MS)
    }

    /// A new session: the next measurement is reported whatever it says.
    pub fn restart(&mut self) {
        self.sent_ms = None;
        self.sent_memory.clear();
    }

    /// Whether `report` (measured at `now_ms`) should go out; if so it is
    /// taken as sent.
    pub fn due(&mut self, report: &UsageReport, now_ms: u64) -> bool {
        let due = match self.sent_ms {
            None => true,
            Some(sent) if now_ms < sent.saturating_add(MIN_REPORT_SPACING_MS) => false,
            Some(sent) if now_ms >= sent.saturating_add(self.interval_ms) => true,
            Some(_) => self.changed(report),
        };
        if due {
            self.sent_ms = Some(now_ms);
            self.sent_memory = report
                .runs
                .iter()
                .map(|r| (r.key.clone(), r.memory_bytes))
                .collect();
        }
        due
    }

    /// Runs came or went, or one's memory moved by more than
    /// [`MEMORY_CHANGE_PERCENT`] of what was reported.
    fn changed(&self, report: &UsageReport) -> bool {
        report.runs.len() != self.sent_memory.len()
            || report
                .runs
                .iter()
                .any(|r| match self.sent_memory.get(&r.key) {
                    None => true,
                    Some(&before) => {
                        r.memory_bytes.abs_diff(before).saturating_mul(100)
                            > before.saturating_mul(MEMORY_CHANGE_PERCENT)
                    }
                })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(instance: u32) -> RunId {
        RunId {
            job_id: "j".into(),
            instance,
            run_id: 1,
            launch_id: u64::from(instance),
        }
    }

    fn report(memory: &[u64]) -> UsageReport {
        UsageReport {
            time_ms: 0,
            runs: memory
                .iter()
                .enumerate()
                .map(|(i, &m)| RunUsage {
                    key: key(i as u32),
                    cpu_usec: 0,
                    memory_bytes: m,
                    disk_bytes: 0,
                })
                .collect(),
        }
    }

    #[test]
    fn cpu_stat_gives_usage_usec() {
        let text = "usage_usec 1234567\nuser_usec 1000000\nsystem_usec 234567\nnr_periods 0\n";
        assert_eq!(parse_cpu_stat(text), Some(1_234_567));
        assert_eq!(parse_cpu_stat("user_usec 5\n"), None);
    }

    #[test]
    fn working_set_leaves_out_inactive_file_pages() {
        let stat = "anon 1000\nfile 5000\nactive_file 1000\ninactive_file 4000\n";
        assert_eq!(working_set_bytes("9000\n", stat), Some(5000));
        // No inactive_file line: all of memory.current.
        assert_eq!(working_set_bytes("9000\n", "anon 9000\n"), Some(9000));
        // Never below zero (the two files are read at different moments).
        assert_eq!(working_set_bytes("100\n", "inactive_file 4000\n"), Some(0));
        assert_eq!(working_set_bytes("max\n", ""), None);
    }

    #[test]
    fn proc_stat_cpu_is_user_and_system_time_with_reaped_children() {
        // A name with spaces and a parenthesis; utime 100, stime 20,
        // cutime 3, cstime 4 (fields 14 to 17).
        let text = "4242 (a b) c) R 1 4242 4242 0 -1 4194304 100 0 0 0 100 20 3 4 20 0 1 0 555 1000 10 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n";
        assert_eq!(parse_stat_cpu_ticks(text), Some(127));
        assert_eq!(parse_stat_cpu_ticks("4242 (x) R 1 2 3"), None);
    }

    #[test]
    fn the_own_process_is_measured() {
        // This process has run for a while: some CPU time and memory.
        let (cpu, memory) = measure_processes(&[std::process::id()]);
        assert!(memory > 0, "{memory}");
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(50) {}
        let (after, _) = measure_processes(&[std::process::id()]);
        assert!(after > cpu, "{after} after {cpu}");
    }

    #[test]
    fn reports_go_at_the_interval_or_early_on_a_memory_change() {
        let mut meter = UsageMeter::new(10_000);
        assert_eq!(meter.measure_every_ms(), 2_000);
        // The first one goes at once.
        assert!(meter.due(&report(&[100]), 0));
        // Nothing changed: not before the interval.
        assert!(!meter.due(&report(&[110]), 2_000));
        assert!(meter.due(&report(&[110]), 10_000));
        // More than a quarter more memory: early, but not within a second.
        assert!(!meter.due(&report(&[200]), 10_500));
        assert!(meter.due(&report(&[200]), 11_000));
        // A quarter exactly is not more than a quarter.
        assert!(!meter.due(&report(&[250]), 13_000));
        // A new run, or one gone, goes early.
        assert!(meter.due(&report(&[200, 5]), 14_000));
        assert!(meter.due(&report(&[200]), 15_000));
        // A new session reports at once.
        meter.restart();
        assert!(meter.due(&report(&[200]), 15_100));
    }

    #[test]
    fn the_interval_is_at_least_the_minimum_spacing() {
        let mut meter = UsageMeter::new(10);
        assert_eq!(meter.measure_every_ms(), MIN_REPORT_SPACING_MS);
        assert!(meter.due(&report(&[1]), 0));
        assert!(!meter.due(&report(&[1]), 999));
        assert!(meter.due(&report(&[1]), 1_000));
    }
}
