//! The one place where the lifecycle core's errors become gRPC codes, and
//! where every status leaving the server is made to keep the contract:
//! messages of at most [`MAX_MESSAGE_BYTES`] (so that they fit any client's
//! default metadata limit, 8 KiB in grpc-go and grpc-java, even
//! percent-encoded) and RESOURCE_EXHAUSTED for a request larger than a
//! service accepts (tonic says OUT_OF_RANGE).

use std::task::{Context, Poll};

use futures::TryFutureExt;
use peloton_engine::PoolError;
use tonic::codegen::{Service, http};
use tonic::{Code, Status};

use crate::lifecycle::Error;
use crate::refused::Refused;

/// The gRPC code of a refusal.
pub fn code(e: &Error) -> Code {
    match e {
        Error::JobNotFound(_)
        | Error::NoInstance { .. }
        | Error::HostNotFound(_)
        | Error::VolumeNotFound(_)
        | Error::UpdateNotFound(_)
        | Error::HostPoolNotFound(_)
        | Error::NotFound(_) => Code::NotFound,
        Error::AlreadyExists(_) => Code::AlreadyExists,
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
        Error::HostHeld { .. } | Error::HostHeldBySession { .. } => Code::AlreadyExists,
    }
}

/// A refusal as a gRPC status.
pub fn status(e: Error) -> Status {
    contract(Status::new(code(&e), e.to_string()))
}

/// A refusal of the scheduling loop as a gRPC status.
pub fn refused(r: Refused) -> Status {
    match r {
        Refused::Core(e) => status(e),
        other => {
            let code = match &other {
                Refused::SimulatedHosts(_) => Code::FailedPrecondition,
                Refused::OutOfRange(_) => Code::OutOfRange,
                _ => Code::Unavailable,
            };
            contract(Status::new(code, other.to_string()))
        }
    }
}

/// Longest status message sent, in bytes. Messages name the field and the
/// problem and quote user input only as a short prefix; this is the last
/// line of defence for anything that still grew long.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// `message` cut to at most `max` bytes at a character boundary, with "…"
/// where it was cut.
pub fn truncate(message: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if message.len() <= max {
        return message.into();
    }
    let ellipsis = "…";
    let mut end = max.saturating_sub(ellipsis.len());
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{ellipsis}", &message[..end]).into()
}

/// What tonic answers when a request is larger than the service's
/// `max_decoding_message_size`.
const DECODE_TOO_LARGE: &str = "Error, decoded message length too large";

/// A status as it may leave the server: an oversize request is
/// RESOURCE_EXHAUSTED, and the message is at most [`MAX_MESSAGE_BYTES`].
pub fn contract(s: Status) -> Status {
    let too_large = s.code() == Code::OutOfRange && s.message().starts_with(DECODE_TOO_LARGE);
    if !too_large && s.message().len() <= MAX_MESSAGE_BYTES {
        return s;
    }
    let code = if too_large {
        Code::ResourceExhausted
    } else {
        s.code()
    };
    let message = if too_large {
        format!(
            "the request is too large: {} (send less per call, e.g. fewer overrides per job)",
            s.message()
        )
    } else {
        s.message().to_string()
    };
    Status::with_details_and_metadata(
        code,
        truncate(&message, MAX_MESSAGE_BYTES),
        s.details().to_vec().into(),
        s.metadata().clone(),
    )
}

/// A gRPC service whose error answers keep the contract ([`contract`]):
/// errors of unary calls (and of streaming calls before their first
/// message) travel in the response headers, where they are rewritten.
/// Errors inside a stream are ours and go through [`contract`] where they
/// are made.
#[derive(Clone, Debug)]
pub struct Contract<S>(pub S);

impl<S: tonic::server::NamedService> tonic::server::NamedService for Contract<S> {
    const NAME: &'static str = S::NAME;
}

type Rewrite<RB> = fn(http::Response<RB>) -> http::Response<RB>;

impl<S, B, RB> Service<http::Request<B>> for Contract<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
{
    type Response = http::Response<RB>;
    type Error = S::Error;
    type Future = futures::future::MapOk<S::Future, Rewrite<RB>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        self.0
            .call(request)
            .map_ok(rewrite_headers::<RB> as Rewrite<RB>)
    }
}

/// Applies [`contract`] to a status carried in response headers.
fn rewrite_headers<RB>(mut response: http::Response<RB>) -> http::Response<RB> {
    let Some(before) = Status::from_header_map(response.headers()) else {
        return response;
    };
    let after = contract(Status::new(before.code(), before.message()));
    if after.code() == before.code() && after.message() == before.message() {
        return response;
    }
    let mut headers = http::HeaderMap::new();
    if after.add_header(&mut headers).is_ok() {
        let h = response.headers_mut();
        h.remove("grpc-message");
        for name in ["grpc-status", "grpc-message"] {
            if let Some(v) = headers.remove(name) {
                h.insert(name, v);
            }
        }
    }
    response
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
            (
                Error::HostHeld {
                    host: "h".into(),
                    holder: "a1".into(),
                    agent: "a2".into(),
                },
                Code::AlreadyExists,
                "",
            ),
        ];
        for (e, c, message) in cases {
            let s = status(e);
            assert_eq!(s.code(), c);
            if !message.is_empty() {
                assert_eq!(s.message(), message);
            }
        }
    }

    #[test]
    fn long_messages_are_cut_at_a_character_boundary() {
        let long = "é".repeat(5000);
        let s = status(Error::invalid("spec.name", &long));
        assert!(
            s.message().len() <= MAX_MESSAGE_BYTES,
            "{}",
            s.message().len()
        );
        assert!(s.message().starts_with("spec.name: éé"));
        assert!(s.message().ends_with('…'));
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("abcdef", 5), "ab…");
        assert_eq!(truncate("aééé", 5), "a…");
    }

    #[test]
    fn an_oversize_request_is_resource_exhausted() {
        let s = contract(Status::out_of_range(
            "Error, decoded message length too large: found 5 bytes, the limit is: 4 bytes",
        ));
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert!(s.message().contains("found 5 bytes"), "{}", s.message());
        // Any other OUT_OF_RANGE stays as it is.
        let s = contract(Status::out_of_range("revision 9 is ahead"));
        assert_eq!(s.code(), Code::OutOfRange);
    }
}
