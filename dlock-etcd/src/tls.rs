//! TLS towards the members (`etcds://`): the options' CA or the system's roots, and
//! a client certificate when given. Needs the crate's `tls` feature.

use dlock_spi::{Error, ErrorKind, Result};

use crate::config::EtcdOptions;

/// The TLS settings of every member's connection; `None` for plain connections.
#[cfg(feature = "tls")]
pub(crate) fn client_config(
    options: &EtcdOptions,
) -> Result<Option<tonic::transport::ClientTlsConfig>> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    if !options.tls {
        return plain(options);
    }
    // tonic builds its rustls config from the process' default crypto provider when
    // the application installed one, else from ring's; dlock installs none.
    let config = match &options.tls_root_certificate {
        Some(ca) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)),
        None => ClientTlsConfig::new().with_native_roots(),
    };
    Ok(Some(match &options.tls_identity {
        Some(id) => config.identity(Identity::from_pem(id.cert_pem(), id.key_pem())),
        None => config,
    }))
}

/// Without the `tls` feature: plain connections only.
#[cfg(not(feature = "tls"))]
pub(crate) fn client_config(options: &EtcdOptions) -> Result<Option<std::convert::Infallible>> {
    if options.tls {
        return Err(Error::new(
            ErrorKind::Config,
            "etcds:// needs TLS, and this build has none: enable dlock-etcd's `tls` feature (dlock-api: `etcd-tls`)",
        ));
    }
    plain(options)
}

/// A plain connection's settings: no certificates may be given for it.
fn plain<T>(options: &EtcdOptions) -> Result<Option<T>> {
    if options.tls_root_certificate.is_some() || options.tls_identity.is_some() {
        return Err(Error::new(
            ErrorKind::Config,
            "TLS certificates are given for a plain etcd connection; use etcds:// (or EtcdOptions::tls)",
        ));
    }
    Ok(None)
}
