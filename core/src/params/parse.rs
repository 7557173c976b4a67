//! The one parser of parameter values: integers with binary suffixes,
//! booleans, and comma-separated lists.

/// Why a number could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum NumberError {
    /// Not `[+-](decimal | 0x hex)[kKmMgG]`.
    Malformed,
    /// Beyond the 64-bit range.
    Overflow {
        /// Whether it was negative.
        negative: bool,
    },
}

/// Parses `[+-](decimal | 0x hex)[kKmMgG]`, surrounding whitespace allowed;
/// the suffixes multiply by 2^10, 2^20 and 2^30.
pub fn parse_int(s: &str) -> Result<i64, NumberError> {
    let s = s.trim();
    let (negative, rest) = if let Some(r) = s.strip_prefix('-') {
        (true, r)
    } else {
        (false, s.strip_prefix('+').unwrap_or(s))
    };
    let (shift, digits) = match rest.char_indices().last() {
        Some((i, 'k' | 'K')) => (10u32, rest.get(..i).unwrap_or("")),
        Some((i, 'm' | 'M')) => (20, rest.get(..i).unwrap_or("")),
        Some((i, 'g' | 'G')) => (30, rest.get(..i).unwrap_or("")),
        _ => (0, rest),
    };
    let (radix, digits) = match digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        Some(hex) => (16, hex),
        None => (10, digits),
    };
    if digits.is_empty() {
        return Err(NumberError::Malformed);
    }
    let mut magnitude: u64 = 0;
    for c in digits.chars() {
        let d = c.to_digit(radix).ok_or(NumberError::Malformed)?;
        magnitude = magnitude
            .checked_mul(u64::from(radix))
            .and_then(|m| m.checked_add(u64::from(d)))
            .ok_or(NumberError::Overflow { negative })?;
    }
    // u64 * 2^30 < 2^94: exact in i128.
    let value = i128::from(magnitude) << shift;
    let value = if negative { -value } else { value };
    i64::try_from(value).map_err(|_| NumberError::Overflow { negative })
}

/// Parses a boolean as 0 or 1: `true`/`yes` and `false`/`no` (ASCII
/// case-insensitive, surrounding whitespace allowed), else a number as
/// [`parse_int`] does (whose range the parameter then checks).
pub fn parse_bool(s: &str) -> Result<i64, NumberError> {
    let t = s.trim();
    for (word, v) in [("true", 1), ("yes", 1), ("false", 0), ("no", 0)] {
        if t.eq_ignore_ascii_case(word) {
            return Ok(v);
        }
    }
    parse_int(t)
}

/// The entries of a comma-separated list, trimmed, empty ones skipped.
pub fn entries(list: &str) -> impl Iterator<Item = &str> {
    list.split(',').map(str::trim).filter(|e| !e.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    #[test]
    fn numbers() {
        for (s, v) in [
            (" 8k ", 8192),
            ("0x10000", 65536),
            ("0X1f", 31),
            ("1M", 1 << 20),
            ("2g", 2 << 30),
            ("-3", -3),
            ("+100", 100),
            ("-0x1K", -1024),
            ("9223372036854775807", i64::MAX),
            ("-9223372036854775808", i64::MIN),
        ] {
            assert_eq!(parse_int(s), Ok(v), "{s:?}");
        }
        for bad in [
            "", "abc", "0x", "12q", "--1", "-+1", "1.5", "k", "0xg", "1kk", "١",
        ] {
            assert_eq!(parse_int(bad), Err(NumberError::Malformed), "{bad:?}");
        }
        assert_eq!(
            parse_int("99999999999999999999999"),
            Err(NumberError::Overflow { negative: false })
        );
        assert_eq!(
            parse_int("-9999999999999g"),
            Err(NumberError::Overflow { negative: true })
        );
        assert_eq!(
            parse_int("9223372036854775808"),
            Err(NumberError::Overflow { negative: false })
        );
    }

    #[test]
    fn booleans_and_lists() {
        for (s, v) in [("yes", 1), (" TRUE", 1), ("no", 0), ("False", 0), ("2", 2)] {
            assert_eq!(parse_bool(s), Ok(v), "{s:?}");
        }
        assert_eq!(parse_bool("maybe"), Err(NumberError::Malformed));
        assert_eq!(entries(" a,, b ,").collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(entries(" , ").count(), 0);
    }
}
