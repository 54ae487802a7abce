//! Where the engine is: resolved once, the way the `docker` CLI would resolve it.
//!
//! Resolution order: an explicitly configured context, then `DOCKER_HOST` (with
//! `DOCKER_TLS_VERIFY`/`DOCKER_CERT_PATH` for `tcp://`), then `DOCKER_CONTEXT`, then the
//! `currentContext` of the client configuration (`$DOCKER_CONFIG/config.json`, default
//! `~/.docker/config.json`) looked up in the context store
//! (`contexts/meta/<sha256 of the name>/meta.json`), then the default socket. Only the snapshot of
//! the management environment taken at connect is read, so a later change of this process's
//! environment never moves the backend to another engine. It reads small files and does not talk
//! to the engine: [`crate::connection`] connects to what it resolves.

use std::ffi::OsString;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use sandbox_core::SandboxError;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use crate::BACKEND_NAME;

/// Where the engine listens when nothing else names it.
pub const DEFAULT_DOCKER_HOST: &str = "unix:///var/run/docker.sock";

/// The largest client configuration or context file read (they are a few hundred bytes).
const MAX_CONFIG_FILE: u64 = 1024 * 1024;

/// What chose the endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EndpointSource {
    /// The `DOCKER_HOST` variable of the management environment.
    DockerHost,
    /// A named context from the context store (`DockerConfig::context`, `DOCKER_CONTEXT` or the
    /// client configuration's `currentContext`).
    Context(String),
    /// Nothing named one: the default socket.
    Default,
}

impl std::fmt::Display for EndpointSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EndpointSource::DockerHost => f.write_str("DOCKER_HOST"),
            EndpointSource::Context(name) => write!(f, "context {name}"),
            EndpointSource::Default => f.write_str("the default socket"),
        }
    }
}

/// TLS material of a `tcp://` endpoint, as the CLI would use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA bundle (`ca.pem`).
    pub ca: PathBuf,
    /// The client certificate (`cert.pem`).
    pub cert: PathBuf,
    /// The client key (`key.pem`).
    pub key: PathBuf,
}

/// The engine endpoint a backend is pinned to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `unix://…`, `tcp://…` or `ssh://…`.
    pub host: String,
    /// What chose it.
    pub source: EndpointSource,
    /// Client TLS material, for a verified `tcp://` endpoint.
    pub tls: Option<TlsFiles>,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (from {})", self.host, self.source)
    }
}

/// What a context's `meta.json` must yield.
#[derive(Debug, Deserialize)]
struct ContextMeta {
    #[serde(rename = "Name")]
    name: String,
    #[serde(rename = "Endpoints")]
    endpoints: ContextEndpoints,
}

#[derive(Debug, Deserialize)]
struct ContextEndpoints {
    docker: ContextDockerEndpoint,
}

#[derive(Debug, Deserialize)]
struct ContextDockerEndpoint {
    #[serde(rename = "Host")]
    host: String,
    #[serde(rename = "SkipTLSVerify", default)]
    skip_tls_verify: bool,
}

#[derive(Debug, Deserialize)]
struct ClientConfig {
    #[serde(rename = "currentContext", default)]
    current_context: Option<String>,
}

impl Endpoint {
    /// Resolves the endpoint from a snapshot of an environment, as the `docker` CLI would.
    ///
    /// `context` is an explicit choice (like `docker --context`) and wins over every variable.
    ///
    /// # Errors
    /// BackendUnavailable when a named context is absent from the store or unreadable, or when
    /// the client configuration is malformed.
    pub fn resolve(
        env: &[(OsString, OsString)],
        context: Option<&str>,
    ) -> Result<Endpoint, SandboxError> {
        let var = |name: &str| {
            env.iter()
                .rev()
                .find(|(n, _)| n == name)
                .and_then(|(_, v)| v.to_str())
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        };
        let config_dir = var("DOCKER_CONFIG")
            .map(PathBuf::from)
            .or_else(|| var("HOME").map(|home| Path::new(&home).join(".docker")));
        if let Some(name) = context {
            return from_context(name, config_dir.as_deref(), &var);
        }
        if let Some(host) = var("DOCKER_HOST") {
            return Ok(from_docker_host(host, config_dir.as_deref(), &var));
        }
        if let Some(name) = var("DOCKER_CONTEXT") {
            return from_context(&name, config_dir.as_deref(), &var);
        }
        if let Some(dir) = &config_dir {
            if let Some(text) = read_small(&dir.join("config.json"))? {
                let config: ClientConfig = serde_json::from_slice(&text).map_err(|e| {
                    unavailable(format!(
                        "the client configuration {} is malformed: {e}",
                        dir.join("config.json").display()
                    ))
                })?;
                if let Some(name) = config.current_context.filter(|n| !n.is_empty()) {
                    return from_context(&name, Some(dir), &var);
                }
            }
        }
        Ok(Endpoint {
            host: DEFAULT_DOCKER_HOST.to_owned(),
            source: EndpointSource::Default,
            tls: None,
        })
    }
}

/// `DOCKER_HOST`, with the CLI's TLS variables for `tcp://`.
fn from_docker_host(
    host: String,
    config_dir: Option<&Path>,
    var: &dyn Fn(&str) -> Option<String>,
) -> Endpoint {
    let tls = (host.starts_with("tcp://") && var("DOCKER_TLS_VERIFY").is_some()).then(|| {
        let dir = var("DOCKER_CERT_PATH")
            .map(PathBuf::from)
            .or_else(|| config_dir.map(Path::to_owned))
            .unwrap_or_default();
        tls_files(&dir)
    });
    Endpoint {
        host,
        source: EndpointSource::DockerHost,
        tls,
    }
}

fn tls_files(dir: &Path) -> TlsFiles {
    TlsFiles {
        ca: dir.join("ca.pem"),
        cert: dir.join("cert.pem"),
        key: dir.join("key.pem"),
    }
}

/// A named context: `default` is `DOCKER_HOST` or the default socket; any other name is read
/// from the context store.
fn from_context(
    name: &str,
    config_dir: Option<&Path>,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<Endpoint, SandboxError> {
    if name == "default" {
        return Ok(match var("DOCKER_HOST") {
            Some(host) => from_docker_host(host, config_dir, var),
            None => Endpoint {
                host: DEFAULT_DOCKER_HOST.to_owned(),
                source: EndpointSource::Context("default".to_owned()),
                tls: None,
            },
        });
    }
    let Some(dir) = config_dir else {
        return Err(unavailable(format!(
            "context {name:?} is named but neither DOCKER_CONFIG nor HOME locates the context store"
        )));
    };
    let digest = hex(&Sha256::digest(name.as_bytes()));
    let meta_path = dir
        .join("contexts")
        .join("meta")
        .join(&digest)
        .join("meta.json");
    let text = read_small(&meta_path)?.ok_or_else(|| {
        unavailable(format!(
            "context {name:?} not found: {} does not exist",
            meta_path.display()
        ))
    })?;
    let meta: ContextMeta = serde_json::from_slice(&text).map_err(|e| {
        unavailable(format!(
            "context {name:?}: {} is malformed: {e}",
            meta_path.display()
        ))
    })?;
    if meta.name != name || meta.endpoints.docker.host.is_empty() {
        return Err(unavailable(format!(
            "context {name:?}: {} names context {:?} with endpoint {:?}",
            meta_path.display(),
            meta.name,
            meta.endpoints.docker.host
        )));
    }
    let tls_dir = dir
        .join("contexts")
        .join("tls")
        .join(&digest)
        .join("docker");
    let tls = (meta.endpoints.docker.host.starts_with("tcp://")
        && !meta.endpoints.docker.skip_tls_verify
        && tls_dir.join("ca.pem").exists())
    .then(|| tls_files(&tls_dir));
    Ok(Endpoint {
        host: meta.endpoints.docker.host,
        source: EndpointSource::Context(name.to_owned()),
        tls,
    })
}

/// A small file's bytes; `None` when it does not exist.
fn read_small(path: &Path) -> Result<Option<Vec<u8>>, SandboxError> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(unavailable(format!("cannot read {}: {e}", path.display())));
        }
    };
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| unavailable(format!("cannot read {}: {e}", path.display())))?;
    if bytes.len() as u64 > MAX_CONFIG_FILE {
        return Err(unavailable(format!(
            "{} is larger than {MAX_CONFIG_FILE} bytes",
            path.display()
        )));
    }
    Ok(Some(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The backend is unavailable: no engine, or no way to name one.
#[cold]
pub(crate) fn unavailable(detail: impl Into<String>) -> SandboxError {
    SandboxError::BackendUnavailable {
        backend: BACKEND_NAME.to_owned(),
        detail: detail.into(),
        source: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(n, v)| (OsString::from(n), OsString::from(v)))
            .collect()
    }

    fn write_context(dir: &Path, name: &str, host: &str) {
        let digest = hex(&Sha256::digest(name.as_bytes()));
        let meta = dir.join("contexts/meta").join(digest);
        std::fs::create_dir_all(&meta).unwrap();
        std::fs::write(
            meta.join("meta.json"),
            format!(
                r#"{{"Name":"{name}","Metadata":{{}},"Endpoints":{{"docker":{{"Host":"{host}","SkipTLSVerify":false}}}}}}"#
            ),
        )
        .unwrap();
    }

    #[test]
    fn nothing_named_is_the_default_socket() {
        let home = tempfile::tempdir().unwrap();
        let endpoint =
            Endpoint::resolve(&env(&[("HOME", home.path().to_str().unwrap())]), None).unwrap();
        assert_eq!(endpoint.host, DEFAULT_DOCKER_HOST);
        assert_eq!(endpoint.source, EndpointSource::Default);
        assert_eq!(endpoint.tls, None);
    }

    #[test]
    fn docker_host_wins_over_contexts_and_carries_tls() {
        let home = tempfile::tempdir().unwrap();
        let config = home.path().join(".docker");
        write_context(&config, "ctx", "unix:///ctx.sock");
        std::fs::write(config.join("config.json"), r#"{"currentContext":"ctx"}"#).unwrap();
        let vars = env(&[
            ("HOME", home.path().to_str().unwrap()),
            ("DOCKER_CONTEXT", "ctx"),
            ("DOCKER_HOST", "tcp://10.0.0.1:2376"),
            ("DOCKER_TLS_VERIFY", "1"),
            ("DOCKER_CERT_PATH", "/certs"),
        ]);
        let endpoint = Endpoint::resolve(&vars, None).unwrap();
        assert_eq!(endpoint.host, "tcp://10.0.0.1:2376");
        assert_eq!(endpoint.source, EndpointSource::DockerHost);
        assert_eq!(endpoint.tls.unwrap().key, PathBuf::from("/certs/key.pem"));
        // An explicit context wins over the variables.
        let explicit = Endpoint::resolve(&vars, Some("ctx")).unwrap();
        assert_eq!(explicit.host, "unix:///ctx.sock");
        assert_eq!(explicit.source, EndpointSource::Context("ctx".into()));
    }

    #[test]
    fn docker_context_then_current_context() {
        let home = tempfile::tempdir().unwrap();
        let config = home.path().join(".docker");
        write_context(&config, "one", "unix:///one.sock");
        write_context(&config, "two", "ssh://user@host");
        std::fs::write(config.join("config.json"), r#"{"currentContext":"two"}"#).unwrap();
        let home_var = ("HOME", home.path().to_str().unwrap());
        let by_variable = Endpoint::resolve(&env(&[home_var, ("DOCKER_CONTEXT", "one")]), None);
        assert_eq!(by_variable.unwrap().host, "unix:///one.sock");
        let current = Endpoint::resolve(&env(&[home_var]), None).unwrap();
        assert_eq!(current.host, "ssh://user@host");
        assert_eq!(current.source, EndpointSource::Context("two".into()));
        // DOCKER_CONFIG moves the whole client configuration.
        let elsewhere = tempfile::tempdir().unwrap();
        let moved = Endpoint::resolve(
            &env(&[
                home_var,
                ("DOCKER_CONFIG", elsewhere.path().to_str().unwrap()),
            ]),
            None,
        )
        .unwrap();
        assert_eq!(moved.source, EndpointSource::Default);
    }

    #[test]
    fn the_default_context_is_docker_host_or_the_socket() {
        let vars = env(&[("DOCKER_CONTEXT", "default")]);
        assert_eq!(
            Endpoint::resolve(&vars, None).unwrap().host,
            DEFAULT_DOCKER_HOST
        );
        let vars = env(&[("DOCKER_HOST", "unix:///x.sock")]);
        assert_eq!(
            Endpoint::resolve(&vars, Some("default")).unwrap().host,
            "unix:///x.sock"
        );
    }

    #[test]
    fn a_missing_or_forged_context_is_unavailable() {
        let home = tempfile::tempdir().unwrap();
        let config = home.path().join(".docker");
        let vars = env(&[
            ("HOME", home.path().to_str().unwrap()),
            ("DOCKER_CONTEXT", "absent"),
        ]);
        let error = Endpoint::resolve(&vars, None).unwrap_err();
        assert_eq!(error.kind(), sandbox_core::ErrorKind::BackendUnavailable);
        assert!(error.to_string().contains("absent"), "{error}");
        // A meta file filed under one name's digest but naming another is refused.
        write_context(&config, "other", "unix:///other.sock");
        let digest_of_other = hex(&Sha256::digest(b"other"));
        let digest_of_absent = hex(&Sha256::digest(b"absent"));
        std::fs::rename(
            config.join("contexts/meta").join(digest_of_other),
            config.join("contexts/meta").join(digest_of_absent),
        )
        .unwrap();
        assert!(Endpoint::resolve(&vars, None).is_err());
        std::fs::write(config.join("config.json"), b"{not json").unwrap();
        let malformed = env(&[("HOME", home.path().to_str().unwrap())]);
        assert!(Endpoint::resolve(&malformed, None).is_err());
    }
}
