//! Who opened a connection (SPEC §6 `command`). The sandbox supervisor maps
//! a peer address to the process inside the sandbox; the standalone proxy
//! only knows the source address.

use std::net::SocketAddr;

/// The sandboxed process behind a connection, as the audit log records it.
pub use airlock_audit::Command as Client;

pub trait ClientIdentity: Send + Sync {
    fn identify(&self, peer: SocketAddr) -> Option<Client>;
}

/// The standalone proxy: clients are their source addresses.
pub struct SourceAddressOnly;

impl ClientIdentity for SourceAddressOnly {
    fn identify(&self, _: SocketAddr) -> Option<Client> {
        None
    }
}
