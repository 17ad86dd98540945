//! A refusal (SPEC §5.1): the reason, what was blocked, and how to allow
//! it. Rendered as a 403/502/504 for HTTP clients and as a reply code for
//! SOCKS5 clients.

use std::net::IpAddr;

use airlock_policy::{advice, Reason, Rule, Target};
use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;

#[derive(Debug, Clone)]
pub struct Refusal {
    pub reason: Reason,
    /// The target as the client named it (canonical when it parsed).
    pub target: String,
    pub parsed: Option<Target>,
    pub rule: Option<Rule>,
    /// One sentence on what happened, for the body and the log.
    pub detail: String,
    /// The address a `private-address` refusal resolved to.
    pub resolved: Option<IpAddr>,
    /// False under the managed `user_allow = false`: no `--allow` advice.
    pub user_allow: bool,
}

impl Refusal {
    pub fn new(reason: Reason, target: &Target, detail: impl Into<String>) -> Refusal {
        Refusal {
            reason,
            target: target.to_string(),
            parsed: Some(target.clone()),
            rule: None,
            detail: detail.into(),
            resolved: None,
            user_allow: true,
        }
    }

    /// For input that never became a `Target`.
    pub fn invalid(target: &str, detail: impl Into<String>) -> Refusal {
        Refusal {
            reason: Reason::InvalidHost,
            target: crate::escape::line(target, 200),
            parsed: None,
            rule: None,
            detail: detail.into(),
            resolved: None,
            user_allow: true,
        }
    }

    pub fn with_rule(mut self, rule: Option<Rule>) -> Refusal {
        self.rule = rule;
        self
    }

    pub fn status(&self) -> StatusCode {
        match self.reason {
            Reason::UpstreamUnreachable => StatusCode::BAD_GATEWAY,
            Reason::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            Reason::InvalidHost => StatusCode::BAD_REQUEST,
            _ => StatusCode::FORBIDDEN,
        }
    }

    /// The one-paragraph body: what, why, and how to allow it.
    pub fn body(&self) -> String {
        let by = match &self.rule {
            Some(r) => format!(" The rule {:?} at {} decided it.", r.value.text, r.origin),
            None => String::new(),
        };
        let advice = match &self.parsed {
            Some(t) => format!(
                " To allow it: {}.",
                advice(t, self.reason, self.resolved, self.user_allow)
            ),
            None => String::new(),
        };
        format!(
            "airlock blocked the connection to {} ({}): {}.{}{}\n",
            self.target,
            self.reason,
            crate::escape::line(&self.detail, 500),
            by,
            advice
        )
    }

    pub fn response(&self) -> Response<Full<Bytes>> {
        let mut resp = Response::new(Full::new(Bytes::from(self.body())));
        *resp.status_mut() = self.status();
        let h = resp.headers_mut();
        h.insert("x-airlock-decision", http::HeaderValue::from_static("deny"));
        h.insert(
            "x-airlock-reason",
            http::HeaderValue::from_static(self.reason.as_str()),
        );
        h.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        h.insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
        resp
    }

    /// The SOCKS5 reply code (RFC 1928 §6).
    pub fn socks_code(&self) -> u8 {
        match self.reason {
            Reason::UpstreamUnreachable => 0x04, // host unreachable
            Reason::UpstreamTimeout => 0x06,     // TTL expired
            Reason::InvalidHost => 0x08,         // address type not supported
            _ => 0x02,                           // not allowed by ruleset
        }
    }
}
