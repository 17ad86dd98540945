//! airlock's audit log (SPEC §6): the schema (one typed event per kind),
//! the JSON Lines writer, and the reader behind `airlock audit`. The proxy
//! and the supervisor both write through it.

pub mod safe_file;
pub mod schema;
pub mod writer;

pub use schema::{Command, Event, Record};
pub use writer::{AuditError, AuditLog, Sink};
#[cfg(feature = "otlp")]
pub mod otlp;
pub mod reader;
pub mod summary;

/// Summarise audit logs read in order (rotated files oldest first, or
/// concatenated ones): one pass, line by line.
pub fn summarise_files(
    files: &[std::path::PathBuf],
) -> Result<summary::Summary, (std::path::PathBuf, std::io::Error)> {
    let mut s = summary::Summariser::default();
    for f in files {
        let file = std::fs::File::open(f).map_err(|e| (f.clone(), e))?;
        let input = std::io::BufReader::with_capacity(1 << 20, file);
        let (lines, bad) =
            reader::for_each_line(input, |l| s.add(l)).map_err(|e| (f.clone(), e))?;
        s.counted(lines, bad);
    }
    Ok(s.finish())
}
