//! The TLS of terminated tunnels: the proxy's own certificate authority, the leaf certificates it
//! mints from it, and the client configuration it reaches upstreams with.
//!
//! Each proxy process makes its authority at start-up (an ECDSA P-256 key generated in memory,
//! never written anywhere); only the authority's certificate leaves the process, for the workload
//! to trust. A leaf for a requested name is minted on first use, signed by the authority, and
//! cached (one leaf key per process). Upstreams are verified by rustls/webpki for the
//! allowlisted name the client asked for, against the configured roots (the public roots of
//! `webpki-roots` and any operator bundle). Both sides speak HTTP/1.1 only (ALPN), on the `ring`
//! provider.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::error::{tls_error, ProxyError};

/// Leaves cached at once; past this the cache starts again empty.
const LEAF_CACHE: usize = 512;

/// Where upstream certificates are verified against.
#[derive(Debug, Clone, Default)]
pub struct UpstreamRoots {
    /// Whether the public roots of `webpki-roots` are trusted.
    pub public: bool,
    /// Further trusted roots (an operator's CA bundle).
    pub extra: Vec<CertificateDer<'static>>,
}

impl UpstreamRoots {
    /// Reads every certificate of the PEM bundle at `path` into [`UpstreamRoots::extra`].
    ///
    /// # Errors
    /// An unreadable file, or one holding no certificate.
    pub fn add_pem_file(&mut self, path: &std::path::Path) -> Result<(), ProxyError> {
        use rustls::pki_types::pem::PemObject as _;
        let found: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .and_then(|certs| certs.collect::<Result<_, _>>())
            .map_err(|e| tls_error(format!("reading {}: {e}", path.display())))?;
        self.add_found(found, &path.display().to_string())
    }

    /// Reads every certificate of the PEM bundle `pem` (named `what` in errors) into
    /// [`UpstreamRoots::extra`].
    ///
    /// # Errors
    /// A bundle that does not parse, or holds no certificate.
    pub fn add_pem(&mut self, pem: &[u8], what: &str) -> Result<(), ProxyError> {
        use rustls::pki_types::pem::PemObject as _;
        let found: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<_, _>>()
            .map_err(|e| tls_error(format!("reading {what}: {e}")))?;
        self.add_found(found, what)
    }

    fn add_found(
        &mut self,
        found: Vec<CertificateDer<'static>>,
        what: &str,
    ) -> Result<(), ProxyError> {
        if found.is_empty() {
            return Err(tls_error(format!("{what} holds no PEM certificate")));
        }
        self.extra.extend(found);
        Ok(())
    }
}

/// The proxy's certificate authority, its leaf cache and its upstream client configuration.
pub struct Terminator {
    provider: Arc<CryptoProvider>,
    authority: rcgen::Certificate,
    authority_key: KeyPair,
    leaf_key: KeyPair,
    leaves: Mutex<HashMap<String, Arc<ServerConfig>>>,
    client: Arc<ClientConfig>,
}

impl fmt::Debug for Terminator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Terminator").finish_non_exhaustive()
    }
}

fn http1_only() -> Vec<Vec<u8>> {
    vec![b"http/1.1".to_vec()]
}

impl Terminator {
    /// Makes a fresh authority and the upstream client configuration.
    ///
    /// # Errors
    /// [`ProxyError::Tls`] when a key, the authority or a configuration cannot be made (or no
    /// upstream root is given).
    pub fn new(roots: &UpstreamRoots) -> Result<Terminator, ProxyError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let authority_key = KeyPair::generate().map_err(tls_error)?;
        let mut params = CertificateParams::default();
        let serial: [u8; 8] = {
            let mut bytes = [0u8; 8];
            provider
                .secure_random
                .fill(&mut bytes)
                .map_err(|_| tls_error("no randomness for the authority's name"))?;
            bytes
        };
        let tag: String = serial.iter().map(|b| format!("{b:02x}")).collect();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("maf-egress-proxy CA {tag}"));
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let authority = params.self_signed(&authority_key).map_err(tls_error)?;
        let leaf_key = KeyPair::generate().map_err(tls_error)?;

        let mut store = RootCertStore::empty();
        if roots.public {
            store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        }
        for root in &roots.extra {
            store.add(root.clone()).map_err(tls_error)?;
        }
        if store.is_empty() {
            return Err(tls_error("no upstream root to verify upstreams against"));
        }
        let mut client = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(tls_error)?
            .with_root_certificates(store)
            .with_no_client_auth();
        client.alpn_protocols = http1_only();
        Ok(Terminator {
            provider,
            authority,
            authority_key,
            leaf_key,
            leaves: Mutex::new(HashMap::new()),
            client: Arc::new(client),
        })
    }

    /// The authority's certificate, PEM: what the workload trusts.
    pub fn authority_pem(&self) -> String {
        self.authority.pem()
    }

    /// The authority's certificate, DER.
    pub fn authority_der(&self) -> CertificateDer<'static> {
        self.authority.der().clone()
    }

    /// The server configuration presenting a leaf for `name`, minted on first use and cached.
    ///
    /// # Errors
    /// [`ProxyError::Tls`] when the leaf cannot be made.
    pub fn server_config(&self, name: &str) -> Result<Arc<ServerConfig>, ProxyError> {
        let mut leaves = self
            .leaves
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(config) = leaves.get(name) {
            return Ok(Arc::clone(config));
        }
        let config = Arc::new(self.mint(name)?);
        if leaves.len() >= LEAF_CACHE {
            leaves.clear();
        }
        leaves.insert(name.to_owned(), Arc::clone(&config));
        Ok(config)
    }

    fn mint(&self, name: &str) -> Result<ServerConfig, ProxyError> {
        let mut params = CertificateParams::new(vec![name.to_owned()]).map_err(tls_error)?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let leaf = params
            .signed_by(&self.leaf_key, &self.authority, &self.authority_key)
            .map_err(tls_error)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.leaf_key.serialize_der()));
        let mut config = ServerConfig::builder_with_provider(Arc::clone(&self.provider))
            .with_safe_default_protocol_versions()
            .map_err(tls_error)?
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone(), self.authority_der()], key)
            .map_err(tls_error)?;
        config.alpn_protocols = http1_only();
        Ok(config)
    }

    /// The client configuration for upstreams.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        Arc::clone(&self.client)
    }

    /// How many leaves are cached.
    pub fn cached_leaves(&self) -> usize {
        self.leaves
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terminator() -> Terminator {
        Terminator::new(&UpstreamRoots {
            public: true,
            extra: Vec::new(),
        })
        .unwrap()
    }

    #[test]
    fn leaves_are_minted_once_per_name_and_chain_to_the_authority() {
        let t = terminator();
        let a = t.server_config("api.test").unwrap();
        let again = t.server_config("api.test").unwrap();
        assert!(Arc::ptr_eq(&a, &again));
        t.server_config("other.test").unwrap();
        assert_eq!(t.cached_leaves(), 2);
        assert!(t.authority_pem().starts_with("-----BEGIN CERTIFICATE-----"));
    }

    #[test]
    fn two_proxies_have_different_authorities() {
        let (a, b) = (terminator(), terminator());
        assert_ne!(a.authority_der(), b.authority_der());
        assert_ne!(a.authority_pem(), b.authority_pem());
    }

    #[test]
    fn no_roots_at_all_is_refused_and_bundles_must_hold_certificates() {
        assert!(matches!(
            Terminator::new(&UpstreamRoots::default()),
            Err(ProxyError::Tls(_))
        ));
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "nothing here\n").unwrap();
        let mut roots = UpstreamRoots::default();
        assert!(roots.add_pem_file(&empty).is_err());
        assert!(roots.add_pem_file(&dir.path().join("missing.pem")).is_err());
        let bundle = dir.path().join("ca.pem");
        std::fs::write(&bundle, terminator().authority_pem()).unwrap();
        roots.add_pem_file(&bundle).unwrap();
        assert_eq!(roots.extra.len(), 1);
        Terminator::new(&roots).unwrap();

        let mut roots = UpstreamRoots::default();
        let error = roots.add_pem(b"nothing here\n", "a line").unwrap_err();
        assert!(error.to_string().contains("a line holds no PEM"), "{error}");
        assert!(roots.extra.is_empty());
        let two = format!(
            "{}{}",
            terminator().authority_pem(),
            terminator().authority_pem()
        );
        roots.add_pem(two.as_bytes(), "two").unwrap();
        assert_eq!(roots.extra.len(), 2);
        assert_ne!(roots.extra[0], roots.extra[1]);
        Terminator::new(&roots).unwrap();
    }
}
