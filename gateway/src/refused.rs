//! Why the scheduling loop refused a command, as data: the core's typed
//! [`Error`], what only the shell can tell (the store cannot write, a
//! host's session, logs of simulated runs), or a read request its
//! validation refused. The loop builds no gRPC status: `crate::status`
//! maps each kind to a code, in one place, as the answer leaves the loop.

use crate::lifecycle::Error;

/// A command the loop refused. Every refusal changes nothing.
#[derive(Debug)]
pub enum Refused {
    /// The core refused the input.
    Core(Error),
    /// The store cannot write: writes are refused until it can.
    StoreUnwritable {
        /// The store's last error.
        error: String,
        /// For how long it has failed, in seconds.
        for_s: u64,
        /// How often the server retries, in seconds.
        retry_s: u64,
    },
    /// This server runs simulated hosts: no agents, no logs.
    SimulatedHosts(&'static str),
    /// The agent of a host is not connected.
    AgentNotConnected(String),
    /// A read asked past the end of what there is (a job's instances).
    OutOfRange(String),
}

impl From<Error> for Refused {
    fn from(e: Error) -> Self {
        Refused::Core(e)
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Core(e) => write!(f, "{e}"),
            Refused::StoreUnwritable {
                error,
                for_s,
                retry_s,
            } => write!(
                f,
                "the store cannot write ({error}), for {for_s} s now: writes are refused until it can and \
                 are retried by the server every {retry_s} s; reads are served"
            ),
            Refused::SimulatedHosts(what) => write!(f, "{what}"),
            Refused::AgentNotConnected(host) => {
                write!(f, "the agent of host {host} is not connected")
            }
            Refused::OutOfRange(what) => write!(f, "{what}"),
        }
    }
}
