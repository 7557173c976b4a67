//! Logging macros of the adapter, routed to `log` (feature `log`) or
//! `defmt` (feature `defmt`); with neither they compile to nothing (the
//! arguments are still type-checked, never evaluated).
#![allow(unused_macros)]

#[cfg(all(feature = "log", feature = "defmt"))]
compile_error!("btl-baremetal: features `log` and `defmt` are mutually exclusive (use default-features = false with defmt)");

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

macro_rules! debug { ($($arg:expr),+ $(,)?) => { btl_log!(debug, $($arg),+) }; }
macro_rules! warn { ($($arg:expr),+ $(,)?) => { btl_log!(warn, $($arg),+) }; }
