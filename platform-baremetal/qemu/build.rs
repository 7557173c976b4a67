//! Links the image with `link.ld` (QEMU `virt`: RAM at 0x8000_0000, the
//! image at 0x8020_0000, after OpenSBI).
fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rustc-link-arg-bins=-T{dir}/link.ld");
    println!("cargo:rerun-if-changed=link.ld");
}
