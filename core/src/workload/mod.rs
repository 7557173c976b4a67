//! The workload of `btl stress` and `btl bench`, shared by every rank that
//! takes part in one: the Linux command (`btl-cli`), the bare-metal node in
//! QEMU and the hosted smoltcp node. One definition of the tags the tools
//! use and of the checked message content, so that all of them send and
//! verify identical bytes.

pub mod check;

/// `btl bench`'s data messages (ping-pong and bandwidth windows).
pub const TAG_DATA: u8 = 1;
/// `btl bench`'s acknowledgement of a bandwidth window.
pub const TAG_ACK: u8 = 2;
/// `btl stress`'s checked messages (content: [`check`]).
pub const TAG_STRESS: u8 = 7;
/// `btl stress`'s region keys (a [`crate::rma::RegionKey`] in its byte
/// form), sent before the one-sided phase.
pub const TAG_KEY: u8 = 8;
