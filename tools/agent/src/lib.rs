//! The Peloton host agent: runs the server's tasks on one machine.
//!
//! The agent holds one gRPC stream to the server (`session`), and a
//! [`Supervisor`] that owns the runs: each run is a sandbox directory, a
//! task started, waited for and cleaned up after by the agent's launcher
//! process (`launcher`: one per agent, it outlives the agent), and the
//! records on disk that let a restarted agent take its runs back
//! (`record`). The design rule is that the disk, not the agent's
//! memory, is the truth about a run: the agent may die at any moment, its
//! tasks keep running, their exit statuses are still recorded, and the
//! next agent on the same work directory reports exactly what the server
//! has not yet acknowledged. Isolation is a cgroup v2 per run when the
//! machine allows it, else rlimits (`isolation`). Health checks of running
//! tasks (`health`) run on threads of their own, never under the
//! supervisor's lock, and only report: killing an unhealthy task is the
//! server's decision. Persistent volumes live outside the sandboxes and are
//! linked into them (`volumes`); secrets are private files in the sandbox
//! while the run lives (`secrets`). What runs use (CPU time, memory) is
//! measured for the server's usage reports (`usage`). A gang's tasks run an
//! MPICH job through the agent's binary (`peloton-agent mpirun`, `mpi`).
//!
//! The library exists for the binary and for tests that drive the
//! supervisor without a server; it must not know the gateway.

mod cli;
mod clock;
mod detect;
mod gc;
mod health;
mod isolation;
mod launcher;
mod mpi;
mod ports;
mod proc;
mod record;
mod rendezvous;
mod run;
mod secrets;
mod session;
mod supervisor;
mod usage;
mod volumes;

pub use cli::{
    AgentConfig, Args, ConfigError, IsolationChoice, ResourceOverrides, parse_resources,
};
pub use clock::now_ms;
pub use gc::{GcOutcome, GcPolicy};
pub use isolation::Isolation;
pub use launcher::run_launcher;
pub use mpi::{MpirunArgs, run_mpirun};
pub use ports::{PortRange, ephemeral_overlap_warning, ephemeral_range};
pub use run::{
    AssignedPort, CheckKind, Command, GangMember, GpuAssignment, Health, HealthCheckPlan,
    KillRequest, LogChunk, LogRequest, Phase, PhaseReport, Rendezvous, Resources, RunId, RunPlan,
    RunReport, Secret, TaskSpec,
};
pub use session::{MAX_REPORTS_PER_MESSAGE, OnExit, SessionConfig, codec, run as run_session};
pub use supervisor::{
    DEFAULT_MAX_RUNS, DEFAULT_OPEN_FILES, LogSource, MAX_LOG_CHUNK_BYTES, StopGrace, Supervisor,
    SupervisorConfig, SupervisorError,
};
pub use usage::{
    DEFAULT_USAGE_INTERVAL_MS, MIN_REPORT_SPACING_MS, RunUsage, UsageMeter, UsageReport,
};
pub use volumes::VolumeDeletion;
