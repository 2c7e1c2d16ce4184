//! Gangs' rendezvous: the ports the server chooses for a gang's members
//! at placement, and what each member is told of its gang at launch.
//!
//! A gang is placed all or nothing in one cycle, so when its runs are
//! launched every member's host is known. Each member's named ports are
//! chosen then on its host (from the ranges its agent registered, less
//! the ports the host's other current runs hold), recorded with the run
//! (`Task::ports`, stored in its row) and sent with its launch, with the
//! gang: size, generation (the gang's number, new each time it is queued)
//! and every member's rank, instance, host, address and ports. A launch
//! sent again is built from the same records, so it says the same.

use std::sync::Arc;

use rustc_hash::FxHashSet;

use super::model::AssignedPorts;

/// An inclusive range of ports a host hands out to tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortRange {
    /// First port.
    pub first: u16,
    /// Last port (at least `first`).
    pub last: u16,
}

/// What a gang job's spec asks its members to be told beyond the
/// `PELOTON_GANG_*` environment (validated by the shell; opaque here).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RendezvousAsk {
    /// "pytorch", "tensorflow", "mpi" or "" (none).
    pub framework: Box<str>,
    /// The leader's rendezvous port's name ("": the task's first port).
    pub port: Box<str>,
}

/// One member of a gang as its peers see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GangMember {
    /// Its position in the gang (by instance), from 0.
    pub rank: u32,
    /// Its instance.
    pub instance: u32,
    /// Its host's name.
    pub host: Arc<str>,
    /// Its host's address, as its agent registered it ("" if unknown).
    pub address: Arc<str>,
    /// Its ports, by name.
    pub ports: AssignedPorts,
}

/// One start of a gang: the same for each of its members' launches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gang {
    /// The gang's number in its job: grows each time it is queued.
    pub generation: u64,
    /// Every member, by rank.
    pub members: Vec<GangMember>,
    /// What the job's spec asks for.
    pub ask: Option<Arc<RendezvousAsk>>,
}

/// A member's view of its gang, sent with its launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchRendezvous {
    /// The member's rank.
    pub rank: u32,
    /// The gang (shared by its members' launches).
    pub gang: Arc<Gang>,
}

/// `names.len()` distinct ports from `ranges` that are not in `taken`,
/// paired with the names in order: from the top of the ranges down (the
/// agent hands out ports to other tasks from the bottom up, so the two
/// rarely meet). `None` when too few are free.
pub fn choose_ports(
    ranges: &[PortRange],
    taken: &FxHashSet<u32>,
    names: &[Box<str>],
) -> Option<AssignedPorts> {
    if names.is_empty() {
        return Some(Box::default());
    }
    let mut chosen = Vec::with_capacity(names.len());
    let free = ranges
        .iter()
        .rev()
        .flat_map(|r| (u32::from(r.first)..=u32::from(r.last)).rev())
        .filter(|p| !taken.contains(p));
    for (name, port) in names.iter().zip(free) {
        chosen.push((name.clone(), port));
    }
    (chosen.len() == names.len()).then(|| {
        chosen.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        chosen.into_boxed_slice()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<Box<str>> {
        n.iter().map(|&s| s.into()).collect()
    }

    #[test]
    fn ports_come_from_the_top_and_skip_taken_ones() {
        let ranges = [
            PortRange {
                first: 100,
                last: 101,
            },
            PortRange {
                first: 200,
                last: 202,
            },
        ];
        let taken: FxHashSet<u32> = [202, 200].into_iter().collect();
        let got = choose_ports(&ranges, &taken, &names(&["b", "a", "c"])).unwrap();
        assert_eq!(
            &*got,
            &[("a".into(), 101), ("b".into(), 201), ("c".into(), 100)]
        );
        assert_eq!(
            choose_ports(&ranges, &taken, &names(&["a", "b", "c", "d"])),
            None
        );
        assert_eq!(
            choose_ports(&[], &taken, &names(&[])).as_deref(),
            Some(&[][..])
        );
    }
}
