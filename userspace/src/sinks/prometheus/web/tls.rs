//! `tls_server_config` as a rustls server configuration (ring provider): the certificate
//! chain and key, the TLS versions, and the client-certificate policy.
use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use super::file::{ClientAuth, TlsServerConfig, TlsVersion};
use super::reader::{shown, Reader};

/// Longest certificate, key or CA file read.
const MAX_PEM_BYTES: u64 = 1 << 20;

/// The server configuration `t` describes, its files read through `r` (relative paths: from
/// the web config file's directory).
pub fn server_config(t: &TlsServerConfig, r: &mut Reader) -> Result<rustls::ServerConfig, String> {
    let (cert_path, key_path) = match (&t.cert_file, &t.key_file) {
        (Some(c), Some(k)) => (r.path(c), r.path(k)),
        (None, _) => return Err("tls_server_config: cert_file is missing".into()),
        (_, None) => return Err("tls_server_config: key_file is missing".into()),
    };
    let certs = certificates(&cert_path, "cert_file", r)?;
    let key = private_key(&key_path, r)?;
    let versions = versions(t.min_version, t.max_version)?;
    let provider = provider();
    let verifier = client_verifier(t, r, &provider)?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions)
        .map_err(|e| format!("tls_server_config: {e}"))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| format!("tls_server_config: cert_file and key_file: {e}"))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// rustls with ring, the project's one TLS provider (no aws-lc: no cmake or Go in the build).
/// rustls 0.23.48 deprecates ring's provider for its lack of post-quantum key exchange.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    #[allow(deprecated)]
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every PEM certificate of `path` (at least one).
fn certificates(
    path: &Path,
    key: &str,
    r: &mut Reader,
) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes = r.read(path, key, MAX_PEM_BYTES)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<_, _>>()
        .map_err(|_| format!("tls_server_config: {key} {} is not PEM", shown(path)))?;
    if certs.is_empty() {
        return Err(format!(
            "tls_server_config: {key} {} holds no PEM certificate",
            shown(path)
        ));
    }
    Ok(certs)
}

/// The PEM private key of `path` (PKCS#8, PKCS#1 or SEC1). Nothing of the file is quoted in
/// an error; a file others may read is noted (one warning per path, by the caller).
fn private_key(path: &Path, r: &mut Reader) -> Result<PrivateKeyDer<'static>, String> {
    let bytes = r.read(path, "key_file", MAX_PEM_BYTES)?;
    r.check_key_mode(path);
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|_| {
        format!(
            "tls_server_config: key_file {} holds no PEM private key",
            shown(path)
        )
    })
}

/// The protocol versions between `min` (default TLS 1.2) and `max` (default TLS 1.3).
fn versions(
    min: Option<TlsVersion>,
    max: Option<TlsVersion>,
) -> Result<Vec<&'static rustls::SupportedProtocolVersion>, String> {
    let min = min.unwrap_or(TlsVersion::TLS12).max(TlsVersion::TLS12);
    let max = max.unwrap_or(TlsVersion::TLS13);
    if max < TlsVersion::TLS12 {
        return Err(
            "tls_server_config: max_version must be TLS12 or TLS13 (TLS 1.0 and 1.1 are not spoken)"
                .into(),
        );
    }
    if min > max {
        return Err("tls_server_config: min_version is above max_version".into());
    }
    let mut v = Vec::new();
    if min <= TlsVersion::TLS12 {
        v.push(&rustls::version::TLS12);
    }
    if max >= TlsVersion::TLS13 {
        v.push(&rustls::version::TLS13);
    }
    Ok(v)
}

/// What `client_auth_type` asks of a client, with `client_ca_file`'s roots where it verifies.
fn client_verifier(
    t: &TlsServerConfig,
    r: &mut Reader,
    provider: &Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, String> {
    let auth = t.client_auth_type;
    let ca = t.client_ca_file.as_ref().map(|p| r.path(p));
    match (auth, &ca) {
        (ClientAuth::NoClientCert, None) => {
            Ok(rustls::server::WebPkiClientVerifier::no_client_auth())
        }
        (ClientAuth::NoClientCert, Some(_)) => Err(
            "tls_server_config: client_ca_file is given but client_auth_type is NoClientCert (say RequireAndVerifyClientCert to check client certificates)"
                .into(),
        ),
        (a, None) if a.verifies() => Err(format!(
            "tls_server_config: client_auth_type {a:?} needs client_ca_file, the CA that signs the clients' certificates"
        )),
        (a, Some(ca)) if a.verifies() => verified(a, ca, r, provider),
        (a, _) => Ok(Arc::new(AnyClientCert {
            mandatory: a.required(),
            provider: provider.clone(),
        })),
    }
}

/// webpki's verifier over the certificates of `ca`.
fn verified(
    auth: ClientAuth,
    ca: &Path,
    r: &mut Reader,
    provider: &Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certificates(ca, "client_ca_file", r)? {
        roots
            .add(c)
            .map_err(|e| format!("tls_server_config: client_ca_file {}: {e}", shown(ca)))?;
    }
    let b = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    );
    let b = match auth {
        ClientAuth::VerifyClientCertIfGiven => b.allow_unauthenticated(),
        _ => b,
    };
    b.build()
        .map_err(|e| format!("tls_server_config: client_ca_file {}: {e}", shown(ca)))
}

/// `RequestClientCert` / `RequireAnyClientCert`: any certificate is taken (Go's meaning);
/// the handshake's signature is still checked by the provider.
#[derive(Debug)]
struct AnyClientCert {
    mandatory: bool,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ClientCertVerifier for AnyClientCert {
    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
