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

/// The TLS files a backend URL names — `tls_ca`, `tls_cert`, `tls_key`, paths of PEM
/// files — read as the parameters are met, and judged together once all are: a
/// client certificate comes with its key. One home for what every backend's URL
/// takes the same way. Its `Debug` shows which files were read, never their
/// contents.
#[derive(Default)]
pub struct TlsFiles {
    ca: Option<Vec<u8>>,
    identity: (Option<Vec<u8>>, Option<Vec<u8>>),
}

impl std::fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsFiles")
            .field("tls_ca", &self.ca.is_some())
            .field("tls_cert", &self.identity.0.is_some())
            .field("tls_key", &self.identity.1.is_some())
            .finish()
    }
}

impl TlsFiles {
    /// Reads the file that URL parameter `name` (of `url`) names at `path`, if `name`
    /// is one of the three; `Ok(false)` for any other parameter, left to the caller.
    pub fn take(&mut self, url: &str, name: &str, path: &str) -> Result<bool> {
        let slot = match name {
            "tls_ca" => &mut self.ca,
            "tls_cert" => &mut self.identity.0,
            "tls_key" => &mut self.identity.1,
            _ => return Ok(false),
        };
        *slot = Some(read_pem_file(url, name, path)?);
        Ok(true)
    }

    /// Puts the CA's PEM and the client identity the parameters gave into `ca` and
    /// `identity` (the URL's win over what they held); a `Config` error (naming
    /// `url` without its secrets) when only one of `tls_cert` and `tls_key` was given.
    pub fn finish(
        self,
        url: &str,
        ca: &mut Option<Vec<u8>>,
        identity: &mut Option<TlsIdentity>,
    ) -> Result<()> {
        match self.identity {
            (Some(cert), Some(key)) => *identity = Some(TlsIdentity::new(cert, key)),
            (None, None) => {}
            _ => {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!(
                        "{} gives only one of tls_cert and tls_key; give both (a client certificate and its key) or neither",
                        redact_url(url)
                    ),
                ))
            }
        }
        if self.ca.is_some() {
            *ca = self.ca;
        }
        Ok(())
    }
}

/// Takes the TLS file options (`tls_ca`, `tls_cert`, `tls_key`) off `options` of
/// the URL `shown` into `ca` and `identity` (the URL's win over what they held) and
/// returns the others, in order. Without `tls` (a plain connection) a TLS option is
/// refused with `refuse(key)`. The one loop behind
/// [`BackendUrl::take_tls_files`](crate::BackendUrl::take_tls_files) and
/// [`DriverUrl::take_tls_files`](crate::DriverUrl::take_tls_files).
pub(crate) fn take_tls_options<'a>(
    shown: &str,
    options: &'a [(String, String)],
    tls: bool,
    ca: &mut Option<Vec<u8>>,
    identity: &mut Option<TlsIdentity>,
    refuse: impl Fn(&str) -> Error,
) -> Result<Vec<(&'a str, &'a str)>> {
    let mut files = TlsFiles::default();
    let mut rest = Vec::with_capacity(options.len());
    for (key, value) in options {
        if !key.starts_with("tls_") {
            rest.push((key.as_str(), value.as_str()));
        } else if !tls {
            return Err(refuse(key));
        } else if !files.take(shown, key, value)? {
            rest.push((key.as_str(), value.as_str()));
        }
    }
    files.finish(shown, ca, identity)?;
    Ok(rest)
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
    fn a_certificate_without_its_key_is_refused() {
        let url = "x://u:secret@h/?tls_cert=/etc/hostname";
        let mut files = TlsFiles::default();
        assert!(files.take(url, "tls_cert", "/etc/hostname").unwrap());
        assert!(!files.take(url, "timeout", "5s").unwrap());
        let e = files.finish(url, &mut None, &mut None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert!(
            e.to_string().contains("tls_key") && !e.to_string().contains("secret"),
            "{e}"
        );
        let mut both = TlsFiles::default();
        both.take(url, "tls_cert", "/etc/hostname").unwrap();
        both.take(url, "tls_key", "/etc/hostname").unwrap();
        assert!(!format!("{both:?}").contains('['), "{both:?}");
        let (mut ca, mut id) = (Some(b"kept".to_vec()), None);
        both.finish(url, &mut ca, &mut id).unwrap();
        assert!(ca.as_deref() == Some(&b"kept"[..]) && id.is_some());
    }

    #[test]
    fn an_unreadable_file_names_its_parameter_not_the_password() {
        let e = read_pem_file("x://u:secret@h/?tls_ca=/nope", "tls_ca", "/nope").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert!(e.to_string().contains("tls_ca"), "{e}");
        assert!(!e.to_string().contains("secret"), "{e}");
    }
}
