//! The parameter registry every component shares, without an allocator:
//! definitions, one parser, one error type, the environment mapping and one
//! verify driver. The `sm` and `tcp` components ([`crate::sm::params`],
//! [`crate::tcp::params`]) are tables plus their own rules on top of it.
//!
//! # What the registry provides
//!
//! - **Definitions** ([`ParamDef`]): name, [`ParamKind`] (Open MPI's int,
//!   unsigned, size, bool, string), default ([`Value`]; as text with
//!   [`ParamDef::default_text`]), accepted values (`[min, max]` and
//!   [`Allowed`]; for a string its longest length), help text, what it
//!   accepts (for errors) and Open MPI info level. A component's table is a
//!   `static` built with [`table`], which checks it at compile time, and is
//!   named by a [`Component`].
//! - **One parser** ([`ParamDef::validate`]): numbers
//!   `[+-](decimal | 0x hex)[kKmMgG]` (binary suffixes; [`parse_int`]),
//!   booleans `0`/`1`/`true`/`false`/`yes`/`no` ([`parse_bool`]), strings
//!   as given; comma-separated lists split by [`entries`].
//! - **One error type** ([`ParamError`]): every variant names the
//!   environment variable (`BTL_SM_FIFO_SIZE=1 is out of range; it accepts
//!   ...`) and says what it accepts.
//! - **One environment mapping**: `BTL_<COMP>_<PARAM>` (the parameter part
//!   in any case) and Open MPI's `OMPI_MCA_btl_<comp>_<param>`
//!   ([`env_name`], [`ompi_env_name`], [`env_param_part`],
//!   [`ParamKey::from_env_name`]).
//! - **One driver** over a component's typed struct ([`Params`]): set by
//!   name or key from text or a typed value ([`Params::set`],
//!   [`Params::set_typed`], [`Params::set_value`]), from the environment
//!   ([`Params::set_from_env_var`]; [`Params::apply_env_var`] lets values
//!   set by code win), sources ([`ParamSource`]: code, environment,
//!   default), the `btl info` listing ([`Params::iter`]) and verification
//!   ([`Params::verify`]: every value against its definition, then the
//!   component's errors, then its adjustments, each recorded in
//!   [`Verified`] and logged).
//! - Open MPI's **base BTL parameters** and their rules ([`base`]).
//!
//! Capacities are fixed: at most [`MAX_PARAMS`] parameters per component;
//! strings live in [`FixedStr`]s of the component's choosing.
//!
//! # Adding a component
//!
//! 1. A key enum (one variant per parameter, in table order) implementing
//!    [`ParamKey`] (`ALL`, `component`, `index`, `def`).
//! 2. `static TABLE: [ParamDef; N] = table("name", [...])`, with rows
//!    `ParamDef::number(..).doc(level, accepts, help)`,
//!    `ParamDef::text(..)`, and [`base`]'s rows where the component has
//!    Open MPI's base parameters; a `static` [`Component`] naming it.
//! 3. A struct with one typed field per parameter plus a [`ParamState`],
//!    implementing [`Params`]: `value` and `store` (a `match` on the key),
//!    `state`/`state_mut`, and, if it has any, `check_rules` /
//!    `apply_rules` (calling [`base::check`] / [`base::adjust`] for the
//!    base rules), `default_value` / `is_set` for defaults that follow other
//!    parameters, `set_other` for names outside the table.
//!
//! Everything else (parsing, errors, environment names, sources, listing,
//! the verify driver) then works for it as for `sm` and `tcp`.
//!
//! # For Open MPI's registration and a configuration builder
//!
//! - Open MPI's `mca_base_component_var_register` per parameter: enumerate
//!   [`Component::params`] (each [`ParamDef`] has its [`ParamKind`] — int,
//!   unsigned, size, bool, string —, its default as a [`Value`] and as
//!   text, its help and info level), then set what Open MPI read with
//!   [`Params::set`] (by name, from text): the same validation and the same
//!   errors as the environment path.
//! - A configuration builder (`btl_config_set(cfg, "sm", "fifo_size",
//!   "8192")`): find the component by [`Component::name`], set with
//!   [`Params::set`] / [`Params::set_typed`] and [`ParamSource::Code`],
//!   then read the environment with [`Params::apply_env_var`], which keeps
//!   what code set (code wins, whatever the order); [`Params::source`] and
//!   [`Params::iter`] report code, environment or default.

pub mod base;
mod def;
mod env;
mod error;
mod parse;
mod registry;
mod text;

pub use def::{table, Allowed, Component, ParamDef, ParamKind, Value, ValueText, MAX_PARAMS};
pub use env::{env_name, env_param_part, ompi_env_name, EnvName, OmpiEnvName};
pub use error::{ParamError, ParamName, PARAM_NAME_CAP};
pub use parse::{entries, parse_bool, parse_int, NumberError};
pub use registry::{
    Adjustment, Assign, EnvApplied, ParamInfo, ParamKey, ParamSource, ParamState, Params,
    Precedence, Setting, Verified,
};
pub use text::FixedStr;

#[cfg(test)]
pub(crate) mod tests;
