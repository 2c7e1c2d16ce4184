//! What a gang member is told of its gang: the `PELOTON_GANG_*`
//! environment, `rendezvous.json` in its sandbox, and the framework
//! aliases its job asked for (PyTorch's `MASTER_ADDR`…, TensorFlow's
//! `TF_CONFIG`, an MPI hostfile). Pure: the caller writes the files.
//!
//! The names (the project's contract, shared with the MPI launch path):
//! `PELOTON_GANG_SIZE`, `PELOTON_GANG_RANK`, `PELOTON_GANG_LOCAL_RANK`,
//! `PELOTON_GANG_LOCAL_SIZE` (among the members on the same host, by
//! rank), `PELOTON_GANG_GENERATION`, `PELOTON_GANG_LEADER_ADDR`,
//! `PELOTON_GANG_LEADER_PORT_<NAME>`, `PELOTON_GANG_PEERS` (addresses by
//! rank, comma-separated), `PELOTON_GANG_FILE`.

use std::collections::BTreeMap;

use serde_json::json;

use crate::ports::port_env_name;
use crate::run::{GangMember, Rendezvous};

/// The file in the sandbox that holds the gang.
pub(crate) const RENDEZVOUS_FILE: &str = "rendezvous.json";
/// The MPI hostfile in the sandbox (framework "mpi").
pub(crate) const HOSTFILE: &str = "hostfile";

/// What the agent gives a gang member: variables and files (name in the
/// sandbox, contents).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct GangView {
    pub env: BTreeMap<String, String>,
    pub files: Vec<(&'static str, String)>,
}

/// A member's address as its peers reach it: its host's registered
/// address, else its host's name.
fn address(m: &GangMember) -> &str {
    if m.address.is_empty() {
        &m.host
    } else {
        &m.address
    }
}

/// The gang's view for member `r.rank`; `own_ports` are the member's
/// task's port names in its spec's order (the first is the leader's
/// rendezvous port unless the job names one); `sandbox` is where the files
/// go. An error for a gang that does not hold together (ranks out of
/// order, a missing leader, a rendezvous port the leader lacks).
pub(crate) fn gang_view(
    r: &Rendezvous,
    own_ports: &[String],
    sandbox: &str,
) -> Result<GangView, String> {
    let size = r.members.len();
    if size == 0 || r.size as usize != size || r.rank as usize >= size {
        return Err(format!(
            "rendezvous: rank {} of a gang of {} with {size} members",
            r.rank, r.size
        ));
    }
    if r.members
        .iter()
        .enumerate()
        .any(|(i, m)| m.rank as usize != i)
    {
        return Err("rendezvous: members are not in rank order".to_owned());
    }
    let me = &r.members[r.rank as usize];
    let leader = &r.members[0];
    let local: Vec<&GangMember> = r.members.iter().filter(|m| m.host == me.host).collect();
    let local_rank = local
        .iter()
        .position(|m| m.rank == me.rank)
        .expect("a member is on its own host");
    let file = format!("{sandbox}/{RENDEZVOUS_FILE}");
    let mut env = BTreeMap::new();
    let mut set = |name: &str, value: String| {
        env.insert(name.to_owned(), value);
    };
    set("PELOTON_GANG_SIZE", size.to_string());
    set("PELOTON_GANG_RANK", r.rank.to_string());
    set("PELOTON_GANG_LOCAL_RANK", local_rank.to_string());
    set("PELOTON_GANG_LOCAL_SIZE", local.len().to_string());
    set("PELOTON_GANG_GENERATION", r.generation.to_string());
    set("PELOTON_GANG_LEADER_ADDR", address(leader).to_owned());
    for (name, port) in &leader.ports {
        let own = port_env_name(name);
        let suffix = own.strip_prefix("PELOTON_PORT_").unwrap_or(&own);
        set(
            &format!("PELOTON_GANG_LEADER_PORT_{suffix}"),
            port.to_string(),
        );
    }
    let peers: Vec<&str> = r.members.iter().map(address).collect();
    set("PELOTON_GANG_PEERS", peers.join(","));
    set("PELOTON_GANG_FILE", file);
    let ports = |m: &GangMember| json!(m.ports);
    let members: Vec<serde_json::Value> = r
        .members
        .iter()
        .map(|m| {
            json!({"rank": m.rank, "instance": m.instance, "host": m.host,
                   "address": address(m), "ports": ports(m)})
        })
        .collect();
    let document = json!({
        "size": size, "rank": r.rank, "local_rank": local_rank,
        "local_size": local.len(), "generation": r.generation,
        "leader": {"rank": 0, "address": address(leader), "ports": ports(leader)},
        "members": members,
    });
    let mut files = vec![(RENDEZVOUS_FILE, format!("{document:#}\n"))];
    // The leader's rendezvous port, for the frameworks that need one.
    let port_name = if r.port.is_empty() {
        own_ports.first().map(String::as_str)
    } else {
        Some(r.port.as_str())
    };
    let port_of = |m: &GangMember| -> Result<u32, String> {
        let name = port_name.ok_or_else(|| {
            format!(
                "rendezvous: the {} framework needs a port, and the task declares none",
                r.framework
            )
        })?;
        m.ports.get(name).copied().ok_or_else(|| {
            format!(
                "rendezvous: member {} (instance {}) has no port {name:?}",
                m.rank, m.instance
            )
        })
    };
    match r.framework.as_str() {
        "" => {}
        "pytorch" => {
            set("WORLD_SIZE", size.to_string());
            set("RANK", r.rank.to_string());
            set("LOCAL_RANK", local_rank.to_string());
            set("LOCAL_WORLD_SIZE", local.len().to_string());
            set("MASTER_ADDR", address(leader).to_owned());
            set("MASTER_PORT", port_of(leader)?.to_string());
        }
        "tensorflow" => {
            let workers = r
                .members
                .iter()
                .map(|m| Ok(format!("{}:{}", address(m), port_of(m)?)))
                .collect::<Result<Vec<String>, String>>()?;
            let config = json!({"cluster": {"worker": workers},
                                "task": {"type": "worker", "index": r.rank}});
            set("TF_CONFIG", config.to_string());
        }
        "mpi" => {
            let lines: String = r
                .members
                .iter()
                .map(|m| format!("{}:1\n", address(m)))
                .collect();
            files.push((HOSTFILE, lines));
            set("PELOTON_MPI_HOSTFILE", format!("{sandbox}/{HOSTFILE}"));
        }
        other => return Err(format!("rendezvous: unknown framework {other:?}")),
    }
    Ok(GangView { env, files })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(rank: u32, host: &str, address: &str, master: u32) -> GangMember {
        GangMember {
            rank,
            instance: rank + 10,
            host: host.to_owned(),
            address: address.to_owned(),
            ports: [("master".to_owned(), master), ("x-y".to_owned(), 9)].into(),
        }
    }

    fn gang(rank: u32, framework: &str) -> Rendezvous {
        Rendezvous {
            size: 3,
            rank,
            generation: 4,
            members: vec![
                member(0, "h1", "10.0.0.1", 31000),
                member(1, "h2", "", 31001),
                member(2, "h1", "10.0.0.1", 31002),
            ],
            framework: framework.to_owned(),
            port: String::new(),
        }
    }

    #[test]
    fn every_member_gets_the_gang_and_pytorch_names() {
        let view = gang_view(&gang(2, "pytorch"), &["master".to_owned()], "/s").unwrap();
        let env: Vec<String> = view.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(
            env,
            [
                "LOCAL_RANK=1",
                "LOCAL_WORLD_SIZE=2",
                "MASTER_ADDR=10.0.0.1",
                "MASTER_PORT=31000",
                "PELOTON_GANG_FILE=/s/rendezvous.json",
                "PELOTON_GANG_GENERATION=4",
                "PELOTON_GANG_LEADER_ADDR=10.0.0.1",
                "PELOTON_GANG_LEADER_PORT_MASTER=31000",
                "PELOTON_GANG_LEADER_PORT_X_Y=9",
                "PELOTON_GANG_LOCAL_RANK=1",
                "PELOTON_GANG_LOCAL_SIZE=2",
                "PELOTON_GANG_PEERS=10.0.0.1,h2,10.0.0.1",
                "PELOTON_GANG_RANK=2",
                "PELOTON_GANG_SIZE=3",
                "RANK=2",
                "WORLD_SIZE=3",
            ]
        );
        let (name, text) = &view.files[0];
        assert_eq!(*name, RENDEZVOUS_FILE);
        let doc: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(doc["rank"], 2);
        assert_eq!(doc["local_rank"], 1);
        assert_eq!(doc["leader"]["ports"]["master"], 31000);
        assert_eq!(doc["members"][1]["address"], "h2");
        assert_eq!(doc["members"][1]["instance"], 11);
    }

    #[test]
    fn tensorflow_and_mpi_names() {
        let view = gang_view(&gang(1, "tensorflow"), &["master".to_owned()], "/s").unwrap();
        let tf: serde_json::Value = serde_json::from_str(&view.env["TF_CONFIG"]).unwrap();
        assert_eq!(
            tf,
            json!({"cluster": {"worker": ["10.0.0.1:31000", "h2:31001", "10.0.0.1:31002"]},
                   "task": {"type": "worker", "index": 1}})
        );
        let view = gang_view(&gang(0, "mpi"), &[], "/s").unwrap();
        assert_eq!(view.env["PELOTON_MPI_HOSTFILE"], "/s/hostfile");
        assert_eq!(
            view.files[1],
            (HOSTFILE, "10.0.0.1:1\nh2:1\n10.0.0.1:1\n".to_owned())
        );
    }

    #[test]
    fn a_gang_that_does_not_hold_together_is_refused() {
        let mut g = gang(0, "pytorch");
        g.port = "nope".to_owned();
        assert!(
            gang_view(&g, &[], "/s")
                .unwrap_err()
                .contains("no port \"nope\"")
        );
        assert!(
            gang_view(&gang(0, "pytorch"), &[], "/s")
                .unwrap_err()
                .contains("declares none")
        );
        let mut g = gang(0, "");
        g.rank = 3;
        assert!(gang_view(&g, &[], "/s").is_err());
        g.rank = 0;
        g.members.swap(0, 1);
        assert!(gang_view(&g, &[], "/s").unwrap_err().contains("rank order"));
    }
}
