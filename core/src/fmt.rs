//! Logging macros of the core, routed to `log` (feature `log`) or `defmt`
//! (feature `defmt`); with neither feature they compile to nothing (the
//! arguments are still type-checked, never evaluated).
#![allow(unused_macros)]

#[cfg(all(feature = "log", feature = "defmt"))]
compile_error!("btl-core: features `log` and `defmt` are mutually exclusive");

macro_rules! btl_log {
    ($level:ident, $($arg:expr),+ $(,)?) => {{
        #[cfg(feature = "log")]
        { ::log::$level!($($arg),+); }
        #[cfg(feature = "defmt")]
        { ::defmt::$level!($($arg),+); }
        #[cfg(not(any(feature = "log", feature = "defmt")))]
        { if false { let _ = ($(&$arg),+); } }
    }};
}

macro_rules! trace { ($($arg:expr),+ $(,)?) => { btl_log!(trace, $($arg),+) }; }
macro_rules! debug { ($($arg:expr),+ $(,)?) => { btl_log!(debug, $($arg),+) }; }
macro_rules! warn { ($($arg:expr),+ $(,)?) => { btl_log!(warn, $($arg),+) }; }
macro_rules! error { ($($arg:expr),+ $(,)?) => { btl_log!(error, $($arg),+) }; }
