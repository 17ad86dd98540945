//! `airlock approve --socket PATH`: a ready client for the socket protocol,
//! for a second terminal. It shows each question and sends the answer.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use serde_json::{json, Value};

fn verdict_for(input: &str) -> Option<&'static str> {
    match input.trim().to_ascii_lowercase().as_str() {
        "o" | "once" | "allow-once" => Some("allow-once"),
        "s" | "session" | "allow-session" => Some("allow-session"),
        "a" | "always" | "allow-always" => Some("allow-always"),
        "d" | "deny" | "n" | "no" => Some("deny"),
        _ => None,
    }
}

pub fn run(path: &Path) -> Result<ExitCode> {
    let stream =
        UnixStream::connect(path).with_context(|| format!("connecting to {}", path.display()))?;
    let mut writer = stream.try_clone().context("socket")?;
    let stdin = std::io::stdin();
    eprintln!(
        "airlock approve: connected to {}; answer o (once), s (session), a (always) or d (deny)",
        path.display()
    );
    for line in BufReader::new(stream).lines() {
        let line = line.context("reading from airlock")?;
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        match msg["type"].as_str() {
            Some("ask") => {
                let id = msg["id"].as_str().unwrap_or_default().to_string();
                let who = msg["command"].as_str().unwrap_or("a sandboxed command");
                let verdict = loop {
                    eprint!(
                        "{who} wants {}:{}. [o/s/a/d] ",
                        msg["host"].as_str().unwrap_or("?"),
                        msg["port"]
                    );
                    let mut input = String::new();
                    if stdin
                        .lock()
                        .read_line(&mut input)
                        .context("reading your answer")?
                        == 0
                    {
                        return Ok(ExitCode::SUCCESS);
                    }
                    if let Some(v) = verdict_for(&input) {
                        break v;
                    }
                };
                let answer = json!({"type": "answer", "id": id, "verdict": verdict});
                writeln!(writer, "{answer}").context("sending the answer")?;
            }
            Some("answered") => eprintln!(
                "question {} settled: {}",
                msg["id"].as_str().unwrap_or("?"),
                msg["verdict"].as_str().unwrap_or("?")
            ),
            Some("error") => eprintln!("airlock: {}", msg["message"].as_str().unwrap_or("?")),
            _ => {}
        }
    }
    Ok(ExitCode::SUCCESS)
}
