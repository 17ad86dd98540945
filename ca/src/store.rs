//! The local CA on disk (SPEC §5.3): `ca.pem`, and `ca-key.pem` with mode
//! 0600, in `$XDG_DATA_HOME/airlock/ca/`. A key readable by others is
//! refused, not silently used.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject as _;
use time::{Duration, OffsetDateTime};

use crate::CaError;

pub const CERT_FILE: &str = "ca.pem";
pub const KEY_FILE: &str = "ca-key.pem";

/// A loaded CA: its certificate (PEM and DER) and the issuer that signs leaves.
pub struct Ca {
    pub dir: PathBuf,
    pub cert_pem: String,
    pub cert_der: Vec<u8>,
    pub(crate) issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// `$XDG_DATA_HOME/airlock/ca`, or `~/.local/share/airlock/ca`.
pub fn default_dir() -> Option<PathBuf> {
    let data = std::env::var_os("XDG_DATA_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))?;
    Some(data.join("airlock/ca"))
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> CaError + '_ {
    move |source| CaError::Io {
        path: path.display().to_string(),
        source,
    }
}

impl Ca {
    /// Create a new CA in `dir`; fails if one is there already.
    pub fn create(dir: &Path) -> Result<Ca, CaError> {
        let key_path = dir.join(KEY_FILE);
        if key_path.exists() {
            return Err(CaError::Exists(dir.display().to_string()));
        }
        fs::create_dir_all(dir).map_err(io(dir))?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(io(dir))?;
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        let who = std::env::var("USER").unwrap_or_else(|_| "user".into());
        dn.push(DnType::CommonName, format!("airlock local CA ({who})"));
        dn.push(DnType::OrganizationName, "airlock");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Duration::days(1);
        params.not_after = now + Duration::days(3650);
        params.serial_number = Some(crate::mint::random_serial()?);
        let cert = params.self_signed(&key)?;
        // The key file is created 0600 from the start, never widened.
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&key_path)
            .map_err(io(&key_path))?;
        f.write_all(key.serialize_pem().as_bytes())
            .map_err(io(&key_path))?;
        let cert_path = dir.join(CERT_FILE);
        // Never through a link someone left in the directory.
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&cert_path)
            .and_then(|mut f| f.write_all(cert.pem().as_bytes()))
            .map_err(io(&cert_path))?;
        Ca::load(dir)
    }

    /// Load the CA from `dir`.
    pub fn load(dir: &Path) -> Result<Ca, CaError> {
        let key_path = dir.join(KEY_FILE);
        let meta = fs::metadata(&key_path).map_err(io(&key_path))?;
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(CaError::LooseKey {
                path: key_path.display().to_string(),
                mode: meta.permissions().mode() & 0o777,
            });
        }
        let key_pem = fs::read_to_string(&key_path).map_err(io(&key_path))?;
        let cert_path = dir.join(CERT_FILE);
        let cert_pem = fs::read_to_string(&cert_path).map_err(io(&cert_path))?;
        let key = KeyPair::from_pem(&key_pem)?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key)?;
        let cert_der = rustls::pki_types::CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| CaError::Pem(e.to_string()))?
            .to_vec();
        Ok(Ca {
            dir: dir.to_path_buf(),
            cert_pem,
            cert_der,
            issuer,
        })
    }

    /// Load the CA, creating it on first use.
    pub fn load_or_create(dir: &Path) -> Result<Ca, CaError> {
        if dir.join(KEY_FILE).exists() {
            Ca::load(dir)
        } else {
            Ca::create(dir)
        }
    }
}

impl Ca {
    /// SHA-256 fingerprint of the certificate, as colon-separated hex.
    pub fn fingerprint(&self) -> String {
        let d = ring::digest::digest(&ring::digest::SHA256, &self.cert_der);
        d.as_ref()
            .iter()
            .map(|b| format!("{b:02X}"))
            .collect::<Vec<_>>()
            .join(":")
    }

    /// Subject and validity, for `airlock ca show`.
    pub fn describe(&self) -> String {
        match x509_parser::parse_x509_certificate(&self.cert_der) {
            Ok((_, c)) => format!(
                "subject:     {}\nnot before:  {}\nnot after:   {}\nsha256:      {}",
                c.subject(),
                c.validity().not_before,
                c.validity().not_after,
                self.fingerprint()
            ),
            Err(_) => format!("sha256:      {}", self.fingerprint()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_load_and_refuse_loose_keys() {
        let dir = tempfile::tempdir().unwrap();
        let ca_dir = dir.path().join("ca");
        let ca = Ca::create(&ca_dir).unwrap();
        assert!(ca.cert_pem.contains("BEGIN CERTIFICATE"));
        let mode = fs::metadata(ca_dir.join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        assert!(matches!(Ca::create(&ca_dir), Err(CaError::Exists(_))));
        let again = Ca::load(&ca_dir).unwrap();
        assert_eq!(again.cert_der, ca.cert_der);
        fs::set_permissions(ca_dir.join(KEY_FILE), fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(Ca::load(&ca_dir), Err(CaError::LooseKey { .. })));
    }
}
