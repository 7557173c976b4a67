//! `include/btl.h` is what cbindgen makes of the crate: regenerated here
//! with cbindgen's library and compared byte for byte, so a change to the
//! ABI without the header fails. `BTL_UPDATE_HEADER=1` rewrites it.

use std::path::Path;

#[test]
fn header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut out);
    let path = dir.join("include/btl.h");
    if std::env::var_os("BTL_UPDATE_HEADER").is_some() {
        std::fs::write(&path, &out).unwrap();
        return;
    }
    let have = std::fs::read(&path).unwrap_or_default();
    assert!(
        have == out,
        "{} is stale: regenerate it with `BTL_UPDATE_HEADER=1 cargo test -p btl-capi --test header`",
        path.display()
    );
}
