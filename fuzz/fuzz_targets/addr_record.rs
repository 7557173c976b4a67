//! The wire-up address record parser (what a peer publishes as its TCP
//! listen addresses) against arbitrary bytes: a value or a typed error,
//! never a panic; a record that parses is written back by
//! `write_addr_record` into a record that parses to the same addresses, and
//! every entry of the original was an address (nothing skipped silently).
#![no_main]

use btl_core::tcp::addr::{write_addr_record, AddrRecord, AddrRecordError};
use libfuzzer_sys::fuzz_target;
use std::net::SocketAddr;

fuzz_target!(|data: &[u8]| {
    match AddrRecord::parse(data) {
        Ok(record) => {
            let addrs: Vec<SocketAddr> = record.iter().collect();
            let text = std::str::from_utf8(data).unwrap();
            assert_eq!(addrs.len(), text.trim().split(',').count());
            let mut again = String::new();
            write_addr_record(&mut again, addrs.iter().copied()).unwrap();
            let back: Vec<SocketAddr> = AddrRecord::parse(again.as_bytes())
                .unwrap()
                .iter()
                .collect();
            assert_eq!(back, addrs);
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            match e {
                AddrRecordError::NotText => assert!(std::str::from_utf8(data).is_err()),
                AddrRecordError::Empty => {
                    assert!(std::str::from_utf8(data).unwrap().trim().is_empty())
                }
                AddrRecordError::BadEntry { index } => {
                    let text = std::str::from_utf8(data).unwrap().trim();
                    let entry = text.split(',').nth(index).unwrap();
                    assert!(entry.trim().parse::<SocketAddr>().is_err());
                }
            }
        }
    }
});
