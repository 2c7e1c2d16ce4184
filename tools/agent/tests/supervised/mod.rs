//! The supervisor driven in the server's words: every call that takes or
//! gives runs goes through the session's codec, as the server's messages
//! do, at the wall clock's time of the call; everything else is the
//! supervisor's own (through `Deref`).

#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::ops::{Deref, DerefMut};
use std::path::PathBuf;

use peloton_agent::{StopGrace, Supervisor, SupervisorConfig, SupervisorError, codec, now_ms};
use peloton_proto::v1;

#[derive(Debug)]
pub struct ProtoSupervisor(Supervisor);

impl ProtoSupervisor {
    pub fn open(config: SupervisorConfig) -> Result<ProtoSupervisor, SupervisorError> {
        Supervisor::open(config, now_ms()).map(ProtoSupervisor)
    }

    pub fn launch(&mut self, runs: &[v1::LaunchRun]) {
        let plans: Vec<_> = runs.iter().cloned().filter_map(codec::run_plan).collect();
        self.0.launch(&plans, now_ms());
    }

    pub fn kill(&mut self, kills: &[v1::KillRun]) {
        let kills: Vec<_> = kills.iter().filter_map(codec::kill_request).collect();
        self.0.kill(&kills, now_ms());
    }

    pub fn poll(&mut self) {
        self.0.poll(now_ms());
    }

    /// A poll as if the wall clock said `now_ms`.
    pub fn poll_at(&mut self, now_ms: u64) {
        self.0.poll(now_ms);
    }

    /// A kill as if the wall clock said `now_ms`.
    pub fn kill_at(&mut self, kills: &[v1::KillRun], now_ms: u64) {
        let kills: Vec<_> = kills.iter().filter_map(codec::kill_request).collect();
        self.0.kill(&kills, now_ms);
    }

    pub fn kill_all(&mut self, grace: StopGrace) -> usize {
        self.0.kill_all(grace, now_ms())
    }

    pub fn ack(&mut self, keys: &[v1::RunKey]) {
        let keys: Vec<_> = keys.iter().map(codec::run_id).collect();
        self.0.ack(&keys);
    }

    pub fn take_reports(&mut self, max: usize) -> Vec<v1::RunReport> {
        let reports = self.0.take_reports(max);
        reports.into_iter().map(codec::report).collect()
    }

    pub fn registration_runs(&mut self) -> Vec<v1::RunReport> {
        let reports = self.0.registration_runs();
        reports.into_iter().map(codec::report).collect()
    }

    pub fn read_log(&self, read: &v1::ReadLog) -> v1::LogChunk {
        codec::log_chunk(self.0.read_log(&codec::log_request(read)))
    }

    pub fn sandbox_dir(&self, key: &v1::RunKey) -> PathBuf {
        self.0.sandbox_dir(&codec::run_id(key))
    }
}

impl Deref for ProtoSupervisor {
    type Target = Supervisor;

    fn deref(&self) -> &Supervisor {
        &self.0
    }
}

impl DerefMut for ProtoSupervisor {
    fn deref_mut(&mut self) -> &mut Supervisor {
        &mut self.0
    }
}
