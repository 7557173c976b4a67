//! Logging macros of the core and of the adapters built on it
//! (`btl-baremetal` uses them too), routed to `log` (feature `log`) or
//! `defmt` (feature `defmt`) of **this** crate; with neither feature they
//! compile to nothing (the arguments are still type-checked, never
//! evaluated).
//!
//! The routing is chosen where the macros are defined, so an adapter that
//! enables `btl-core/log` (or `btl-core/defmt`) logs through the same
//! backend as the core; the caller needs the `log` (or `defmt`) crate as a
//! dependency, as every adapter enabling the feature has.

#[cfg(all(feature = "log", feature = "defmt"))]
compile_error!("btl-core: features `log` and `defmt` are mutually exclusive (use default-features = false with defmt)");

/// Logs at `$level` through the backend selected by the core's features.
#[cfg(feature = "log")]
#[doc(hidden)]
#[macro_export]
macro_rules! btl_log {
    ($level:ident, $($arg:expr),+ $(,)?) => {{ ::log::$level!($($arg),+); }};
}

/// Logs at `$level` through the backend selected by the core's features.
#[cfg(all(feature = "defmt", not(feature = "log")))]
#[doc(hidden)]
#[macro_export]
macro_rules! btl_log {
    ($level:ident, $($arg:expr),+ $(,)?) => {{ ::defmt::$level!($($arg),+); }};
}

/// Logs at `$level` through the backend selected by the core's features.
#[cfg(not(any(feature = "log", feature = "defmt")))]
#[doc(hidden)]
#[macro_export]
macro_rules! btl_log {
    ($level:ident, $($arg:expr),+ $(,)?) => {{ if false { let _ = ($(&$arg),+); } }};
}

/// Logs a trace message (format string and arguments as in `log`).
#[macro_export]
macro_rules! trace { ($($arg:expr),+ $(,)?) => { $crate::btl_log!(trace, $($arg),+) }; }
/// Logs a debug message (format string and arguments as in `log`).
#[macro_export]
macro_rules! debug { ($($arg:expr),+ $(,)?) => { $crate::btl_log!(debug, $($arg),+) }; }
/// Logs a warning (format string and arguments as in `log`).
#[macro_export]
macro_rules! warn { ($($arg:expr),+ $(,)?) => { $crate::btl_log!(warn, $($arg),+) }; }
/// Logs an error (format string and arguments as in `log`).
#[macro_export]
macro_rules! error { ($($arg:expr),+ $(,)?) => { $crate::btl_log!(error, $($arg),+) }; }
