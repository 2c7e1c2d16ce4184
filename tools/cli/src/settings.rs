//! Where the CLI connects and as whom: the servers, the CA file that
//! `https://` servers' certificates are checked against, and the bearer
//! token, gathered from flags, the environment and the config file.
//!
//! Precedence, first found wins:
//! - servers: `--server`, `PELOTON_SERVER`, the file's `server`, else
//!   127.0.0.1:5391;
//! - CA file: `--ca-file`, `PELOTON_CA_FILE`, the file's `ca_file`;
//! - client certificate and key: `--cert-file`/`--key-file`,
//!   `PELOTON_CERT_FILE`/`PELOTON_KEY_FILE`, the file's
//!   `cert_file`/`key_file`. One from the command line (flag or variable)
//!   replaces the token; one from the file is sent beside a token found,
//!   and the server takes the token;
//! - the pool of `peloton run` without `--pool`: `PELOTON_POOL`, the
//!   file's `pool`;
//! - token (never a flag, so that it stays out of shell histories and
//!   process lists): `PELOTON_TOKEN`, `PELOTON_TOKEN_FILE` (the file's
//!   content, trimmed), the file's `token_file`, the file's `token`.
//!
//! An address without a scheme is `http://`, or `https://` once a CA file
//! is configured. The config file is `--config FILE` / `PELOTON_CONFIG`, else
//! `$XDG_CONFIG_HOME/peloton/config.yaml` (`~/.config/peloton/config.yaml`)
//! if it exists. Its relative paths are relative to its directory. An empty
//! environment variable counts as unset.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use tonic::transport::{Certificate, Identity};

use crate::channel::{self, Security};
use crate::error::UsageError;
use crate::servers;

/// Where the CLI connects when no server is given anywhere (with the scheme
/// the CA file decides).
pub const DEFAULT_ADDRESS: &str = "127.0.0.1:5391";

/// The keys a config file may hold.
pub const CONFIG_KEYS: &[&str] = &[
    "server",
    "ca_file",
    "cert_file",
    "key_file",
    "token_file",
    "token",
    "pool",
];

/// What reads the environment: `std::env` in the binary, a map in tests.
pub type Env<'a> = &'a dyn Fn(&str) -> Option<OsString>;

/// The process's environment; empty values count as unset.
pub fn process_env(name: &str) -> Option<OsString> {
    std::env::var_os(name).filter(|value| !value.is_empty())
}

/// A parsed config file. Paths are resolved against the file's directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigFile {
    pub path: PathBuf,
    pub server: Option<String>,
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub token_file: Option<PathBuf>,
    pub token: Option<String>,
    /// The pool `peloton run` submits to when none is given.
    pub pool: Option<String>,
}

impl ConfigFile {
    /// Parses `text`, the content of the file at `path`.
    pub fn parse(text: &str, path: &Path) -> Result<ConfigFile, UsageError> {
        let shown = path.display();
        let expected = || {
            UsageError(format!(
                "config file {shown}: expected a mapping of keys ({})",
                CONFIG_KEYS.join(", ")
            ))
        };
        let mut config = ConfigFile {
            path: path.to_path_buf(),
            ..ConfigFile::default()
        };
        if text.trim().is_empty() {
            return Ok(config);
        }
        let value: serde_norway::Value = serde_norway::from_str(text)
            .map_err(|err| UsageError(format!("config file {shown}: {err}")))?;
        let mapping = match value {
            serde_norway::Value::Null => return Ok(config),
            serde_norway::Value::Mapping(mapping) => mapping,
            _ => return Err(expected()),
        };
        let dir = path.parent().unwrap_or(Path::new(""));
        for (key, value) in mapping {
            let serde_norway::Value::String(key) = key else {
                return Err(expected());
            };
            if !CONFIG_KEYS.contains(&key.as_str()) {
                return Err(UsageError(format!(
                    "config file {shown}: unknown key `{key}` (the keys are {})",
                    CONFIG_KEYS.join(", ")
                )));
            }
            let value = match value {
                serde_norway::Value::Null => continue,
                serde_norway::Value::String(value) => value,
                _ => {
                    return Err(UsageError(format!(
                        "config file {shown}: `{key}` must be a string"
                    )));
                }
            };
            match key.as_str() {
                "server" => config.server = Some(value),
                "ca_file" => config.ca_file = Some(dir.join(value)),
                "cert_file" => config.cert_file = Some(dir.join(value)),
                "key_file" => config.key_file = Some(dir.join(value)),
                "token_file" => config.token_file = Some(dir.join(value)),
                "token" => config.token = Some(value),
                "pool" => config.pool = Some(value),
                _ => unreachable!("the keys are checked above"),
            }
        }
        Ok(config)
    }

    /// Reads and parses the file at `path`; warns on stderr if it holds a
    /// token and others may read it.
    pub fn load(path: &Path) -> Result<ConfigFile, UsageError> {
        let text = std::fs::read_to_string(path).map_err(|err| {
            UsageError(format!("cannot read config file {}: {err}", path.display()))
        })?;
        let config = ConfigFile::parse(&text, path)?;
        if config.token.is_some()
            && let Some(mode) = readable_by_others(path)
        {
            eprintln!(
                "warning: config file {} holds a token and is readable by group or others \
                 (mode {mode:o}); `chmod 600` it, or keep the token in a token_file",
                path.display()
            );
        }
        Ok(config)
    }
}

/// The file's permission bits, if group or others may read it.
#[cfg(unix)]
fn readable_by_others(path: &Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    (mode & 0o044 != 0).then_some(mode)
}

#[cfg(not(unix))]
fn readable_by_others(_: &Path) -> Option<u32> {
    None
}

/// The config file read when none is named, if it exists:
/// `$XDG_CONFIG_HOME/peloton/config.yaml`, else
/// `$HOME/.config/peloton/config.yaml`.
pub fn default_config_path(env: Env<'_>) -> Option<PathBuf> {
    let base = env("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        // The XDG spec: a relative path is to be ignored.
        .filter(|dir| dir.is_absolute())
        .or_else(|| env("HOME").map(|home| PathBuf::from(home).join(".config")))?;
    Some(base.join("peloton").join("config.yaml"))
}

/// What the command line says (a flag, or its variable as clap read it).
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `--server` / `PELOTON_SERVER`.
    pub server: Option<String>,
    /// `--config` / `PELOTON_CONFIG`.
    pub config: Option<PathBuf>,
    /// `--ca-file` / `PELOTON_CA_FILE`.
    pub ca_file: Option<PathBuf>,
    /// `--cert-file` / `PELOTON_CERT_FILE`.
    pub cert_file: Option<PathBuf>,
    /// `--key-file` / `PELOTON_KEY_FILE`.
    pub key_file: Option<PathBuf>,
}

/// Where and how to connect.
#[derive(Debug)]
pub struct Resolved {
    /// URIs, in the order they are tried.
    pub servers: Vec<String>,
    pub security: Security,
    /// The config file read, if any.
    pub config: Option<PathBuf>,
}

/// The config file: the one named (which must exist), else the default one
/// if it exists.
/// The pool `peloton run` submits to when none is given: `PELOTON_POOL`,
/// else the config file's `pool`.
pub fn default_pool(options: &Options, env: Env<'_>) -> Result<Option<String>, UsageError> {
    if let Some(pool) = env("PELOTON_POOL") {
        return pool
            .into_string()
            .map(Some)
            .map_err(|_| UsageError("PELOTON_POOL: not UTF-8".into()));
    }
    Ok(config_file(options, env)?.and_then(|f| f.pool))
}

pub fn config_file(options: &Options, env: Env<'_>) -> Result<Option<ConfigFile>, UsageError> {
    if let Some(path) = &options.config {
        return ConfigFile::load(path).map(Some);
    }
    match default_config_path(env) {
        Some(path) if path.exists() => ConfigFile::load(&path).map(Some),
        _ => Ok(None),
    }
}

/// The servers, CA and token from `options`, `env` and the config file.
pub fn resolve(options: &Options, env: Env<'_>) -> Result<Resolved, UsageError> {
    let file = config_file(options, env)?;
    let file = file.as_ref();
    let mut security = Security::default();

    let ca_file = options
        .ca_file
        .clone()
        .or_else(|| file.and_then(|f| f.ca_file.clone()));
    if let Some(ca_file) = ca_file {
        security.ca = Some((read_ca(&ca_file)?, ca_file.display().to_string()));
    }

    // A certificate from the command line (a flag or its variable) is the
    // caller's identity, whatever token a lower source holds.
    let cert_from_command_line = options.cert_file.is_some() || options.key_file.is_some();
    let cert_file = options
        .cert_file
        .clone()
        .or_else(|| file.and_then(|f| f.cert_file.clone()));
    let key_file = options
        .key_file
        .clone()
        .or_else(|| file.and_then(|f| f.key_file.clone()));
    match (cert_file, key_file) {
        (Some(cert), Some(key)) => {
            security.identity = Some((read_identity(&cert, &key)?, cert.display().to_string()));
        }
        (None, None) => {}
        (Some(cert), None) => {
            return Err(UsageError(format!(
                "client certificate {}: give its key too (--key-file, PELOTON_KEY_FILE or \
                 `key_file:` in the config file)",
                cert.display()
            )));
        }
        (None, Some(key)) => {
            return Err(UsageError(format!(
                "client key {}: give its certificate too (--cert-file, PELOTON_CERT_FILE or \
                 `cert_file:` in the config file)",
                key.display()
            )));
        }
    }

    let token = if cert_from_command_line {
        None
    } else {
        token(env, file)?
    };
    if let Some((token, source)) = token {
        security = security
            .with_token(&token)
            .map_err(|why| UsageError(format!("{source}: {why}")))?;
    }

    let server = options
        .server
        .clone()
        .or_else(|| file.and_then(|f| f.server.clone()))
        .unwrap_or_else(|| DEFAULT_ADDRESS.to_owned());
    let servers = servers::parse_servers_as(&server, security.scheme())?;
    if security.ca.is_none()
        && let Some(https) = servers.iter().find(|uri| uri.starts_with("https://"))
    {
        return Err(UsageError(channel::no_ca_file(https)));
    }
    Ok(Resolved {
        servers,
        security,
        config: file.map(|f| f.path.clone()),
    })
}

/// The CA certificate in `path` (PEM).
fn read_ca(path: &Path) -> Result<Certificate, UsageError> {
    let pem = std::fs::read(path)
        .map_err(|err| UsageError(format!("cannot read CA file {}: {err}", path.display())))?;
    if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
        return Err(UsageError(format!(
            "CA file {}: no PEM certificate in it (expected -----BEGIN CERTIFICATE-----)",
            path.display()
        )));
    }
    Ok(Certificate::from_pem(pem))
}

/// A client certificate and its key (PEM files).
fn read_identity(cert: &Path, key: &Path) -> Result<Identity, UsageError> {
    let read = |path: &Path, what: &str, marker: &str| {
        let pem = std::fs::read(path)
            .map_err(|err| UsageError(format!("cannot read {what} {}: {err}", path.display())))?;
        if !String::from_utf8_lossy(&pem).contains(marker) {
            return Err(UsageError(format!(
                "{what} {}: no PEM {marker} in it",
                path.display()
            )));
        }
        Ok(pem)
    };
    let cert = read(cert, "client certificate", "-----BEGIN CERTIFICATE-----")?;
    let key = read(key, "client key", "PRIVATE KEY-----")?;
    Ok(Identity::from_pem(cert, key))
}

/// The token (trimmed) and where it came from, first found of
/// `PELOTON_TOKEN`, `PELOTON_TOKEN_FILE`, the config file's `token_file`
/// and its `token`.
fn token(env: Env<'_>, file: Option<&ConfigFile>) -> Result<Option<(String, String)>, UsageError> {
    if let Some(token) = env("PELOTON_TOKEN") {
        let token = token.to_string_lossy().trim().to_owned();
        return Ok(Some((token, "PELOTON_TOKEN".to_owned())));
    }
    let from_file = |path: &Path, named: &str| {
        let content = std::fs::read(path).map_err(|err| {
            UsageError(format!(
                "cannot read the token file {} ({named}): {err}",
                path.display()
            ))
        })?;
        let token = String::from_utf8_lossy(&content).trim().to_owned();
        Ok(Some((
            token,
            format!("the token file {} ({named})", path.display()),
        )))
    };
    if let Some(path) = env("PELOTON_TOKEN_FILE") {
        return from_file(Path::new(&path), "PELOTON_TOKEN_FILE");
    }
    let Some(file) = file else {
        return Ok(None);
    };
    if let Some(path) = &file.token_file {
        return from_file(
            path,
            &format!("`token_file` in config file {}", file.path.display()),
        );
    }
    Ok(file.token.as_ref().map(|token| {
        (
            token.trim().to_owned(),
            format!("`token` in config file {}", file.path.display()),
        )
    }))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn parse(text: &str) -> Result<ConfigFile, String> {
        ConfigFile::parse(text, Path::new("/etc/peloton/config.yaml")).map_err(|e| e.0)
    }

    #[test]
    fn config_file_keys_and_relative_paths() {
        let config = parse(
            "server: peloton:5391\nca_file: tls/ca.pem\ncert_file: me.pem\nkey_file: /k/me.key\n\
             token_file: /secrets/token\ntoken: abc\npool: /demo\n",
        )
        .expect("valid");
        assert_eq!(
            config,
            ConfigFile {
                path: PathBuf::from("/etc/peloton/config.yaml"),
                server: Some("peloton:5391".to_owned()),
                // Relative to the file's directory; absolute stays.
                ca_file: Some(PathBuf::from("/etc/peloton/tls/ca.pem")),
                cert_file: Some(PathBuf::from("/etc/peloton/me.pem")),
                key_file: Some(PathBuf::from("/k/me.key")),
                token_file: Some(PathBuf::from("/secrets/token")),
                token: Some("abc".to_owned()),
                pool: Some("/demo".to_owned()),
            }
        );
        // Empty files and keys without a value set nothing.
        assert_eq!(parse("").expect("empty").server, None);
        assert_eq!(parse("# nothing\n").expect("comment").server, None);
        assert_eq!(parse("token:\n").expect("null").token, None);
        // A file named without a directory: paths relative to the current
        // one.
        let here = ConfigFile::parse("ca_file: ca.pem", Path::new("config.yaml")).expect("valid");
        assert_eq!(here.ca_file, Some(PathBuf::from("ca.pem")));
    }

    #[test]
    fn config_file_errors_name_the_file_and_key() {
        let err = parse("server: a:1\ntokn: x\n").unwrap_err();
        assert!(
            err.contains("/etc/peloton/config.yaml")
                && err.contains("unknown key `tokn`")
                && err.contains("token_file"),
            "{err}"
        );
        let err = parse("server: [a, b]\n").unwrap_err();
        assert!(err.contains("`server` must be a string"), "{err}");
        let err = parse("- server\n").unwrap_err();
        assert!(err.contains("expected a mapping of keys"), "{err}");
        let err = parse("server: 'unclosed\n").unwrap_err();
        assert!(
            err.starts_with("config file /etc/peloton/config.yaml: "),
            "{err}"
        );
    }

    #[test]
    fn the_default_file_is_under_xdg_config_home_else_home() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        assert_eq!(
            default_config_path(&env(&[("XDG_CONFIG_HOME", "/x"), ("HOME", "/h")])),
            Some(PathBuf::from("/x/peloton/config.yaml"))
        );
        assert_eq!(
            default_config_path(&env(&[("XDG_CONFIG_HOME", "rel"), ("HOME", "/h")])),
            Some(PathBuf::from("/h/.config/peloton/config.yaml"))
        );
        assert_eq!(default_config_path(&env(&[])), None);
    }

    /// A directory with a config file and a CA file, and an environment.
    struct Setup {
        dir: tempfile::TempDir,
        vars: HashMap<String, OsString>,
    }

    impl Setup {
        fn new(config: &str) -> Setup {
            let dir = tempfile::tempdir().expect("temp dir");
            let cfg = dir.path().join("cfg");
            std::fs::create_dir(&cfg).expect("mkdir");
            std::fs::write(cfg.join("config.yaml"), config).expect("write");
            let pem = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
            std::fs::write(cfg.join("ca.pem"), pem).expect("write");
            std::fs::write(dir.path().join("other-ca.pem"), pem).expect("write");
            std::fs::write(cfg.join("token"), "from-token-file\n").expect("write");
            std::fs::write(dir.path().join("env-token"), "  from-env-file \n").expect("write");
            // The default location: XDG_CONFIG_HOME/peloton/config.yaml.
            let mut vars = HashMap::new();
            vars.insert(
                "XDG_CONFIG_HOME".to_owned(),
                dir.path().join("xdg").into_os_string(),
            );
            Setup { dir, vars }
        }

        fn path(&self, name: &str) -> PathBuf {
            self.dir.path().join(name)
        }

        fn set(&mut self, name: &str, value: impl Into<OsString>) -> &mut Setup {
            self.vars.insert(name.to_owned(), value.into());
            self
        }

        fn resolve(&self, options: &Options) -> Result<Resolved, String> {
            let env = |name: &str| self.vars.get(name).cloned();
            resolve(options, &env).map_err(|e| e.0)
        }

        fn with_config(&self) -> Options {
            Options {
                config: Some(self.path("cfg/config.yaml")),
                ..Options::default()
            }
        }
    }

    fn bearer(resolved: &Resolved) -> Option<String> {
        resolved
            .security
            .authorization
            .as_ref()
            .map(|v| v.to_str().expect("ascii").to_owned())
    }

    #[test]
    fn nothing_configured_is_the_insecure_default() {
        let setup = Setup::new("");
        let resolved = setup.resolve(&Options::default()).expect("resolves");
        assert_eq!(resolved.servers, ["http://127.0.0.1:5391"]);
        assert!(resolved.security.ca.is_none());
        assert_eq!(bearer(&resolved), None);
        assert_eq!(resolved.config, None);
    }

    #[test]
    fn flags_beat_the_environment_beats_the_file() {
        let mut setup = Setup::new(
            "server: file-host:1\nca_file: ca.pem\ntoken_file: token\ntoken: from-token-key\n",
        );
        // Everything from the file: https assumed, the CA next to it.
        let resolved = setup.resolve(&setup.with_config()).expect("resolves");
        assert_eq!(resolved.servers, ["https://file-host:1"]);
        let ca = &resolved.security.ca.as_ref().expect("a CA").1;
        assert_eq!(ca, &setup.path("cfg/ca.pem").display().to_string());
        assert_eq!(bearer(&resolved).as_deref(), Some("Bearer from-token-file"));
        // Flags (or the variables clap reads for them) win.
        let options = Options {
            server: Some("flag-host:2".to_owned()),
            ca_file: Some(setup.path("other-ca.pem")),
            ..setup.with_config()
        };
        let resolved = setup.resolve(&options).expect("resolves");
        assert_eq!(resolved.servers, ["https://flag-host:2"]);
        assert!(
            resolved
                .security
                .ca
                .as_ref()
                .expect("a CA")
                .1
                .ends_with("other-ca.pem")
        );
        // PELOTON_TOKEN_FILE beats the file's token_file; PELOTON_TOKEN
        // beats both.
        let env_file = setup.path("env-token");
        setup.set("PELOTON_TOKEN_FILE", env_file);
        let resolved = setup.resolve(&setup.with_config()).expect("resolves");
        assert_eq!(bearer(&resolved).as_deref(), Some("Bearer from-env-file"));
        setup.set("PELOTON_TOKEN", "from-env");
        let resolved = setup.resolve(&setup.with_config()).expect("resolves");
        assert_eq!(bearer(&resolved).as_deref(), Some("Bearer from-env"));
    }

    #[test]
    fn the_token_key_is_last_and_the_default_file_is_read_if_it_exists() {
        let setup = Setup::new("");
        let xdg = setup.path("xdg/peloton");
        std::fs::create_dir_all(&xdg).expect("mkdir");
        std::fs::write(
            xdg.join("config.yaml"),
            "server: http://x:1\ntoken: secret-1\n",
        )
        .expect("write");
        let resolved = setup.resolve(&Options::default()).expect("resolves");
        assert_eq!(resolved.servers, ["http://x:1"]);
        assert_eq!(bearer(&resolved).as_deref(), Some("Bearer secret-1"));
        assert_eq!(resolved.config, Some(xdg.join("config.yaml")));
    }

    #[test]
    fn bad_settings_are_usage_errors() {
        let mut setup = Setup::new("");
        // A named config file that does not exist.
        let err = setup
            .resolve(&Options {
                config: Some(setup.path("missing.yaml")),
                ..Options::default()
            })
            .unwrap_err();
        assert!(
            err.starts_with("cannot read config file ") && err.contains("missing.yaml"),
            "{err}"
        );
        // https without a CA file names the three ways to give one.
        let err = setup
            .resolve(&Options {
                server: Some("https://h:1".to_owned()),
                ..Options::default()
            })
            .unwrap_err();
        for way in ["--ca-file", "PELOTON_CA_FILE", "ca_file"] {
            assert!(err.contains(way), "{err}");
        }
        // A CA file that is not PEM.
        let err = setup
            .resolve(&Options {
                ca_file: Some(setup.path("env-token")),
                ..Options::default()
            })
            .unwrap_err();
        assert!(err.contains("no PEM certificate"), "{err}");
        // A token that is not printable ASCII, named by its source.
        setup.set("PELOTON_TOKEN", "tok\u{e9}n");
        let err = setup.resolve(&Options::default()).unwrap_err();
        assert!(
            err.starts_with("PELOTON_TOKEN: the token is not printable ASCII"),
            "{err}"
        );
        setup.set("PELOTON_TOKEN", "two words");
        assert!(setup.resolve(&Options::default()).is_err());
        setup.vars.remove("PELOTON_TOKEN");
        let missing = setup.path("no-token");
        setup.set("PELOTON_TOKEN_FILE", missing);
        let err = setup.resolve(&Options::default()).unwrap_err();
        assert!(
            err.contains("PELOTON_TOKEN_FILE") && err.contains("no-token"),
            "{err}"
        );
        let empty = setup.path("empty-token");
        std::fs::write(&empty, "\n").expect("write");
        setup.set("PELOTON_TOKEN_FILE", empty);
        let err = setup.resolve(&Options::default()).unwrap_err();
        assert!(err.contains("the token is empty"), "{err}");
    }

    #[test]
    fn the_token_is_never_in_debug_output() {
        let security = Security::default().with_token("s3cret").expect("valid");
        let shown = format!("{security:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(security.authorization.expect("set").is_sensitive());
    }
}
