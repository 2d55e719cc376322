//! TLS connections (`rediss://`, and `rediss+cluster://` for a Cluster). Certificates
//! come from [`RedisOptions`] or from the URL's `tls_ca`, `tls_cert` and `tls_key`
//! parameters (paths of PEM files, so the `dlock` command and `open_backend` can use
//! them too); without a CA the system's roots verify the server (loaded once per
//! process, not per connection). Needs the crate's `tls` feature.

use dlock_spi::{redact_url, Error, ErrorKind, Result};

use crate::error::config_error;
use crate::RedisOptions;

/// Whether `options` carry TLS certificates.
fn has_certificates(options: &RedisOptions) -> bool {
    options.tls_root_certificate.is_some() || options.tls_identity.is_some()
}

fn config(message: String) -> Error {
    Error::new(ErrorKind::Config, message)
}

/// A client for one node: plain, or TLS with the options' certificates. `shown` is
/// the URL as the user gave it (for messages).
pub(crate) fn client(url: &str, shown: &str, options: &RedisOptions) -> Result<redis::Client> {
    if url.starts_with("rediss://") {
        return tls_client(url, shown, options);
    }
    if has_certificates(options) {
        return Err(config(format!(
            "TLS certificates were given for {}, which is not a TLS URL; use rediss:// (rediss+cluster:// for a Cluster)",
            redact_url(shown)
        )));
    }
    redis::Client::open(url).map_err(|e| config_error(shown, e))
}

#[cfg(feature = "tls")]
fn tls_client(url: &str, shown: &str, options: &RedisOptions) -> Result<redis::Client> {
    // The redis crate builds its rustls config from the process' default crypto
    // provider and takes no other. Choosing that default is the application's call
    // (rustls: "applications should call install_default early in main"); dlock
    // installs none behind its back, and refuses to connect rather than let rustls
    // panic on a connection task when it finds none.
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        return Err(config(format!(
            "{} needs TLS, and no rustls crypto provider is installed for this process (the redis crate uses the process default and takes no other); \
             install one before connecting, early in main: rustls::crypto::ring::default_provider().install_default() \
             (or aws_lc_rs' with rustls' aws_lc_rs feature)",
            redact_url(shown)
        )));
    }
    redis::Client::build_with_tls(url, certificates(options)?).map_err(|e| config_error(shown, e))
}

/// The system's root certificates as PEM, loaded once per process: the redis crate
/// would read the whole store (every file of `/etc/ssl/certs`) synchronously on the
/// runtime's thread for every connection it opens — a stall of 20–200 ms on each
/// reconnect, longer than a short loss margin — when it is not handed the roots.
#[cfg(feature = "tls")]
fn system_roots() -> Result<Vec<u8>> {
    use base64::Engine;
    static ROOTS: std::sync::OnceLock<std::result::Result<Vec<u8>, String>> =
        std::sync::OnceLock::new();
    let loaded = ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        if found.certs.is_empty() {
            if let Some(e) = found.errors.first() {
                return Err(e.to_string());
            }
        }
        let mut pem = Vec::new();
        for cert in &found.certs {
            pem.extend_from_slice(b"-----BEGIN CERTIFICATE-----\n");
            let text = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
            for line in text.as_bytes().chunks(64) {
                pem.extend_from_slice(line);
                pem.push(b'\n');
            }
            pem.extend_from_slice(b"-----END CERTIFICATE-----\n");
        }
        Ok(pem)
    });
    loaded.clone().map_err(|e| {
        config(format!(
            "cannot load the system's root certificates ({e}); give the server's CA with tls_ca=<pem file> in the URL or RedisOptions::tls_root_certificate"
        ))
    })
}

/// The options' certificates as the redis crate takes them; without a CA, the
/// system's roots (loaded once).
#[cfg(feature = "tls")]
fn certificates(options: &RedisOptions) -> Result<redis::TlsCertificates> {
    let root_cert = match &options.tls_root_certificate {
        Some(ca) => ca.clone(),
        None => system_roots()?,
    };
    Ok(redis::TlsCertificates {
        client_tls: options
            .tls_identity
            .as_ref()
            .map(|id| redis::ClientTlsConfig {
                client_cert: id.cert_pem().to_vec(),
                client_key: id.key_pem().to_vec(),
            }),
        root_cert: Some(root_cert),
    })
}

#[cfg(not(feature = "tls"))]
fn tls_client(_url: &str, shown: &str, _options: &RedisOptions) -> Result<redis::Client> {
    Err(config(format!(
        "{} needs TLS, and this build has none: enable dlock-redis' `tls` feature (dlock-api: `redis-tls`)",
        redact_url(shown)
    )))
}

/// The Cluster client's TLS: for `tls` (a `rediss+cluster://` URL) the options'
/// certificates, or the system's roots (the node URLs' scheme turns TLS on; each node
/// was checked by [`client`] already, which also refuses certificates for plain nodes
/// and TLS in a build without it).
pub(crate) fn cluster(
    builder: redis::cluster::ClusterClientBuilder,
    options: &RedisOptions,
    tls: bool,
) -> Result<redis::cluster::ClusterClientBuilder> {
    #[cfg(feature = "tls")]
    if tls {
        return Ok(builder.certs(certificates(options)?));
    }
    let _ = (options, tls);
    Ok(builder)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificates_for_a_plain_url_are_refused() {
        let with_ca = RedisOptions::default().tls_root_certificate(b"CA".to_vec());
        let err = client("redis://h:1", "redis://h:1", &with_ca)
            .map(drop)
            .err();
        assert!(
            err.as_ref()
                .is_some_and(|e| e.message().contains("rediss://")),
            "{err:?}"
        );
    }

    /// The roots handed to the redis crate are the system's, every one of them, as
    /// PEM it parses.
    #[cfg(feature = "tls")]
    #[test]
    fn the_system_roots_are_handed_over_as_pem() {
        use rustls::pki_types::pem::PemObject;
        let pem = system_roots().unwrap();
        let parsed: Vec<_> = rustls::pki_types::CertificateDer::pem_slice_iter(&pem)
            .collect::<std::result::Result<_, _>>()
            .unwrap();
        let system = rustls_native_certs::load_native_certs().certs;
        assert!(
            !system.is_empty(),
            "this machine has no system roots to compare"
        );
        assert_eq!(parsed, system);
    }
}
