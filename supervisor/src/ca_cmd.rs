//! `airlock ca init | path | show | export [--out FILE]`.

use std::path::Path;
use std::process::ExitCode;

use airlock_ca::Ca;
use anyhow::{Context, Result};

use crate::cli::CaAction;

pub fn run(action: CaAction, out: Option<&Path>) -> Result<ExitCode> {
    let dir = crate::places::ca_dir()?;
    match action {
        CaAction::Init => {
            let ca = Ca::create(&dir)
                .with_context(|| format!("creating the CA in {}", dir.display()))?;
            say!("created the airlock CA in {}", dir.display());
            say!("{}", ca.describe());
        }
        CaAction::Path => say!("{}", dir.display()),
        CaAction::Show => {
            let ca = Ca::load(&dir)
                .with_context(|| format!("no CA in {} (run `airlock ca init`)", dir.display()))?;
            say!("{}", ca.describe());
        }
        CaAction::Export => {
            let ca = Ca::load(&dir)
                .with_context(|| format!("no CA in {} (run `airlock ca init`)", dir.display()))?;
            match out {
                Some(p) => std::fs::write(p, &ca.cert_pem)
                    .with_context(|| format!("writing {}", p.display()))?,
                None => print!("{}", ca.cert_pem),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
