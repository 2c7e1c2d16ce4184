//! Why the core refused an input. Every refusal changes nothing. The shell
//! maps each kind to a gRPC code in one place (`crate::status`).

use peloton_engine::PoolError;

/// A refused input.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Error {
    /// No job with this id.
    #[error("job {0} not found")]
    JobNotFound(String),
    /// The job has fewer instances.
    #[error("job {job} has no instance {instance} (it has {count})")]
    NoInstance {
        /// Job id.
        job: String,
        /// Asked for.
        instance: u32,
        /// Instances it has.
        count: u32,
    },
    /// No volume with this id.
    #[error("volume {0} not found")]
    VolumeNotFound(String),
    /// No update with this id.
    #[error("update {0} not found")]
    UpdateNotFound(String),
    /// No host with this name.
    #[error("host {0} not found")]
    HostNotFound(String),
    /// No host pool with this name.
    #[error("host pool {0:?} not found")]
    HostPoolNotFound(String),
    /// Something else the input names does not exist.
    #[error("{0}")]
    NotFound(String),
    /// Something of this name exists already.
    #[error("{0}")]
    AlreadyExists(String),
    /// The caller's version is not the current one.
    #[error("{what}: version {given} is stale; the current version is {current}")]
    Stale {
        /// What ("job …", "pool …").
        what: String,
        /// Given.
        given: u64,
        /// Current.
        current: u64,
    },
    /// The pool tree refused a change or a lookup.
    #[error("{0}")]
    Pool(PoolError),
    /// A job names a pool that does not exist.
    #[error("spec.pool: {0}")]
    JobPool(PoolError),
    /// A field of the request is wrong.
    #[error("{field}: {problem}")]
    Invalid {
        /// The field.
        field: String,
        /// The problem.
        problem: String,
    },
    /// The request is fine but the state does not allow it now.
    #[error("{0}")]
    Precondition(String),
    /// A bound is reached (engine queues full); retry later.
    #[error("{0}")]
    Exhausted(String),
    /// Something the request needs is not reachable now.
    #[error("{0}")]
    Unavailable(String),
    /// A host is bound to another agent: an agent may take a host bound
    /// to another only once the host has been declared lost.
    #[error(
        "host {host} belongs to another agent (agent id {holder:?}) and is not lost; this agent \
         (agent id {agent:?}) may take it only once that one has stayed away past the host-lost \
         timeout — give each agent its own --host"
    )]
    HostHeld {
        /// Host name.
        host: String,
        /// The agent it is bound to.
        holder: String,
        /// The agent that asked.
        agent: String,
    },
    /// Another agent's live session holds the host.
    #[error(
        "host {host} is held by another agent (agent id {holder:?}, connected, heard from \
         {silent_ms} ms ago); this agent (agent id {agent:?}) may take it only once that one has \
         been silent for {after_ms} ms — give each agent its own --host"
    )]
    HostHeldBySession {
        /// Host name.
        host: String,
        /// The holder's agent id.
        holder: String,
        /// The newcomer's agent id.
        agent: String,
        /// How long the holder has been silent.
        silent_ms: u64,
        /// How long it must be silent to be taken over.
        after_ms: u64,
    },
}

impl Error {
    /// An invalid field.
    pub fn invalid(field: &str, problem: impl std::fmt::Display) -> Self {
        Error::Invalid {
            field: field.to_string(),
            problem: problem.to_string(),
        }
    }
}
