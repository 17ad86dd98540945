//! Just enough netlink to set up transparent capture in the sandbox's
//! network namespace (SPEC §5.5): a default route via `lo` (rtnetlink) and
//! an nf_tables batch (nfnetlink). Hand-built messages rather than a crate:
//! the nftables crates here either generate bindings with bindgen (libclang
//! at build time) or link libnftnl, and the few messages we need are fixed.
//! Every request is acknowledged, and any error the kernel returns fails
//! the whole setup.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;
const NLA_F_NESTED: u16 = 0x8000;

/// A netlink message being built: header first, then family header and
/// attributes, with nests patched once they are closed.
pub struct Msg {
    buf: Vec<u8>,
    nests: Vec<usize>,
}

impl Msg {
    fn new(kind: u16, flags: u16) -> Msg {
        let mut buf = Vec::with_capacity(256);
        buf.extend_from_slice(&0u32.to_ne_bytes()); // length, patched in `finish`
        buf.extend_from_slice(&kind.to_ne_bytes());
        buf.extend_from_slice(&flags.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes()); // sequence, set when sent
        buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
        Msg { buf, nests: vec![] }
    }

    fn raw(&mut self, bytes: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(bytes);
        self
    }

    fn pad(&mut self) {
        while self.buf.len() % 4 != 0 {
            self.buf.push(0);
        }
    }

    pub fn attr(&mut self, kind: u16, data: &[u8]) -> &mut Self {
        let len = u16::try_from(4 + data.len()).unwrap_or(u16::MAX);
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.pad();
        self
    }

    /// A NUL-terminated string attribute.
    pub fn str(&mut self, kind: u16, s: &str) -> &mut Self {
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        self.attr(kind, &v)
    }

    /// nf_tables integers are big-endian.
    pub fn be32(&mut self, kind: u16, v: u32) -> &mut Self {
        self.attr(kind, &v.to_be_bytes())
    }

    pub fn nest(&mut self, kind: u16) -> &mut Self {
        self.nests.push(self.buf.len());
        self.attr(kind | NLA_F_NESTED, &[])
    }

    pub fn end(&mut self) -> &mut Self {
        if let Some(at) = self.nests.pop() {
            let len = u16::try_from(self.buf.len() - at).unwrap_or(u16::MAX);
            self.buf[at..at + 2].copy_from_slice(&len.to_ne_bytes());
        }
        self
    }

    fn finish(mut self, seq: u32) -> Vec<u8> {
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        self.buf
    }
}

struct Socket(OwnedFd);

impl Socket {
    fn open(protocol: libc::c_int) -> io::Result<Socket> {
        // SAFETY: plain socket(2); the result is checked.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                protocol,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: we own this fresh descriptor.
        let sock = Socket(unsafe { OwnedFd::from_raw_fd(fd) });
        // The kernel answers at once; never let a missing ack hang the
        // sandbox's start.
        let tv = libc::timeval {
            tv_sec: 2,
            tv_usec: 0,
        };
        // SAFETY: setsockopt with a timeval of the right size.
        let r = unsafe {
            libc::setsockopt(
                sock.0.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(sock)
    }

    /// Send the messages in one datagram (a batch must arrive whole) and
    /// wait for the acknowledgement of every one that asked for it.
    fn transact(&self, msgs: Vec<(Msg, bool)>) -> io::Result<()> {
        let mut out = vec![];
        let mut waiting = std::collections::HashSet::new();
        for (i, (m, acked)) in msgs.into_iter().enumerate() {
            let seq = i as u32 + 1;
            if acked {
                waiting.insert(seq);
            }
            out.extend(m.finish(seq));
        }
        // SAFETY: sending our own buffer on our own socket.
        let n = unsafe { libc::send(self.0.as_raw_fd(), out.as_ptr().cast(), out.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u8; 16 * 1024];
        while !waiting.is_empty() {
            // SAFETY: receiving into our own buffer.
            let n =
                unsafe { libc::recv(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut rest = &buf[..n as usize];
            while rest.len() >= 16 {
                let len = u32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
                let kind = u16::from_ne_bytes([rest[4], rest[5]]);
                let seq = u32::from_ne_bytes([rest[8], rest[9], rest[10], rest[11]]);
                if len < 16 || len > rest.len() {
                    return Err(io::Error::other("malformed netlink reply"));
                }
                if kind == NLMSG_ERROR && len >= 20 {
                    let code = i32::from_ne_bytes([rest[16], rest[17], rest[18], rest[19]]);
                    if code != 0 {
                        return Err(io::Error::from_raw_os_error(-code));
                    }
                    waiting.remove(&seq);
                }
                rest = &rest[(len + 3) & !3..];
            }
        }
        Ok(())
    }
}

// rtnetlink
const RTM_NEWROUTE: u16 = 24;
const RT_TABLE_MAIN: u8 = 254;
const RTPROT_STATIC: u8 = 4;
const RTN_UNICAST: u8 = 1;
const RTA_OIF: u16 = 4;
const RTA_PREFSRC: u16 = 7;

/// `ip route add default dev <ifindex> src <src>`: every destination leaves
/// through loopback, where the NAT rule catches it. The source is the
/// loopback address, which is the only one the namespace has.
pub fn default_route(ifindex: u32, src: IpAddr) -> io::Result<()> {
    let (family, src) = match src {
        IpAddr::V4(a) => (libc::AF_INET as u8, a.octets().to_vec()),
        IpAddr::V6(a) => (libc::AF_INET6 as u8, a.octets().to_vec()),
    };
    let mut m = Msg::new(
        RTM_NEWROUTE,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
    );
    // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags.
    m.raw(&[
        family,
        0,
        0,
        0,
        RT_TABLE_MAIN,
        RTPROT_STATIC,
        0,
        RTN_UNICAST,
    ]);
    m.raw(&0u32.to_ne_bytes());
    m.attr(RTA_OIF, &ifindex.to_ne_bytes());
    // The kernel refuses a preferred source for IPv6 default routes on some
    // versions; IPv6 picks ::1 from lo by itself.
    if family == libc::AF_INET as u8 {
        m.attr(RTA_PREFSRC, &src);
    }
    Socket::open(libc::NETLINK_ROUTE)?.transact(vec![(m, true)])
}

// nfnetlink / nf_tables
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_NEWRULE: u16 = 6;
pub const NFPROTO_INET: u8 = 1;

const fn nft(msg: u16) -> u16 {
    (NFNL_SUBSYS_NFTABLES << 8) | msg
}

fn nfgen(kind: u16, flags: u16, family: u8, res_id: u16) -> Msg {
    let mut m = Msg::new(kind, flags);
    m.raw(&[family, 0]).raw(&res_id.to_be_bytes());
    m
}

/// One nf_tables transaction: all of it applies, or none.
pub struct Batch {
    family: u8,
    msgs: Vec<(Msg, bool)>,
}

// Attribute numbers from linux/netfilter/nf_tables.h.
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NF_ACCEPT: u32 = 1;
pub const NF_INET_LOCAL_OUT: u32 = 3;

impl Batch {
    pub fn new(family: u8) -> Batch {
        let begin = nfgen(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, 0, NFNL_SUBSYS_NFTABLES);
        Batch {
            family,
            msgs: vec![(begin, false)],
        }
    }

    fn msg(&mut self, kind: u16, extra: u16) -> &mut Msg {
        let m = nfgen(
            nft(kind),
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | extra,
            self.family,
            0,
        );
        self.msgs.push((m, true));
        let last = self.msgs.len() - 1;
        &mut self.msgs[last].0
    }

    pub fn table(&mut self, name: &str) {
        self.msg(NFT_MSG_NEWTABLE, 0).str(NFTA_TABLE_NAME, name);
    }

    /// A base chain: `type <kind> hook <hook> priority <prio>; policy accept`.
    pub fn chain(&mut self, table: &str, name: &str, kind: &str, hook: u32, prio: i32) {
        self.msg(NFT_MSG_NEWCHAIN, 0)
            .str(NFTA_CHAIN_TABLE, table)
            .str(NFTA_CHAIN_NAME, name)
            .nest(NFTA_CHAIN_HOOK)
            .be32(NFTA_HOOK_HOOKNUM, hook)
            .be32(NFTA_HOOK_PRIORITY, prio as u32)
            .end()
            .be32(NFTA_CHAIN_POLICY, NF_ACCEPT)
            .str(NFTA_CHAIN_TYPE, kind);
    }

    pub fn rule(&mut self, table: &str, chain: &str, exprs: &[Expr]) {
        let m = self.msg(NFT_MSG_NEWRULE, NLM_F_APPEND);
        m.str(NFTA_RULE_TABLE, table)
            .str(NFTA_RULE_CHAIN, chain)
            .nest(NFTA_RULE_EXPRESSIONS);
        for e in exprs {
            m.nest(NFTA_LIST_ELEM).str(NFTA_EXPR_NAME, e.name());
            m.nest(NFTA_EXPR_DATA);
            e.attrs(m);
            m.end().end();
        }
        m.end();
    }

    pub fn commit(mut self) -> io::Result<()> {
        let end = nfgen(NFNL_MSG_BATCH_END, NLM_F_REQUEST, 0, NFNL_SUBSYS_NFTABLES);
        self.msgs.push((end, false));
        Socket::open(libc::NETLINK_NETFILTER)?.transact(self.msgs)
    }
}

/// The few nf_tables expressions capture needs. Everything goes through
/// register 1.
pub enum Expr {
    /// Load a meta key (`NFT_META_*`) into the register.
    Meta(u32),
    /// Load `len` bytes of the network header at `offset`.
    NetworkHeader { offset: u32, len: u32 },
    /// Compare the register with `value`: equal, or not equal.
    Cmp { eq: bool, value: Vec<u8> },
    /// Put `value` in the register.
    Immediate(Vec<u8>),
    /// Redirect to the local port in the register.
    Redirect,
    /// Reject with an ICMP(v6) port unreachable.
    Reject,
}

pub const NFT_META_NFPROTO: u32 = 15;
pub const NFT_META_L4PROTO: u32 = 16;
const NFT_REG_1: u32 = 1;

impl Expr {
    fn name(&self) -> &'static str {
        match self {
            Expr::Meta(_) => "meta",
            Expr::NetworkHeader { .. } => "payload",
            Expr::Cmp { .. } => "cmp",
            Expr::Immediate(_) => "immediate",
            Expr::Redirect => "redir",
            Expr::Reject => "reject",
        }
    }

    fn attrs(&self, m: &mut Msg) {
        match self {
            // NFTA_META_DREG, NFTA_META_KEY
            Expr::Meta(key) => {
                m.be32(1, NFT_REG_1).be32(2, *key);
            }
            // NFTA_PAYLOAD_DREG, _BASE (network header), _OFFSET, _LEN
            Expr::NetworkHeader { offset, len } => {
                m.be32(1, NFT_REG_1)
                    .be32(2, 1)
                    .be32(3, *offset)
                    .be32(4, *len);
            }
            // NFTA_CMP_SREG, _OP (NFT_CMP_EQ 0 / NFT_CMP_NEQ 1), _DATA
            Expr::Cmp { eq, value } => {
                m.be32(1, NFT_REG_1)
                    .be32(2, if *eq { 0 } else { 1 })
                    .nest(3)
                    .attr(NFTA_DATA_VALUE, value)
                    .end();
            }
            // NFTA_IMMEDIATE_DREG, _DATA
            Expr::Immediate(value) => {
                m.be32(1, NFT_REG_1)
                    .nest(2)
                    .attr(NFTA_DATA_VALUE, value)
                    .end();
            }
            // NFTA_REDIR_REG_PROTO_MIN
            Expr::Redirect => {
                m.be32(1, NFT_REG_1);
            }
            // NFTA_REJECT_TYPE = NFT_REJECT_ICMPX_UNREACH,
            // NFTA_REJECT_ICMP_CODE = NFT_REJECT_ICMPX_PORT_UNREACH
            Expr::Reject => {
                m.be32(1, 2).attr(2, &[1]);
            }
        }
    }
}
