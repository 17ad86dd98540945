//! Everything the sandbox controls (argv, host names, URLs, paths) is
//! shown with control characters escaped (SPEC §5.2): on a terminal, an
//! escape sequence in an argv could draw a fake question over the real one.

/// `s` with every control character (C0, DEL, C1) and the Unicode
/// bidirectional overrides written as `\x1b`-style or `\u{202e}` escapes,
/// and backslashes doubled so an escape can't be forged; at most `max`
/// characters of the input are shown.
pub fn line(s: &str, max: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max));
    for (i, c) in s.chars().enumerate() {
        if i >= max {
            out.push_str("...");
            break;
        }
        match c {
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if (0x80..0xa0).contains(&(c as u32))
                || matches!(c as u32, 0x200e | 0x200f | 0x202a..=0x202e | 0x2066..=0x2069) =>
            {
                out.push_str(&format!("\\u{{{:x}}}", c as u32))
            }
            c => out.push(c),
        }
    }
    out
}

/// An argv as one escaped line, arguments separated by spaces.
pub fn argv(argv: &[String]) -> String {
    line(&argv.join(" "), 300)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(line("npm install", 100), "npm install");
        assert_eq!(
            line("\x1b[2K\rnpm wants registry\u{9b}31m\u{202e}", 100),
            "\\x1b[2K\\x0dnpm wants registry\\u{9b}31m\\u{202e}"
        );
        assert_eq!(line("a\\x1b", 100), "a\\\\x1b");
        assert_eq!(line("abcdef", 3), "abc...");
        assert!(!line("\x07\x08\t\n\x7f", 100)
            .chars()
            .any(|c| c.is_control()));
    }
}
