//! Turning the policy's inspection entries into what the proxy needs: the
//! CA (created on first use), upstream trust, credentials read from the
//! supervisor's environment, and the per-run trust bundle for the sandbox.

use std::path::PathBuf;
use std::sync::Arc;

use airlock_ca::{Bundle, Ca, Minter};
use airlock_policy::Policy;
use airlock_proxy::inspect::{upstream_client, Credential, InspectConfig};
use anyhow::{Context, Result};

/// Whether anything in the policy asks for decryption.
pub fn wanted(policy: &Policy) -> bool {
    !policy.inspect.is_empty()
        || !policy.credentials.is_empty()
        || !policy.request_rules.is_empty()
        || !policy.hold_rules.is_empty()
}

/// The inspection config when the policy wants one.
pub fn for_policy(policy: &Policy) -> Result<Option<InspectConfig>> {
    if wanted(policy) {
        config(policy).map(Some)
    } else {
        Ok(None)
    }
}

pub fn config(policy: &Policy) -> Result<InspectConfig> {
    let dir = crate::places::ca_dir()?;
    let ca = Ca::load_or_create(&dir)
        .with_context(|| format!("loading the airlock CA from {}", dir.display()))?;
    let minter = Arc::new(Minter::new(ca).context("preparing leaf certificates")?);
    let roots: Vec<PathBuf> = policy
        .upstream_ca
        .iter()
        .map(|p| PathBuf::from(&p.value))
        .collect();
    let upstream = upstream_client(&roots).context("loading upstream trust (--upstream-ca)")?;
    let mut credentials = vec![];
    for c in &policy.credentials {
        let value = airlock_policy::request::expand_env(&c.value, |k| std::env::var(k).ok())
            .map_err(|e| {
                anyhow::anyhow!("credential for {} ({}): {e}", c.host.text, c.origin.origin)
            })?;
        credentials.push(Credential {
            host: c.host.clone(),
            header: http::HeaderName::from_bytes(c.header.as_bytes())
                .with_context(|| format!("credential header {:?}", c.header))?,
            value: {
                let mut v = http::HeaderValue::from_str(&value).with_context(|| {
                    format!(
                        "credential value for {} is not a valid header value",
                        c.host.text
                    )
                })?;
                // Never printed by Debug, nor compressed into HPACK tables.
                v.set_sensitive(true);
                v
            },
            methods: c.methods.clone(),
            from: c.origin.origin.to_string(),
        });
    }
    Ok(InspectConfig {
        minter,
        upstream,
        credentials,
    })
}

/// The per-run trust files, next to (never inside) the CA directory.
pub fn bundle(cfg: &InspectConfig, run: &str) -> Result<Bundle> {
    let ca = cfg.minter.ca();
    let dir = ca
        .dir
        .parent()
        .map(|p| p.join("trust"))
        .context("CA directory has no parent")?;
    Bundle::write(&dir, run, ca).context("writing the sandbox's trust bundle")
}

/// `--upstream-proxy URL`, parsed.
pub fn upstream_proxy(
    args: &crate::cli::PolicyArgs,
) -> Result<Option<airlock_proxy::UpstreamProxy>> {
    let Some(url) = &args.upstream_proxy else {
        return Ok(None);
    };
    Ok(Some(airlock_proxy::UpstreamProxy::parse(url)?))
}
