//! Host ports handed to tasks from the agent's `--ports` range.
//!
//! A port is taken while a run that holds it is alive (adopted runs take
//! theirs back from `run.json` when the agent restarts) and returns to the
//! pool when the run ends. The allocator walks the range round-robin from
//! where it last stopped, so a port just released is the last to be reused
//! (a client of the old task is less likely to reach the new one), and it
//! skips ports something else on the host is listening on, found by trying
//! to bind them.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{Ipv4Addr, TcpListener};
use std::str::FromStr;

/// An inclusive range of ports, `first-last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    /// How many ports.
    pub fn len(&self) -> u32 {
        u32::from(self.last) - u32::from(self.first) + 1
    }

    /// Never true (a range has at least one port); for clippy's sake.
    pub fn is_empty(&self) -> bool {
        false
    }

    fn contains(&self, port: u16) -> bool {
        (self.first..=self.last).contains(&port)
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

impl FromStr for PortRange {
    type Err = String;

    /// `31000-31999`, or one port `31000`.
    fn from_str(text: &str) -> Result<PortRange, String> {
        let parse = |part: &str| -> Result<u16, String> {
            match part.trim().parse::<u16>() {
                Ok(0) | Err(_) => Err(format!(
                    "{:?} is not a port number (1 to 65535)",
                    part.trim()
                )),
                Ok(port) => Ok(port),
            }
        };
        let (first, last) = match text.split_once('-') {
            Some((first, last)) => (parse(first)?, parse(last)?),
            None => {
                let port = parse(text)?;
                (port, port)
            }
        };
        if first > last {
            return Err(format!("the range {first}-{last} is empty (first > last)"));
        }
        Ok(PortRange { first, last })
    }
}

/// Where Linux keeps the ports it picks for outgoing connections.
const EPHEMERAL_RANGE: &str = "/proc/sys/net/ipv4/ip_local_port_range";
/// Ports excluded from that pick by the operator.
const RESERVED_PORTS: &str = "/proc/sys/net/ipv4/ip_local_reserved_ports";

/// The kernel's ephemeral port range, the ports it gives outgoing
/// connections (`ip_local_port_range`, e.g. `32768\t60999`), if readable.
pub fn ephemeral_range() -> Option<PortRange> {
    parse_ephemeral(&std::fs::read_to_string(EPHEMERAL_RANGE).ok()?)
}

fn parse_ephemeral(text: &str) -> Option<PortRange> {
    let mut parts = text.split_whitespace().map(|p| p.parse::<u16>().ok());
    let (Some(Some(first)), Some(Some(last))) = (parts.next(), parts.next()) else {
        return None;
    };
    (first >= 1 && first <= last).then_some(PortRange { first, last })
}

/// Ports reserved from the ephemeral pick (`ip_local_reserved_ports`:
/// `8080,31000-31999`); unreadable or malformed parts count as none.
fn parse_reserved(text: &str) -> Vec<PortRange> {
    text.split(',')
        .filter(|part| !part.trim().is_empty())
        .filter_map(|part| part.parse::<PortRange>().ok())
        .collect()
}

/// The ports of `offered` that the kernel may also give an outgoing
/// connection: those in `ephemeral` and not in `reserved`, as
/// (first, last, how many). Such a port can pass the allocator's bind
/// check and then be taken by a connection before the task binds it, and
/// the task fails with "address in use".
fn exposed(
    offered: PortRange,
    ephemeral: PortRange,
    reserved: &[PortRange],
) -> Option<(u16, u16, u32)> {
    let first = offered.first.max(ephemeral.first);
    let last = offered.last.min(ephemeral.last);
    if first > last {
        return None;
    }
    let mut span: Option<(u16, u16)> = None;
    let mut count = 0u32;
    for port in first..=last {
        if reserved.iter().any(|r| r.contains(port)) {
            continue;
        }
        count += 1;
        span = Some(span.map_or((port, port), |(a, _)| (a, port)));
    }
    span.map(|(a, b)| (a, b, count))
}

/// A warning for `--ports` when it overlaps the kernel's ephemeral range
/// (less the reserved ports), naming the overlap and the two fixes.
pub fn ephemeral_overlap_warning(offered: PortRange) -> Option<String> {
    let ephemeral = ephemeral_range()?;
    let reserved = std::fs::read_to_string(RESERVED_PORTS)
        .map(|t| parse_reserved(&t))
        .unwrap_or_default();
    overlap_warning(offered, ephemeral, &reserved)
}

fn overlap_warning(
    offered: PortRange,
    ephemeral: PortRange,
    reserved: &[PortRange],
) -> Option<String> {
    let (first, last, count) = exposed(offered, ephemeral, reserved)?;
    Some(format!(
        "{count} port(s) of --ports {offered} (between {first} and {last}) are in the kernel's \
         ephemeral range {ephemeral} ({EPHEMERAL_RANGE}): an outgoing connection may take one \
         between the agent's check and the task's bind, and the task then fails with \
         \"address in use\"; offer ports below {} or reserve them \
         (add {offered} to net.ipv4.ip_local_reserved_ports)",
        ephemeral.first
    ))
}

/// Which ports of the range are taken.
#[derive(Debug)]
pub(crate) struct PortAllocator {
    range: Option<PortRange>,
    in_use: BTreeSet<u16>,
    next: u16,
}

impl PortAllocator {
    pub(crate) fn new(range: Option<PortRange>) -> PortAllocator {
        PortAllocator {
            range,
            in_use: BTreeSet::new(),
            next: range.map_or(0, |r| r.first),
        }
    }

    /// The ports the agent offers.
    pub(crate) fn ranges(&self) -> Vec<PortRange> {
        self.range.into_iter().collect()
    }

    /// How many ports the agent offers.
    pub(crate) fn capacity(&self) -> u32 {
        self.range.map_or(0, |r| r.len())
    }

    /// Takes `count` distinct free ports, or none and says why.
    pub(crate) fn allocate(&mut self, count: usize) -> Result<Vec<u16>, String> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let Some(range) = self.range else {
            return Err(format!(
                "the task asks for {count} port(s) but the agent has no --ports range"
            ));
        };
        let mut taken = Vec::with_capacity(count);
        // One lap around the range at most.
        for _ in 0..range.len() {
            let port = self.next;
            self.next = if port >= range.last {
                range.first
            } else {
                port + 1
            };
            if self.in_use.contains(&port) || !bindable(port) {
                continue;
            }
            taken.push(port);
            if taken.len() == count {
                self.in_use.extend(&taken);
                return Ok(taken);
            }
        }
        Err(format!(
            "the task asks for {count} port(s) but only {} of the range {range} are free",
            taken.len()
        ))
    }

    /// Takes the ports the server chose for a run, all or none: each in
    /// the range and not held by another run.
    pub(crate) fn take(&mut self, ports: &[u16]) -> Result<(), String> {
        let Some(range) = self.range else {
            return Err(format!(
                "the server chose port(s) {ports:?} but the agent has no --ports range"
            ));
        };
        for (i, &port) in ports.iter().enumerate() {
            if !range.contains(port) {
                return Err(format!(
                    "the server chose port {port}, outside this agent's range {range}"
                ));
            }
            if self.in_use.contains(&port) || ports[..i].contains(&port) {
                return Err(format!(
                    "the server chose port {port}, which another run on this host holds"
                ));
            }
        }
        self.in_use.extend(ports);
        Ok(())
    }

    /// Marks ports held by a run found on disk as taken.
    pub(crate) fn mark_used(&mut self, ports: impl IntoIterator<Item = u16>) {
        for port in ports {
            if self.range.is_some_and(|r| r.contains(port)) {
                self.in_use.insert(port);
            }
        }
    }

    pub(crate) fn release(&mut self, ports: impl IntoIterator<Item = u16>) {
        for port in ports {
            self.in_use.remove(&port);
        }
    }
}

/// Nothing on the host listens on `port` (TCP, all addresses).
fn bindable(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).is_ok()
}

/// `PELOTON_PORT_<NAME>`: the name upper-cased, anything but ASCII letters
/// and digits turned into `_`.
pub(crate) fn port_env_name(name: &str) -> String {
    let mut env = String::from("PELOTON_PORT_");
    env.extend(name.chars().map(|c| {
        if c.is_ascii_alphanumeric() {
            c.to_ascii_uppercase()
        } else {
            '_'
        }
    }));
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_with_clear_errors() {
        assert_eq!(
            "31000-31999".parse::<PortRange>(),
            Ok(PortRange {
                first: 31000,
                last: 31999
            })
        );
        assert_eq!("8080".parse::<PortRange>().map(|r| r.len()), Ok(1));
        assert_eq!(
            "9-3".parse::<PortRange>(),
            Err("the range 9-3 is empty (first > last)".to_owned())
        );
        assert_eq!(
            "0-10".parse::<PortRange>(),
            Err("\"0\" is not a port number (1 to 65535)".to_owned())
        );
        assert!("1-70000".parse::<PortRange>().is_err());
        assert!("x".parse::<PortRange>().is_err());
    }

    #[test]
    fn ports_in_the_ephemeral_range_are_named_unless_reserved() {
        let range = |t: &str| t.parse::<PortRange>().unwrap();
        let ephemeral = parse_ephemeral("32768\t60999\n").expect("the kernel's format");
        assert_eq!(ephemeral, range("32768-60999"));
        assert_eq!(parse_ephemeral("60999 32768"), None);
        assert_eq!(parse_ephemeral(""), None);
        // Below the range: nothing to say.
        assert_eq!(overlap_warning(range("31000-31999"), ephemeral, &[]), None);
        assert_eq!(overlap_warning(range("20000-32767"), ephemeral, &[]), None);
        // Across its start: the overlap is named.
        let w = overlap_warning(range("32000-32999"), ephemeral, &[]).expect("overlaps");
        assert!(w.contains("232 port(s) of --ports 32000-32999"), "{w}");
        assert!(w.contains("between 32768 and 32999"), "{w}");
        assert!(w.contains("below 32768"), "{w}");
        assert!(
            w.contains("add 32000-32999 to net.ipv4.ip_local_reserved_ports"),
            "{w}"
        );
        // Reserved ports are never given to connections.
        let reserved = parse_reserved("8080,32000-32899\n");
        assert_eq!(reserved, [range("8080"), range("32000-32899")]);
        let w = overlap_warning(range("32000-32999"), ephemeral, &reserved).expect("overlaps");
        assert!(
            w.contains("100 port(s)") && w.contains("between 32900 and 32999"),
            "{w}"
        );
        assert_eq!(
            overlap_warning(
                range("32000-32999"),
                ephemeral,
                &parse_reserved("32000-33000")
            ),
            None
        );
        assert_eq!(parse_reserved("\n"), []);
    }

    #[test]
    fn env_names() {
        assert_eq!(port_env_name("http"), "PELOTON_PORT_HTTP");
        assert_eq!(port_env_name("admin-x.2"), "PELOTON_PORT_ADMIN_X_2");
    }

    #[test]
    fn allocation_is_distinct_and_released() {
        let range = PortRange {
            first: 47100,
            last: 47103,
        };
        let mut ports = PortAllocator::new(Some(range));
        let a = ports.allocate(2).expect("two free");
        let b = ports.allocate(2).expect("two more");
        let mut all: Vec<u16> = a.iter().chain(&b).copied().collect();
        all.sort_unstable();
        all.dedup();
        // Some ports of the range may be busy on this machine; whatever was
        // handed out is distinct and in range.
        assert_eq!(all.len(), 4);
        assert!(all.iter().all(|&p| range.contains(p)));
        assert!(ports.allocate(1).is_err());
        ports.release(a);
        assert_eq!(ports.allocate(2).map(|p| p.len()), Ok(2));
        assert!(PortAllocator::new(None).allocate(1).is_err());
    }
}
