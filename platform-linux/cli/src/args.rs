//! Hand-rolled command-line parsing shared by the subcommands.
//!
//! ```text
//! let mut a = Args::new(args);
//! loop {
//!     if a.flag(&["--json"]) { json = true; continue; }
//!     if let Some(n) = a.value::<u32>(&["-n", "--np"], "an integer")? { ...; continue; }
//!     if a.at_option() { return Err(a.unexpected()); }
//!     break;
//! }
//! let positional = a.rest();
//! ```

use std::ffi::{OsStr, OsString};
use std::str::FromStr;

/// What is wrong with a command line; printed before the usage text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

impl UsageError {
    /// An error with this message.
    pub fn new(msg: impl Into<String>) -> Self {
        UsageError(msg.into())
    }
}

/// A cursor over a subcommand's arguments. Options are recognised at the
/// cursor only, in any order, until the first positional argument or
/// `--`.
#[derive(Debug, Clone)]
pub struct Args<'a> {
    items: &'a [OsString],
    pos: usize,
}

impl<'a> Args<'a> {
    /// A cursor at the first of `items`.
    pub fn new(items: &'a [OsString]) -> Self {
        Args { items, pos: 0 }
    }

    /// Whether every argument has been consumed.
    pub fn is_empty(&self) -> bool {
        self.pos >= self.items.len()
    }

    /// The argument at the cursor, not consumed.
    pub fn peek(&self) -> Option<&'a OsStr> {
        self.items.get(self.pos).map(OsString::as_os_str)
    }

    /// Consumes and returns the argument at the cursor.
    pub fn next_arg(&mut self) -> Option<&'a OsStr> {
        let arg = self.peek()?;
        self.pos += 1;
        Some(arg)
    }

    /// Whether the argument at the cursor looks like an option (starts
    /// with `-` and is not `-` alone).
    pub fn at_option(&self) -> bool {
        self.peek()
            .is_some_and(|a| a.len() > 1 && a.as_encoded_bytes().first() == Some(&b'-'))
    }

    /// Consumes the argument at the cursor if it is one of `names`.
    pub fn flag(&mut self, names: &[&str]) -> bool {
        let hit = self
            .peek()
            .and_then(OsStr::to_str)
            .is_some_and(|a| names.contains(&a));
        if hit {
            self.pos += 1;
        }
        hit
    }

    /// If the argument at the cursor is option `names` with a value
    /// (`-n 4`, `-n4` for a one-letter name, `--np 4` or `--np=4`),
    /// consumes both and parses the value with `FromStr`; the error
    /// names the option and says what it `accepts`.
    pub fn value<T: FromStr>(
        &mut self,
        names: &[&str],
        accepts: &str,
    ) -> Result<Option<T>, UsageError> {
        self.value_with(names, accepts, |s| s.parse().ok())
    }

    /// [`Args::value`] with the value parsed (and range-checked) by
    /// `parse`, which returns `None` for a value it does not accept.
    pub fn value_with<T>(
        &mut self,
        names: &[&str],
        accepts: &str,
        parse: impl FnOnce(&str) -> Option<T>,
    ) -> Result<Option<T>, UsageError> {
        let Some(arg) = self.peek().and_then(OsStr::to_str) else {
            return Ok(None);
        };
        let mut found = None;
        for &name in names {
            if arg == name {
                found = Some((name, None));
            } else if let Some(rest) = arg.strip_prefix(name) {
                let short = name.len() == 2 && !name.starts_with("--");
                if let Some(v) = rest.strip_prefix('=').filter(|_| !short) {
                    found = Some((name, Some(v)));
                } else if short {
                    found = Some((name, Some(rest)));
                }
            }
            if found.is_some() {
                break;
            }
        }
        let Some((name, attached)) = found else {
            return Ok(None);
        };
        self.pos += 1;
        let value = match attached {
            Some(v) => v,
            None => {
                let v = self.next_arg().ok_or_else(|| {
                    UsageError::new(format!("option {name} needs a value: {accepts}"))
                })?;
                v.to_str().ok_or_else(|| {
                    UsageError::new(format!(
                        "option {name}: the value {v:?} is not valid UTF-8; it accepts \
                         {accepts}"
                    ))
                })?
            }
        };
        parse(value).map(Some).ok_or_else(|| {
            UsageError::new(format!(
                "option {name}: invalid value {value:?}; it accepts {accepts}"
            ))
        })
    }

    /// The error for the argument at the cursor: an unknown option or an
    /// unexpected argument.
    pub fn unexpected(&self) -> UsageError {
        match self.peek() {
            Some(a) if self.at_option() => UsageError::new(format!("unknown option {a:?}")),
            Some(a) => UsageError::new(format!("unexpected argument {a:?}")),
            None => UsageError::new("missing argument"),
        }
    }

    /// Consumes and returns every remaining argument.
    pub fn rest(&mut self) -> &'a [OsString] {
        let rest = self.items.get(self.pos..).unwrap_or(&[]);
        self.pos = self.items.len();
        rest
    }

    /// An error unless every argument has been consumed.
    pub fn finish(&self) -> Result<(), UsageError> {
        if self.is_empty() {
            Ok(())
        } else {
            Err(self.unexpected())
        }
    }
}

/// An argument vector from string literals, for the crate's unit tests.
#[cfg(test)]
pub(crate) fn os(v: &[&str]) -> Vec<OsString> {
    v.iter().map(OsString::from).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_and_flags() {
        let v = os(&[
            "-n4", "--np=5", "--np", "6", "-n", "7", "--json", "prog", "-x",
        ]);
        let mut a = Args::new(&v);
        for want in [4, 5, 6, 7] {
            assert_eq!(a.value::<u32>(&["-n", "--np"], "n"), Ok(Some(want)));
        }
        assert_eq!(a.value::<u32>(&["-n", "--np"], "n"), Ok(None));
        assert!(!a.flag(&["--js"]));
        assert!(a.flag(&["--json"]));
        assert!(!a.at_option());
        assert_eq!(a.rest(), &os(&["prog", "-x"])[..]);
        assert!(a.finish().is_ok());
    }

    #[test]
    fn errors_name_the_option() {
        let v = os(&["-n", "x"]);
        let e = Args::new(&v)
            .value::<u32>(&["-n"], "an integer")
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "option -n: invalid value \"x\"; it accepts an integer"
        );
        let v = os(&["--timeout"]);
        let e = Args::new(&v)
            .value::<u32>(&["--timeout"], "seconds")
            .unwrap_err();
        assert_eq!(e.to_string(), "option --timeout needs a value: seconds");
        let v = os(&["--timeoutx"]);
        let mut a = Args::new(&v);
        assert_eq!(a.value::<u32>(&["--timeout"], "s"), Ok(None));
        assert!(a.at_option());
        assert_eq!(a.unexpected().to_string(), "unknown option \"--timeoutx\"");
    }
}
