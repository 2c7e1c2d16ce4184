//! Which server the session talks to. `--server` may list several (one
//! leads, the others are standbys): a session that cannot be made or that
//! breaks moves on to the next address, and a standby's refusal (UNAVAILABLE
//! `not the leader: ...`, naming the leader in the `peloton-leader` header
//! when it knows it) sends the agent to that leader at once. Pure: the
//! session loop does the waiting and the connecting.

use tonic::{Code, Status};

/// The response header in which a standby names the leader.
pub const LEADER_HEADER: &str = "peloton-leader";
/// How the message of a standby's refusal starts.
pub const NOT_LEADER: &str = "not the leader";
/// Most addresses `--server` may list.
pub const MAX_SERVERS: usize = 32;

/// One server address: `http://HOST:PORT`, or `https://HOST:PORT` for a
/// secure server.
pub fn parse_server(text: &str) -> Result<String, String> {
    let rest = text
        .strip_prefix("http://")
        .or_else(|| text.strip_prefix("https://"))
        .ok_or_else(|| format!("{text:?} must start with http:// or https://"))?;
    if rest.is_empty() {
        return Err(format!("{text:?} names no host"));
    }
    tonic::transport::Endpoint::from_shared(text.to_owned())
        .map_err(|e| format!("{text:?} is not a valid address: {e}"))?;
    Ok(text.to_owned())
}

/// `--server`: comma-separated addresses, tried in this order; blanks
/// around commas are ignored, a repeated address is kept once.
pub fn parse_servers(text: &str) -> Result<Vec<String>, String> {
    let mut servers: Vec<String> = Vec::new();
    for item in text.split(',') {
        let item = item.trim();
        if item.is_empty() {
            return Err(format!(
                "{text:?} has an empty address (expected http://HOST:PORT,http://HOST:PORT,...)"
            ));
        }
        let server = parse_server(item)?;
        if !servers.contains(&server) {
            servers.push(server);
        }
    }
    if servers.len() > MAX_SERVERS {
        return Err(format!(
            "{} addresses, at most {MAX_SERVERS}",
            servers.len()
        ));
    }
    Ok(servers)
}

/// `Some` when `status` is a standby's refusal, holding the leader it
/// named (when it named a usable address).
pub fn not_leader(status: &Status) -> Option<Option<String>> {
    if status.code() != Code::Unavailable || !status.message().starts_with(NOT_LEADER) {
        return None;
    }
    let leader = status
        .metadata()
        .get(LEADER_HEADER)
        .and_then(|value| value.to_str().ok())
        .map(str::trim)
        .and_then(|leader| {
            if leader.contains("://") {
                parse_server(leader).ok()
            } else {
                parse_server(&format!("http://{leader}")).ok()
            }
        });
    Some(leader)
}

/// When to try the next server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Go {
    /// Now: a standby named the leader, or the list has addresses left to
    /// try in this pass.
    AtOnce,
    /// After the back-off: a pass over the list has ended (every address
    /// failed, or with one address, it did), or more than the list's
    /// length plus one leaders were named in a row without a registration
    /// (standbys naming each other).
    AfterBackoff,
}

/// The addresses of `--server` and the one the next session goes to.
#[derive(Debug)]
pub struct Servers {
    list: Vec<String>,
    /// The list entry last taken from the list.
    cursor: usize,
    /// Where the next session goes: a list entry, or a leader a standby
    /// named.
    current: String,
    /// Leaders followed since the last registration.
    redirects: usize,
}

impl Servers {
    pub fn new(list: Vec<String>) -> Servers {
        assert!(!list.is_empty(), "at least one server");
        Servers {
            current: list[0].clone(),
            list,
            cursor: 0,
            redirects: 0,
        }
    }

    /// Where the next session goes.
    pub fn current(&self) -> &str {
        &self.current
    }

    /// The session could not be made, or broke: the next address of the
    /// list (after the last one taken from it), round and round; a pass
    /// ends at the list's end.
    pub fn advance(&mut self) -> Go {
        self.cursor = (self.cursor + 1) % self.list.len();
        self.current = self.list[self.cursor].clone();
        if self.cursor == 0 {
            Go::AfterBackoff
        } else {
            Go::AtOnce
        }
    }

    /// A standby refused the session, naming `leader` or not.
    pub fn refused_by_standby(&mut self, leader: Option<&str>) -> Go {
        match leader {
            Some(leader) if leader != self.current => {
                self.redirects += 1;
                if let Some(at) = self.list.iter().position(|s| s == leader) {
                    self.cursor = at;
                }
                self.current = leader.to_owned();
                if self.redirects <= self.list.len() + 1 {
                    Go::AtOnce
                } else {
                    Go::AfterBackoff
                }
            }
            _ => self.advance(),
        }
    }

    /// A session registered: leaders named from now on are followed at
    /// once again.
    pub fn registered(&mut self) {
        self.redirects = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn servers(text: &str) -> Servers {
        Servers::new(parse_servers(text).expect("valid"))
    }

    #[test]
    fn a_list_is_comma_separated_in_order_without_repeats() {
        assert_eq!(parse_servers("http://a:1").expect("one"), ["http://a:1"]);
        assert_eq!(
            parse_servers("http://a:1, http://b:2 ,http://a:1").expect("two"),
            ["http://a:1", "http://b:2"]
        );
        for (text, want) in [
            ("http://a:1,,http://b:2", "has an empty address"),
            ("http://a:1,", "has an empty address"),
            ("http://a:1,b:2", "\"b:2\" must start with http://"),
            ("http://a:1,ftp://b:2", "must start with http://"),
            ("http://", "names no host"),
        ] {
            let err = parse_servers(text).expect_err(text);
            assert!(err.contains(want), "{text:?}: {err}");
        }
        let many: Vec<String> = (0..=MAX_SERVERS)
            .map(|i| format!("http://h{i}:1"))
            .collect();
        let err = parse_servers(&many.join(",")).expect_err("too many");
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
    fn a_standby_refusal_names_the_leader_when_known() {
        let named = refusal(
            "not the leader: the leader is at http://10.0.0.2:5000",
            Some("http://10.0.0.2:5000"),
        );
        assert_eq!(
            not_leader(&named),
            Some(Some("http://10.0.0.2:5000".to_owned()))
        );
        let unknown = refusal("not the leader: no leader is known yet", None);
        assert_eq!(not_leader(&unknown), Some(None));
        let bare = refusal("not the leader", Some("10.0.0.2:5000"));
        assert_eq!(
            not_leader(&bare),
            Some(Some("http://10.0.0.2:5000".to_owned()))
        );
        let tls = refusal("not the leader", Some("https://10.0.0.2:5000"));
        assert_eq!(
            not_leader(&tls),
            Some(Some("https://10.0.0.2:5000".to_owned()))
        );
        let odd = refusal("not the leader", Some("ftp://10.0.0.2:5000"));
        assert_eq!(not_leader(&odd), Some(None));
        assert_eq!(not_leader(&Status::unavailable("store unavailable")), None);
        assert_eq!(not_leader(&Status::unauthenticated("not the leader")), None);
    }

    #[test]
    fn failures_go_round_the_list_backing_off_once_a_pass() {
        let mut s = servers("http://a:1,http://b:2,http://c:3");
        let mut seen = vec![(s.current().to_owned(), Go::AtOnce)];
        for _ in 0..4 {
            let go = s.advance();
            seen.push((s.current().to_owned(), go));
        }
        let want = [
            ("http://a:1", Go::AtOnce),
            ("http://b:2", Go::AtOnce),
            ("http://c:3", Go::AtOnce),
            ("http://a:1", Go::AfterBackoff),
            ("http://b:2", Go::AtOnce),
        ]
        .map(|(server, go)| (server.to_owned(), go));
        assert_eq!(seen, want);
        // One address: always that one, after the back-off.
        let mut one = servers("http://a:1");
        assert_eq!(one.advance(), Go::AfterBackoff);
        assert_eq!(one.current(), "http://a:1");
    }

    #[test]
    fn a_named_leader_is_followed_at_once_and_the_list_goes_on_after_it() {
        let mut s = servers("http://a:1,http://b:2,http://c:3");
        assert_eq!(s.refused_by_standby(Some("http://c:3")), Go::AtOnce);
        assert_eq!(s.current(), "http://c:3");
        // c broke: the list goes on after c.
        s.advance();
        assert_eq!(s.current(), "http://a:1");
        // A leader outside the list (its advertised address).
        assert_eq!(s.refused_by_standby(Some("http://10.0.0.9:5")), Go::AtOnce);
        assert_eq!(s.current(), "http://10.0.0.9:5");
        s.advance();
        assert_eq!(s.current(), "http://b:2");
        // No leader known: the next address, as after a failure.
        assert_eq!(s.refused_by_standby(None), Go::AtOnce);
        assert_eq!(s.current(), "http://c:3");
        // A standby naming itself is not followed; the pass ends.
        assert_eq!(s.refused_by_standby(Some("http://c:3")), Go::AfterBackoff);
        assert_eq!(s.current(), "http://a:1");
    }

    #[test]
    fn standbys_naming_each_other_fall_back_to_the_back_off() {
        let mut s = servers("http://a:1,http://b:2");
        let mut at_once = 0;
        loop {
            let other = if s.current() == "http://a:1" {
                "http://b:2"
            } else {
                "http://a:1"
            };
            match s.refused_by_standby(Some(other)) {
                Go::AtOnce => at_once += 1,
                Go::AfterBackoff => break,
            }
        }
        // The list's length plus one hops at once, then the back-off (to
        // the leader named all the same).
        assert_eq!(at_once, 3);
        assert_eq!(s.current(), "http://a:1");
        assert_eq!(s.refused_by_standby(Some("http://b:2")), Go::AfterBackoff);
        assert_eq!(s.current(), "http://b:2");
        // A registration starts the count again.
        s.registered();
        assert_eq!(s.refused_by_standby(Some("http://a:1")), Go::AtOnce);
    }
}
