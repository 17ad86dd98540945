//! Reading audit logs back: line by line, one small borrowed view per line,
//! so a log of any size streams in constant memory. Rotated and
//! concatenated logs are just more lines; a line that is not an event (a
//! torn last write, another program's output) is counted, not fatal.

use std::borrow::Cow;
use std::io::{self, BufRead};

use serde::Deserialize;

/// `command` is the argv in a `run` line and `{pid, argv}` elsewhere;
/// read by hand (not `untagged`, which buffers every value first).
pub struct CommandField<'a>(pub Vec<Cow<'a, str>>);

impl CommandField<'_> {
    pub fn argv(&self) -> &[Cow<'_, str>] {
        &self.0
    }

    pub fn to_vec(&self) -> Vec<String> {
        self.0.iter().map(|a| a.to_string()).collect()
    }
}

/// A string that borrows from the line when it holds no escapes.
struct Str<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Cow::<'a, str>::deserialize(d).map(Str)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for CommandField<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for V<'a> {
            type Value = CommandField<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an argv array or {pid, argv}")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut v = vec![];
                while let Some(Str(s)) = seq.next_element::<Str<'a>>()? {
                    v.push(s);
                }
                Ok(CommandField(v))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut argv = None;
                while let Some(Str(k)) = map.next_key::<Str<'de>>()? {
                    if k == "argv" {
                        argv = Some(map.next_value::<CommandField<'a>>()?);
                    } else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
                Ok(argv.unwrap_or(CommandField(vec![])))
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// The fields the summary reads, from any kind of line. Unknown fields are
/// skipped, so newer logs still read.
#[derive(Deserialize)]
pub struct Line<'a> {
    #[serde(borrow)]
    pub event: Cow<'a, str>,
    #[serde(borrow, default)]
    pub run: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub ts: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub host: Option<Cow<'a, str>>,
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(borrow, default)]
    pub decision: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub reason: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub command: Option<CommandField<'a>>,
    #[serde(default)]
    pub bytes_up: Option<u64>,
    #[serde(default)]
    pub bytes_down: Option<u64>,
    #[serde(borrow, default)]
    pub answer: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub by: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub path: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub change: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub action: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub dest: Option<Cow<'a, str>>,
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub duration_ms: Option<u64>,
    #[serde(borrow, default)]
    pub tier: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub cwd: Option<Cow<'a, str>>,
    #[serde(default)]
    pub learn: Option<bool>,
    #[serde(borrow, default)]
    pub method: Option<Cow<'a, str>>,
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(borrow, default)]
    pub url: Option<Cow<'a, str>>,
}

/// Call `each` for every event line of `input`; returns (lines read, lines
/// that were not events).
pub fn for_each_line(
    input: impl BufRead,
    mut each: impl FnMut(Line<'_>),
) -> io::Result<(u64, u64)> {
    let mut input = input;
    let mut buf = Vec::with_capacity(4096);
    let (mut lines, mut bad) = (0u64, 0u64);
    loop {
        buf.clear();
        if input.read_until(b'\n', &mut buf)? == 0 {
            return Ok((lines, bad));
        }
        let text = buf.strip_suffix(b"\n").unwrap_or(&buf);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        if text.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        lines += 1;
        match serde_json::from_slice::<Line<'_>>(text) {
            Ok(l) => each(l),
            Err(_) => bad += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torn_and_foreign_lines_are_counted_not_fatal() {
        let log = concat!(
            "{\"event\":\"end\",\"run\":\"a\",\"exit_code\":0,\"duration_ms\":1}\n",
            "not json\n",
            "\n",
            "{\"old\":1}\n",
            "{\"event\":\"run\",\"run\":\"b\",\"command\":[\"sh\"],\"extra\":{\"x\":[1]}}\n",
            "{\"event\":\"close\",\"run\":\"b\",\"command\":{\"pid\":3,\"argv\":[\"curl\"]}}\n",
            "{\"event\":\"decision\",\"run\":\"b\",\"host\":\"a.t",
        );
        let mut seen = vec![];
        let (lines, bad) = for_each_line(log.as_bytes(), |l| {
            seen.push((l.event.to_string(), l.command.map(|c| c.argv().join(" "))))
        })
        .unwrap();
        assert_eq!((lines, bad), (6, 3));
        assert_eq!(
            seen,
            vec![
                ("end".to_string(), None),
                ("run".to_string(), Some("sh".to_string())),
                ("close".to_string(), Some("curl".to_string())),
            ]
        );
    }
}
