//! The command line's names for the API's enums: the proto value name without
//! its prefix, in lower case (`TASK_STATE_RUNNING` is `running`). Used for
//! flags, tables and JSON alike, so one vocabulary covers input and output.

use peloton_proto::v1::{
    CronOverlap, Health, HostState, JobState, JobType, PlacementStrategy, PoolKind, TaskState,
    UpdateState, VolumeLossPolicy,
};

/// A protobuf enum whose values the CLI names.
pub trait ProtoEnum: Copy + TryFrom<i32> + 'static {
    /// Prefix of every value name in the proto, e.g. `TASK_STATE_`.
    const PREFIX: &'static str;
    /// What the enum is, for error messages (`task state`).
    const WHAT: &'static str;
    /// Every value, in proto order.
    const ALL: &'static [Self];

    fn proto_name(self) -> &'static str;
}

macro_rules! proto_enum {
    ($ty:ty, $prefix:literal, $what:literal, [$($value:ident),+ $(,)?]) => {
        impl ProtoEnum for $ty {
            const PREFIX: &'static str = $prefix;
            const WHAT: &'static str = $what;
            const ALL: &'static [Self] = &[$(<$ty>::$value),+];

            fn proto_name(self) -> &'static str {
                self.as_str_name()
            }
        }
    };
}

proto_enum!(
    TaskState,
    "TASK_STATE_",
    "task state",
    [
        Unknown,
        Initialized,
        Pending,
        Ready,
        Placing,
        Placed,
        Launching,
        Running,
        Succeeded,
        Failed,
        Lost,
        Killed,
        Preempted,
        Backoff,
    ]
);
proto_enum!(
    JobState,
    "JOB_STATE_",
    "job state",
    [
        Unknown,
        Initialized,
        Pending,
        Running,
        Succeeded,
        Failed,
        Killing,
        Killed,
    ]
);
proto_enum!(
    HostState,
    "HOST_STATE_",
    "host state",
    [Unknown, Up, Draining, Down]
);
proto_enum!(
    JobType,
    "JOB_TYPE_",
    "job type",
    [Batch, Service, Stateful, Daemon]
);
proto_enum!(PoolKind, "POOL_KIND_", "pool kind", [Elastic, Static]);
proto_enum!(
    VolumeLossPolicy,
    "VOLUME_LOSS_POLICY_",
    "volume loss policy",
    [Wait, Relocate]
);
proto_enum!(
    CronOverlap,
    "CRON_OVERLAP_",
    "overlap policy",
    [Allow, Forbid, Replace]
);
proto_enum!(
    UpdateState,
    "UPDATE_STATE_",
    "update state",
    [
        Unknown,
        Initialized,
        RollingForward,
        Succeeded,
        Failed,
        RollingBackward,
        RolledBack,
        Paused,
        Aborted,
    ]
);
proto_enum!(
    Health,
    "HEALTH_",
    "health",
    [None, Unknown, Healthy, Unhealthy]
);
proto_enum!(
    PlacementStrategy,
    "PLACEMENT_STRATEGY_",
    "placement strategy",
    [Pack, Spread, FirstFit, GpuFrag,]
);

/// The CLI name of `value`: `running`, `first_fit`.
pub fn name<E: ProtoEnum>(value: E) -> String {
    let proto = value.proto_name();
    proto
        .strip_prefix(E::PREFIX)
        .unwrap_or(proto)
        .to_ascii_lowercase()
}

/// The CLI name of a raw enum field; a value this client does not know (a
/// newer server) shows as `unknown(17)` rather than being mistaken for 0.
pub fn name_of<E: ProtoEnum>(raw: i32) -> String {
    match E::try_from(raw) {
        Ok(value) => name(value),
        Err(_) => format!("unknown({raw})"),
    }
}

/// Parses a CLI name (case-insensitive); the error lists the accepted names.
pub fn parse<E: ProtoEnum>(text: &str) -> Result<E, String> {
    E::ALL
        .iter()
        .copied()
        .find(|&value| name(value).eq_ignore_ascii_case(text))
        .ok_or_else(|| {
            let accepted: Vec<String> = E::ALL.iter().map(|&value| name(value)).collect();
            format!(
                "unknown {} `{text}` (expected one of: {})",
                E::WHAT,
                accepted.join(", ")
            )
        })
}

/// Job states a job never leaves.
pub fn is_terminal_job_state(state: JobState) -> bool {
    matches!(
        state,
        JobState::Succeeded | JobState::Failed | JobState::Killed
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_for_every_value() {
        fn check<E: ProtoEnum + PartialEq + std::fmt::Debug>() {
            for &value in E::ALL {
                let text = name(value);
                assert_eq!(text, text.to_ascii_lowercase());
                assert!(!text.contains(E::PREFIX));
                assert_eq!(parse::<E>(&text), Ok(value));
            }
        }
        check::<TaskState>();
        check::<JobState>();
        check::<HostState>();
        check::<JobType>();
        check::<PoolKind>();
        check::<PlacementStrategy>();
    }

    #[test]
    fn examples_of_names() {
        assert_eq!(name(TaskState::Running), "running");
        assert_eq!(name(PlacementStrategy::FirstFit), "first_fit");
        assert_eq!(parse::<JobState>("SUCCEEDED"), Ok(JobState::Succeeded));
        assert_eq!(name_of::<TaskState>(99), "unknown(99)");
        assert_eq!(name_of::<TaskState>(TaskState::Backoff as i32), "backoff");
    }

    #[test]
    fn unknown_name_lists_the_accepted_ones() {
        let err = parse::<JobState>("done").unwrap_err();
        assert!(err.starts_with("unknown job state `done`"), "{err}");
        assert!(err.contains("succeeded"), "{err}");
    }
}
