//! An HTTPS origin on 127.0.0.1 with its own test CA, for the inspection
//! tests: the proxy must verify it through `--upstream-ca`.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A test CA and a server certificate it signed, also written as PEM files.
pub struct TestPki {
    pub ca_pem: PathBuf,
    pub cert_pem: PathBuf,
    pub key_pem: PathBuf,
    chain: Vec<CertificateDer<'static>>,
    key_der: Vec<u8>,
}

impl TestPki {
    pub fn new(dir: &Path, names: &[&str]) -> TestPki {
        std::fs::create_dir_all(dir).expect("pki dir");
        let ca_key = KeyPair::generate().expect("ca key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        ca.distinguished_name
            .push(DnType::CommonName, "airlock tests origin CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).expect("ca cert");
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().expect("server key");
        let params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("params");
        let cert = params.signed_by(&key, &issuer).expect("server cert");
        let ca_pem = dir.join("origin-ca.pem");
        let cert_pem = dir.join("origin-cert.pem");
        let key_pem = dir.join("origin-key.pem");
        std::fs::write(&ca_pem, ca_cert.pem()).expect("write");
        std::fs::write(&cert_pem, format!("{}{}", cert.pem(), ca_cert.pem())).expect("write");
        std::fs::write(&key_pem, key.serialize_pem()).expect("write");
        TestPki {
            ca_pem,
            cert_pem,
            key_pem,
            chain: vec![cert.der().clone(), ca_cert.der().clone()],
            key_der: key.serialize_der(),
        }
    }

    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone()));
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(self.chain.clone(), key)
            .expect("cert");
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(cfg)
    }
}

/// An HTTPS origin answering like `Origin`, counting accepted connections.
pub struct TlsOrigin {
    pub addr: SocketAddr,
    pub hits: Arc<AtomicUsize>,
}

impl TlsOrigin {
    pub fn start(pki: &TestPki, name: &'static str) -> TlsOrigin {
        TlsOrigin::start_on(pki, name, "127.0.0.1:0")
    }

    /// On another address, e.g. 127.0.0.2 for captured connections, which
    /// leave the sandbox only for addresses other than 127.0.0.1.
    pub fn start_on(pki: &TestPki, name: &'static str, bind: &str) -> TlsOrigin {
        let listener = TcpListener::bind(bind).expect("bind");
        let addr = listener.local_addr().expect("addr");
        let hits = Arc::new(AtomicUsize::new(0));
        let counter = hits.clone();
        let config = pki.server_config();
        std::thread::spawn(move || {
            for tcp in listener.incoming().map_while(Result::ok) {
                counter.fetch_add(1, Ordering::SeqCst);
                let config = config.clone();
                std::thread::spawn(move || {
                    let _ = tcp.set_read_timeout(Some(std::time::Duration::from_secs(10)));
                    let _ = tcp.set_nodelay(true);
                    let Ok(conn) = rustls::ServerConnection::new(config) else {
                        return;
                    };
                    let mut tls = rustls::StreamOwned::new(conn, tcp);
                    crate::serve_http(&mut tls, name);
                });
            }
        });
        TlsOrigin { addr, hits }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }
}
