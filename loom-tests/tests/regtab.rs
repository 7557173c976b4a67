//! loom model of the region table (`btl_core::sm::regtab`): a peer's
//! `lookup` racing with the owner's `publish` / `withdraw` / `publish`
//! finds a whole entry the owner wrote (address and length of the same
//! publication) or nothing, never a mix; after the owner is done, the last
//! publication.
#![cfg(loom)]

use btl_core::sm::regtab::{Entry, Published, RegionTable};
use loom::sync::Arc;
use loom::thread;

#[test]
fn a_lookup_sees_one_whole_publication_or_nothing() {
    loom::model(|| {
        let mem: Arc<Vec<Entry>> = Arc::new((0..2).map(|_| Entry::new()).collect());
        let owner_mem = mem.clone();
        let owner = thread::spawn(move || {
            let t = RegionTable::new(&owner_mem);
            assert!(t.publish(0, 0x1000, 10));
            t.withdraw(0);
            assert!(t.publish(0, 0x2000, 20));
        });
        let t = RegionTable::new(&mem);
        let first = Published {
            addr: 0x1000,
            len: 10,
        };
        let second = Published {
            addr: 0x2000,
            len: 20,
        };
        if let Some(p) = t.lookup(0) {
            assert!(p == first || p == second, "a torn entry: {p:?}");
        }
        // The other entry's id is never found.
        assert_eq!(t.lookup(1), None);
        owner.join().unwrap();
        assert_eq!(t.lookup(0), Some(second));
    });
}
