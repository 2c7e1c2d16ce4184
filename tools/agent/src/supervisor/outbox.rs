//! The reports waiting to be sent: the latest per run, oldest first.

use std::collections::{HashMap, VecDeque};

use crate::run::{RunId, RunReport};

/// Reports waiting to be sent, at most (kills of unknown runs are the only
/// reports not bounded by the number of runs).
const MAX_OUTBOX: usize = 65_536;

/// The latest report per run, oldest first.
#[derive(Debug, Default)]
pub(super) struct Outbox {
    order: VecDeque<RunId>,
    reports: HashMap<RunId, RunReport>,
    dropped: u64,
}

impl Outbox {
    pub(super) fn push(&mut self, key: &RunId, report: RunReport) {
        if let Some(slot) = self.reports.get_mut(key) {
            *slot = report;
            return;
        }
        if self.reports.len() >= MAX_OUTBOX {
            self.dropped += 1;
            if self.dropped.is_power_of_two() {
                tracing::warn!(
                    dropped = self.dropped,
                    "report outbox full; dropping reports of unknown runs"
                );
            }
            return;
        }
        // Keys of removed reports linger in `order`; compact before it grows
        // far past the reports it indexes.
        if self.order.len() > 2 * self.reports.len() + 64 {
            let reports = &self.reports;
            self.order.retain(|k| reports.contains_key(k));
        }
        self.order.push_back(key.clone());
        self.reports.insert(key.clone(), report);
    }

    pub(super) fn take(&mut self, max: usize) -> Vec<RunReport> {
        let mut out = Vec::new();
        while out.len() < max {
            let Some(key) = self.order.pop_front() else {
                break;
            };
            if let Some(report) = self.reports.remove(&key) {
                out.push(report);
            }
        }
        out
    }

    /// Reports waiting.
    pub(super) fn len(&self) -> usize {
        self.reports.len()
    }

    pub(super) fn remove(&mut self, key: &RunId) {
        self.reports.remove(key);
    }
}
