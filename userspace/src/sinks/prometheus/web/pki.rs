//! Certificates made at test time (rcgen): a CA, a server certificate for 127.0.0.1 and
//! localhost, a client certificate it signed, and a client certificate of another CA. For
//! the unit tests and, with feature `test-pki`, the end-to-end tests. Never in a release.
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};

/// Paths of PEM files written into one directory.
#[derive(Debug, Clone)]
pub struct Pki {
    pub ca_cert: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A client certificate and key signed by a CA the server does not trust.
    pub untrusted_cert: PathBuf,
    pub untrusted_key: PathBuf,
}

struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().expect("key");
    let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    let cert = p.self_signed(&key).expect("self-signed CA");
    Ca { cert, key }
}

/// A leaf for `names` with `usage`, signed by `ca`: (cert PEM, key PEM).
fn leaf(ca: &Ca, cn: &str, names: &[&str], usage: ExtendedKeyUsagePurpose) -> (String, String) {
    let key = KeyPair::generate().expect("key");
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let mut p = CertificateParams::new(names).expect("params");
    p.distinguished_name.push(DnType::CommonName, cn);
    p.extended_key_usages = vec![usage];
    let cert = p.signed_by(&key, &ca.cert, &ca.key).expect("signed");
    (cert.pem(), key.serialize_pem())
}

/// Write a CA, a server certificate, a client certificate and an untrusted one into `dir`.
pub fn make(dir: &Path) -> std::io::Result<Pki> {
    let trusted = ca("rttscope test CA");
    let other = ca("rttscope untrusted CA");
    let server = leaf(
        &trusted,
        "rttscope",
        &["127.0.0.1", "localhost"],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let client = leaf(
        &trusted,
        "prometheus",
        &[],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    let untrusted = leaf(&other, "intruder", &[], ExtendedKeyUsagePurpose::ClientAuth);
    let write = |name: &str, text: &str| -> std::io::Result<PathBuf> {
        let p = dir.join(name);
        std::fs::write(&p, text)?;
        Ok(p)
    };
    Ok(Pki {
        ca_cert: write("ca.pem", &trusted.cert.pem())?,
        server_cert: write("server.pem", &server.0)?,
        server_key: write("server.key", &server.1)?,
        client_cert: write("client.pem", &client.0)?,
        client_key: write("client.key", &client.1)?,
        untrusted_cert: write("untrusted.pem", &untrusted.0)?,
        untrusted_key: write("untrusted.key", &untrusted.1)?,
    })
}
