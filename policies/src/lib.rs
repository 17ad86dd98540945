//! airlock's policy model (SPEC §3): loading, merging, host patterns and
//! the decision function. Pure: no sockets, no processes. Presets reach
//! the machine only through the `Probe` the caller supplies.

pub mod address;
pub mod decide;
pub mod env;
pub mod fragment;
pub mod host;
pub mod load;
pub mod merge;
pub mod model;
pub mod pattern;
pub mod preset;
pub mod request;
pub mod source;
pub mod units;

pub use address::{check_address, special_range};
pub use decide::{
    advice, decide, decide_with, how_to_allow, inspects, Approvals, Decision, Reason, Verdict,
};
pub use fragment::{flag_rule, Fragment, Rule};
pub use host::{Host, InvalidHost, Target, TargetError};
pub use load::{load_str, parse_cidr};
pub use merge::{Conflict, Policy};
pub use model::{EnvInherit, NetworkMode, Unknown};
pub use pattern::{Pattern, PatternList, PatternMatch};
pub use preset::{Probe, Resolved, PRESETS};
pub use source::{Diagnostic, Layer, Located, Origin};
