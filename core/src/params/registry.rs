//! The registry's machinery over a component's typed parameter struct:
//! setting by name, key or environment variable, sources, the `btl info`
//! listing, and the verify driver.

use core::fmt;

use super::def::{Component, ParamDef, Value, MAX_PARAMS};
use super::env::env_param_part;
use super::error::{ParamError, ParamName};
use super::text::FixedStr;

/// Where a parameter's current value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ParamSource {
    /// The built-in default.
    Default,
    /// An environment variable (`BTL_<COMP>_*` or `OMPI_MCA_btl_<comp>_*`).
    Environment,
    /// Program code (a field assignment, [`Params::set`], a configuration
    /// builder).
    Code,
}

impl fmt::Display for ParamSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ParamSource::Default => "default",
            ParamSource::Environment => "environment",
            ParamSource::Code => "code",
        })
    }
}

/// What a component's parameter struct records besides the values: the
/// source of each value and which ones verify adjusted. Indexed like the
/// component's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamState {
    sources: [ParamSource; MAX_PARAMS],
    adjusted: u64,
}

impl Default for ParamState {
    fn default() -> Self {
        Self::new()
    }
}

impl ParamState {
    /// Every value from its default, nothing adjusted.
    pub const fn new() -> Self {
        ParamState {
            sources: [ParamSource::Default; MAX_PARAMS],
            adjusted: 0,
        }
    }

    fn recorded(&self, index: usize) -> ParamSource {
        self.sources
            .get(index)
            .copied()
            .unwrap_or(ParamSource::Default)
    }

    /// Records that parameter `index` was set from `source` (and is no
    /// longer an adjustment of verify).
    fn record(&mut self, index: usize, source: ParamSource) {
        if let Some(s) = self.sources.get_mut(index) {
            *s = source;
        }
        self.adjusted &= !bit(index);
    }

    fn is_adjusted(&self, index: usize) -> bool {
        self.adjusted & bit(index) != 0
    }
}

// One bit of `ParamState::adjusted` per parameter.
const _: () = assert!(MAX_PARAMS <= u64::BITS as usize);

fn bit(index: usize) -> u64 {
    u32::try_from(index)
        .ok()
        .and_then(|i| 1u64.checked_shl(i))
        .unwrap_or(0)
}

/// Names one parameter of a component: implemented by the component's key
/// enum, whose variants index its table.
pub trait ParamKey: Copy + Eq + fmt::Debug + 'static {
    /// Every key, in table order (`ALL[i].index() == i`).
    const ALL: &'static [Self];

    /// The component the key belongs to.
    fn component() -> &'static Component;

    /// Index into the component's table.
    fn index(self) -> usize;

    /// The definition.
    fn def(self) -> &'static ParamDef;

    /// The key at `index` of the table.
    fn from_index(index: usize) -> Option<Self> {
        Self::ALL.get(index).copied()
    }

    /// Looks a parameter up by name (ASCII case-insensitive).
    fn from_name(name: &str) -> Option<Self> {
        Self::component().find(name).and_then(Self::from_index)
    }

    /// The parameter an environment variable sets (`BTL_<COMP>_<PARAM>`,
    /// the parameter part in any case, or `OMPI_MCA_btl_<comp>_<param>`),
    /// if it names one of the table.
    fn from_env_name(var: &str) -> Option<Self> {
        env_param_part(Self::component().name, var).and_then(Self::from_name)
    }
}

/// A value on its way into a component's field ([`Params::store`]):
/// converts it to the field's type, failing with the parameter's error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assign<'a> {
    def: &'static ParamDef,
    value: Value<'a>,
}

impl<'a> Assign<'a> {
    fn number(&self) -> Result<i64, ParamError> {
        self.value.as_int().ok_or(self.def.malformed())
    }

    /// The value.
    pub fn value(&self) -> Value<'a> {
        self.value
    }

    /// As an `i32`.
    pub fn to_i32(&self) -> Result<i32, ParamError> {
        let v = self.number()?;
        i32::try_from(v).map_err(|_| self.def.out_of_range(v))
    }

    /// As a `u32`.
    pub fn to_u32(&self) -> Result<u32, ParamError> {
        let v = self.number()?;
        u32::try_from(v).map_err(|_| self.def.out_of_range(v))
    }

    /// As a boolean (any non-zero `u32`).
    pub fn to_bool(&self) -> Result<bool, ParamError> {
        self.to_u32().map(|v| v != 0)
    }

    /// As inline text of at most `N` bytes.
    pub fn to_text<const N: usize>(&self) -> Result<FixedStr<N>, ParamError> {
        let s = self.value.as_text().ok_or(self.def.malformed())?;
        FixedStr::new(s).ok_or(ParamError::TooLong {
            component: self.def.component,
            name: self.def.name,
            len: s.len(),
            cap: N,
        })
    }
}

/// How a new value meets one set before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precedence {
    /// The new value replaces it.
    Replace,
    /// A value set by code stays (the new one is still validated).
    KeepCode,
}

/// A value to set, where it comes from and how it meets one set before
/// (what [`Params::set_other`] receives).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting<'a> {
    /// The value (text as typed, or a number).
    pub value: Value<'a>,
    /// Where it comes from.
    pub source: ParamSource,
    /// Whether it replaces a value set by code.
    pub precedence: Precedence,
}

impl<'a> Setting<'a> {
    /// `value` from `source`, replacing any value set before.
    pub fn new(value: impl Into<Value<'a>>, source: ParamSource) -> Self {
        Setting {
            value: value.into(),
            source,
            precedence: Precedence::Replace,
        }
    }
}

/// What [`Params::apply_env_var`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvApplied {
    /// The variable is not one of this component.
    NotOurs,
    /// The parameter was set.
    Set,
    /// The value is valid, but code had set the parameter: code wins.
    KeptCode,
}

/// One parameter as `btl info` lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamInfo<'a, K> {
    /// The parameter.
    pub key: K,
    /// Its definition.
    pub def: &'static ParamDef,
    /// The current value.
    pub value: Value<'a>,
    /// The default value (for a default that follows other parameters, the
    /// one computed from their current values).
    pub default: Value<'a>,
    /// Where the current value came from.
    pub source: ParamSource,
    /// Whether [`Params::verify`] changed the value since it was last set.
    pub adjusted: bool,
}

/// One change [`Params::verify`] made to a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Adjustment<K> {
    /// The parameter changed.
    pub param: K,
    /// The value before.
    pub from: i64,
    /// The value after.
    pub to: i64,
    /// Why.
    pub reason: &'static str,
}

impl<K: ParamKey> fmt::Display for Adjustment<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} adjusted from {} to {}: {}",
            self.param.def().env_name(),
            self.from,
            self.to,
            self.reason
        )
    }
}

/// What [`Params::verify`] adjusted (at most one entry per parameter, in the
/// order the changes were first made).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified<K> {
    entries: [Option<Adjustment<K>>; MAX_PARAMS],
    len: usize,
}

impl<K: ParamKey> Default for Verified<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: ParamKey> Verified<K> {
    /// Nothing adjusted.
    pub const fn new() -> Self {
        Verified {
            entries: [None; MAX_PARAMS],
            len: 0,
        }
    }

    /// The adjustments, in the order they were made.
    pub fn adjustments(&self) -> impl Iterator<Item = &Adjustment<K>> + '_ {
        self.entries.iter().take(self.len).flatten()
    }

    /// The adjustment of `param`, if verify changed it.
    pub fn get(&self, param: impl Into<K>) -> Option<&Adjustment<K>> {
        let param = param.into();
        self.adjustments().find(|a| a.param == param)
    }

    /// How many parameters verify changed.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when verify changed nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Records a change; a second change of the same parameter merges into
    /// the first (original `from`, latest `to` and reason).
    fn push(&mut self, adj: Adjustment<K>) {
        let len = self.len;
        if let Some(prev) = self
            .entries
            .iter_mut()
            .take(len)
            .flatten()
            .find(|a| a.param == adj.param)
        {
            prev.to = adj.to;
            prev.reason = adj.reason;
        } else if let Some(slot) = self.entries.get_mut(len) {
            *slot = Some(adj);
            self.len += 1;
        }
    }
}

/// A component's parameter values: a struct of typed fields that the
/// registry reads and writes through keys.
///
/// A component implements the accessors ([`Params::value`],
/// [`Params::store`], [`Params::state`], [`Params::state_mut`]) and, where
/// it has any, its own verify rules ([`Params::check_rules`],
/// [`Params::apply_rules`]) and parameters outside its table
/// ([`Params::set_other`]); the rest is provided, the same for every
/// component.
pub trait Params {
    /// The component's key type.
    type Key: ParamKey;

    /// The current value of `key` (for a parameter whose value follows other
    /// parameters until set, the computed value).
    fn value(&self, key: Self::Key) -> Value<'_>;

    /// Stores `value` into the field of `key`; fails only if it does not
    /// fit the field's type. (The registry has already checked it against
    /// the definition, except for verify's adjustments.)
    fn store(&mut self, key: Self::Key, value: Assign<'_>) -> Result<(), ParamError>;

    /// The recorded sources and adjustments.
    fn state(&self) -> &ParamState;

    /// The recorded sources and adjustments, mutably.
    fn state_mut(&mut self) -> &mut ParamState;

    /// The default of `key` given the other current values (a default that
    /// follows another parameter); the table's default otherwise.
    fn default_value(&self, key: Self::Key) -> Value<'_> {
        key.def().default
    }

    /// For a parameter whose value follows other parameters until set (an
    /// `Option` field): whether it is set. `None` for the others.
    fn is_set(&self, key: Self::Key) -> Option<bool> {
        let _ = key;
        None
    }

    /// Sets a parameter that is not in the table (`name` as given, such as
    /// tcp's `bandwidth_eth0`): `None` if the component has no such
    /// parameter, else whether the value was stored (`Ok(false)`: kept a
    /// value set by code under [`Precedence::KeepCode`]).
    fn set_other(&mut self, name: &str, setting: Setting<'_>) -> Option<Result<bool, ParamError>> {
        let _ = (name, setting);
        None
    }

    /// The component's verify errors, checked after every value has been
    /// checked against its definition; nothing may change here.
    fn check_rules(&self) -> Result<(), ParamError> {
        Ok(())
    }

    /// The component's verify adjustments, each made with
    /// [`Params::adjust`]; runs only once [`Params::check_rules`] passed.
    fn apply_rules(&mut self, out: &mut Verified<Self::Key>) -> Result<(), ParamError> {
        let _ = out;
        Ok(())
    }

    /// Where the value of `key` came from: the recorded source, except that
    /// a value set by assigning a field (different from the table's default,
    /// or for an `Option` field any `Some`) while recorded as
    /// [`ParamSource::Default`] counts as [`ParamSource::Code`] unless
    /// verify produced it.
    fn source(&self, key: impl Into<Self::Key>) -> ParamSource
    where
        Self: Sized,
    {
        let key = key.into();
        let index = key.index();
        let recorded = self.state().recorded(index);
        let differs = self
            .is_set(key)
            .unwrap_or_else(|| self.value(key) != key.def().default);
        if recorded == ParamSource::Default && differs && !self.state().is_adjusted(index) {
            ParamSource::Code
        } else {
            recorded
        }
    }

    /// Whether [`Params::verify`] changed `key` since it was last set.
    fn is_adjusted(&self, key: impl Into<Self::Key>) -> bool
    where
        Self: Sized,
    {
        self.state().is_adjusted(key.into().index())
    }

    /// Sets parameter `key` to `value`, recording `source`: a number, or a
    /// string — parsed for a numeric parameter as [`ParamDef::validate`]
    /// says, stored as given for a string parameter. The value must be
    /// accepted by the parameter's definition; rules between parameters are
    /// checked by [`Params::verify`]. On error nothing changes.
    fn set_value<'a>(
        &mut self,
        key: impl Into<Self::Key>,
        value: impl Into<Value<'a>>,
        source: ParamSource,
    ) -> Result<(), ParamError>
    where
        Self: Sized,
    {
        set_key(self, key.into(), Setting::new(value, source)).map(|_| ())
    }

    /// Sets parameter `name` (its table name, ASCII case-insensitive, or a
    /// parameter outside the table the component understands) from its
    /// textual `value` as a user types it, recording `source`, as
    /// [`Params::set_value`] does. On error nothing changes.
    fn set(&mut self, name: &str, value: &str, source: ParamSource) -> Result<(), ParamError>
    where
        Self: Sized,
    {
        self.set_typed(name, value, source)
    }

    /// [`Params::set`] with a typed value (a number, or text parsed as
    /// [`Params::set`] parses it).
    fn set_typed<'a>(
        &mut self,
        name: &str,
        value: impl Into<Value<'a>>,
        source: ParamSource,
    ) -> Result<(), ParamError>
    where
        Self: Sized,
    {
        set_by_name(self, name, name, Setting::new(value, source)).map(|_| ())
    }

    /// Applies one environment variable: `Ok(false)` if `var` is not a
    /// variable of this component (neither `BTL_<COMP>_*` nor
    /// `OMPI_MCA_btl_<comp>_*`), `Ok(true)` once set. A variable of the
    /// component naming no parameter is [`ParamError::UnknownParam`] holding
    /// the whole variable name. The value replaces any set before.
    fn set_from_env_var(&mut self, var: &str, value: &str) -> Result<bool, ParamError>
    where
        Self: Sized,
    {
        apply_env(self, var, value, Precedence::Replace).map(|a| a != EnvApplied::NotOurs)
    }

    /// [`Params::set_from_env_var`], except that a parameter set by code
    /// keeps its value (the environment's is still validated, and a bad one
    /// is an error): code wins over the environment whatever the order.
    fn apply_env_var(&mut self, var: &str, value: &str) -> Result<EnvApplied, ParamError>
    where
        Self: Sized,
    {
        apply_env(self, var, value, Precedence::KeepCode)
    }

    /// Every parameter of the table with its current value, default and
    /// source, in table order (for `btl info`).
    fn iter(&self) -> impl Iterator<Item = ParamInfo<'_, Self::Key>>
    where
        Self: Sized,
    {
        Self::Key::ALL.iter().map(move |&key| ParamInfo {
            key,
            def: key.def(),
            value: self.value(key),
            default: self.default_value(key),
            source: self.source(key),
            adjusted: self.is_adjusted(key),
        })
    }

    /// Verifies the parameters: every value against its definition (those
    /// following other parameters need not), then the component's rules
    /// ([`Params::check_rules`]) — on error nothing has changed —, then its
    /// adjustments ([`Params::apply_rules`]), returned. Verify is idempotent
    /// when the component's rules are: a second call adjusts nothing.
    fn verify(&mut self) -> Result<Verified<Self::Key>, ParamError>
    where
        Self: Sized,
    {
        for &key in Self::Key::ALL {
            if self.is_set(key) != Some(false) {
                key.def().validate(self.value(key))?;
            }
        }
        self.check_rules()?;
        let mut out = Verified::new();
        self.apply_rules(&mut out)?;
        Ok(out)
    }

    /// Changes `key` to `to` on behalf of verify: stores it, records it in
    /// `out` and in [`ParamInfo::adjusted`], and logs it — a warning if the
    /// user set `key` or one of the parameters `causes`, else (an
    /// adjustment of defaults alone) a debug message.
    fn adjust<K: Into<Self::Key> + Copy>(
        &mut self,
        out: &mut Verified<Self::Key>,
        key: K,
        to: i64,
        reason: &'static str,
        causes: &[K],
    ) -> Result<(), ParamError>
    where
        Self: Sized,
    {
        let key = key.into();
        let def = key.def();
        let from = self.value(key).as_int().ok_or(def.malformed())?;
        let user_set = core::iter::once(key)
            .chain(causes.iter().map(|&c| c.into()))
            .any(|p| self.source(p) != ParamSource::Default);
        self.store(
            key,
            Assign {
                def,
                value: Value::Int(to),
            },
        )?;
        self.state_mut().adjusted |= bit(key.index());
        out.push(Adjustment {
            param: key,
            from,
            to,
            reason,
        });
        let (component, name) = (def.component, def.name);
        if user_set {
            warn!(
                "btl {}: parameter {} adjusted from {} to {}: {}",
                component, name, from, to, reason
            );
        } else {
            debug!(
                "btl {}: parameter {} adjusted from {} to {}: {}",
                component, name, from, to, reason
            );
        }
        Ok(())
    }
}

/// Sets table parameter `key` (see [`Params::set_value`]).
fn set_key<P: Params>(p: &mut P, key: P::Key, setting: Setting<'_>) -> Result<bool, ParamError> {
    let def = key.def();
    let value = def.validate(setting.value)?;
    if setting.precedence == Precedence::KeepCode && p.source(key) == ParamSource::Code {
        return Ok(false);
    }
    p.store(key, Assign { def, value })?;
    p.state_mut().record(key.index(), setting.source);
    Ok(true)
}

/// Sets parameter `name`; `shown` is the name an unknown-parameter error
/// reports (the whole environment variable when set from one).
fn set_by_name<P: Params>(
    p: &mut P,
    name: &str,
    shown: &str,
    setting: Setting<'_>,
) -> Result<bool, ParamError> {
    match P::Key::from_name(name) {
        Some(key) => set_key(p, key, setting),
        None => p
            .set_other(name, setting)
            .unwrap_or(Err(ParamError::UnknownParam {
                component: P::Key::component().name,
                name: ParamName::new(shown),
            })),
    }
}

fn apply_env<P: Params>(
    p: &mut P,
    var: &str,
    value: &str,
    precedence: Precedence,
) -> Result<EnvApplied, ParamError> {
    let Some(name) = env_param_part(P::Key::component().name, var) else {
        return Ok(EnvApplied::NotOurs);
    };
    let setting = Setting {
        precedence,
        ..Setting::new(value, ParamSource::Environment)
    };
    let stored = set_by_name(p, name, var, setting)?;
    Ok(if stored {
        EnvApplied::Set
    } else {
        EnvApplied::KeptCode
    })
}
