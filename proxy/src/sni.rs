//! The ClientHello peek (SPEC §5.1): without inspection, a tunnel's TLS
//! ClientHello must name the host the client asked to CONNECT to, so an
//! allowed name can't front for another. A ClientHello can be large and
//! arrive in pieces, so it is parsed by rustls, not sliced at an offset.

use tokio::io::{AsyncRead, AsyncReadExt};

/// A ClientHello larger than this is refused rather than buffered.
const MAX_HELLO: usize = 64 * 1024;
const TLS_HANDSHAKE: u8 = 0x16;

#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    /// A complete ClientHello, with its SNI if it sent one.
    Tls { sni: Option<String> },
    /// The first byte is not a TLS handshake record.
    NotTls,
}

#[derive(Debug, thiserror::Error)]
pub enum PeekError {
    #[error("the client closed the tunnel inside its ClientHello")]
    Truncated,
    #[error("malformed ClientHello: {0}")]
    Malformed(String),
    #[error("ClientHello larger than {MAX_HELLO} bytes")]
    TooLarge,
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Parse a (possibly partial) byte prefix. `Ok(None)` means more is needed.
pub fn parse(bytes: &[u8]) -> Result<Option<Hello>, PeekError> {
    match bytes.first() {
        None => return Ok(None),
        Some(&b) if b != TLS_HANDSHAKE => return Ok(Some(Hello::NotTls)),
        Some(_) => {}
    }
    let mut acceptor = rustls::server::Acceptor::default();
    let mut rest = bytes;
    loop {
        match acceptor.read_tls(&mut rest) {
            Ok(0) => return Ok(None),
            Ok(_) => {}
            Err(e) => return Err(PeekError::Malformed(e.to_string())),
        }
        match acceptor.accept() {
            Ok(Some(accepted)) => {
                let sni = accepted.client_hello().server_name().map(str::to_string);
                return Ok(Some(Hello::Tls { sni }));
            }
            Ok(None) if rest.is_empty() => return Ok(None),
            Ok(None) => continue,
            Err((e, _)) => return Err(PeekError::Malformed(e.to_string())),
        }
    }
}

/// Read from the client until its first bytes are classified, starting
/// with `buf` (bytes already read). Returns all the bytes read, which
/// still have to be sent upstream.
pub async fn read_hello<R: AsyncRead + Unpin>(
    r: &mut R,
    mut buf: Vec<u8>,
) -> Result<(Vec<u8>, Hello), PeekError> {
    if let Some(hello) = parse(&buf)? {
        return Ok((buf, hello));
    }
    let mut chunk = [0u8; 4096];
    loop {
        let n = r.read(&mut chunk).await?;
        if n == 0 {
            return Err(PeekError::Truncated);
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(hello) = parse(&buf)? {
            return Ok((buf, hello));
        }
        if buf.len() > MAX_HELLO {
            return Err(PeekError::TooLarge);
        }
    }
}
