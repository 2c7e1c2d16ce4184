//! How a failure reaches the user: one line on stderr and an exit code that
//! tells a script what kind of failure it was.

use std::fmt;
use std::io;

use tonic::{Code, Status};

use crate::spec::SpecError;

/// Exit code when the server said no or could not be reached.
pub const EXIT_SERVER: u8 = 1;
/// Exit code of a bad command line or spec file (clap uses it too).
pub const EXIT_USAGE: u8 = 2;
/// Exit code of `job create --wait` when the job ended other than SUCCEEDED.
pub const EXIT_JOB_NOT_SUCCEEDED: u8 = 3;

/// Something wrong with what the user asked for, found before any call.
#[derive(Debug)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// None of the servers could be reached: each with why.
#[derive(Debug)]
pub struct ConnectError {
    pub failures: Vec<(String, tonic::codegen::StdError)>,
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The transport error's own text is generic ("transport error"); the
        // useful part ("Connection refused") is at the bottom of its chain.
        let why = |source: &tonic::codegen::StdError| crate::channel::root_cause(&**source);
        match self.failures.as_slice() {
            [(address, source)] => write!(
                f,
                "cannot connect to the Peloton server at {address}: {}",
                why(source)
            )?,
            failures => {
                f.write_str("cannot connect to any of the Peloton servers: ")?;
                for (i, (address, source)) in failures.iter().enumerate() {
                    let separator = if i == 0 { "" } else { "; " };
                    write!(f, "{separator}{address}: {}", why(source))?;
                }
            }
        }
        write!(
            f,
            " (set --server, PELOTON_SERVER or `server:` in the config file)"
        )
    }
}

impl std::error::Error for ConnectError {}

/// Short lower-case name of a gRPC code, as in `invalid argument`.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid argument",
        Code::DeadlineExceeded => "deadline exceeded",
        Code::NotFound => "not found",
        Code::AlreadyExists => "already exists",
        Code::PermissionDenied => "permission denied",
        Code::ResourceExhausted => "resource exhausted",
        Code::FailedPrecondition => "failed precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out of range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

/// `<code>: <message>` for a gRPC status.
pub fn describe_status(status: &Status) -> String {
    let code = code_name(status.code());
    if status.message().is_empty() {
        code.to_owned()
    } else {
        format!("{code}: {}", status.message())
    }
}

/// What to print (after `error: `) and the exit code for a failed command.
///
/// The first error in the chain that this module knows decides the code and
/// its own wording; context added above it (`creating pool /a`) is kept in
/// front, outermost first.
pub fn report(err: &anyhow::Error) -> (String, u8) {
    let mut parts = Vec::new();
    for cause in err.chain() {
        let classified = if let Some(status) = cause.downcast_ref::<Status>() {
            Some((describe_status(status), EXIT_SERVER))
        } else if let Some(spec) = cause.downcast_ref::<SpecError>() {
            Some((spec.to_string(), EXIT_USAGE))
        } else if let Some(usage) = cause.downcast_ref::<UsageError>() {
            Some((usage.to_string(), EXIT_USAGE))
        } else {
            cause
                .downcast_ref::<ConnectError>()
                .map(|connect| (connect.to_string(), EXIT_SERVER))
        };
        match classified {
            Some((message, code)) => {
                parts.push(message);
                return (parts.join(": "), code);
            }
            None => parts.push(cause.to_string()),
        }
    }
    (format!("{err:#}"), EXIT_SERVER)
}

/// Whether the failure is stdout closed by its reader (`peloton ... | head`),
/// which is not worth a message.
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    // A connection to the server that broke ends in a broken pipe too: that
    // one is a failure.
    let from_server = err
        .chain()
        .any(|e| e.is::<Status>() || e.is::<ConnectError>() || e.is::<tonic::transport::Error>());
    !from_server
        && err
            .chain()
            .filter_map(|e| e.downcast_ref::<io::Error>())
            .any(|e| e.kind() == io::ErrorKind::BrokenPipe)
}

#[cfg(test)]
mod tests {
    use anyhow::Context;

    use super::*;

    #[test]
    fn status_prints_as_code_and_message() {
        let err = anyhow::Error::from(Status::invalid_argument(
            "spec.instance_count: must be at least 1",
        ));
        assert_eq!(
            report(&err),
            (
                "invalid argument: spec.instance_count: must be at least 1".to_owned(),
                EXIT_SERVER
            )
        );
    }

    #[test]
    fn context_goes_in_front() {
        let err = Err::<(), _>(Status::already_exists("pool /a exists"))
            .context("creating pool /a")
            .unwrap_err();
        assert_eq!(
            report(&err).0,
            "creating pool /a: already exists: pool /a exists"
        );
    }

    #[test]
    fn usage_and_spec_errors_exit_2() {
        let err = anyhow::Error::from(UsageError("bad address".into()));
        assert_eq!(report(&err), ("bad address".to_owned(), EXIT_USAGE));
        let spec = crate::spec::parse_job_spec("nme: x", "job.yaml").unwrap_err();
        let (message, code) = report(&anyhow::Error::from(spec));
        assert!(message.starts_with("job.yaml: "), "{message}");
        assert_eq!(code, EXIT_USAGE);
    }

    #[test]
    fn only_a_closed_stdout_is_a_quiet_broken_pipe() {
        let pipe = || io::Error::from(io::ErrorKind::BrokenPipe);
        assert!(is_broken_pipe(&anyhow::Error::from(pipe())));
        // The server's connection broke: tonic's status carries the cause.
        let status = Status::from_error(Box::new(pipe()));
        assert!(!is_broken_pipe(&anyhow::Error::from(status)));
    }

    #[test]
    fn every_code_has_a_lower_case_name() {
        for raw in 0..=16 {
            let name = code_name(Code::from_i32(raw));
            assert_eq!(name, name.to_lowercase());
            assert!(!name.is_empty());
        }
        assert_eq!(code_name(Code::FailedPrecondition), "failed precondition");
    }
}
