//! Crate-private helper macros.

/// `From<Inner>` for an enum of each `Variant(Inner)` named: the value
/// wrapped as is, so `?` lifts an `Inner` error into the enum.
macro_rules! wrap_from {
    ($outer:ident { $($variant:ident($inner:ty)),+ $(,)? }) => {
        $(
            impl From<$inner> for $outer {
                fn from(e: $inner) -> Self {
                    Self::$variant(e)
                }
            }
        )+
    };
}
