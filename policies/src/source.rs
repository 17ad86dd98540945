//! Where a piece of policy came from: every decision names it (SPEC §3.2).

use std::fmt;

/// The precedence layers of SPEC §3.3, lowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Layer {
    BuiltIn,
    User,
    Project,
    CommandLine,
    Managed,
}

impl Layer {
    pub fn name(self) -> &'static str {
        match self {
            Layer::BuiltIn => "built-in",
            Layer::User => "user",
            Layer::Project => "project",
            Layer::CommandLine => "command line",
            Layer::Managed => "managed",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Origin {
    BuiltIn,
    File { path: String, line: u32 },
    Flag { flag: String },
    Preset { name: String, from: String },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::BuiltIn => f.write_str("built-in default"),
            Origin::File { path, line } => write!(f, "{path}:{line}"),
            Origin::Flag { flag } => write!(f, "command line {flag}"),
            Origin::Preset { name, from } => write!(f, "preset {name} ({from})"),
        }
    }
}

/// A value together with its layer and origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located<T> {
    pub value: T,
    pub layer: Layer,
    pub origin: Origin,
}

impl<T> Located<T> {
    pub fn new(value: T, layer: Layer, origin: Origin) -> Self {
        Located {
            value,
            layer,
            origin,
        }
    }

    pub fn built_in(value: T) -> Self {
        Located::new(value, Layer::BuiltIn, Origin::BuiltIn)
    }
}

/// One problem in a policy file, printed as `file:line:column: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub file: String,
    pub line: u32,
    pub column: u32,
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file, self.line, self.column, self.message
        )
    }
}

/// Line and column (1-based, columns in characters) of a byte offset.
pub fn line_col(text: &str, offset: usize) -> (u32, u32) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line as u32, col as u32)
}
