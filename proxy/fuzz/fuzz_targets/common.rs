//! An engine that refuses everything, and a way to feed it raw bytes.

use std::sync::Arc;

use airlock_policy::{preset::Offline, Fragment, Policy};
use airlock_proxy::{DenyApprover, Engine, EngineConfig, SourceAddressOnly};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub fn feed(data: &[u8], socks: bool) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    rt.block_on(async {
        let policy = Policy::build(vec![Fragment::built_in()], &Offline);
        let engine = Engine::new(EngineConfig {
            policy: Arc::new(policy),
            audit: None,
            approver: Arc::new(DenyApprover),
            identity: Arc::new(SourceAddressOnly),
            dns_server: None,
            inspect: None,
            lend_to: airlock_proxy::LendTo::Sandbox,
            upstream_proxy: None,
        });
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let conn = engine.open("127.0.0.1:1".parse().expect("addr"));
        let task = if socks {
            tokio::spawn(airlock_proxy::socks::serve(engine, server, conn))
        } else {
            tokio::spawn(airlock_proxy::http::serve(engine, server, conn))
        };
        let _ = client.write_all(data).await;
        let _ = client.shutdown().await;
        let mut sink = Vec::new();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(60), client.read_to_end(&mut sink)).await;
        task.abort();
    });
}
