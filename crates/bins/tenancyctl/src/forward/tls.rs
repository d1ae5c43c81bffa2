//! The forwarder's TLS sessions: the client configuration from `[audit]`, connecting with a
//! verified handshake, and ending a session so that the collector's end confirms it.

use std::io::Read;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tenancy_config::{Collector, Config};

/// The TLS client of every collector: the CA file's certificates, and the node's client
/// certificate when the config names one (its key root's alone).
pub(super) fn tls_config(config: &Config) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let Some(ca) = &config.audit.ca_file else {
        bail!("audit.ca_file is not set: the collectors' certificates cannot be checked");
    };
    let mut roots = rustls::RootCertStore::empty();
    let certs: Vec<CertificateDer> = CertificateDer::pem_file_iter(ca)
        .with_context(|| format!("audit.ca_file {}", ca.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("audit.ca_file {}: not PEM certificates", ca.display()))?;
    if certs.is_empty() {
        bail!("audit.ca_file {}: holds no certificate", ca.display());
    }
    for c in certs {
        roots
            .add(c)
            .with_context(|| format!("audit.ca_file {}: a certificate it holds", ca.display()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_root_certificates(roots);
    let cfg = match (&config.audit.cert_file, &config.audit.key_file) {
        (Some(cert), Some(key)) => {
            // The key file: root's alone, as every key of the product.
            let pem = tenancy_audit_log::sign::read_root_only(key, "audit.key_file", 1, 1 << 20)
                .map_err(anyhow::Error::msg)?;
            let key_der = PrivateKeyDer::from_pem_slice(&pem)
                .with_context(|| format!("audit.key_file {}: no PEM private key", key.display()))?;
            let chain: Vec<CertificateDer> = CertificateDer::pem_file_iter(cert)
                .with_context(|| format!("audit.cert_file {}", cert.display()))?
                .collect::<Result<_, _>>()
                .with_context(|| format!("audit.cert_file {}: not PEM", cert.display()))?;
            builder
                .with_client_auth_cert(chain, key_der)
                .context("audit.cert_file and audit.key_file do not make a client certificate")?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(Arc::new(cfg))
}

/// Whether the collector still holds the session: what it sent (session tickets, an alert,
/// close_notify) is read without waiting; end of stream, a reset or an alert mean it is gone.
pub(super) fn alive(tls: &mut Tls) -> bool {
    if tls.sock.set_nonblocking(true).is_err() {
        return false;
    }
    let up = loop {
        match tls.conn.read_tls(&mut tls.sock) {
            Ok(0) => break false,
            Ok(_) => match tls.conn.process_new_packets() {
                Ok(st) if st.peer_has_closed() => break false,
                Ok(_) => continue,
                Err(_) => break false,
            },
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break true,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break false,
        }
    };
    // Plaintext the collector sent (it never should) is dropped.
    let mut sink = [0u8; 512];
    while matches!(tls.conn.reader().read(&mut sink), Ok(n) if n > 0) {}
    up && tls.sock.set_nonblocking(false).is_ok()
}

/// How long a collector has to close its end of a session after ours.
pub(super) const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Ends a session and waits for the collector's end: Ok once it closed after reading
/// everything (end of stream, after its close_notify or without); a reset (it closed with our
/// bytes unread), an error or no answer within [`CLOSE_WAIT`] is an Err.
pub(super) fn close_and_wait(tls: &mut Tls) -> Result<(), String> {
    tls.conn.send_close_notify();
    while tls.conn.wants_write() {
        tls.conn
            .write_tls(&mut tls.sock)
            .map_err(|e| format!("sending close_notify: {e}"))?;
    }
    tls.sock
        .shutdown(std::net::Shutdown::Write)
        .map_err(|e| format!("closing our end: {e}"))?;
    let deadline = Instant::now() + CLOSE_WAIT;
    let _ = tls.sock.set_read_timeout(Some(CLOSE_WAIT));
    loop {
        match tls.conn.read_tls(&mut tls.sock) {
            Ok(0) => return Ok(()),
            Ok(_) => {
                let _ = tls.conn.process_new_packets();
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(format!(
                    "no end of the session from it within {CLOSE_WAIT:?}"
                ))
            }
            Err(e) => return Err(format!("the session ended with {e}")),
        }
        if Instant::now() > deadline {
            return Err(format!(
                "no end of the session from it within {CLOSE_WAIT:?}"
            ));
        }
    }
}

pub(super) type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// Connects and completes the TLS handshake: nothing is sent to a collector whose certificate
/// does not verify.
pub(super) fn connect(c: &Collector, tls: &Arc<rustls::ClientConfig>) -> Result<Tls, String> {
    let addrs: Vec<_> = (c.host.as_str(), c.port)
        .to_socket_addrs()
        .map_err(|e| format!("collector {c}: cannot resolve {}: {e}", c.host))?
        .collect();
    let mut last = format!("collector {c}: no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, Duration::from_secs(5)) {
            Ok(sock) => {
                let _ = sock.set_write_timeout(Some(Duration::from_secs(30)));
                let _ = sock.set_read_timeout(Some(Duration::from_secs(10)));
                let name = ServerName::try_from(c.host.clone())
                    .map_err(|e| format!("collector {c}: {e}"))?;
                let conn = rustls::ClientConnection::new(tls.clone(), name)
                    .map_err(|e| format!("collector {c}: TLS: {e}"))?;
                let mut s = rustls::StreamOwned::new(conn, sock);
                while s.conn.is_handshaking() {
                    if let Err(e) = s.conn.complete_io(&mut s.sock) {
                        return Err(format!("collector {c}: TLS handshake with {a}: {e}"));
                    }
                }
                return Ok(s);
            }
            Err(e) => last = format!("collector {c}: cannot connect to {a}: {e}"),
        }
    }
    Err(last)
}
