//! Slot and fragment-header decoding against a region of arbitrary
//! contents: the first 8 bytes are a slot value popped from a FIFO, the rest
//! is owner 1's region as a hostile peer left it. Decoding and validation
//! must return a value or a typed error, never panic or read out of bounds;
//! whatever validates must describe a payload inside the region.
#![no_main]

use btl_core::sm::frag::{read_frag, Slot, FRAG_HEADER_SIZE};
use btl_core::shm::{Region, SegmentTable};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((raw, rest)) = data.split_first_chunk::<8>() else {
        return;
    };
    let raw = u64::from_le_bytes(*raw);
    // 8-aligned copy of the region bytes (fragment headers need alignment 8).
    let mut words = vec![0u64; rest.len().div_ceil(8)];
    let bytes: &mut [u8] = as_bytes_mut(&mut words);
    bytes[..rest.len()].copy_from_slice(rest);
    let region = Region::from_mut_slice(&mut bytes[..rest.len()]);
    let region_len = region.len();
    let mut table: SegmentTable<'_, 4> = SegmentTable::new();
    table.insert(1, region).unwrap();

    if let Ok(slot) = Slot::decode(raw) {
        assert_eq!(slot.encode(), raw, "decode/encode must round-trip");
        if let Ok(view) = read_frag(&table, slot.frag, 32 * 1024) {
            let end = slot.frag.offset() as usize + FRAG_HEADER_SIZE + view.info.len as usize;
            assert!(end <= region_len);
            assert_eq!(view.payload.len(), view.info.len as usize);
            let mut out = vec![0u8; view.info.len as usize];
            view.copy_payload(&mut out).unwrap();
        }
    }
});

/// Views a `u64` buffer as bytes (alignment 8 for the region's start).
fn as_bytes_mut(words: &mut [u64]) -> &mut [u8] {
    let len = std::mem::size_of_val(words);
    // SAFETY: u64 has no padding and every byte pattern is a valid u8; the
    // returned slice borrows `words` exclusively for its lifetime.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), len) }
}
