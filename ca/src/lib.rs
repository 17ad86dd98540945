//! airlock's local CA (SPEC §5.3): create and load it, mint leaf
//! certificates for inspected hosts and cache them, and write the trust
//! bundles and variables that point sandboxed clients at it.

pub mod mint;
pub mod store;
pub mod trust;

pub use mint::{ForHost, Minter};
pub use store::{default_dir, Ca};
pub use trust::Bundle;

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("a CA already exists in {0}")]
    Exists(String),
    #[error("{path} is readable by others (mode {mode:o}); run `chmod 600 {path}`")]
    LooseKey { path: String, mode: u32 },
    #[error("certificate generation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("bad PEM: {0}")]
    Pem(String),
    #[error("TLS key setup failed: {0}")]
    Rustls(String),
    #[error("no randomness: {0}")]
    Random(String),
}
