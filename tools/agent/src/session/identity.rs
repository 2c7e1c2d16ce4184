//! The agent's identity: a random id drawn the first time an agent runs on
//! a work directory and kept there (`agent-id`), so an agent restarted on
//! the same work directory — the one that owns its runs — presents the same
//! id. The server lets a registration take a host whose session still looks
//! connected only when it carries the holder's id (a restart whose old
//! connection is not yet seen to close); another agent claiming the host
//! name is refused until the holder has been silent for a while.
//!
//! Read and written under the work directory's lock (held by the
//! supervisor), so two agents never draw ids for one directory.

use std::fs;
use std::io::{self, Read, Write};
use std::path::Path;

const FILE: &str = "agent-id";
/// Longest id read back (the server bounds it too).
const MAX_LEN: usize = 128;

/// The work directory's agent id, drawn and stored (written to a temporary
/// file, synced and renamed) if it has none.
pub fn load_or_create(work_dir: &Path) -> io::Result<String> {
    let path = work_dir.join(FILE);
    match fs::read_to_string(&path) {
        Ok(text) => {
            let id = text.trim();
            if !id.is_empty() && id.len() <= MAX_LEN && id.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Ok(id.to_owned());
            }
            // A damaged file: draw a new id (the worst that happens is that
            // this agent waits for its old session to go, as a new one would).
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let id = drawn()?;
    let tmp = work_dir.join(format!("{FILE}.tmp"));
    {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(id.as_bytes())?;
        f.write_all(b"\n")?;
        f.sync_all()?;
    }
    fs::rename(&tmp, &path)?;
    fs::File::open(work_dir)?.sync_all()?;
    Ok(id)
}

/// A fresh id: 16 random bytes in hex.
pub fn drawn() -> io::Result<String> {
    let mut bytes = [0u8; 16];
    fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_drawn_once_per_work_directory_and_kept() {
        let a = tempfile::tempdir().expect("dir");
        let b = tempfile::tempdir().expect("dir");
        let first = load_or_create(a.path()).expect("id");
        assert_eq!(first.len(), 32);
        assert_eq!(load_or_create(a.path()).expect("id"), first);
        assert_ne!(load_or_create(b.path()).expect("id"), first);
        fs::write(a.path().join(FILE), "not hex!").expect("write");
        let redrawn = load_or_create(a.path()).expect("id");
        assert_ne!(redrawn, first);
        assert_eq!(load_or_create(a.path()).expect("id"), redrawn);
    }
}
