//! Leaf certificates (SPEC §5.3): minted for the CONNECT host (an IP SAN
//! for IP hosts), all sharing one ECDSA P-256 key, with random serials, a
//! backdated start and at most 30 days of validity, kept in an LRU cache
//! and served to rustls through `ResolvesServerCert`.

use std::net::IpAddr;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use lru::LruCache;
use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, KeyPair, SanType,
    SerialNumber,
};
use rustls::crypto::ring::sign::any_ecdsa_type;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use time::{Duration, OffsetDateTime};

use crate::store::Ca;
use crate::CaError;

pub const CACHE_SIZE: usize = 1024;

pub fn random_serial() -> Result<SerialNumber, CaError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| CaError::Random(e.to_string()))?;
    bytes[0] &= 0x7f; // positive
    Ok(SerialNumber::from_slice(&bytes))
}

/// Mints and caches leaves. Cheap to share behind an `Arc`.
pub struct Minter {
    ca: Ca,
    leaf_key: KeyPair,
    signing: Arc<dyn rustls::sign::SigningKey>,
    cache: Mutex<LruCache<String, Arc<CertifiedKey>>>,
    minted: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Minter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Minter")
            .field("ca", &self.ca)
            .finish_non_exhaustive()
    }
}

impl Minter {
    pub fn new(ca: Ca) -> Result<Minter, CaError> {
        let leaf_key = KeyPair::generate()?;
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
        let signing = any_ecdsa_type(&der).map_err(|e| CaError::Rustls(e.to_string()))?;
        Ok(Minter {
            ca,
            leaf_key,
            signing,
            cache: Mutex::new(LruCache::new(
                NonZeroUsize::new(CACHE_SIZE).unwrap_or(NonZeroUsize::MIN),
            )),
            minted: std::sync::atomic::AtomicU64::new(0),
        })
    }

    pub fn ca(&self) -> &Ca {
        &self.ca
    }

    /// How many leaves were minted (the rest came from the cache).
    pub fn minted(&self) -> u64 {
        self.minted.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The leaf for `host` (a canonical name or IP), from the cache or new.
    pub fn leaf(&self, host: &str) -> Result<Arc<CertifiedKey>, CaError> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(hit) = cache.get(host) {
            return Ok(hit.clone());
        }
        let key = Arc::new(self.mint(host)?);
        cache.put(host.to_string(), key.clone());
        Ok(key)
    }

    fn mint(&self, host: &str) -> Result<CertifiedKey, CaError> {
        let mut params = CertificateParams::default();
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        params.subject_alt_names = match bare.parse::<IpAddr>() {
            Ok(ip) => vec![SanType::IpAddress(ip)],
            Err(_) => vec![SanType::DnsName(host.to_string().try_into()?)],
        };
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, bare);
        params.distinguished_name = dn;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let now = OffsetDateTime::now_utc();
        // Backdated for clients with slow clocks; 30 days in all.
        params.not_before = now - Duration::hours(1);
        params.not_after = params.not_before + Duration::days(30);
        params.serial_number = Some(random_serial()?);
        let cert = params.signed_by(&self.leaf_key, &self.ca.issuer)?;
        self.minted
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let chain = vec![
            cert.der().clone(),
            CertificateDer::from(self.ca.cert_der.clone()),
        ];
        Ok(CertifiedKey::new(chain, self.signing.clone()))
    }
}

/// Serves the leaf for one CONNECT host, whatever the ClientHello says
/// (the SNI was checked against the host before the handshake).
#[derive(Debug)]
pub struct ForHost {
    pub minter: Arc<Minter>,
    pub host: String,
}

impl ResolvesServerCert for ForHost {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        match self.minter.leaf(&self.host) {
            Ok(k) => Some(k),
            Err(e) => {
                tracing::error!("minting a certificate for {} failed: {e}", self.host);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minter() -> (tempfile::TempDir, Minter) {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::create(&dir.path().join("ca")).unwrap();
        (dir, Minter::new(ca).unwrap())
    }

    #[test]
    fn leaves_are_cached_and_share_a_key() {
        let (_d, m) = minter();
        let a = m.leaf("api.example.test").unwrap();
        let b = m.leaf("api.example.test").unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(m.minted(), 1);
        let c = m.leaf("other.example.test").unwrap();
        assert_eq!(m.minted(), 2);
        assert_ne!(a.cert[0], c.cert[0]);
        assert!(Arc::ptr_eq(&a.key, &c.key), "leaves share one key");
        assert_eq!(
            a.cert[1].as_ref(),
            m.ca().cert_der.as_slice(),
            "chain carries the CA"
        );
    }

    #[test]
    fn ip_hosts_get_ip_sans() {
        let (_d, m) = minter();
        assert!(m.leaf("127.0.0.1").is_ok());
        assert!(m.leaf("[::1]").is_ok());
    }
}
