//! Paging of list reads, in one place: page tokens (a position in a list,
//! checked so that a token works only for the list and the server that gave
//! it), page sizes (a default and a bound per list) and the byte budget of
//! a page.

use prost::Message;
use tonic::Status;

use crate::convert::{bounded, invalid, shown};

/// A page size: `requested`, or `default` for 0, at most `max`.
pub fn page_size(requested: u32, default: u32, max: u32) -> usize {
    let n = match requested {
        0 => default,
        n => n.min(max),
    };
    n as usize
}

/// Longest page token: 2 KiB (a pool list's token holds a pool path of up
/// to [`crate::convert::MAX_POOL_PATH_BYTES`]).
pub const MAX_PAGE_TOKEN_BYTES: usize = 2048;

/// What page tokens start with: `p2.<list>.<tag>.<key>`, where the key is
/// the position of the last item of the page it follows and the tag a
/// keyed hash of list and key.
const PAGE_TOKEN_PREFIX: &str = "p2.";

/// The list a page token belongs to: a token of one list is refused by
/// every other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageKind {
    /// `JobService.Query`.
    Jobs,
    /// `ResourcePoolService.List`.
    Pools,
    /// `VolumeService.List`.
    Volumes,
    /// `HostPoolService.List`.
    HostPools,
    /// `JobService.ListUsage`.
    Usage,
}

impl PageKind {
    const ALL: [PageKind; 5] = [
        PageKind::Jobs,
        PageKind::Pools,
        PageKind::Volumes,
        PageKind::HostPools,
        PageKind::Usage,
    ];

    /// Its name in tokens and messages.
    pub fn name(self) -> &'static str {
        match self {
            PageKind::Jobs => "jobs",
            PageKind::Pools => "pools",
            PageKind::Volumes => "volumes",
            PageKind::HostPools => "hostpools",
            PageKind::Usage => "usage",
        }
    }
}

/// The tag of a token: SipHash of (list, key) under a key drawn at random
/// once per process, so a token that was edited, or made up, or given by
/// another server (or by this one before a restart) does not check.
fn page_tag(kind: PageKind, key: &str) -> u64 {
    use std::hash::BuildHasher;
    static SECRET: std::sync::OnceLock<std::hash::RandomState> = std::sync::OnceLock::new();
    SECRET
        .get_or_init(std::hash::RandomState::new)
        .hash_one((kind.name(), key))
}

/// The token of a page of the list `kind` that follows the position `key`.
pub fn page_token(kind: PageKind, key: &str) -> String {
    format!(
        "{PAGE_TOKEN_PREFIX}{}.{:016x}.{key}",
        kind.name(),
        page_tag(kind, key)
    )
}

/// The position a page token of the list `kind` holds ("" for none: the
/// first page). A token this server did not give for this list is
/// INVALID_ARGUMENT: "not a token of this list", and why.
pub fn page_token_key<'a>(field: &str, kind: PageKind, token: &'a str) -> Result<&'a str, Status> {
    if token.is_empty() {
        return Ok("");
    }
    bounded(field, token, MAX_PAGE_TOKEN_BYTES)?;
    let refuse = |why: String| {
        invalid(
            field,
            format!(
                "not a token of this list ({why}): pass the previous answer's next_page_token, or nothing for the first page"
            ),
        )
    };
    let parts = token.strip_prefix(PAGE_TOKEN_PREFIX).and_then(|rest| {
        let (list, rest) = rest.split_once('.')?;
        let (tag, key) = rest.split_once('.')?;
        Some((list, u64::from_str_radix(tag, 16).ok()?, key))
    });
    let Some((list, tag, key)) = parts else {
        return Err(refuse(format!("{} is not a page token", shown(token))));
    };
    if list != kind.name() {
        return Err(refuse(
            match PageKind::ALL.into_iter().find(|k| k.name() == list) {
                Some(other) => format!(
                    "it is a token of the {} list, and this is the {} list",
                    other.name(),
                    kind.name()
                ),
                None => format!("{} is not a page token", shown(token)),
            },
        ));
    }
    if key.is_empty() || tag != page_tag(kind, key) {
        return Err(refuse(
            "its checksum does not match: it was edited, or given by another server or before a restart"
                .into(),
        ));
    }
    Ok(key)
}

/// Most bytes of the items of one page of any list: a page ends early
/// rather than grow past it, so that every answer (items and the rest)
/// fits the 4 MiB a gRPC client accepts by default. A single item larger
/// than this (a job whose spec was sent that large) is a page of its own.
pub const MAX_PAGE_BYTES: usize = 3 << 20;

/// The bytes a page's items have used.
#[derive(Debug, Default)]
pub struct PageBytes(usize);

impl PageBytes {
    /// Counts `item` in and says whether it belongs on the page: it does if
    /// the page is empty or it fits in what is left.
    pub fn admits(&mut self, n_on_page: usize, item: &impl Message) -> bool {
        // The field's tag and length prefix: at most 6 bytes.
        let cost = item.encoded_len() + 6;
        if n_on_page > 0 && self.0 + cost > MAX_PAGE_BYTES {
            return false;
        }
        self.0 += cost;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_size_is_the_default_for_0_and_at_most_the_bound() {
        assert_eq!(page_size(0, 100, 1000), 100);
        assert_eq!(page_size(7, 100, 1000), 7);
        assert_eq!(page_size(5000, 100, 1000), 1000);
        assert_eq!(page_size(0, u32::MAX, u32::MAX), u32::MAX as usize);
    }

    #[test]
    fn a_token_works_for_its_list_only() {
        let t = page_token(PageKind::Jobs, "j-1");
        assert_eq!(
            page_token_key("page_token", PageKind::Jobs, &t).unwrap(),
            "j-1"
        );
        assert_eq!(
            page_token_key("page_token", PageKind::Jobs, "").unwrap(),
            ""
        );
        let e = page_token_key("page_token", PageKind::Pools, &t).unwrap_err();
        assert!(e.message().contains("jobs list"), "{}", e.message());
        let edited = t.replace("j-1", "j-2");
        assert!(page_token_key("page_token", PageKind::Jobs, &edited).is_err());
    }
}
