//! Trust inside the sandbox (SPEC §5.3): a per-run bundle of the system
//! roots plus the airlock CA for the variables that replace the trust
//! store, and the CA alone for those that add to it. Never the key.

use std::fs;
use std::path::{Path, PathBuf};

use crate::store::Ca;
use crate::CaError;

/// Variables whose file replaces the client's trust store.
pub const REPLACE_VARS: &[&str] = &[
    "SSL_CERT_FILE",
    "CURL_CA_BUNDLE",
    "REQUESTS_CA_BUNDLE",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
    "CARGO_HTTP_CAINFO",
    "AWS_CA_BUNDLE",
    "BUNDLE_SSL_CA_CERT",
    "NPM_CONFIG_CAFILE",
];

/// Variables whose file adds to the client's trust store.
pub const ADD_VARS: &[&str] = &["NODE_EXTRA_CA_CERTS", "DENO_CERT"];

const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
    "/usr/local/etc/openssl/cert.pem",
];

/// The system's PEM bundle: `$SSL_CERT_FILE` of the supervisor, or the
/// distribution's usual file.
pub fn system_roots() -> Option<(PathBuf, String)> {
    let from_env = std::env::var_os("SSL_CERT_FILE").map(PathBuf::from);
    from_env
        .into_iter()
        .chain(SYSTEM_BUNDLES.iter().map(PathBuf::from))
        .find_map(|p| {
            fs::read_to_string(&p)
                .ok()
                .filter(|t| t.contains("BEGIN CERTIFICATE"))
                .map(|t| (p, t))
        })
}

#[derive(Debug, Clone)]
pub struct Bundle {
    /// System roots plus the airlock CA.
    pub bundle: PathBuf,
    /// The airlock CA alone.
    pub ca_only: PathBuf,
}

impl Bundle {
    /// Write both files into `dir` for one run.
    pub fn write(dir: &Path, run: &str, ca: &Ca) -> Result<Bundle, CaError> {
        let io = |p: &Path| {
            let path = p.display().to_string();
            move |source| CaError::Io { path, source }
        };
        fs::create_dir_all(dir).map_err(io(dir))?;
        let mut text = system_roots().map(|(_, t)| t).unwrap_or_default();
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&ca.cert_pem);
        let bundle = dir.join(format!("{run}-bundle.pem"));
        fs::write(&bundle, text).map_err(io(&bundle))?;
        let ca_only = dir.join(format!("{run}-ca.pem"));
        fs::write(&ca_only, &ca.cert_pem).map_err(io(&ca_only))?;
        Ok(Bundle { bundle, ca_only })
    }

    pub fn env(&self) -> Vec<(String, String)> {
        let b = self.bundle.display().to_string();
        let c = self.ca_only.display().to_string();
        REPLACE_VARS
            .iter()
            .map(|v| (v.to_string(), b.clone()))
            .chain(ADD_VARS.iter().map(|v| (v.to_string(), c.clone())))
            .collect()
    }

    pub fn remove(&self) {
        let _ = fs::remove_file(&self.bundle);
        let _ = fs::remove_file(&self.ca_only);
    }
}
