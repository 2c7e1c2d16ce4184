//! `pelotond --help` shows the default of every flag that takes a value,
//! and the defaults it shows are the server's.

use std::process::Command;

use peloton_gateway::config::Config;

fn help() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_pelotond"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The help of each flag: `--name` → the text from its line to the next
/// flag's.
fn flags(help: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in help.lines() {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("--") {
            let name = rest.split([' ', '=']).next().unwrap_or_default();
            out.push((name.to_owned(), trimmed.to_owned()));
        } else if let Some((_, text)) = out.last_mut() {
            text.push(' ');
            text.push_str(trimmed);
        }
    }
    out
}

#[test]
fn every_flag_with_a_value_shows_its_default() {
    let help = help();
    let d = Config::default();
    for expected in [
        format!("[default: {}]", d.listen),
        format!("[default: {}]", d.metrics_listen.unwrap()),
        format!("[default: {}]", d.data_dir.display()),
        format!("[default: {}]", d.host_lost_after_ms),
        format!("[default: {}]", d.job_retention_s),
        format!("[default: {}]", d.event_retention),
        format!("[default: {}]", d.store_cache_mb),
    ] {
        assert!(help.contains(&expected), "{expected} missing from:\n{help}");
    }
    assert!(help.contains("127.0.0.1:5391"), "{help}");
    // Secure by default: the opt-out is a flag, and says what it gives up.
    assert!(d.secure);
    let insecure = flags(&help)
        .into_iter()
        .find(|(name, _)| name == "insecure")
        .unwrap_or_else(|| panic!("no --insecure in:\n{help}"));
    assert!(
        insecure.1.contains("no TLS, no tokens"),
        "--insecure: {}",
        insecure.1
    );
    // Flags whose default is "none" or a sentence say so in words.
    let in_words = [
        ("config", ""),
        ("sim-hosts-file", ""),
        ("agent-token", "default: kept in DATA_DIR/agent-token"),
        ("agent-bin", "default: `peloton-agent` next to this binary"),
        ("store", "default: the embedded store in DATA_DIR"),
        ("advertise", "default: https:// and the listen address"),
        (
            "tls-cert",
            "default: issued by the private CA in DATA_DIR/tls",
        ),
        ("tls-key", "the private key (PEM) of --tls-cert"),
        ("tls-client-ca", "default: the private CA in DATA_DIR/tls"),
        (
            "tls-client-ca-key",
            "the private key (PEM) of --tls-client-ca",
        ),
    ];
    let flags = flags(&help);
    assert!(flags.len() > 15, "{help}");
    for (name, text) in &flags {
        let takes_value = text.contains(&format!("--{name} <"));
        if !takes_value {
            continue;
        }
        match in_words.iter().find(|(n, _)| n == name) {
            Some((_, words)) => assert!(text.contains(words), "--{name}: {text}"),
            None => assert!(
                text.contains("[default: "),
                "--{name} shows no default: {text}"
            ),
        }
    }
}

#[test]
fn keep_tasks_on_exit_needs_local_agents() {
    let out = Command::new(env!("CARGO_BIN_EXE_pelotond"))
        .args([
            "--keep-tasks-on-exit",
            "--listen",
            "127.0.0.1:0",
            "--no-metrics",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--keep-tasks-on-exit: only with --local-agents"),
        "{stderr}"
    );
}
