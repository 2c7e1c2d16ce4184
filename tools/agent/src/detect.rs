//! What the machine offers, when the operator does not say: cores, memory,
//! disk of the work directory, GPUs.
//!
//! Detection reads the kernel's own accounts (`available_parallelism`,
//! which honours CPU affinity and cgroup quotas; `MemTotal` of
//! `/proc/meminfo`; `statvfs` of the work directory) and asks
//! `nvidia-smi` for GPUs only if it is installed, with a timeout, since a
//! wedged driver can hang it. Disk is the space *available* in the work
//! directory's file system, not its size: the rest is not the agent's to
//! offer.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::run::Resources;

const MIB: f64 = 1024.0 * 1024.0;
const NVIDIA_SMI_TIMEOUT: Duration = Duration::from_secs(10);

/// Every dimension detected.
pub fn detect_resources(work_dir: &Path) -> Resources {
    Resources {
        cpu: cpu_cores(),
        memory_mb: memory_mib().unwrap_or(0.0),
        disk_mb: disk_mib(work_dir).unwrap_or(0.0),
        gpu: f64::from(gpu_count()),
    }
}

fn cpu_cores() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| {
        f64::from(u32::try_from(n.get()).unwrap_or(u32::MAX))
    })
}

fn memory_mib() -> Option<f64> {
    parse_mem_total_mib(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// `MemTotal:  16314248 kB` → MiB (rounded down).
pub(crate) fn parse_mem_total_mib(meminfo: &str) -> Option<f64> {
    let line = meminfo.lines().find_map(|l| l.strip_prefix("MemTotal:"))?;
    let kib: u64 = line.trim().trim_end_matches("kB").trim().parse().ok()?;
    #[expect(
        clippy::cast_precision_loss,
        reason = "MiB of memory fit in f64 exactly"
    )]
    Some((kib / 1024) as f64)
}

fn disk_mib(dir: &Path) -> Option<f64> {
    let stat = nix::sys::statvfs::statvfs(dir).ok()?;
    #[expect(clippy::cast_precision_loss, reason = "an approximate MiB count")]
    #[allow(
        clippy::useless_conversion,
        reason = "the field types differ by platform"
    )]
    let bytes = u64::from(stat.blocks_available()) as f64 * stat.fragment_size() as f64;
    Some((bytes / MIB).floor())
}

/// GPUs `nvidia-smi` lists; 0 when it is missing, fails or hangs.
fn gpu_count() -> u32 {
    let on_path = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| dir.join("nvidia-smi").is_file())
    });
    if !on_path {
        return 0;
    }
    let Ok(mut child) = Command::new("nvidia-smi")
        .args(["--query-gpu=index", "--format=csv,noheader"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
    else {
        return 0;
    };
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(None) if started.elapsed() < NVIDIA_SMI_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(50));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                tracing::warn!("nvidia-smi failed or hung; reporting 0 GPUs");
                return 0;
            }
        }
    }
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        let _ = std::io::Read::read_to_string(&mut stdout, &mut out);
    }
    u32::try_from(out.lines().filter(|l| !l.trim().is_empty()).count()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo() {
        let text = "MemFree:  100 kB\nMemTotal:       16314248 kB\nSwap: 0 kB\n";
        assert_eq!(parse_mem_total_mib(text), Some(15931.0));
        assert_eq!(parse_mem_total_mib("nothing"), None);
    }

    #[test]
    fn this_machine_has_something() {
        let dir = tempfile::tempdir().expect("tempdir");
        let found = detect_resources(dir.path());
        assert!(found.cpu >= 1.0);
        assert!(found.memory_mb > 0.0);
        assert!(found.disk_mb >= 0.0);
    }
}

/// The local address this machine reaches `server` (a URL such as
/// `http://10.0.0.1:5000`) from: that of a UDP socket "connected" to it
/// (no packet is sent). 127.0.0.1 for a server on this machine. `None`
/// when the server's name does not resolve.
pub fn address_toward(server: &str) -> Option<std::net::IpAddr> {
    use std::net::{ToSocketAddrs, UdpSocket};
    let rest = server.split_once("://").map_or(server, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or(rest);
    let with_port = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        && !authority.ends_with(']')
    {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    };
    let target = with_port.to_socket_addrs().ok()?.next()?;
    let socket = if target.is_ipv4() {
        UdpSocket::bind(("0.0.0.0", 0))
    } else {
        UdpSocket::bind(("::", 0))
    }
    .ok()?;
    socket.connect(target).ok()?;
    Some(socket.local_addr().ok()?.ip())
}

#[cfg(test)]
mod address_tests {
    use super::address_toward;

    #[test]
    fn a_server_on_this_machine_is_reached_from_loopback() {
        assert_eq!(
            address_toward("http://127.0.0.1:5000").map(|a| a.to_string()),
            Some("127.0.0.1".to_owned())
        );
        assert_eq!(
            address_toward("https://localhost:5000/").map(|a| a.is_loopback()),
            Some(true)
        );
        assert_eq!(address_toward("http://no-such-host.invalid:5000"), None);
    }
}
