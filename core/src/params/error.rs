//! The one error type of the registry: every variant names the parameter
//! as the user types it in the environment (`BTL_SM_FIFO_SIZE`) and, where
//! it applies, what the parameter accepts.

use core::fmt;

use super::env::env_name;
use super::text::FixedStr;

/// Capacity of [`ParamName`] in bytes.
pub const PARAM_NAME_CAP: usize = 32;

/// A copy of a name the user gave, truncated to [`PARAM_NAME_CAP`] bytes (at
/// a character boundary), so that an error can hold it without borrowing.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ParamName {
    text: FixedStr<PARAM_NAME_CAP>,
    truncated: bool,
}

impl ParamName {
    /// Copies `s`, truncating it if it is longer than [`PARAM_NAME_CAP`].
    pub fn new(s: &str) -> Self {
        let (text, truncated) = FixedStr::truncated(s);
        ParamName { text, truncated }
    }

    /// The (possibly truncated) name.
    pub fn as_str(&self) -> &str {
        self.text.as_str()
    }

    /// Whether the name was longer than [`PARAM_NAME_CAP`] bytes.
    pub fn is_truncated(&self) -> bool {
        self.truncated
    }

    fn ellipsis(&self) -> &'static str {
        if self.truncated {
            "..."
        } else {
            ""
        }
    }
}

impl fmt::Debug for ParamName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)?;
        f.write_str(self.ellipsis())
    }
}

impl fmt::Display for ParamName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())?;
        f.write_str(self.ellipsis())
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for ParamName {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(f, "{=str}{=str}", self.as_str(), self.ellipsis());
    }
}

/// Why a parameter could not be set or verified. `component` is the
/// component's name (`"sm"`), `name` fields hold the parameter's name as
/// registered (`"fifo_size"`); `Display` shows the environment variable
/// (`BTL_SM_FIFO_SIZE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ParamError {
    /// The component has no parameter of this name (as given: a parameter
    /// name or a whole environment variable, truncated).
    #[error("unknown {component} parameter `{name}` (see `btl info`)")]
    UnknownParam {
        /// The component.
        component: &'static str,
        /// The name as given.
        name: ParamName,
    },
    /// The value is not in an accepted syntax (a number or boolean for a
    /// numeric parameter; a number given for a string parameter).
    #[error(
        "{}: malformed value; it accepts {accepts}",
        env_name(.component, .name)
    )]
    Malformed {
        /// The component.
        component: &'static str,
        /// The parameter.
        name: &'static str,
        /// What it accepts.
        accepts: &'static str,
    },
    /// The value is a number outside the accepted values (numbers beyond
    /// the 64-bit range are saturated to `i64::MIN`/`i64::MAX`).
    #[error(
        "{}={value} is out of range; it accepts {accepts}",
        env_name(.component, .name)
    )]
    OutOfRange {
        /// The component.
        component: &'static str,
        /// The parameter.
        name: &'static str,
        /// The value given.
        value: i64,
        /// What it accepts.
        accepts: &'static str,
    },
    /// A string value longer than its fixed storage.
    #[error(
        "{}: the value is {len} bytes long; it accepts at most {cap} bytes",
        env_name(.component, .name)
    )]
    TooLong {
        /// The component.
        component: &'static str,
        /// The parameter.
        name: &'static str,
        /// The length given, in bytes.
        len: usize,
        /// The capacity, in bytes.
        cap: usize,
    },
    /// Two parameters contradict each other.
    #[error(
        "{} conflicts with {}: {rule}",
        env_name(.component, .name),
        env_name(.component, .other)
    )]
    Conflict {
        /// The component.
        component: &'static str,
        /// The parameter at fault.
        name: &'static str,
        /// The parameter it contradicts.
        other: &'static str,
        /// The rule that is broken.
        rule: &'static str,
    },
    /// The value asks for something this build cannot do.
    #[error(
        "{}={value} is not supported: {reason}",
        env_name(.component, .name)
    )]
    Unsupported {
        /// The component.
        component: &'static str,
        /// The parameter.
        name: &'static str,
        /// The value given.
        value: i64,
        /// Why it cannot be done.
        reason: &'static str,
    },
    /// An entry of a list parameter (`if_include`) is malformed.
    #[error(
        "{}: malformed entry `{entry}` ({reason}); it accepts {accepts}",
        env_name(.component, .name)
    )]
    BadListEntry {
        /// The component.
        component: &'static str,
        /// The parameter.
        name: &'static str,
        /// The entry (truncated).
        entry: ParamName,
        /// What is wrong with it.
        reason: &'static str,
        /// What the parameter accepts.
        accepts: &'static str,
    },
    /// A per-instance parameter (`<param>_<target>`, such as
    /// `bandwidth_eth0:1`) is malformed.
    #[error(
        "{}{}: {reason}",
        env_name(.component, .param).with_suffix(.target.as_str()),
        .target.ellipsis()
    )]
    BadOverride {
        /// The component.
        component: &'static str,
        /// The parameter it overrides (`"bandwidth"`).
        param: &'static str,
        /// What follows `<param>_` as given (`eth0:x`; truncated).
        target: ParamName,
        /// What is wrong.
        reason: &'static str,
    },
    /// More distinct per-instance parameters than the component can hold.
    #[error(
        "{}{}: too many {what} (at most {cap})",
        env_name(.component, .param).with_suffix(.target.as_str()),
        .target.ellipsis()
    )]
    TooManyOverrides {
        /// The component.
        component: &'static str,
        /// The parameter it overrides.
        param: &'static str,
        /// What follows `<param>_` as given (truncated).
        target: ParamName,
        /// What they are ("per-interface bandwidth/latency settings").
        what: &'static str,
        /// How many the component holds.
        cap: usize,
    },
    /// The value is smaller than what the situation at run time needs
    /// (`max_procs` below the number of processes on the node).
    #[error(
        "{}={value} is less than the {needed} {what}; it accepts {accepts}",
        env_name(.component, .name)
    )]
    TooSmall {
        /// The component.
        component: &'static str,
        /// The parameter.
        name: &'static str,
        /// Its value.
        value: i64,
        /// What is needed.
        needed: u64,
        /// What `needed` counts ("processes on this node").
        what: &'static str,
        /// What the parameter accepts.
        accepts: &'static str,
    },
    /// A quantity derived from this parameter does not fit in 32 bits.
    #[error(
        "{}: {what} derived from it does not fit in 32 bits",
        env_name(.component, .name)
    )]
    Overflow {
        /// The component.
        component: &'static str,
        /// The parameter.
        name: &'static str,
        /// The quantity ("the number of processes").
        what: &'static str,
    },
    /// A value given together with the parameters (not a parameter) is
    /// invalid.
    #[error("{reason}")]
    Argument {
        /// What is wrong.
        reason: &'static str,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::ToString;

    #[test]
    fn unknown_names_are_truncated() {
        let long = "BTL_SM_THIS_IS_A_VERY_LONG_NAME_Ü_THAT_GOES_ON";
        let n = ParamName::new(long);
        assert!(n.is_truncated());
        assert!(n.as_str().len() <= PARAM_NAME_CAP);
        assert!(long.starts_with(n.as_str()));
        assert!(n.to_string().ends_with("..."));
        assert_eq!(std::format!("{n:?}"), std::format!("{:?}...", n.as_str()));
        assert_eq!(ParamName::new("x").to_string(), "x");
    }

    #[test]
    fn messages_name_the_variable() {
        let e = ParamError::BadOverride {
            component: "tcp",
            param: "latency",
            target: ParamName::new("eth0:x"),
            reason: "bad",
        };
        assert_eq!(e.to_string(), "BTL_TCP_LATENCY_ETH0:X: bad");
        let e = ParamError::TooManyOverrides {
            component: "tcp",
            param: "latency",
            target: ParamName::new(&"e".repeat(40)),
            what: "things",
            cap: 2,
        };
        assert!(e
            .to_string()
            .ends_with("EEE...: too many things (at most 2)"));
        let e = ParamError::TooSmall {
            component: "x",
            name: "n",
            value: 1,
            needed: 2,
            what: "apples",
            accepts: "more",
        };
        assert_eq!(
            e.to_string(),
            "BTL_X_N=1 is less than the 2 apples; it accepts more"
        );
        let e = ParamError::Argument { reason: "why" };
        assert_eq!(e.to_string(), "why");
    }
}
