//! The `btl` command: the launcher (`btl run`), `btl info`, `btl bench`
//! and `btl stress`, and its argument parser. It is built on the library
//! (the job API and the transports); nothing in the library depends on it.

pub mod args;
pub mod bench;
pub mod info;
pub mod launcher;
pub mod plot;
pub mod stress;
mod subcommand;
pub mod transport;
