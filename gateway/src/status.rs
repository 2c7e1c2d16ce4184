//! The one place where the lifecycle core's errors become gRPC codes.

use peloton_engine::PoolError;
use tonic::{Code, Status};

use crate::lifecycle::Error;

/// The gRPC code of a refusal.
pub fn code(e: &Error) -> Code {
    match e {
        Error::JobNotFound(_)
        | Error::NoInstance { .. }
        | Error::HostNotFound(_)
        | Error::VolumeNotFound(_)
        | Error::UpdateNotFound(_) => Code::NotFound,
        Error::JobPool(_) => Code::NotFound,
        Error::Stale { .. } | Error::Precondition(_) => Code::FailedPrecondition,
        Error::Pool(p) => match p {
            PoolError::NotFound { .. } | PoolError::ParentNotFound { .. } => Code::NotFound,
            PoolError::AlreadyExists { .. } => Code::AlreadyExists,
            PoolError::TooManyPools { .. } => Code::ResourceExhausted,
            _ => Code::InvalidArgument,
        },
        Error::Invalid { .. } => Code::InvalidArgument,
        Error::Exhausted(_) => Code::ResourceExhausted,
        Error::Unavailable(_) => Code::Unavailable,
    }
}

/// A refusal as a gRPC status.
pub fn status(e: Error) -> Status {
    Status::new(code(&e), e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_code() {
        let cases = [
            (
                Error::JobNotFound("j".into()),
                Code::NotFound,
                "job j not found",
            ),
            (
                Error::NoInstance {
                    job: "j".into(),
                    instance: 5,
                    count: 2,
                },
                Code::NotFound,
                "job j has no instance 5 (it has 2)",
            ),
            (
                Error::HostNotFound("h".into()),
                Code::NotFound,
                "host h not found",
            ),
            (
                Error::Stale {
                    what: "job j".into(),
                    given: 1,
                    current: 2,
                },
                Code::FailedPrecondition,
                "job j: version 1 is stale; the current version is 2",
            ),
            (
                Error::Pool(PoolError::AlreadyExists { path: "/a".into() }),
                Code::AlreadyExists,
                "",
            ),
            (
                Error::invalid("spec.x", "bad"),
                Code::InvalidArgument,
                "spec.x: bad",
            ),
            (
                Error::Precondition("no".into()),
                Code::FailedPrecondition,
                "no",
            ),
            (
                Error::Exhausted("full".into()),
                Code::ResourceExhausted,
                "full",
            ),
            (Error::Unavailable("away".into()), Code::Unavailable, "away"),
        ];
        for (e, c, message) in cases {
            let s = status(e);
            assert_eq!(s.code(), c);
            if !message.is_empty() {
                assert_eq!(s.message(), message);
            }
        }
    }
}
