//! Gives libbtl.so its soname (`libbtl.so.0`), so that programs linked
//! against it keep working across compatible releases.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libbtl.so.0");
}
