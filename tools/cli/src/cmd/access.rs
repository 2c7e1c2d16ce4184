//! `peloton token ...`, `peloton whoami`, `peloton audit` and `peloton
//! agent cert`: who may call a secure server, who the caller is, what was
//! called, and agents' certificates.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use peloton_proto::v1::access_service_client::AccessServiceClient;
use peloton_proto::v1::{
    AuditEntry, CreateTokenRequest, Grant, IssueAgentCertificateRequest, IssueCertificateRequest,
    ListAuditRequest, ListTokensRequest, RevokeCertificateRequest, RevokeTokenRequest, Token,
    TokenCertificate, WhoAmIRequest,
};
use serde_json::{Value, json};
use tonic::Code;

use super::{Ctx, Outcome};
use crate::channel::LeaderChannel;
use crate::cli::{AgentCommand, AuditArgs, TokenCommand, role_name};
use crate::error::code_name;
use crate::output::{
    Align, OutputFormat, Table, fmt_time_ms, or_dash, print_json, print_out, render_fields,
};

/// Most entries the server returns in one answer.
const AUDIT_PAGE: u32 = 1000;

async fn client(ctx: &Ctx) -> Result<AccessServiceClient<LeaderChannel>> {
    Ok(AccessServiceClient::new(ctx.connect().await?)
        .max_decoding_message_size(crate::MAX_MESSAGE_BYTES))
}

pub(super) async fn token(ctx: &Ctx, command: TokenCommand) -> Result<Outcome> {
    let mut client = client(ctx).await?;
    match command {
        TokenCommand::Create { name, grants } => {
            let created = client
                .create_token(CreateTokenRequest { name, grants })
                .await?
                .into_inner();
            let token = created.token.context("the server returned no token")?;
            match ctx.output {
                OutputFormat::Table => print_out(&format!(
                    "created token {}\n{}\nSECRET: {}",
                    token.name,
                    token_table(std::slice::from_ref(&token)),
                    created.secret
                ))?,
                OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({
                    "token": token_json(&token),
                    "secret": created.secret,
                }))?,
            }
            eprintln!(
                "note: the secret is not shown again (the server keeps only its digest); \
                 store it now, e.g. in a private file named by PELOTON_TOKEN_FILE"
            );
        }
        TokenCommand::List => {
            let mut tokens = client
                .list_tokens(ListTokensRequest {})
                .await?
                .into_inner()
                .tokens;
            tokens.sort_by(|a, b| a.name.cmp(&b.name));
            match ctx.output {
                OutputFormat::Table => print_out(&token_table(&tokens))?,
                OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({
                    "tokens": tokens.iter().map(token_json).collect::<Vec<_>>(),
                }))?,
            }
        }
        TokenCommand::Revoke { name } => {
            client
                .revoke_token(RevokeTokenRequest { name: name.clone() })
                .await?;
            match ctx.output {
                OutputFormat::Table => print_out(&format!("revoked token {name}"))?,
                OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({ "revoked": name }))?,
            }
        }
        TokenCommand::Cert { name, out, days } => {
            return issue_certificate(ctx, &mut client, name, &out, days).await;
        }
        TokenCommand::CertRevoke { name, fingerprint } => {
            client
                .revoke_certificate(RevokeCertificateRequest {
                    name: name.clone(),
                    fingerprint: fingerprint.clone(),
                })
                .await?;
            match ctx.output {
                OutputFormat::Table => print_out(&format!(
                    "revoked certificate {fingerprint} of token {name}"
                ))?,
                OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({
                    "revoked": {"name": name, "fingerprint": fingerprint},
                }))?,
            }
        }
    }
    Ok(Outcome::Success)
}

/// `token cert`: a key made here, a request the server signs, both files
/// written (the key before the server is asked, so a certificate is never
/// recorded for a key that was lost).
async fn issue_certificate(
    ctx: &Ctx,
    client: &mut AccessServiceClient<LeaderChannel>,
    name: String,
    out: &Path,
    days: Option<u32>,
) -> Result<Outcome> {
    let cert_path = out.join(format!("{name}.pem"));
    let key_path = out.join(format!("{name}.key"));
    for path in [&cert_path, &key_path] {
        if path.exists() {
            return Err(crate::error::UsageError(format!(
                "{} exists: choose another --out directory or remove it",
                path.display()
            ))
            .into());
        }
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let request = peloton_tls::user_csr(&name).context("making a key and a request")?;
    write_new(&key_path, request.key_pem.as_bytes(), 0o600)?;
    let issued = client
        .issue_certificate(IssueCertificateRequest {
            name: name.clone(),
            csr_pem: request.csr_pem,
            valid_days: days.unwrap_or(0),
        })
        .await;
    let issued = match issued {
        Ok(issued) => issued.into_inner(),
        Err(status) => {
            // A refusal: no certificate, so the key is of no use. Another
            // failure (the connection broke, say) may follow a certificate
            // the server recorded: the key stays, and the error says so.
            if refused_outright(status.code()) {
                let _ = std::fs::remove_file(&key_path);
            } else {
                eprintln!(
                    "note: the server may have recorded a certificate before this error; \
                     `peloton token list -o json` shows it (revoke it with `token cert-revoke`); \
                     the key {} is kept",
                    key_path.display()
                );
            }
            return Err(status.into());
        }
    };
    write_new(&cert_path, issued.certificate_pem.as_bytes(), 0o644)?;
    let certificate = issued.certificate.unwrap_or_default();
    match ctx.output {
        OutputFormat::Table => print_out(&render_fields(&[
            ("TOKEN", name.clone()),
            ("CERTIFICATE", cert_path.display().to_string()),
            ("KEY", key_path.display().to_string()),
            ("FINGERPRINT", certificate.fingerprint.clone()),
            ("EXPIRES", fmt_time_ms(certificate.not_after_ms)),
        ]))?,
        OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({
            "name": name,
            "certificate_file": cert_path,
            "key_file": key_path,
            "certificate": certificate_json(&certificate),
        }))?,
    }
    eprintln!(
        "note: use them with --cert-file {} --key-file {} (or PELOTON_CERT_FILE and \
         PELOTON_KEY_FILE); revoking the token revokes them too",
        cert_path.display(),
        key_path.display()
    );
    Ok(Outcome::Success)
}

/// `agent cert`: as `token cert`, for a host; the CA and the agents' token
/// written beside the certificate, and the agent's command printed.
pub(super) async fn agent(ctx: &Ctx, command: AgentCommand) -> Result<Outcome> {
    let AgentCommand::Cert {
        host,
        out,
        days,
        work_dir,
    } = command;
    let out = out.unwrap_or_else(|| PathBuf::from(&host));
    let cert_path = out.join(format!("{host}.pem"));
    let key_path = out.join(format!("{host}.key"));
    let ca_path = out.join("ca.pem");
    let token_path = out.join("agent-token");
    for path in [&cert_path, &key_path, &ca_path, &token_path] {
        if path.exists() {
            return Err(crate::error::UsageError(format!(
                "{} exists: choose another --out directory or remove it",
                path.display()
            ))
            .into());
        }
    }
    let resolved = crate::settings::resolve(&ctx.options, &crate::settings::process_env)?;
    let servers = resolved.servers.join(",");
    let mut client = client(ctx).await?;
    let request = peloton_tls::agent_csr(&host).context("making a key and a request")?;
    let issued = client
        .issue_agent_certificate(IssueAgentCertificateRequest {
            host: host.clone(),
            csr_pem: request.csr_pem,
            valid_days: days.unwrap_or(0),
        })
        .await?
        .into_inner();
    if issued.agent_token.is_empty() {
        return Err(anyhow::anyhow!(
            "the server has no agents' token (its hosts are simulated): it takes no agents"
        ));
    }
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let out = out
        .canonicalize()
        .with_context(|| format!("reading {}", out.display()))?;
    let [cert_path, key_path, ca_path, token_path] = [&cert_path, &key_path, &ca_path, &token_path]
        .map(|p| out.join(p.file_name().expect("a file")));
    write_new(&key_path, request.key_pem.as_bytes(), 0o600)?;
    write_new(
        &token_path,
        format!("{}\n", issued.agent_token).as_bytes(),
        0o600,
    )?;
    write_new(&cert_path, issued.certificate_pem.as_bytes(), 0o644)?;
    write_new(&ca_path, issued.ca_pem.as_bytes(), 0o644)?;
    let command = [
        "peloton-agent".to_owned(),
        "--server".to_owned(),
        servers.clone(),
        "--host".to_owned(),
        host.clone(),
        "--ca-file".to_owned(),
        ca_path.display().to_string(),
        "--cert-file".to_owned(),
        cert_path.display().to_string(),
        "--key-file".to_owned(),
        key_path.display().to_string(),
        "--token-file".to_owned(),
        token_path.display().to_string(),
        "--work-dir".to_owned(),
        work_dir.display().to_string(),
    ];
    match ctx.output {
        OutputFormat::Table => print_out(&command.join(" "))?,
        OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({
            "host": host,
            "certificate_file": cert_path,
            "key_file": key_path,
            "ca_file": ca_path,
            "token_file": token_path,
            "expires_ms": issued.not_after_ms,
            "command": command,
        }))?,
    }
    eprintln!(
        "note: copy {} to {host} (to the same path; the key and the token are secrets) and run \
         the command there; the certificate expires {}",
        out.display(),
        fmt_time_ms(issued.not_after_ms)
    );
    if resolved
        .servers
        .iter()
        .any(|s| s.contains("://127.") || s.contains("://localhost") || s.contains("://[::1]"))
    {
        eprintln!(
            "note: --server {servers} is this machine's loopback address: on {host}, name an \
             address of this server that {host} reaches"
        );
    }
    Ok(Outcome::Success)
}

/// Whether a refusal means the server recorded nothing.
fn refused_outright(code: Code) -> bool {
    matches!(
        code,
        Code::InvalidArgument
            | Code::NotFound
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::FailedPrecondition
            | Code::ResourceExhausted
            | Code::AlreadyExists
            | Code::Unimplemented
    )
}

/// Writes a new file with `mode` (never one that exists); a file half
/// written is removed.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    use std::io::Write as _;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    if let Err(e) = file.write_all(bytes).and_then(|()| file.sync_all()) {
        drop(file);
        let _ = std::fs::remove_file(path);
        return Err(e).with_context(|| format!("writing {}", path.display()));
    }
    Ok(())
}

pub(super) async fn whoami(ctx: &Ctx) -> Result<Outcome> {
    let token = client(ctx)
        .await?
        .who_am_i(WhoAmIRequest {})
        .await?
        .into_inner()
        .token
        .context("the server returned no token")?;
    match ctx.output {
        OutputFormat::Table => print_out(&render_fields(&[
            ("NAME", token.name.clone()),
            ("GRANTS", fmt_grants(&token.grants)),
            ("CREATED", fmt_time_ms(token.created_at_ms)),
            ("CREATED BY", or_dash(&token.created_by)),
        ]))?,
        OutputFormat::Json | OutputFormat::Yaml => {
            print_json(&json!({ "token": token_json(&token) }))?;
        }
    }
    Ok(Outcome::Success)
}

pub(super) async fn audit(ctx: &Ctx, args: AuditArgs) -> Result<Outcome> {
    let mut client = client(ctx).await?;
    let principal = args.principal.unwrap_or_default();
    let mut entries: Vec<AuditEntry> = Vec::new();
    let mut before_seq = args.before.unwrap_or(0);
    // Newest first, a page at a time, until --limit or the oldest entry.
    while entries.len() < args.limit as usize {
        let want = (args.limit - entries.len() as u32).min(AUDIT_PAGE);
        let page = client
            .list_audit(ListAuditRequest {
                before_seq,
                limit: want,
                principal: principal.clone(),
            })
            .await?
            .into_inner()
            .entries;
        let got = page.len();
        let Some(last) = page.last() else { break };
        before_seq = last.seq;
        entries.extend(page.into_iter().take(want as usize));
        if got < want as usize || before_seq <= 1 {
            break;
        }
    }
    match ctx.output {
        OutputFormat::Table => print_out(&audit_table(&entries))?,
        OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({
            "entries": entries.iter().map(audit_json).collect::<Vec<_>>(),
        }))?,
    }
    Ok(Outcome::Success)
}

/// `submitter:/a, viewer:/`; `-` for none.
fn fmt_grants(grants: &[Grant]) -> String {
    if grants.is_empty() {
        return "-".to_owned();
    }
    let grants: Vec<String> = grants
        .iter()
        .map(|g| format!("{}:{}", role_name(g.role), g.pool))
        .collect();
    grants.join(", ")
}

fn token_table(tokens: &[Token]) -> String {
    let mut table = Table::new(&[
        ("NAME", Align::Left),
        ("GRANTS", Align::Left),
        ("CREATED", Align::Left),
        ("CREATED BY", Align::Left),
        ("CERTS", Align::Right),
    ]);
    for token in tokens {
        table.row(vec![
            token.name.clone(),
            fmt_grants(&token.grants),
            fmt_time_ms(token.created_at_ms),
            or_dash(&token.created_by),
            token.certificates.len().to_string(),
        ]);
    }
    table.render()
}

fn token_json(token: &Token) -> Value {
    json!({
        "name": token.name,
        "grants": token
            .grants
            .iter()
            .map(|g| json!({"role": role_name(g.role), "pool": g.pool}))
            .collect::<Vec<_>>(),
        "created_at_ms": token.created_at_ms,
        "created_by": token.created_by,
        "certificates": token.certificates.iter().map(certificate_json).collect::<Vec<_>>(),
    })
}

fn certificate_json(c: &TokenCertificate) -> Value {
    json!({
        "fingerprint": c.fingerprint,
        "issued_at_ms": c.issued_at_ms,
        "not_after_ms": c.not_after_ms,
    })
}

/// A status code as one word: `ok`, `permission_denied`.
fn fmt_code(code: i32) -> String {
    code_name(Code::from_i32(code)).replace(' ', "_")
}

/// `/peloton.v1.JobService/Kill` as `JobService/Kill`.
fn short_method(method: &str) -> &str {
    method
        .strip_prefix('/')
        .and_then(|m| m.strip_prefix("peloton.v1."))
        .unwrap_or(method)
}

/// One line per cell: newlines and tabs become blanks.
fn one_line(text: &str) -> String {
    or_dash(&text.replace(['\n', '\r', '\t'], " "))
}

fn audit_table(entries: &[AuditEntry]) -> String {
    let mut table = Table::new(&[
        ("SEQ", Align::Right),
        ("TIME", Align::Left),
        ("PRINCIPAL", Align::Left),
        ("METHOD", Align::Left),
        ("TARGET", Align::Left),
        ("CODE", Align::Left),
        ("MESSAGE", Align::Left),
    ]);
    for e in entries {
        table.row(vec![
            e.seq.to_string(),
            fmt_time_ms(e.time_ms),
            one_line(&e.principal),
            short_method(&e.method).to_owned(),
            one_line(&e.target),
            fmt_code(e.code),
            one_line(&e.message),
        ]);
    }
    table.render()
}

fn audit_json(e: &AuditEntry) -> Value {
    json!({
        "seq": e.seq,
        "time_ms": e.time_ms,
        "principal": e.principal,
        "method": e.method,
        "target": e.target,
        "code": e.code,
        "message": e.message,
    })
}

#[cfg(test)]
mod tests {
    use peloton_proto::v1::Role;

    use super::*;

    #[test]
    fn audit_rows_are_one_line_each() {
        let entry = AuditEntry {
            seq: 12,
            time_ms: 1_709_210_096_000,
            principal: "alice".to_owned(),
            method: "/peloton.v1.JobService/Create".to_owned(),
            target: "/b".to_owned(),
            code: Code::PermissionDenied as i32,
            message: "alice lacks permission jobs.write\non pool /b".to_owned(),
        };
        let table = audit_table(&[entry]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 2, "{table}");
        assert!(lines[0].starts_with("SEQ  TIME"), "{table}");
        for cell in [
            "12",
            "2024-02-29 12:34:56",
            "alice",
            "JobService/Create",
            "/b",
            "permission_denied",
            "alice lacks permission jobs.write on pool /b",
        ] {
            assert!(lines[1].contains(cell), "{cell}: {table}");
        }
        assert_eq!(fmt_code(0), "ok");
        assert_eq!(short_method("Other"), "Other");
    }

    #[test]
    fn tokens_show_their_grants_by_cli_names() {
        let token = Token {
            name: "alice".to_owned(),
            grants: vec![
                Grant {
                    role: Role::Submitter as i32,
                    pool: "/a".to_owned(),
                },
                Grant {
                    role: Role::PoolAdmin as i32,
                    pool: "/b".to_owned(),
                },
            ],
            created_at_ms: 0,
            created_by: "admin".to_owned(),
            certificates: Vec::new(),
        };
        assert_eq!(fmt_grants(&token.grants), "submitter:/a, pool-admin:/b");
        let json = token_json(&token);
        assert_eq!(json["grants"][1]["role"], "pool-admin");
        assert_eq!(json["created_by"], "admin");
        assert!(
            token_table(&[token]).contains("alice  submitter:/a, pool-admin:/b  -"),
            "{}",
            token_table(&[])
        );
    }
}
