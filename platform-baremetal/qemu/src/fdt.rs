//! Just enough of a flattened device tree reader (the devicetree
//! specification's `dtb` format) to find a property by path: the kernel
//! command line (`/chosen/bootargs`, QEMU's `-append`) and the timer's
//! rate (`/cpus/timebase-frequency`). Every offset and length is checked
//! against the blob: a malformed tree gives `None`, never a panic.

const FDT_BEGIN_NODE: u32 = 1;
const FDT_END_NODE: u32 = 2;
const FDT_PROP: u32 = 3;
const FDT_NOP: u32 = 4;
const FDT_END: u32 = 9;
/// Deepest node path followed.
const MAX_DEPTH: usize = 16;

fn be32(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
}

fn align4(n: usize) -> Option<usize> {
    Some(n.checked_add(3)? & !3)
}

/// The NUL-terminated string at `at` (without the NUL).
fn cstr(b: &[u8], at: usize) -> Option<&[u8]> {
    let rest = b.get(at..)?;
    let end = rest.iter().position(|&c| c == 0)?;
    Some(&rest[..end])
}

/// The value of property `prop` of the node at `path` (node names without
/// their `@unit-address`; `&[]` is the root).
pub fn property<'a>(dtb: &'a [u8], path: &[&str], prop: &str) -> Option<&'a [u8]> {
    let structs = be32(dtb, 8)? as usize;
    let strings = be32(dtb, 12)? as usize;
    // depth: how deep we are; matched: how many leading path components
    // the current node's ancestry matches.
    let (mut depth, mut matched) = (0usize, 0usize);
    let mut at = structs;
    loop {
        let token = be32(dtb, at)?;
        at = at.checked_add(4)?;
        match token {
            FDT_BEGIN_NODE => {
                let name = cstr(dtb, at)?;
                at = align4(at.checked_add(name.len() + 1)?)?;
                // The root (depth 0) has the empty name and matches `&[]`.
                if depth > 0 && matched == depth - 1 && depth - 1 < path.len() {
                    let base = name.split(|&c| c == b'@').next().unwrap_or(name);
                    if base == path[depth - 1].as_bytes() {
                        matched = depth;
                    }
                }
                depth += 1;
                if depth > MAX_DEPTH {
                    return None;
                }
            }
            FDT_END_NODE => {
                depth = depth.checked_sub(1)?;
                if matched >= depth && depth > 0 {
                    matched = depth - 1;
                }
                if depth == 0 {
                    return None;
                }
            }
            FDT_PROP => {
                let len = be32(dtb, at)? as usize;
                let nameoff = be32(dtb, at + 4)? as usize;
                let value_at = at.checked_add(8)?;
                let value = dtb.get(value_at..value_at.checked_add(len)?)?;
                at = align4(value_at + len)?;
                // Properties of the node we are in: depth - 1 path
                // components below the root, all matched.
                if depth >= 1 && depth - 1 == path.len() && matched == path.len() {
                    let name = cstr(dtb, strings.checked_add(nameoff)?)?;
                    if name == prop.as_bytes() {
                        return Some(value);
                    }
                }
            }
            FDT_NOP => {}
            FDT_END => return None,
            _ => return None,
        }
    }
}

/// A property holding one big-endian 32-bit or 64-bit number.
pub fn number(value: &[u8]) -> Option<u64> {
    match value.len() {
        4 => Some(u64::from(u32::from_be_bytes(value.try_into().ok()?))),
        8 => Some(u64::from_be_bytes(value.try_into().ok()?)),
        _ => None,
    }
}

/// A string property, without its NUL.
pub fn string(value: &[u8]) -> Option<&str> {
    let s = value.split(|&c| c == 0).next()?;
    core::str::from_utf8(s).ok()
}
