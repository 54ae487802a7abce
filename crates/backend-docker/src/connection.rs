//! Reaching the engine: where it is, resolved once the way the `docker` CLI would resolve it, and
//! one API client pinned to that answer for the backend's whole life.
//!
//! Resolution order: an explicitly configured context, then `DOCKER_HOST` (with
//! `DOCKER_TLS_VERIFY`/`DOCKER_CERT_PATH` for `tcp://`), then `DOCKER_CONTEXT`, then the
//! `currentContext` of the client configuration (`$DOCKER_CONFIG/config.json`, default
//! `~/.docker/config.json`) looked up in the context store
//! (`contexts/meta/<sha256 of the name>/meta.json`), then the default socket. Only the snapshot of
//! the management environment taken at connect is read, so a later change of this process's
//! environment never moves the backend to another engine.

use std::ffi::OsString;
use std::future::Future;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::{ClientVersion, Docker, API_DEFAULT_VERSION};
use sandbox_core::SandboxError;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use crate::BACKEND_NAME;

/// Where the engine listens when nothing else names it.
pub const DEFAULT_DOCKER_HOST: &str = "unix:///var/run/docker.sock";

/// The largest client configuration or context file read (they are a few hundred bytes).
const MAX_CONFIG_FILE: u64 = 1024 * 1024;

/// How many characters of an engine message an error quotes.
const MESSAGE_CHARS: usize = 2000;

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

/// How one API call failed, before it is named for the caller.
#[derive(Debug)]
pub(crate) enum ApiFailure {
    /// The engine answered with an error status.
    Status { code: u16, message: String },
    /// The call's deadline passed.
    Deadline(Duration),
    /// A streamed answer was malformed or refused by this side's parser.
    Stream(String),
    /// The transport failed (connection refused, reset, protocol error…).
    Transport(bollard::errors::Error),
}

impl ApiFailure {
    /// The engine said 404 (no such container, image or path).
    pub(crate) fn is_not_found(&self) -> bool {
        matches!(self, ApiFailure::Status { code: 404, .. })
    }

    /// The engine said 409 (name in use, container paused or not running).
    pub(crate) fn is_conflict(&self) -> bool {
        matches!(self, ApiFailure::Status { code: 409, .. })
    }

    /// The engine's own message, empty for a failure that has none.
    pub(crate) fn message(&self) -> &str {
        match self {
            ApiFailure::Status { message, .. } => message,
            _ => "",
        }
    }
}

impl From<bollard::errors::Error> for ApiFailure {
    fn from(error: bollard::errors::Error) -> Self {
        match error {
            bollard::errors::Error::DockerResponseServerError {
                status_code,
                message,
            } => ApiFailure::Status {
                code: status_code,
                message,
            },
            bollard::errors::Error::DockerStreamError { error } => ApiFailure::Stream(error),
            other => ApiFailure::Transport(other),
        }
    }
}

/// One API client, pinned to one endpoint.
#[derive(Debug, Clone)]
pub(crate) struct EngineConnection {
    docker: Docker,
    endpoint: Endpoint,
}

impl EngineConnection {
    /// Opens the client for `endpoint` and negotiates the API version (an Engine 20.10 speaks
    /// 1.41; the client never asks for more than the engine offers), in one round trip whose
    /// answer also gives the engine's OS, returned with the connection. On a Unix socket that
    /// round trip is `GET /_ping`, read from its `Api-Version` and `Ostype` headers (the
    /// `docker` CLI negotiates the same way): the engine answers it from memory, while its
    /// `version` answer first gathers its components' versions (containerd, the runtime, the
    /// init), several milliseconds per call. Anywhere else, or when the ping's answer names no
    /// version, it is `GET /version`.
    ///
    /// # Errors
    /// BackendUnavailable naming the endpoint when the scheme is not supported, the TLS material
    /// is unreadable or the engine does not answer within `deadline`.
    pub(crate) async fn open(
        endpoint: Endpoint,
        deadline: Duration,
    ) -> Result<(EngineConnection, Option<String>), SandboxError> {
        let pinged = match endpoint.host.strip_prefix("unix://") {
            Some(path) => ping_unix(&endpoint, path, deadline).await?,
            None => None,
        };
        let (offered, os, client) = match pinged {
            Some(PingAnswer { api_version, os }) => (api_version, os, None),
            None => {
                let client = client_for(&endpoint, deadline, API_DEFAULT_VERSION)?;
                let (offered, os) = negotiate_by_version(&client, &endpoint, deadline).await?;
                (offered, os, Some(client))
            }
        };
        // A client is pinned to its version at construction: an engine older than this client
        // gets a client of its own version (no further request; the answer above was all).
        let docker = match client {
            Some(client) if offered >= *API_DEFAULT_VERSION => client,
            _ if offered < *API_DEFAULT_VERSION => client_for(&endpoint, deadline, &offered)?,
            _ => client_for(&endpoint, deadline, API_DEFAULT_VERSION)?,
        };
        let os = os.filter(|os| !os.is_empty());
        Ok((EngineConnection { docker, endpoint }, os))
    }

    /// The pinned endpoint.
    pub(crate) fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The API client.
    pub(crate) fn api(&self) -> &Docker {
        &self.docker
    }

    /// The negotiated API version, e.g. `1.41`.
    pub(crate) fn api_version(&self) -> String {
        self.docker.client_version().to_string()
    }

    /// Runs one API call under `deadline`. Dropping the future drops the request (the engine sees
    /// the connection close).
    pub(crate) async fn call<T, F>(&self, deadline: Duration, call: F) -> Result<T, ApiFailure>
    where
        F: Future<Output = Result<T, bollard::errors::Error>>,
    {
        match tokio::time::timeout(deadline, call).await {
            // The client's own per-request bound is the same deadline, rounded to seconds.
            Ok(Err(bollard::errors::Error::RequestTimeoutError)) | Err(_) => {
                Err(ApiFailure::Deadline(deadline))
            }
            Ok(result) => result.map_err(ApiFailure::from),
        }
    }

    /// The engine's id for the image `reference`, or `None` when it has no such image: the one
    /// way this crate asks whether an image is present (acquire, the image recipe, the health
    /// checks).
    ///
    /// # Errors
    /// Any failure of the inspect call other than "no such image".
    pub(crate) async fn image_id(
        &self,
        deadline: Duration,
        reference: &str,
    ) -> Result<Option<String>, ApiFailure> {
        match self
            .call(deadline, self.docker.inspect_image(reference))
            .await
        {
            Ok(image) => Ok(Some(image.id.unwrap_or_default())),
            Err(failure) if failure.is_not_found() => Ok(None),
            Err(failure) => Err(failure),
        }
    }

    /// The value of label `key` on image `reference`: `None` when the engine has no such image,
    /// `Some(None)` when the image carries no such label.
    pub(crate) async fn image_label(
        &self,
        deadline: Duration,
        reference: &str,
        key: &str,
    ) -> Result<Option<Option<String>>, ApiFailure> {
        match self
            .call(deadline, self.docker.inspect_image(reference))
            .await
        {
            Ok(image) => Ok(Some(
                image
                    .config
                    .and_then(|config| config.labels)
                    .and_then(|mut labels| labels.remove(key)),
            )),
            Err(failure) if failure.is_not_found() => Ok(None),
            Err(failure) => Err(failure),
        }
    }

    /// Names a failure for the caller: an unreachable engine is BackendUnavailable naming the
    /// pinned endpoint, an expired deadline EngineTimeout, anything else Engine.
    #[cold]
    pub(crate) fn failure(&self, operation: &str, failure: ApiFailure) -> SandboxError {
        match failure {
            ApiFailure::Status { code, message } => SandboxError::engine(format!(
                "{operation} failed (HTTP {code}): {}",
                quote(message.as_bytes())
            )),
            ApiFailure::Deadline(bound) => SandboxError::EngineTimeout {
                operation: operation.to_owned(),
                bound,
            },
            ApiFailure::Stream(why) => {
                SandboxError::engine(format!("{operation}: {}", quote(why.as_bytes())))
            }
            ApiFailure::Transport(error) => SandboxError::BackendUnavailable {
                backend: BACKEND_NAME.to_owned(),
                detail: format!(
                    "{operation}: the engine at {} is unreachable: {error}",
                    self.endpoint
                ),
                source: Some(Box::new(error)),
            },
        }
    }
}

/// An API client of `endpoint` speaking `version`, with `deadline` (in whole seconds, at least
/// one) as its per-request bound. Opening it sends nothing.
/// The version negotiation by `GET /version`: the API version the engine speaks and its OS.
async fn negotiate_by_version(
    client: &Docker,
    endpoint: &Endpoint,
    deadline: Duration,
) -> Result<(ClientVersion, Option<String>), SandboxError> {
    let answer = match tokio::time::timeout(deadline, client.version()).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => {
            return Err(unavailable(format!(
                "the engine at {endpoint} did not answer the version negotiation: {e}"
            )))
        }
        Err(_) => return Err(did_not_answer(endpoint, deadline)),
    };
    let offered = answer
        .api_version
        .as_deref()
        .and_then(parse_api_version)
        .ok_or_else(|| {
            unavailable(format!(
                "the engine at {endpoint} names no API version it speaks ({:?})",
                answer.api_version
            ))
        })?;
    Ok((offered, answer.os))
}

/// The most of a ping answer read: a status line and a dozen short headers.
const PING_ANSWER_CAP: usize = 8 * 1024;

/// What the ping's headers say.
#[derive(Debug, Clone, PartialEq)]
struct PingAnswer {
    api_version: ClientVersion,
    os: Option<String>,
}

/// `GET /_ping` on the Unix socket at `path`, within `deadline`. `Ok(None)` when the engine
/// answered but not with a success naming its API version (the caller asks `version` instead);
/// an engine that cannot be reached or does not answer in time is BackendUnavailable.
async fn ping_unix(
    endpoint: &Endpoint,
    path: &str,
    deadline: Duration,
) -> Result<Option<PingAnswer>, SandboxError> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let exchange = async {
        let mut stream = tokio::net::UnixStream::connect(path).await?;
        stream
            .write_all(b"GET /_ping HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n")
            .await?;
        // Only the head is needed: reading stops at its end, so a peer that keeps the
        // connection open anyway costs nothing.
        let mut answer = Vec::new();
        let mut chunk = [0u8; 1024];
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") && answer.len() < PING_ANSWER_CAP {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&chunk[..n]);
        }
        answer.truncate(PING_ANSWER_CAP);
        Ok::<_, std::io::Error>(answer)
    };
    match tokio::time::timeout(deadline, exchange).await {
        Ok(Ok(answer)) => Ok(read_ping_answer(&answer)),
        Ok(Err(e)) => Err(unavailable(format!(
            "the engine at {endpoint} did not answer the version negotiation: {e}"
        ))),
        Err(_) => Err(did_not_answer(endpoint, deadline)),
    }
}

/// The API version and OS from a ping's answer (`HTTP/1.x 200`, headers `Api-Version` and
/// `Ostype`, names in any case); `None` unless the status is a success and the version parses.
fn read_ping_answer(answer: &[u8]) -> Option<PingAnswer> {
    let head_end = answer.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&answer[..head_end]).ok()?;
    let mut lines = head.split("\r\n");
    let mut status = lines.next()?.split(' ');
    if !status.next()?.starts_with("HTTP/1.") || !status.next()?.starts_with('2') {
        return None;
    }
    let mut api_version = None;
    let mut os = None;
    for line in lines {
        let (name, value) = line.split_once(':')?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("Api-Version") {
            api_version = parse_api_version(value);
        } else if name.eq_ignore_ascii_case("Ostype") {
            os = Some(value.to_owned());
        }
    }
    Some(PingAnswer {
        api_version: api_version?,
        os,
    })
}

#[cold]
fn did_not_answer(endpoint: &Endpoint, deadline: Duration) -> SandboxError {
    unavailable(format!(
        "the engine at {endpoint} did not answer within {} s",
        deadline.as_secs()
    ))
}

fn client_for(
    endpoint: &Endpoint,
    deadline: Duration,
    version: &ClientVersion,
) -> Result<Docker, SandboxError> {
    let seconds = deadline.as_secs().max(1);
    let host = endpoint.host.as_str();
    let client = if host.starts_with("unix://") {
        Docker::connect_with_unix(host, seconds, version)
    } else if let (true, Some(tls)) = (host.starts_with("tcp://"), &endpoint.tls) {
        Docker::connect_with_ssl(host, &tls.key, &tls.cert, &tls.ca, seconds, version)
    } else if host.starts_with("tcp://") || host.starts_with("http://") {
        Docker::connect_with_http(host, seconds, version)
    } else if host.starts_with("ssh://") {
        Docker::connect_with_ssh(host, seconds, version, None)
    } else {
        return Err(unavailable(format!(
            "the endpoint {endpoint} has a scheme this client does not speak \
             (unix://, tcp:// and ssh:// are)"
        )));
    };
    client.map_err(|e| unavailable(format!("cannot open the engine at {endpoint}: {e}")))
}

/// `1.41` as a client version; `None` for anything but two dot-separated numbers.
fn parse_api_version(text: &str) -> Option<ClientVersion> {
    let (major, minor) = text.split_once('.')?;
    Some(ClientVersion {
        major_version: major.parse().ok()?,
        minor_version: minor.parse().ok()?,
    })
}

#[cold]
fn unavailable(detail: impl Into<String>) -> SandboxError {
    SandboxError::BackendUnavailable {
        backend: BACKEND_NAME.to_owned(),
        detail: detail.into(),
        source: None,
    }
}

/// The last part of an engine or guest message, control characters escaped, for an error.
pub(crate) fn quote(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    let skip = text.chars().count().saturating_sub(MESSAGE_CHARS);
    let mut out = String::new();
    for c in text.chars().skip(skip) {
        if c == '\n' {
            out.push_str(" | ");
        } else if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if out.is_empty() {
        "(no output)".to_owned()
    } else {
        out
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

    #[test]
    fn api_versions_parse_as_two_numbers() {
        let v = parse_api_version("1.41").unwrap();
        assert_eq!((v.major_version, v.minor_version), (1, 41));
        assert!(parse_api_version("1.41") < Some(*API_DEFAULT_VERSION));
        for bad in ["", "1", "1.", ".4", "1.41.2", "a.b", "1.-1"] {
            assert!(parse_api_version(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn a_ping_answer_gives_the_api_version_and_the_os() {
        let engine = b"HTTP/1.1 200 OK\r\nApi-Version: 1.41\r\nCache-Control: no-cache\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\nDocker-Experimental: false\r\nOstype: linux\r\nServer: Docker/20.10.24 (linux)\r\n\r\nOK";
        let answer = read_ping_answer(engine).unwrap();
        assert_eq!(answer.api_version, parse_api_version("1.41").unwrap());
        assert_eq!(answer.os.as_deref(), Some("linux"));
        let lower = b"HTTP/1.0 200 OK\r\napi-version:  1.47 \r\n\r\n";
        let answer = read_ping_answer(lower).unwrap();
        assert_eq!(answer.api_version, parse_api_version("1.47").unwrap());
        assert_eq!(answer.os, None);
        // No success, no version, no end of head, not HTTP: ask `version` instead.
        for refused in [
            &b"HTTP/1.1 500 Internal Server Error\r\nApi-Version: 1.41\r\n\r\n"[..],
            b"HTTP/1.1 404 Not Found\r\nOstype: linux\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nOstype: linux\r\n\r\nOK",
            b"HTTP/1.1 200 OK\r\nApi-Version: 1.x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nApi-Version: 1.41\r\n",
            b"SSH-2.0-OpenSSH\r\n\r\n",
            b"",
        ] {
            assert_eq!(
                read_ping_answer(refused),
                None,
                "{}",
                String::from_utf8_lossy(refused)
            );
        }
    }

    /// A stand-in engine on a Unix socket: answers `/_ping` with `ping` and `/version` with an
    /// engine's JSON, and records each request line. With `hold`, it keeps each connection open
    /// after answering, as a peer that ignores `Connection: close` would.
    fn stand_in_engine(
        socket: &Path,
        ping: &'static str,
        hold: bool,
    ) -> (
        std::sync::Arc<std::sync::Mutex<Vec<String>>>,
        tokio::task::JoinHandle<()>,
    ) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::UnixListener::bind(socket).unwrap();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = std::sync::Arc::clone(&seen);
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut request = vec![0u8; 4096];
                let n = stream.read(&mut request).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&request[..n]).into_owned();
                let line = head.lines().next().unwrap_or("").to_owned();
                log.lock().unwrap().push(line.clone());
                let response = if line.starts_with("GET /_ping ") {
                    ping.to_owned()
                } else {
                    let body = r#"{"ApiVersion":"1.41","Os":"linux","Version":"20.10.24"}"#;
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    )
                };
                let _ = stream.write_all(response.as_bytes()).await;
                if hold {
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_secs(30)).await;
                        drop(stream);
                    });
                } else {
                    let _ = stream.shutdown().await;
                }
            }
        });
        (seen, task)
    }

    #[tokio::test]
    async fn the_negotiation_is_one_ping_on_a_socket_and_version_when_the_ping_names_none() {
        let dir = tempfile::tempdir().unwrap();
        let answer =
            "HTTP/1.1 200 OK\r\nApi-Version: 1.41\r\nOstype: linux\r\nContent-Length: 2\r\n\r\nOK";
        let ping_only = &["GET /_ping HTTP/1.1"][..];
        for (n, (ping, hold, requests)) in [
            (answer, false, ping_only),
            // A peer that keeps the connection open: the head is all that is read.
            (answer, true, ping_only),
            (
                "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
                false,
                &["GET /_ping HTTP/1.1", "GET /version HTTP/1.1"][..],
            ),
        ]
        .into_iter()
        .enumerate()
        {
            let socket = dir.path().join(format!("engine-{n}.sock"));
            let (seen, task) = stand_in_engine(&socket, ping, hold);
            let host = format!("unix://{}", socket.display());
            let endpoint = Endpoint::resolve(&env(&[("DOCKER_HOST", &host)]), None).unwrap();
            let (connection, os) = EngineConnection::open(endpoint, Duration::from_secs(5))
                .await
                .unwrap();
            assert_eq!(connection.api_version(), "1.41");
            assert_eq!(os.as_deref(), Some("linux"));
            assert_eq!(*seen.lock().unwrap(), requests);
            task.abort();
        }
        // Nothing listening: unavailable, naming the endpoint.
        let host = format!("unix://{}", dir.path().join("absent.sock").display());
        let endpoint = Endpoint::resolve(&env(&[("DOCKER_HOST", &host)]), None).unwrap();
        let error = EngineConnection::open(endpoint, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(error.kind(), sandbox_core::ErrorKind::BackendUnavailable);
        assert!(error.to_string().contains("absent.sock"), "{error}");
    }

    #[test]
    fn quotes_are_bounded_and_escaped() {
        let long = "e".repeat(5000);
        assert_eq!(quote(long.as_bytes()).len(), MESSAGE_CHARS);
        assert_eq!(quote(b"a\x1bb\nc"), "a\\u{1b}b | c");
        assert_eq!(quote(b"  "), "(no output)");
    }
}
