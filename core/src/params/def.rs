//! Parameter definitions: what a parameter is called, its type, default,
//! accepted values, help text and Open MPI info level, and the static table
//! of a component.

use core::fmt::{self, Write as _};

use super::env::{env_name, ompi_env_name, EnvName, OmpiEnvName};
use super::error::ParamError;
use super::parse::{parse_bool, parse_int, NumberError};
use super::text::FixedStr;

/// Most parameters a component may have (per-parameter state is a fixed
/// array and a 32-bit mask).
pub const MAX_PARAMS: usize = 40;

/// A parameter's type, as Open MPI registers it
/// (`MCA_BASE_VAR_TYPE_INT`, `_UNSIGNED_INT`, `_SIZE_T`, `_BOOL`, `_STRING`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ParamKind {
    /// Signed integer (the seed's `int`).
    Int,
    /// Unsigned integer (the seed's `unsigned int`).
    UInt,
    /// A size in bytes (an unsigned integer; Open MPI's `size_t`).
    Size,
    /// A boolean stored as an integer: 0 or 1, also `true`/`false`/`yes`/`no`.
    Bool,
    /// A string, stored as given (at most [`ParamDef::max`] bytes).
    Text,
}

impl ParamKind {
    /// Whether values of this kind are numbers (everything but
    /// [`ParamKind::Text`]).
    pub const fn is_number(self) -> bool {
        !matches!(self, ParamKind::Text)
    }
}

/// A parameter's value: a number (booleans as 0/1) or a string.
///
/// As an input ([`super::Params::set_value`]), `Text` is parsed for a
/// numeric parameter exactly as an environment value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Value<'a> {
    /// A number (booleans as 0/1).
    Int(i64),
    /// A string.
    Text(&'a str),
}

impl<'a> Value<'a> {
    /// The number, if it is one.
    pub fn as_int(self) -> Option<i64> {
        match self {
            Value::Int(v) => Some(v),
            Value::Text(_) => None,
        }
    }

    /// The string, if it is one.
    pub fn as_text(self) -> Option<&'a str> {
        match self {
            Value::Int(_) => None,
            Value::Text(s) => Some(s),
        }
    }

    /// The value as text, without allocating (`4096`, `127.0.0.1/8,sppp`).
    pub fn to_text(self) -> ValueText<'a> {
        match self {
            Value::Text(s) => ValueText::Borrowed(s),
            Value::Int(v) => {
                let mut buf = FixedStr::EMPTY;
                // 20 bytes hold every i64 ("-9223372036854775808").
                let _ = write!(buf, "{v}");
                ValueText::Number(buf)
            }
        }
    }
}

impl fmt::Display for Value<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(v) => write!(f, "{v}"),
            Value::Text(s) => f.write_str(s),
        }
    }
}

impl From<i64> for Value<'_> {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}

impl From<i32> for Value<'_> {
    fn from(v: i32) -> Self {
        Value::Int(i64::from(v))
    }
}

impl From<u32> for Value<'_> {
    fn from(v: u32) -> Self {
        Value::Int(i64::from(v))
    }
}

impl From<bool> for Value<'_> {
    fn from(v: bool) -> Self {
        Value::Int(i64::from(v))
    }
}

impl<'a> From<&'a str> for Value<'a> {
    fn from(s: &'a str) -> Self {
        Value::Text(s)
    }
}

/// A [`Value`] as text ([`Value::to_text`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueText<'a> {
    /// A string value.
    Borrowed(&'a str),
    /// A number, formatted.
    Number(FixedStr<20>),
}

impl ValueText<'_> {
    /// The text.
    pub fn as_str(&self) -> &str {
        match self {
            ValueText::Borrowed(s) => s,
            ValueText::Number(n) => n.as_str(),
        }
    }
}

impl fmt::Display for ValueText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which numbers within `[min, max]` a numeric parameter accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allowed {
    /// All of them.
    Range,
    /// All but this one (`max_procs`: -1 or >= 1, never 0).
    Except(i64),
    /// Only these (`disable_family`: 0, 4 or 6).
    OneOf(&'static [i64]),
}

/// The definition of one parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamDef {
    /// Owning component (`"sm"`), filled in by [`table`].
    pub component: &'static str,
    /// Parameter name as the seed registers it (`"fifo_size"`).
    pub name: &'static str,
    /// Type and parsing rules.
    pub kind: ParamKind,
    /// Default value (a number for numeric kinds, a string for
    /// [`ParamKind::Text`]).
    pub default: Value<'static>,
    /// Smallest number accepted (0 for a string).
    pub min: i64,
    /// Largest number accepted; for a string, its longest accepted length in
    /// bytes.
    pub max: i64,
    /// Which numbers within `[min, max]` are accepted.
    pub allowed: Allowed,
    /// One-line help text.
    pub help: &'static str,
    /// What the parameter accepts, for error messages ("an integer >= 1").
    pub accepts: &'static str,
    /// Open MPI info level (`OPAL_INFO_LVL_*`, 1 = basic user .. 9 = developer).
    pub level: u8,
}

impl ParamDef {
    /// A numeric parameter accepting `min..=max`, without documentation yet
    /// (add it with [`ParamDef::doc`]).
    pub const fn number(
        name: &'static str,
        kind: ParamKind,
        default: i64,
        (min, max): (i64, i64),
    ) -> ParamDef {
        ParamDef {
            component: "",
            name,
            kind,
            default: Value::Int(default),
            min,
            max,
            allowed: Allowed::Range,
            help: "",
            accepts: "",
            level: 0,
        }
    }

    /// A string parameter of at most `cap` bytes, without documentation yet.
    pub const fn text(name: &'static str, default: &'static str, cap: usize) -> ParamDef {
        ParamDef {
            kind: ParamKind::Text,
            default: Value::Text(default),
            max: cap as i64,
            ..ParamDef::number(name, ParamKind::Text, 0, (0, 0))
        }
    }

    /// Adds the info level, what the parameter accepts and its help text.
    pub const fn doc(self, level: u8, accepts: &'static str, help: &'static str) -> ParamDef {
        ParamDef {
            level,
            accepts,
            help,
            ..self
        }
    }

    /// Refuses `value` although it lies within `[min, max]`.
    pub const fn except(self, value: i64) -> ParamDef {
        ParamDef {
            allowed: Allowed::Except(value),
            ..self
        }
    }

    /// Accepts only `values` (which lie within `[min, max]`).
    pub const fn one_of(self, values: &'static [i64]) -> ParamDef {
        ParamDef {
            allowed: Allowed::OneOf(values),
            ..self
        }
    }

    /// Whether the number `v` is an accepted value (of a numeric parameter).
    pub const fn accepts_number(&self, v: i64) -> bool {
        if v < self.min || v > self.max {
            return false;
        }
        match self.allowed {
            Allowed::Range => true,
            Allowed::Except(no) => v != no,
            Allowed::OneOf(values) => {
                let mut i = 0;
                while i < values.len() {
                    if values[i] == v {
                        return true;
                    }
                    i += 1;
                }
                false
            }
        }
    }

    /// Checks `value` against this definition alone (not against other
    /// parameters) and returns what would be stored: for a numeric parameter
    /// a `Text` is parsed (numbers `[+-](decimal | 0x hex)[kKmMgG]`,
    /// surrounding blanks allowed; booleans also `true`/`false`/`yes`/`no`)
    /// and the number must be accepted; a string must fit.
    pub fn validate<'a>(&self, value: Value<'a>) -> Result<Value<'a>, ParamError> {
        match (self.kind, value) {
            (ParamKind::Text, Value::Text(s)) => {
                let cap = usize::try_from(self.max).unwrap_or(0);
                if s.len() > cap {
                    return Err(ParamError::TooLong {
                        component: self.component,
                        name: self.name,
                        len: s.len(),
                        cap,
                    });
                }
                Ok(value)
            }
            (ParamKind::Text, Value::Int(_)) => Err(self.malformed()),
            (kind, Value::Text(s)) => {
                let parsed = if kind == ParamKind::Bool {
                    parse_bool(s)
                } else {
                    parse_int(s)
                };
                match parsed {
                    Ok(v) => self.validate(Value::Int(v)),
                    Err(NumberError::Malformed) => Err(self.malformed()),
                    Err(NumberError::Overflow { negative }) => {
                        Err(self.out_of_range(if negative { i64::MIN } else { i64::MAX }))
                    }
                }
            }
            (_, Value::Int(v)) if self.accepts_number(v) => Ok(value),
            (_, Value::Int(v)) => Err(self.out_of_range(v)),
        }
    }

    /// [`ParamError::Malformed`] for this parameter.
    pub fn malformed(&self) -> ParamError {
        ParamError::Malformed {
            component: self.component,
            name: self.name,
            accepts: self.accepts,
        }
    }

    /// [`ParamError::OutOfRange`] for this parameter and `value`.
    pub fn out_of_range(&self, value: i64) -> ParamError {
        ParamError::OutOfRange {
            component: self.component,
            name: self.name,
            value,
            accepts: self.accepts,
        }
    }

    /// The default as text (`4096`), without allocating.
    pub fn default_text(&self) -> ValueText<'static> {
        self.default.to_text()
    }

    /// The environment variable that sets this parameter (`BTL_SM_FIFO_SIZE`).
    pub fn env_name(&self) -> EnvName<'static> {
        env_name(self.component, self.name)
    }

    /// Open MPI's environment variable for it (`OMPI_MCA_btl_sm_fifo_size`).
    pub fn ompi_env_name(&self) -> OmpiEnvName<'static> {
        ompi_env_name(self.component, self.name)
    }
}

/// A component: its name and its parameters in registration order (what
/// `btl info` lists and what Open MPI's registration enumerates).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Component {
    /// Name (`"sm"`): the `SM` of `BTL_SM_FIFO_SIZE`, the `sm` of
    /// `OMPI_MCA_btl_sm_fifo_size`.
    pub name: &'static str,
    /// The definitions, built with [`table`].
    pub params: &'static [ParamDef],
}

impl Component {
    /// The index of parameter `name` (ASCII case-insensitive).
    pub fn find(&self, name: &str) -> Option<usize> {
        self.params
            .iter()
            .position(|d| d.name.eq_ignore_ascii_case(name))
    }
}

const fn same_name(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if !a[i].eq_ignore_ascii_case(&b[i]) {
            return false;
        }
        i += 1;
    }
    true
}

/// A component's table: `defs` with `component` filled in, checked at
/// compile time when used to initialise a `static` (at most
/// [`MAX_PARAMS`] parameters; names non-empty and distinct ignoring ASCII
/// case; every parameter documented with a level 1 to 9; every default
/// accepted by its own definition).
pub const fn table<const N: usize>(
    component: &'static str,
    mut defs: [ParamDef; N],
) -> [ParamDef; N] {
    assert!(
        N <= MAX_PARAMS,
        "a component has at most MAX_PARAMS parameters"
    );
    assert!(!component.is_empty(), "a component needs a name");
    let mut i = 0;
    while i < N {
        defs[i].component = component;
        let d = &defs[i];
        assert!(!d.name.is_empty(), "a parameter needs a name");
        assert!(
            !d.help.is_empty() && !d.accepts.is_empty() && d.level >= 1 && d.level <= 9,
            "every parameter needs ParamDef::doc"
        );
        match d.default {
            Value::Int(v) => assert!(
                d.kind.is_number() && d.accepts_number(v),
                "a numeric default must be accepted by its parameter"
            ),
            Value::Text(s) => assert!(
                !d.kind.is_number() && s.len() as i64 <= d.max,
                "a string default must fit its parameter"
            ),
        }
        let mut j = 0;
        while j < i {
            assert!(
                !same_name(defs[j].name, d.name),
                "parameter names must differ"
            );
            j += 1;
        }
        i += 1;
    }
    defs
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::ToString;

    static DEFS: [ParamDef; 3] = table(
        "demo",
        [
            ParamDef::number("count", ParamKind::Int, -1, (-1, 10))
                .except(0)
                .doc(4, "-1 or 1 to 10", "How many."),
            ParamDef::number("family", ParamKind::UInt, 0, (0, 6))
                .one_of(&[0, 4, 6])
                .doc(2, "0, 4 or 6", "Which."),
            ParamDef::text("list", "a,b", 8).doc(1, "at most 8 bytes", "A list."),
        ],
    );

    #[test]
    fn validation() {
        let [count, family, list] = &DEFS;
        assert_eq!(count.component, "demo");
        assert_eq!(count.validate(" 0x0A ".into()), Ok(Value::Int(10)));
        assert_eq!(count.validate(0.into()), Err(count.out_of_range(0)));
        assert_eq!(count.validate("1k".into()), Err(count.out_of_range(1024)));
        assert_eq!(
            count.validate("-99999999999999999999".into()),
            Err(count.out_of_range(i64::MIN))
        );
        assert_eq!(count.validate("x".into()), Err(count.malformed()));
        assert_eq!(family.validate(6.into()), Ok(Value::Int(6)));
        assert!(family.validate(5.into()).is_err());
        assert_eq!(
            list.validate("12345678".into()),
            Ok(Value::Text("12345678"))
        );
        assert_eq!(
            list.validate("123456789".into()),
            Err(ParamError::TooLong {
                component: "demo",
                name: "list",
                len: 9,
                cap: 8
            })
        );
        assert_eq!(list.validate(1.into()), Err(list.malformed()));
        let bool_def = ParamDef::number("b", ParamKind::Bool, 0, (0, 1));
        assert_eq!(bool_def.validate("Yes".into()), Ok(Value::Int(1)));
        assert_eq!(bool_def.validate(true.into()), Ok(Value::Int(1)));
    }

    #[test]
    fn defaults_as_text_and_names() {
        let demo = Component {
            name: "demo",
            params: &DEFS,
        };
        assert_eq!(demo.find("FAMILY"), Some(1));
        assert_eq!(demo.find("nope"), None);
        assert_eq!(DEFS[0].default_text().as_str(), "-1");
        assert_eq!(DEFS[2].default_text().to_string(), "a,b");
        assert_eq!(
            Value::Int(i64::MIN).to_text().as_str(),
            "-9223372036854775808"
        );
        assert_eq!(DEFS[1].env_name().to_string(), "BTL_DEMO_FAMILY");
        assert_eq!(
            DEFS[1].ompi_env_name().to_string(),
            "OMPI_MCA_btl_demo_family"
        );
        assert_eq!(Value::from("x").as_text(), Some("x"));
        assert_eq!(Value::from(7u32).as_int(), Some(7));
    }
}
