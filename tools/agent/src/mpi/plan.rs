//! What `peloton-agent mpirun` runs, worked out from the gang's
//! environment with no I/O: the gang read from `PELOTON_GANG_*`, rank 0's
//! `mpiexec` command, every rank's `hydra_pmi_proxy` command, and the
//! reading of the proxy commands `mpiexec -launcher manual` prints.

use std::fmt;

/// The largest gang `mpirun` launches (one hydra proxy per member, all
/// connected to rank 0's `mpiexec`).
pub const MAX_GANG_SIZE: u32 = 4096;

/// The name of the program's first argument in the wrapper that moves each
/// rank into its own sandbox (what `$0` is in that shell).
const WRAPPER_NAME: &str = "peloton-mpi";

/// The variable naming the directory a rank's MPI process runs in (its
/// member's sandbox), set in each proxy's environment.
pub const WDIR_VAR: &str = "PELOTON_MPI_WDIR";

/// How hydra's `mpiexec -launcher manual` ends the list of proxy commands
/// it prints before it waits for the proxies.
pub const LAUNCH_END: &str = "HYDRA_LAUNCH_END";

/// How each printed proxy command starts.
const LAUNCH_PREFIX: &str = "HYDRA_LAUNCH: ";

/// A gang member's view of its gang, from the rendezvous environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gang {
    pub size: u32,
    pub rank: u32,
    /// Rank 0's address (`PELOTON_GANG_LEADER_ADDR`).
    pub leader_addr: String,
    /// Rank 0's port that its `mpiexec` listens on for the proxies
    /// (`PELOTON_GANG_LEADER_PORT_<NAME>`).
    pub leader_port: u16,
}

/// What is wrong with the environment: names the variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvError {
    pub var: String,
    pub problem: String,
}

impl fmt::Display for EnvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.var, self.problem)
    }
}

impl std::error::Error for EnvError {}

/// The variable holding rank 0's port `port_name` (upper-cased, `-` as
/// `_`, as the agent names a task's own ports).
pub fn leader_port_var(port_name: &str) -> String {
    format!(
        "PELOTON_GANG_LEADER_PORT_{}",
        port_name.to_ascii_uppercase().replace('-', "_")
    )
}

impl Gang {
    /// Reads the gang from the environment (`get` is `std::env::var`'s
    /// `ok()` in the binary); `port_name` is the task's port that rank 0's
    /// `mpiexec` listens on.
    pub fn from_env(
        get: impl Fn(&str) -> Option<String>,
        port_name: &str,
    ) -> Result<Gang, EnvError> {
        let var = |name: &str| -> Result<String, EnvError> {
            match get(name) {
                Some(value) if !value.trim().is_empty() => Ok(value.trim().to_owned()),
                Some(_) => Err(env_error(name, "is empty")),
                None => Err(env_error(
                    name,
                    "is not set (mpirun runs inside a gang member, with the rendezvous the \
                     agent gives each one)",
                )),
            }
        };
        let number = |name: &str| -> Result<u32, EnvError> {
            let value = var(name)?;
            value
                .parse::<u32>()
                .map_err(|_| env_error(name, &format!("{value:?} is not a number")))
        };
        let size = number("PELOTON_GANG_SIZE")?;
        if size == 0 || size > MAX_GANG_SIZE {
            return Err(env_error(
                "PELOTON_GANG_SIZE",
                &format!("{size} is not between 1 and {MAX_GANG_SIZE}"),
            ));
        }
        let rank = number("PELOTON_GANG_RANK")?;
        if rank >= size {
            return Err(env_error(
                "PELOTON_GANG_RANK",
                &format!("{rank} is not below the gang's size {size}"),
            ));
        }
        let leader_addr = var("PELOTON_GANG_LEADER_ADDR")?;
        let port_var = leader_port_var(port_name);
        let port = var(&port_var)?;
        let leader_port = match port.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => {
                return Err(env_error(
                    &port_var,
                    &format!("{port:?} is not a port (1-65535)"),
                ));
            }
        };
        Ok(Gang {
            size,
            rank,
            leader_addr,
            leader_port,
        })
    }
}

fn env_error(var: &str, problem: &str) -> EnvError {
    EnvError {
        var: var.to_owned(),
        problem: problem.to_owned(),
    }
}

/// The host label of each rank in `mpiexec`'s host list: one distinct
/// label per rank, so that hydra gives every member a proxy of its own
/// (members on one host, or behind one address, are not merged). The
/// labels are only names: with the manual launcher hydra resolves none.
fn host_label(rank: u32) -> String {
    format!("peloton-rank-{rank}")
}

/// Rank 0's `mpiexec` (hydra) arguments after the program's path, and the
/// environment it needs (its control port fixed to the leader's port).
///
/// - `-launcher manual`: hydra starts no proxy itself (no ssh); it prints
///   their commands and waits for them to connect.
/// - `-envnone`: each rank's process gets its own member's environment
///   (the proxy's: its rank, ports, secrets) rather than rank 0's.
/// - `-wdir /` and a `/bin/sh` wrapper that changes to `$PELOTON_MPI_WDIR`:
///   hydra would move every rank into rank 0's working directory, which is
///   rank 0's sandbox and exists on no other host; each rank runs in its
///   own sandbox instead.
/// - `-hosts LABEL:1,...` and `-n SIZE`: one rank per member, rank `i` on
///   proxy `i`.
pub fn mpiexec_command(gang: &Gang, program: &[String]) -> (Vec<String>, Vec<(String, String)>) {
    let hosts: Vec<String> = (0..gang.size)
        .map(|r| format!("{}:1", host_label(r)))
        .collect();
    let mut args: Vec<String> = [
        "-launcher",
        "manual",
        "-envnone",
        "-wdir",
        "/",
        "-hosts",
        &hosts.join(","),
        "-n",
        &gang.size.to_string(),
        "/bin/sh",
        "-c",
        &format!("cd \"${WDIR_VAR}\" && exec \"$@\""),
        WRAPPER_NAME,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    args.extend(program.iter().cloned());
    let port = gang.leader_port;
    let env = vec![("MPIEXEC_PORT_RANGE".to_owned(), format!("{port}:{port}"))];
    (args, env)
}

/// The arguments of proxy `proxy_id`'s `hydra_pmi_proxy`, connecting to
/// `control_host:control_port`: what MPICH 4.0's `mpiexec -launcher
/// manual` prints for the command line above (checked against what it
/// prints, see [`check_launch`]).
pub fn proxy_args(control_host: &str, control_port: u16, proxy_id: u32) -> Vec<String> {
    let control = format!("{control_host}:{control_port}");
    let id = proxy_id.to_string();
    [
        "--control-port",
        &control,
        "--rmk",
        "user",
        "--launcher",
        "manual",
        "--demux",
        "poll",
        "--pgid",
        "0",
        "--retries",
        "10",
        "--usize",
        "-2",
        "--pmi-port",
        "0",
        "--gpus-per-proc",
        "-2",
        "--proxy-id",
        &id,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

/// One proxy command `mpiexec -launcher manual` printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchLine {
    pub program: String,
    pub args: Vec<String>,
    pub proxy_id: u32,
}

impl LaunchLine {
    /// The command with its control host replaced by `host` (hydra prints
    /// its own host name, which need not resolve).
    pub fn with_control_host(&self, host: &str) -> Vec<String> {
        let mut args = self.args.clone();
        if let Some(i) = args.iter().position(|a| a == "--control-port")
            && let Some(value) = args.get_mut(i + 1)
            && let Some((_, port)) = value.rsplit_once(':')
        {
            *value = format!("{host}:{port}");
        }
        args
    }
}

/// Reads one line of `mpiexec -launcher manual`'s output: `Some` for a
/// proxy command (`HYDRA_LAUNCH: PROGRAM ARGS... --proxy-id N`), `None`
/// for anything else. Hydra separates the words with single spaces and
/// quotes none (no argument of it holds a space).
pub fn parse_launch_line(line: &str) -> Option<Result<LaunchLine, String>> {
    let rest = line.trim_end().strip_prefix(LAUNCH_PREFIX)?;
    let mut words = rest.split_whitespace().map(str::to_owned);
    let Some(program) = words.next() else {
        return Some(Err(format!("no program in {line:?}")));
    };
    let args: Vec<String> = words.collect();
    let proxy_id = args
        .iter()
        .position(|a| a == "--proxy-id")
        .and_then(|i| args.get(i + 1))
        .and_then(|id| id.parse::<u32>().ok());
    Some(match proxy_id {
        Some(proxy_id) => Ok(LaunchLine {
            program,
            args,
            proxy_id,
        }),
        None => Err(format!("no --proxy-id number in {line:?}")),
    })
}

/// Checks the proxy commands `mpiexec` printed: one per rank, in rank
/// order, each what the other members build for themselves
/// ([`proxy_args`], whatever control host hydra printed). A different
/// hydra (another MPICH version) fails here, at rank 0, with both
/// commands, rather than leaving the other members' proxies unable to
/// talk to it.
pub fn check_launch(lines: &[LaunchLine], gang: &Gang) -> Result<(), String> {
    if lines.len() != gang.size as usize {
        return Err(format!(
            "mpiexec printed {} proxy commands for a gang of {}",
            lines.len(),
            gang.size
        ));
    }
    for (rank, line) in (0..gang.size).zip(lines) {
        let expected = proxy_args("HOST", gang.leader_port, rank);
        let printed = line.with_control_host("HOST");
        if line.proxy_id != rank || printed != expected {
            return Err(format!(
                "mpiexec printed proxy command {:?} for rank {rank}, but the other members run \
                 {:?} (is mpiexec MPICH 4's hydra?)",
                printed.join(" "),
                expected.join(" ")
            ));
        }
    }
    Ok(())
}

/// How many connections to local port `port` are established, from the
/// text of `/proc/net/tcp` or `/proc/net/tcp6` (rank 0 counts the proxies
/// that reached its `mpiexec`: each is one accepted connection on the
/// control port).
pub fn established_on_port(proc_net_tcp: &str, port: u16) -> usize {
    const ESTABLISHED: &str = "01";
    proc_net_tcp
        .lines()
        .skip(1)
        .filter(|line| {
            let mut fields = line.split_whitespace();
            let local = fields.nth(1);
            let state = fields.nth(1);
            let local_port = local
                .and_then(|l| l.rsplit_once(':'))
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            local_port == Some(port) && state == Some(ESTABLISHED)
        })
        .count()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    const GANG_ENV: [(&str, &str); 4] = [
        ("PELOTON_GANG_SIZE", "4"),
        ("PELOTON_GANG_RANK", "2"),
        ("PELOTON_GANG_LEADER_ADDR", "10.0.0.1"),
        ("PELOTON_GANG_LEADER_PORT_MPI", "31002"),
    ];

    fn gang_from(pairs: &[(&str, &str)], port_name: &str) -> Result<Gang, String> {
        let vars = env(pairs);
        Gang::from_env(|name| vars.get(name).cloned(), port_name).map_err(|e| e.to_string())
    }

    #[test]
    fn the_gang_is_read_from_the_rendezvous_environment() {
        assert_eq!(
            gang_from(&GANG_ENV, "mpi"),
            Ok(Gang {
                size: 4,
                rank: 2,
                leader_addr: "10.0.0.1".to_owned(),
                leader_port: 31002,
            })
        );
        // Another port name: upper-cased, '-' as '_'.
        let mut other = GANG_ENV.to_vec();
        other[3] = ("PELOTON_GANG_LEADER_PORT_MPI_CONTROL", "40000");
        assert_eq!(
            gang_from(&other, "mpi-control").map(|g| g.leader_port),
            Ok(40000)
        );
    }

    #[test]
    fn a_missing_or_bad_variable_is_named() {
        let cases: &[(&str, Option<&str>, &str)] = &[
            ("PELOTON_GANG_SIZE", None, "PELOTON_GANG_SIZE: is not set"),
            (
                "PELOTON_GANG_SIZE",
                Some("0"),
                "PELOTON_GANG_SIZE: 0 is not between 1 and 4096",
            ),
            (
                "PELOTON_GANG_SIZE",
                Some("4097"),
                "PELOTON_GANG_SIZE: 4097 is not between",
            ),
            (
                "PELOTON_GANG_SIZE",
                Some("four"),
                "PELOTON_GANG_SIZE: \"four\" is not a number",
            ),
            ("PELOTON_GANG_RANK", None, "PELOTON_GANG_RANK: is not set"),
            (
                "PELOTON_GANG_RANK",
                Some("4"),
                "PELOTON_GANG_RANK: 4 is not below the gang's size 4",
            ),
            (
                "PELOTON_GANG_LEADER_ADDR",
                Some(" "),
                "PELOTON_GANG_LEADER_ADDR: is empty",
            ),
            (
                "PELOTON_GANG_LEADER_ADDR",
                None,
                "PELOTON_GANG_LEADER_ADDR: is not set",
            ),
            (
                "PELOTON_GANG_LEADER_PORT_MPI",
                None,
                "PELOTON_GANG_LEADER_PORT_MPI: is not set",
            ),
            (
                "PELOTON_GANG_LEADER_PORT_MPI",
                Some("0"),
                "PELOTON_GANG_LEADER_PORT_MPI: \"0\" is not a port",
            ),
            (
                "PELOTON_GANG_LEADER_PORT_MPI",
                Some("70000"),
                "PELOTON_GANG_LEADER_PORT_MPI: \"70000\" is not a port",
            ),
        ];
        for (var, value, expected) in cases {
            let pairs: Vec<(&str, &str)> = GANG_ENV
                .iter()
                .filter(|(k, _)| k != var)
                .copied()
                .chain(value.map(|v| (*var, v)))
                .collect();
            let error = gang_from(&pairs, "mpi").expect_err(expected);
            assert!(error.starts_with(expected), "{error:?} for {var}={value:?}");
        }
    }

    fn gang(size: u32, rank: u32) -> Gang {
        Gang {
            size,
            rank,
            leader_addr: "10.0.0.1".to_owned(),
            leader_port: 31002,
        }
    }

    #[test]
    fn rank_zero_runs_mpiexec_with_the_manual_launcher_on_the_leader_port() {
        let program = vec!["./allreduce".to_owned(), "--steps=3".to_owned()];
        let (args, env) = mpiexec_command(&gang(3, 0), &program);
        assert_eq!(
            args.join(" "),
            "-launcher manual -envnone -wdir / \
             -hosts peloton-rank-0:1,peloton-rank-1:1,peloton-rank-2:1 -n 3 \
             /bin/sh -c cd \"$PELOTON_MPI_WDIR\" && exec \"$@\" peloton-mpi ./allreduce --steps=3"
        );
        assert_eq!(
            env,
            vec![("MPIEXEC_PORT_RANGE".to_owned(), "31002:31002".to_owned())]
        );
    }

    /// What MPICH 4.0.2's `mpiexec -launcher manual` (Debian 12) printed
    /// for a gang of 2 on port 31002, on a host named `vm`.
    const PRINTED: &str = "\
HYDRA_LAUNCH: /usr/bin/hydra_pmi_proxy --control-port vm:31002 --rmk user --launcher manual --demux poll --pgid 0 --retries 10 --usize -2 --pmi-port 0 --gpus-per-proc -2 --proxy-id 0 
HYDRA_LAUNCH: /usr/bin/hydra_pmi_proxy --control-port vm:31002 --rmk user --launcher manual --demux poll --pgid 0 --retries 10 --usize -2 --pmi-port 0 --gpus-per-proc -2 --proxy-id 1 
HYDRA_LAUNCH_END
";

    fn printed_lines(text: &str) -> Vec<LaunchLine> {
        text.lines()
            .filter_map(parse_launch_line)
            .collect::<Result<_, _>>()
            .expect("parses")
    }

    #[test]
    fn the_printed_proxy_commands_are_what_the_other_members_run() {
        let lines = printed_lines(PRINTED);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1].program, "/usr/bin/hydra_pmi_proxy");
        assert_eq!(lines[1].proxy_id, 1);
        assert_eq!(
            lines[1].with_control_host("10.0.0.1"),
            proxy_args("10.0.0.1", 31002, 1)
        );
        assert_eq!(check_launch(&lines, &gang(2, 0)), Ok(()));
        assert_eq!(parse_launch_line(LAUNCH_END), None);
        assert_eq!(parse_launch_line("rank 0: sum 10"), None);
    }

    #[test]
    fn printed_commands_that_differ_fail_at_rank_zero() {
        let lines = printed_lines(PRINTED);
        let too_few = check_launch(&lines, &gang(3, 0)).expect_err("3 ranks");
        assert!(
            too_few.contains("printed 2 proxy commands for a gang of 3"),
            "{too_few}"
        );
        let other_version = printed_lines(&PRINTED.replace("--usize -2", "--usize -1"));
        let error = check_launch(&other_version, &gang(2, 0)).expect_err("differs");
        assert!(
            error.contains("for rank 0") && error.contains("--usize -1"),
            "{error}"
        );
        let swapped = vec![lines[1].clone(), lines[0].clone()];
        assert!(check_launch(&swapped, &gang(2, 0)).is_err());
        let no_id = parse_launch_line("HYDRA_LAUNCH: /usr/bin/hydra_pmi_proxy --proxy-id x");
        assert!(matches!(no_id, Some(Err(e)) if e.contains("no --proxy-id number")));
    }

    #[test]
    fn established_connections_on_the_control_port_are_counted() {
        // Port 31002 is 0x791A: two accepted proxies (state 01), one
        // listener (0A), one proxy's own end (remote port 31002, local
        // another), one closing (06).
        let table = "\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:791A 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 0100007F:791A 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 2 1
   2: 0100007F:9C40 0100007F:791A 01 00000000:00000000 00:00000000 00000000     0        0 3 1
   3: 0A000001:791A 0A000002:D431 01 00000000:00000000 00:00000000 00000000     0        0 4 1
   4: 0A000001:791A 0A000003:D432 06 00000000:00000000 00:00000000 00000000     0        0 5 1
";
        assert_eq!(established_on_port(table, 31002), 2);
        assert_eq!(established_on_port(table, 40001), 0);
        assert_eq!(established_on_port("", 31002), 0);
    }
}
