//! Reaching the engine: one API client pinned, for the backend's whole life, to the endpoint
//! [`crate::endpoint`] resolved, and what the engine says about itself.

use std::future::Future;
use std::time::Duration;

use bollard::{ClientVersion, Docker, API_DEFAULT_VERSION};
use sandbox_core::SandboxError;

use crate::endpoint::{unavailable, Endpoint};
use crate::BACKEND_NAME;

/// How many characters of an engine message an error quotes.
const MESSAGE_CHARS: usize = 2000;

/// What the engine says about itself, from one `info` call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EngineFacts {
    /// Its OS (`linux`, `windows`); `None` when it did not say.
    pub(crate) os: Option<String>,
    /// Its host's CPUs (0 when it did not say).
    pub(crate) cpus: i64,
    /// Its host's memory in bytes (0 when it did not say).
    pub(crate) memory: i64,
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
    /// The engine's OS and host size, from one `info` call within `deadline`.
    pub(crate) async fn facts(&self, deadline: Duration) -> Result<EngineFacts, SandboxError> {
        let info = self
            .call(deadline, self.api().info())
            .await
            .map_err(|f| self.failure("engine info", f))?;
        Ok(EngineFacts {
            os: info.os_type.filter(|os| !os.is_empty()),
            cpus: info.ncpu.unwrap_or(0),
            memory: info.mem_total.unwrap_or(0),
        })
    }

    /// The engine's OS alone, within `deadline`: on a Unix socket from a ping's `Ostype` header
    /// (the engine answers it from memory; `info` gathers the whole host's state first, several
    /// milliseconds), anywhere else, or when the ping's answer does not parse, from `info`.
    /// `None` when the engine names none.
    pub(crate) async fn os(&self, deadline: Duration) -> Result<Option<String>, SandboxError> {
        if let Some(path) = self.endpoint.host.strip_prefix("unix://") {
            if let Some(PingAnswer { os, .. }) = ping_unix(&self.endpoint, path, deadline).await? {
                return Ok(os.filter(|os| !os.is_empty()));
            }
        }
        Ok(self.facts(deadline).await?.os)
    }

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

    /// The volumes carrying every one of `labels` (`key=value`), within `deadline`; a failure is
    /// named `operation`.
    pub(crate) async fn volumes_labelled(
        &self,
        deadline: Duration,
        labels: Vec<String>,
        operation: &str,
    ) -> Result<Vec<bollard::models::Volume>, SandboxError> {
        let filters = std::collections::HashMap::from([("label".to_owned(), labels)]);
        let options = bollard::query_parameters::ListVolumesOptionsBuilder::new()
            .filters(&filters)
            .build();
        let listed = self
            .call(deadline, self.api().list_volumes(Some(options)))
            .await
            .map_err(|f| self.failure(operation, f))?;
        Ok(listed.volumes.unwrap_or_default())
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
    use std::path::Path;

    /// The endpoint a `DOCKER_HOST` of `host` names.
    fn docker_host(host: &str) -> Endpoint {
        Endpoint::resolve(&[("DOCKER_HOST".into(), host.into())], None).unwrap()
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
            let endpoint = docker_host(&host);
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
        let endpoint = docker_host(&host);
        let error = EngineConnection::open(endpoint, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(error.kind(), sandbox_core::ErrorKind::BackendUnavailable);
        assert!(error.to_string().contains("absent.sock"), "{error}");
    }

    /// The OS re-check reads a ping's `Ostype` on a socket: no `info`.
    #[tokio::test]
    async fn the_os_recheck_is_one_ping_on_a_socket() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("engine.sock");
        let answer =
            "HTTP/1.1 200 OK\r\nApi-Version: 1.41\r\nOstype: windows\r\nContent-Length: 2\r\n\r\nOK";
        let (seen, task) = stand_in_engine(&socket, answer, false);
        let endpoint = docker_host(&format!("unix://{}", socket.display()));
        let (connection, _) = EngineConnection::open(endpoint, Duration::from_secs(5))
            .await
            .unwrap();
        let os = connection.os(Duration::from_secs(5)).await.unwrap();
        assert_eq!(os.as_deref(), Some("windows"));
        assert_eq!(
            *seen.lock().unwrap(),
            ["GET /_ping HTTP/1.1", "GET /_ping HTTP/1.1"]
        );
        task.abort();
    }

    #[test]
    fn quotes_are_bounded_and_escaped() {
        let long = "e".repeat(5000);
        assert_eq!(quote(long.as_bytes()).len(), MESSAGE_CHARS);
        assert_eq!(quote(b"a\x1bb\nc"), "a\\u{1b}b | c");
        assert_eq!(quote(b"  "), "(no output)");
    }
}
