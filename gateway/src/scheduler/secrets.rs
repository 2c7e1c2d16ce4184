//! Jobs' secrets between the API's messages and the core's (which keeps
//! the values: see `lifecycle::Secret`).

use peloton_proto::v1 as pb;

use crate::lifecycle::Secret;

/// Secrets as the core keeps them (names validated by the service).
pub(super) fn from_pb(secrets: Vec<pb::Secret>) -> Vec<Secret> {
    secrets
        .into_iter()
        .map(|s| Secret {
            name: s.name,
            value: s.value,
        })
        .collect()
}

/// Secrets as messages, with their values (for launches; reads redact
/// them).
pub(super) fn to_pb(secrets: &[Secret]) -> Vec<pb::Secret> {
    secrets
        .iter()
        .map(|s| pb::Secret {
            name: s.name.clone(),
            value: s.value.clone(),
            size: s.value.len() as u32,
        })
        .collect()
}
