//! Several servers, one leader: the `--server` list and where a call goes
//! next when a server turns it away. Pure decisions, no I/O; the channel
//! that acts on them is [`crate::channel`].
//!
//! A standby (or a server that lost its lease) refuses every call with
//! UNAVAILABLE `not the leader: ...` and, when it knows the leader, names it
//! in the `peloton-leader` header. Such a refusal was not applied, so the
//! call may always be tried again elsewhere. Other failures are retried only
//! when that cannot apply a write twice: the connection could not be made
//! (nothing was sent), or the call is a read.

use tonic::{Code, Status};

use crate::error::UsageError;

/// The response header in which a standby names the leader.
pub const LEADER_HEADER: &str = "peloton-leader";
/// How the message of a standby's refusal starts.
pub const NOT_LEADER: &str = "not the leader";
/// How the message of a server still recovering (it leads, or will) starts.
pub const STARTING: &str = "starting:";
/// How long a call waits for a server that is starting.
pub const STARTING_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);
/// Between two tries of a server that is starting.
pub const STARTING_RETRY: std::time::Duration = std::time::Duration::from_millis(200);

/// Whether `status` says the server is still starting (recovering its
/// state): the call was not applied and may be sent again.
pub fn is_starting(status: &Status) -> bool {
    status.code() == Code::Unavailable && status.message().starts_with(STARTING)
}

/// Most addresses `--server` may list.
pub const MAX_SERVERS: usize = 32;

/// The scheme assumed for an address given without one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scheme {
    /// `http://`: no CA file is configured.
    #[default]
    Http,
    /// `https://`: a CA file is configured (`--ca-file`, `PELOTON_CA_FILE`
    /// or the config file's `ca_file`).
    Https,
}

impl Scheme {
    pub fn prefix(self) -> &'static str {
        match self {
            Scheme::Http => "http://",
            Scheme::Https => "https://",
        }
    }
}

/// The server's URI: `scheme` is assumed when `address` has none.
pub fn server_uri(address: &str, scheme: Scheme) -> String {
    if address.contains("://") {
        address.to_owned()
    } else {
        format!("{}{address}", scheme.prefix())
    }
}

/// `--server`: comma-separated addresses (`http://` assumed), in the order
/// they are tried; blanks around commas are ignored, a repeated address is
/// kept once.
pub fn parse_servers(text: &str) -> Result<Vec<String>, UsageError> {
    parse_servers_as(text, Scheme::Http)
}

/// [`parse_servers`], assuming `scheme` for addresses without one.
pub fn parse_servers_as(text: &str, scheme: Scheme) -> Result<Vec<String>, UsageError> {
    let mut servers: Vec<String> = Vec::new();
    for item in text.split(',') {
        let item = item.trim();
        if item.is_empty() {
            return Err(UsageError(format!(
                "invalid server list `{text}`: an empty address (expected HOST:PORT,HOST:PORT,...)"
            )));
        }
        let uri = server_uri(item, scheme);
        tonic::transport::Endpoint::from_shared(uri.clone())
            .map_err(|err| UsageError(format!("invalid server address `{item}`: {err}")))?;
        if !servers.contains(&uri) {
            servers.push(uri);
        }
    }
    if servers.len() > MAX_SERVERS {
        return Err(UsageError(format!(
            "invalid server list: {} addresses, at most {MAX_SERVERS}",
            servers.len()
        )));
    }
    debug_assert!(!servers.is_empty(), "split yields at least one item");
    Ok(servers)
}

/// A standby's refusal: the call was not applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotLeader {
    /// The refusal's message (`not the leader: ...`).
    pub message: String,
    /// The leader's URI, when the standby named one that parses.
    pub leader: Option<String>,
}

/// `Some` when `status` is a standby's refusal (a leader named without a
/// scheme is taken to have `scheme`).
pub fn not_leader(status: &Status, scheme: Scheme) -> Option<NotLeader> {
    if status.code() != Code::Unavailable || !status.message().starts_with(NOT_LEADER) {
        return None;
    }
    let leader = status
        .metadata()
        .get(LEADER_HEADER)
        .and_then(|value| value.to_str().ok())
        .map(str::trim)
        .filter(|leader| !leader.is_empty())
        .map(|leader| server_uri(leader, scheme))
        .filter(|uri| tonic::transport::Endpoint::from_shared(uri.clone()).is_ok());
    Some(NotLeader {
        message: status.message().to_owned(),
        leader,
    })
}

/// Whether a call only reads (so trying it twice changes nothing), by its
/// method's name: `/peloton.v1.JobService/Get` reads.
pub fn is_read(path: &str) -> bool {
    let method = path.rsplit('/').next().unwrap_or_default();
    method.starts_with("Get")
        || method.starts_with("List")
        || method.starts_with("Query")
        || method.starts_with("Watch")
        || method == "Logs"
        || method == "WhoAmI"
}

/// How one try of a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// A standby refused it (not applied).
    NotLeader { leader: Option<String> },
    /// No connection could be made: nothing was sent.
    Unreachable,
    /// The connection broke after the call was sent: it may have been
    /// applied.
    Broken,
}

/// One call's way through the servers: where each try goes, what each
/// server said, and when to stop.
#[derive(Debug)]
pub struct Route<'a> {
    servers: &'a [String],
    /// The list entry the last try from the list went to.
    cursor: usize,
    /// Where the last try went (a list entry or a leader a standby named).
    current: String,
    hops: usize,
    read: bool,
    said: Vec<(String, String)>,
}

impl<'a> Route<'a> {
    /// A call (a read or not) first tried at `current`.
    pub fn new(servers: &'a [String], current: &str, read: bool) -> Route<'a> {
        assert!(!servers.is_empty(), "a route needs a server");
        Route {
            servers,
            cursor: servers.iter().position(|s| s == current).unwrap_or(0),
            current: current.to_owned(),
            hops: 0,
            read,
            said: Vec::new(),
        }
    }

    /// Hops after the first try, at most: each address gets a try, and one
    /// more for a leader named outside the list.
    pub fn max_hops(&self) -> usize {
        self.servers.len() + 1
    }

    /// The try at the current address failed (`said` is what it said):
    /// where to try next, or `None` to give up.
    pub fn next(&mut self, failure: &Failure, said: String) -> Option<&str> {
        self.said.push((self.current.clone(), said));
        if failure == &Failure::Broken && !self.read {
            return None;
        }
        if self.hops >= self.max_hops() {
            return None;
        }
        let named = match failure {
            Failure::NotLeader {
                leader: Some(leader),
            } if *leader != self.current => Some(leader.clone()),
            _ => None,
        };
        let next = match named {
            Some(leader) => {
                if let Some(at) = self.servers.iter().position(|s| *s == leader) {
                    self.cursor = at;
                }
                leader
            }
            None => {
                self.cursor = (self.cursor + 1) % self.servers.len();
                let next = self.servers[self.cursor].clone();
                // One address and no leader named: nowhere else to go.
                if next == self.current {
                    return None;
                }
                next
            }
        };
        self.hops += 1;
        self.current = next;
        Some(&self.current)
    }

    /// Why the call failed, naming what each server said.
    pub fn give_up(&self) -> Status {
        let said: Vec<String> = self
            .said
            .iter()
            .map(|(server, said)| format!("{server}: {said}"))
            .collect();
        Status::unavailable(format!(
            "no server took the call ({} tried): {}",
            self.said.len(),
            said.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(text: &str) -> Vec<String> {
        parse_servers(text).expect("valid list")
    }

    #[test]
    fn scheme_is_added_when_missing() {
        assert_eq!(
            server_uri("127.0.0.1:5391", Scheme::Http),
            "http://127.0.0.1:5391"
        );
        assert_eq!(
            server_uri("127.0.0.1:5391", Scheme::Https),
            "https://127.0.0.1:5391"
        );
        assert_eq!(
            server_uri("http://peloton:80", Scheme::Https),
            "http://peloton:80"
        );
        assert_eq!(
            parse_servers_as("a:1,http://b:2", Scheme::Https).expect("valid"),
            ["https://a:1", "http://b:2"]
        );
    }

    #[test]
    fn a_list_is_comma_separated_in_order_without_repeats() {
        assert_eq!(list("127.0.0.1:5391"), ["http://127.0.0.1:5391"]);
        assert_eq!(
            list("a:1, http://b:2 ,a:1,c:3"),
            ["http://a:1", "http://b:2", "http://c:3"]
        );
    }

    #[test]
    fn bad_lists_are_usage_errors() {
        for (text, want) in [
            ("a:1,,b:2", "an empty address"),
            ("a:1,", "an empty address"),
            ("", "an empty address"),
            ("a:1,b c:2", "invalid server address `b c:2`"),
        ] {
            let err = parse_servers(text).expect_err(text).0;
            assert!(err.contains(want), "{text:?}: {err}");
        }
        let many: Vec<String> = (0..=MAX_SERVERS).map(|i| format!("h{i}:1")).collect();
        let err = parse_servers(&many.join(",")).expect_err("too many").0;
        assert!(err.contains("at most 32"), "{err}");
    }

    fn refusal(message: &str, leader: Option<&str>) -> Status {
        let mut status = Status::unavailable(message);
        if let Some(leader) = leader {
            status
                .metadata_mut()
                .insert(LEADER_HEADER, leader.parse().expect("ascii"));
        }
        status
    }

    #[test]
    fn a_refusal_is_unavailable_not_the_leader_with_the_leader_if_known() {
        let named = refusal(
            "not the leader: the leader is at http://10.0.0.2:5000",
            Some("http://10.0.0.2:5000"),
        );
        assert_eq!(
            not_leader(&named, Scheme::Http),
            Some(NotLeader {
                message: "not the leader: the leader is at http://10.0.0.2:5000".to_owned(),
                leader: Some("http://10.0.0.2:5000".to_owned()),
            })
        );
        assert!(is_starting(&Status::unavailable(
            "starting: the server is recovering its state; try again shortly"
        )));
        assert!(!is_starting(&Status::unavailable("the store cannot write")));
        assert!(!is_starting(&Status::failed_precondition("starting: x")));
        let unknown = refusal("not the leader: no leader is known yet", None);
        assert_eq!(
            not_leader(&unknown, Scheme::Http).and_then(|n| n.leader),
            None
        );
        // A leader named without a scheme, or not as an address.
        let bare = refusal("not the leader", Some("10.0.0.2:5000"));
        assert_eq!(
            not_leader(&bare, Scheme::Http)
                .and_then(|n| n.leader)
                .as_deref(),
            Some("http://10.0.0.2:5000")
        );
        let junk = refusal("not the leader", Some("not an address"));
        assert_eq!(not_leader(&junk, Scheme::Http).and_then(|n| n.leader), None);
        // Anything else is not a refusal: the store's outage, other codes.
        assert_eq!(
            not_leader(&Status::unavailable("store unavailable"), Scheme::Http),
            None
        );
        assert_eq!(
            not_leader(&Status::failed_precondition("not the leader"), Scheme::Http),
            None
        );
    }

    #[test]
    fn reads_are_told_by_the_method_name() {
        for path in [
            "/peloton.v1.JobService/Get",
            "/peloton.v1.JobService/Query",
            "/peloton.v1.HostService/List",
            "/peloton.v1.TaskService/Logs",
            "/peloton.v1.WatchService/Watch",
            "/peloton.v1.ApplicationService/WatchExecutors",
            "/peloton.v1.AccessService/WhoAmI",
            "/peloton.v1.AccessService/ListAudit",
        ] {
            assert!(is_read(path), "{path}");
        }
        for path in [
            "/peloton.v1.JobService/Create",
            "/peloton.v1.JobService/Kill",
            "/peloton.v1.HostService/StartMaintenance",
            "/peloton.v1.UpdateService/Rollback",
            "/peloton.v1.HostPoolService/MoveHosts",
            "/peloton.v1.AccessService/CreateToken",
        ] {
            assert!(!is_read(path), "{path}");
        }
    }

    /// The addresses a route tries after the first, each try failing as
    /// `failures` says in turn (the last one repeated).
    fn tries(servers: &[String], read: bool, failures: &[Failure]) -> Vec<String> {
        let mut route = Route::new(servers, &servers[0], read);
        let mut out = Vec::new();
        for i in 0.. {
            let failure = &failures[i.min(failures.len() - 1)];
            match route.next(failure, "said".to_owned()) {
                Some(next) => out.push(next.to_owned()),
                None => return out,
            }
        }
        unreachable!()
    }

    fn not_leader_at(leader: &str) -> Failure {
        Failure::NotLeader {
            leader: Some(leader.to_owned()),
        }
    }

    #[test]
    fn a_refusal_goes_to_the_named_leader_else_the_next_address() {
        let servers = list("a:1,b:2,c:3");
        // a names c; c is the leader (the caller stops there).
        let mut route = Route::new(&servers, "http://a:1", false);
        let next = route.next(&not_leader_at("http://c:3"), "refused".to_owned());
        assert_eq!(next, Some("http://c:3"));
        // c has lost its lease and knows no leader: the list goes on after
        // c, from its start.
        let next = route.next(&Failure::NotLeader { leader: None }, "no leader".to_owned());
        assert_eq!(next, Some("http://a:1"));
        // A standby naming itself is not followed.
        let next = route.next(&not_leader_at("http://a:1"), "itself".to_owned());
        assert_eq!(next, Some("http://b:2"));
    }

    #[test]
    fn hops_are_bounded_by_the_list_length_plus_one() {
        let servers = list("a:1,b:2");
        // Standbys naming each other for ever.
        let mut route = Route::new(&servers, "http://a:1", true);
        let mut hops = 0;
        let mut leader = "http://b:2".to_owned();
        while let Some(next) = route.next(&not_leader_at(&leader), "refused".to_owned()) {
            hops += 1;
            leader = if next == "http://a:1" {
                "http://b:2"
            } else {
                "http://a:1"
            }
            .to_owned();
        }
        assert_eq!(hops, 3);
        // Nobody reachable: each address once, then the first again.
        assert_eq!(
            tries(&servers, false, &[Failure::Unreachable]),
            ["http://b:2", "http://a:1", "http://b:2"]
        );
        // A leader named outside the list gets its hop too (and, naming
        // itself, is not followed again).
        assert_eq!(
            tries(&list("a:1"), false, &[not_leader_at("http://z:9")]),
            ["http://z:9", "http://a:1"]
        );
    }

    #[test]
    fn one_address_and_no_leader_named_means_no_second_try() {
        let servers = list("a:1");
        assert!(tries(&servers, true, &[Failure::Unreachable]).is_empty());
        assert!(tries(&servers, true, &[Failure::NotLeader { leader: None }]).is_empty());
    }

    #[test]
    fn a_broken_call_is_tried_again_only_if_it_reads() {
        let servers = list("a:1,b:2");
        assert_eq!(
            tries(&servers, true, &[Failure::Broken, Failure::Unreachable]),
            ["http://b:2", "http://a:1", "http://b:2"]
        );
        assert!(tries(&servers, false, &[Failure::Broken]).is_empty());
        // A write is tried elsewhere after a refusal or no connection, and
        // stops at the first broken connection.
        assert_eq!(
            tries(
                &list("a:1,b:2,c:3"),
                false,
                &[Failure::Unreachable, Failure::Broken]
            ),
            ["http://b:2"]
        );
    }

    #[test]
    fn giving_up_names_what_each_server_said() {
        let servers = list("a:1,b:2");
        let mut route = Route::new(&servers, "http://a:1", false);
        route.next(
            &Failure::Unreachable,
            "cannot connect: Connection refused".to_owned(),
        );
        route.next(
            &Failure::NotLeader { leader: None },
            "not the leader: no leader is known yet".to_owned(),
        );
        let status = route.give_up();
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(
            status.message(),
            "no server took the call (2 tried): http://a:1: cannot connect: Connection refused; \
             http://b:2: not the leader: no leader is known yet"
        );
    }
}
