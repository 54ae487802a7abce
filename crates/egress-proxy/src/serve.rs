//! The `serve` role: a tiny HTTP/1.1 server answering every request 200 with a fixed body,
//! for offline tests and benchmarks. One request per connection; the request head is read
//! (bounded) and its body ignored. With [`Options::tls`] it speaks TLS under a certificate it is
//! given (a test's own origin); with [`Options::log_requests`] it prints one JSON line per request
//! on stdout (its request line and its `Authorization` field, so a test can see which requests
//! carried a credential upstream: a test server only); with [`Options::redirect`] it answers
//! every request `302 Found` to a location instead (a test origin that redirects, so a test can
//! see that neither the proxy nor a grant follows it).

use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpListener;

use crate::error::{tls_error, ProxyError};
use crate::head::{head_len, MAX_HEAD_LEN};

/// How the server runs besides its reply.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Speak TLS with this configuration.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Print one JSON line per request on stdout.
    pub log_requests: bool,
    /// Answer `302 Found` with this `Location` (and the reply as its body) instead of `200`.
    pub redirect: Option<String>,
}

/// A TLS server configuration (HTTP/1.1) from a PEM certificate chain and a PEM private key.
///
/// # Errors
/// PEM that does not parse, no certificate, or a key that does not fit.
pub fn tls_config(cert_pem: &str, key_pem: &str) -> Result<Arc<rustls::ServerConfig>, ProxyError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| tls_error(format!("reading the serve certificate: {e}")))?;
    if certs.is_empty() {
        return Err(tls_error("the serve certificate holds no PEM certificate"));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| tls_error(format!("reading the serve key: {e}")))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| tls_error(e.to_string()))?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(|e| tls_error(format!("the serve certificate and key: {e}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The log line of one request head: its request line and its `Authorization` field (the
/// first; `null` when absent).
pub fn request_log_line(head: &[u8]) -> String {
    let text = String::from_utf8_lossy(head);
    let mut lines = text.split("\r\n");
    let request = lines.next().unwrap_or_default();
    let authorization = lines.find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("authorization")
            .then(|| value.trim().to_owned())
    });
    serde_json::json!({ "request": request, "authorization": authorization }).to_string()
}

/// What the server answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// This text.
    Text(String),
    /// This many bytes of filler (`x`).
    Filler(u64),
}

impl Reply {
    fn len(&self) -> u64 {
        match self {
            Reply::Text(text) => text.len() as u64,
            Reply::Filler(n) => *n,
        }
    }
}

const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
const WRITE_IDLE: Duration = Duration::from_secs(60);

/// Answers every connection accepted on `listener`.
///
/// # Errors
/// An accept error that is not about one connection or a descriptor shortage (the rule of every
/// accept loop here).
pub async fn serve(listener: TcpListener, reply: Reply) -> std::io::Result<()> {
    serve_with(listener, reply, Options::default()).await
}

/// Answers every connection accepted on `listener`, as `options` say.
///
/// # Errors
/// As [`serve`].
pub async fn serve_with(
    listener: TcpListener,
    reply: Reply,
    options: Options,
) -> std::io::Result<()> {
    let reply = Arc::new(Answer {
        reply,
        redirect: options.redirect,
    });
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                crate::accept::pass_or_fail(error).await?;
                continue;
            }
        };
        let reply = Arc::clone(&reply);
        let log = options.log_requests;
        match &options.tls {
            None => {
                tokio::spawn(async move { serve_one(stream, &reply, log).await });
            }
            Some(config) => {
                let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(config));
                tokio::spawn(async move {
                    if let Ok(Ok(stream)) =
                        tokio::time::timeout(HEAD_TIMEOUT, acceptor.accept(stream)).await
                    {
                        serve_one(stream, &reply, log).await;
                    }
                });
            }
        }
    }
}

/// What every request is answered: the reply, under a redirect when there is one.
struct Answer {
    reply: Reply,
    redirect: Option<String>,
}

/// Reads one head from `stream` and answers it.
async fn serve_one<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, reply: &Answer, log: bool) {
    {
        {
            let mut buffer = Vec::new();
            let mut chunk = [0u8; 4096];
            let got_head = tokio::time::timeout(HEAD_TIMEOUT, async {
                loop {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return false,
                        Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                    }
                    if head_len(&buffer).is_some() {
                        return true;
                    }
                    if buffer.len() > MAX_HEAD_LEN {
                        return false;
                    }
                }
            })
            .await;
            if got_head != Ok(true) {
                return;
            }
            if log {
                let stdout = std::io::stdout();
                let mut out = stdout.lock();
                let _ = writeln!(out, "{}", request_log_line(&buffer));
                let _ = out.flush();
            }
            let _ = answer(&mut stream, reply).await;
        }
    }
}

async fn answer<S: AsyncWrite + Unpin>(stream: &mut S, answer: &Answer) -> std::io::Result<()> {
    let reply = &answer.reply;
    let status = match &answer.redirect {
        None => "200 OK".to_owned(),
        Some(location) => format!("302 Found\r\nLocation: {location}"),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        reply.len()
    );
    timed(stream.write_all(head.as_bytes())).await?;
    match reply {
        Reply::Text(text) => timed(stream.write_all(text.as_bytes())).await?,
        Reply::Filler(size) => {
            let block = vec![b'x'; 64 * 1024];
            let mut left = *size;
            while left > 0 {
                let n = left.min(block.len() as u64) as usize;
                timed(stream.write_all(&block[..n])).await?;
                left -= n as u64;
            }
        }
    }
    timed(stream.shutdown()).await
}

async fn timed<F: std::future::Future<Output = std::io::Result<()>>>(io: F) -> std::io::Result<()> {
    tokio::time::timeout(WRITE_IDLE, io)
        .await
        .unwrap_or_else(|_| Err(std::io::Error::from(std::io::ErrorKind::TimedOut)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_log_names_the_request_line_and_its_authorization() {
        let line =
            request_log_line(b"GET /v1/x HTTP/1.1\r\nHost: a\r\nauthorization: Bearer t\r\n\r\n");
        assert_eq!(
            line,
            r#"{"authorization":"Bearer t","request":"GET /v1/x HTTP/1.1"}"#
        );
        let none = request_log_line(b"POST / HTTP/1.1\r\nHost: a\r\nX-Authorization: no\r\n\r\n");
        assert_eq!(
            none,
            r#"{"authorization":null,"request":"POST / HTTP/1.1"}"#
        );
    }

    #[tokio::test]
    async fn a_redirecting_server_answers_302_with_its_location() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(serve_with(
            listener,
            Reply::Text("moved".into()),
            Options {
                redirect: Some("https://other.test/landed".into()),
                ..Options::default()
            },
        ));
        let mut tcp = tokio::net::TcpStream::connect(address).await.unwrap();
        tcp.write_all(b"GET /v1/x HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        let _ = tcp.read_to_end(&mut answer).await;
        let answer = String::from_utf8(answer).unwrap();
        assert!(
            answer.starts_with(
                "HTTP/1.1 302 Found\r\nLocation: https://other.test/landed\r\nContent-Type: text/plain\r\n"
            ),
            "{answer}"
        );
        assert!(answer.ends_with("\r\n\r\nmoved"), "{answer}");
        server.abort();
    }

    #[tokio::test]
    async fn tls_serving_answers_under_the_given_certificate() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["origin.test".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let config = tls_config(&cert.pem(), &key.serialize_pem()).unwrap();
        assert!(tls_config("nothing", &key.serialize_pem()).is_err());
        assert!(tls_config(&cert.pem(), "nothing").is_err());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(serve_with(
            listener,
            Reply::Text("hello".into()),
            Options {
                tls: Some(config),
                log_requests: true,
                redirect: None,
            },
        ));
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.der().clone()).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("origin.test").unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(client))
            .connect(name, tcp)
            .await
            .unwrap();
        tls.write_all(b"GET / HTTP/1.1\r\nHost: origin.test\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        let _ = tls.read_to_end(&mut answer).await;
        let answer = String::from_utf8(answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.ends_with("\r\n\r\nhello"), "{answer}");
        server.abort();
    }
}
