//! Durations and sizes as the policy file writes them.

use std::time::Duration;

/// `"60s"`, `"10m"`, `"1h 30m"`, `"500ms"`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s.trim())
        .map_err(|e| format!("invalid duration {s:?}: {e} (write e.g. \"90s\" or \"10m\")"))?;
    if d.is_zero() {
        return Err(format!("duration {s:?} must be greater than zero"));
    }
    Ok(d)
}

/// `"512M"`, `"8G"`, `"1024K"` or plain bytes; binary units.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let err = || format!("invalid size {s:?} (write e.g. \"512M\" or \"8G\")");
    let (num, mult) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        None => (t, 1u64),
        Some((i, _)) => {
            let unit = t[i..]
                .trim()
                .trim_end_matches(['b', 'B'])
                .trim_end_matches('i');
            let mult = match unit.to_ascii_uppercase().as_str() {
                "" => 1,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1 << 40,
                _ => return Err(err()),
            };
            (&t[..i], mult)
        }
    };
    let n: u64 = num.parse().map_err(|_| err())?;
    n.checked_mul(mult).filter(|&v| v > 0).ok_or_else(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("60s").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8G").unwrap(), 8 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("8X").is_err());
        assert!(parse_size("").is_err());
    }
}
