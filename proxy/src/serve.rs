//! The accept loop: one task per client, SOCKS5 told from HTTP by the
//! first byte.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

use crate::engine::Engine;

const SOCKS5: u8 = 0x05;
const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(30);

/// Serve an already-bound listener until the future is dropped. The
/// listener may live in any network namespace.
pub async fn serve(engine: Arc<Engine>, listener: TcpListener) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        engine.add_own_addr(addr);
    }
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(client(engine.clone(), stream, peer));
    }
}

async fn client(engine: Arc<Engine>, stream: TcpStream, peer: std::net::SocketAddr) {
    let mut first = [0u8; 1];
    match tokio::time::timeout(FIRST_BYTE_TIMEOUT, stream.peek(&mut first)).await {
        Ok(Ok(1)) => {}
        _ => return,
    }
    let conn = engine.open(peer);
    if first[0] == SOCKS5 {
        crate::socks::serve(engine, stream, conn).await;
    } else {
        crate::http::serve(engine, stream, conn).await;
    }
}
