//! Checked read/write views of fixed-layout byte formats, shared by the
//! wire modules ([`crate::sm::wire`], [`crate::tcp::wire`]).
//!
//! `wire_view!` writes a smoltcp-style `Packet<T: AsRef<[u8]>>` view:
//! `new_unchecked`, `new_checked` / `check_len` (after which no accessor
//! can panic), `into_inner`, and a little-endian getter and setter per
//! field; `fixed_len!` writes `buffer_len` and `to_bytes` of a `Repr`
//! whose format has a fixed length. What a format does beyond that (its
//! validation, data after the header, odd-sized fields) is written by hand
//! in its module.

/// Where a field lies in its format.
pub(crate) type Field = core::ops::Range<usize>;

/// The `N` bytes of `data` at `at` (a range `N` long, inside `data`: a
/// view's `check_len` saw to that).
pub(crate) fn le<const N: usize>(data: &[u8], at: Field) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&data[at]);
    out
}

/// A read/write view: the type, its length constant, the module's error
/// type (which has a `Truncated { needed, got }` variant), its fields
/// (getter, setter, integer type, range; little endian) and optionally its
/// reserved bytes (`nonzero_reserved`, `clear_reserved`).
macro_rules! wire_view {
    (
        $(#[$doc:meta])*
        $name:ident, $len:ident, $err:ident {
            $( $(#[$fdoc:meta])* ($get:ident, $set:ident): $ty:ty = $field:expr; )*
        }
        $( reserved $res:expr; )?
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            #[doc = concat!("Wraps `buffer` without checking its length: accessors panic if \
                it is shorter than [`", stringify!($len), "`]. Prefer [`Self::new_checked`].")]
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            #[doc = concat!("Wraps `buffer`, which must hold at least [`", stringify!($len),
                "`] bytes; no accessor of the result can panic.")]
            pub fn new_checked(buffer: T) -> Result<Self, $err> {
                let packet = Self::new_unchecked(buffer);
                packet.check_len()?;
                Ok(packet)
            }

            /// Checks that the buffer holds the whole format.
            pub fn check_len(&self) -> Result<(), $err> {
                let got = self.buffer.as_ref().len();
                if got < $len {
                    return Err($err::Truncated { needed: $len, got });
                }
                Ok(())
            }

            /// The wrapped buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            $(
                $(#[$fdoc])*
                pub fn $get(&self) -> $ty {
                    <$ty>::from_le_bytes($crate::wire_view::le(self.buffer.as_ref(), $field))
                }
            )*

            $(
                /// Where the first non-zero reserved byte is, if any.
                pub fn nonzero_reserved(&self) -> Option<usize> {
                    let r = $res;
                    let at = self.buffer.as_ref()[r.clone()].iter().position(|&b| b != 0)?;
                    Some(r.start + at)
                }
            )?
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            $(
                #[doc = concat!("Sets the field [`Self::", stringify!($get), "`] reads.")]
                pub fn $set(&mut self, value: $ty) {
                    self.buffer.as_mut()[$field].copy_from_slice(&value.to_le_bytes());
                }
            )*

            $(
                /// Zeroes the reserved bytes.
                pub fn clear_reserved(&mut self) {
                    self.buffer.as_mut()[$res].fill(0);
                }
            )?
        }
    };
}

/// `buffer_len` and `to_bytes` of a `Repr` whose format has a fixed
/// length (its `emit` writes exactly that many bytes into its view).
macro_rules! fixed_len {
    ($($repr:ident: $packet:ident, $len:ident;)*) => {
        $(
            impl $repr {
                #[doc = concat!("Bytes [`Self::emit`] writes: [`", stringify!($len), "`].")]
                pub const fn buffer_len(&self) -> usize {
                    $len
                }

                /// The format as bytes, as [`Self::emit`] writes them.
                pub fn to_bytes(&self) -> [u8; $len] {
                    let mut out = [0u8; $len];
                    self.emit(&mut $packet::new_unchecked(&mut out[..]));
                    out
                }
            }
        )*
    };
}
