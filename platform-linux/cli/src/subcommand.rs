//! The frame `btl bench` and `btl stress` share: parse the arguments, then
//! launch the ranks of a new job (outside a job) or run as one rank of the
//! job (inside one), and turn what happened into an exit status.

use std::ffi::OsString;
use std::fmt::Display;
use std::io::StdoutLock;

/// Runs subcommand `name` (`"bench"`, `"stress"`) on `args` and returns
/// its exit status: 2 for arguments `parse` refuses (the message is
/// followed by `usage`); outside a job (BTL_RANK unset) `launch`'s status,
/// inside one `rank`'s, writing to standard output; 1 for a failure of
/// either, printed as `btl NAME: ...` (a rank's as `btl NAME: rank R:
/// ...`).
pub(crate) fn run<O, E: Display>(
    name: &str,
    usage: &str,
    args: &[OsString],
    parse: impl FnOnce(&[OsString]) -> Result<O, String>,
    launch: impl FnOnce(&O) -> Result<i32, String>,
    rank: impl FnOnce(&O, &mut StdoutLock<'static>) -> Result<i32, E>,
) -> i32 {
    let opts = match parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("btl {name}: {e}\n{usage}");
            return 2;
        }
    };
    let status = match btl_linux::world::in_job() {
        Err(e) => Err(e.to_string()),
        Ok(false) => launch(&opts),
        Ok(true) => rank(&opts, &mut std::io::stdout().lock()).map_err(|e| {
            let rank = btl_linux::world::rank_hint();
            format!("rank {rank}: {e}")
        }),
    };
    status.unwrap_or_else(|e| {
        eprintln!("btl {name}: {e}");
        1
    })
}
