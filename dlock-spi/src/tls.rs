//! TLS material every backend takes the same way: a client certificate and its key,
//! and PEM files named in a URL (`tls_ca`, `tls_cert`, `tls_key`).

use crate::{redact_url, Error, ErrorKind, Result};

/// A client certificate chain and its private key (PEM), for servers that require
/// client authentication (Redis' `tls-auth-clients yes`, etcd's `--client-cert-auth`).
/// Its `Debug` shows neither.
#[derive(Clone)]
pub struct TlsIdentity {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
}

impl TlsIdentity {
    /// A certificate chain and private key, both PEM.
    pub fn new(cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Self {
        TlsIdentity {
            cert_pem: cert_pem.into(),
            key_pem: key_pem.into(),
        }
    }

    /// The certificate chain (PEM).
    pub fn cert_pem(&self) -> &[u8] {
        &self.cert_pem
    }

    /// The private key (PEM).
    pub fn key_pem(&self) -> &[u8] {
        &self.key_pem
    }
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsIdentity")
            .field("cert_pem", &format_args!("<{} bytes>", self.cert_pem.len()))
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// Reads the PEM file `path` that the parameter `param` of `url` names; a `Config`
/// error naming the parameter (and the URL without its secrets) if it cannot.
pub fn read_pem_file(url: &str, param: &str, path: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        Error::new(
            ErrorKind::Config,
            format!(
                "cannot read {param}={path:?} given in {}: {e}; give the path of a PEM file",
                redact_url(url)
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_key_never_shows_in_debug_output() {
        let id = TlsIdentity::new(b"CERT".to_vec(), b"PRIVATE KEY".to_vec());
        assert!(!format!("{id:?}").contains("PRIVATE"));
        assert_eq!(id.key_pem(), b"PRIVATE KEY");
    }

    #[test]
    fn an_unreadable_file_names_its_parameter_not_the_password() {
        let e = read_pem_file("x://u:secret@h/?tls_ca=/nope", "tls_ca", "/nope").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert!(e.to_string().contains("tls_ca"), "{e}");
        assert!(!e.to_string().contains("secret"), "{e}");
    }
}
