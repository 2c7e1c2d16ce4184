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
