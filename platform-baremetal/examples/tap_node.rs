//! A bare-metal btl node hosted on Linux: btl-baremetal's smoltcp node on
//! a TAP device, as one rank of a job whose other ranks run btl-linux on
//! kernel TCP. It runs `btl stress` or `btl bench` (btl-linux's own logic)
//! as that rank; the job comes from the `BTL_*` environment (as `btl run`
//! sets it) and the peers' addresses from the session directory.
//!
//! ```text
//! tap_node --tap TAP --ip 10.78.0.2/24 [--port 7000] stress [btl stress options]
//! tap_node --tap TAP --ip 10.78.0.2/24 [--port 7000] bench  [btl bench options]
//! ```
//!
//! See the README ("The bare-metal adapter") for a whole session.

#[path = "hosted/mod.rs"]
mod hosted;

use std::ffi::OsString;
use std::time::Instant;

fn usage() -> ! {
    eprintln!(
        "usage: tap_node --tap TAP --ip ADDR/PREFIX [--port PORT] (stress|bench) [options]\n\
         (inside a btl job: BTL_JOB, BTL_RANK, BTL_SIZE, ... set)"
    );
    std::process::exit(2)
}

fn main() {
    btl_linux::job::init_logging();
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let (mut tap, mut ip, mut port) = (None, None, 7000u16);
    let mut i = 0;
    while i < args.len() {
        let a = args[i].to_string_lossy().into_owned();
        let mut value = || {
            i += 1;
            args.get(i)
                .map(|v| v.to_string_lossy().into_owned())
                .unwrap_or_else(|| usage())
        };
        match a.as_str() {
            "--tap" => tap = Some(value()),
            "--ip" => ip = Some(value()),
            "--port" => port = value().parse().unwrap_or_else(|_| usage()),
            _ => break,
        }
        i += 1;
    }
    let (Some(tap), Some(ip)) = (tap, ip) else {
        usage()
    };
    let Ok(cidr) = ip.parse::<btl_baremetal::smoltcp::wire::Ipv4Cidr>() else {
        eprintln!("tap_node: --ip {ip}: accepts an IPv4 address with a prefix, as 10.78.0.2/24");
        std::process::exit(2)
    };
    let Some(cmd) = args.get(i).map(|c| c.to_string_lossy().into_owned()) else {
        usage()
    };
    let rest = &args[i + 1..];
    let started = Instant::now();
    let mut node = match hosted::TapNode::open(&tap, cidr, port) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("tap_node: {e}");
            std::process::exit(1)
        }
    };
    let mut out = std::io::stdout().lock();
    let ok = match cmd.as_str() {
        "stress" => match btl_cli::stress::parse_args(rest) {
            Ok(opts) => match btl_cli::stress::run_on(&mut node, &opts, started, &mut out) {
                Ok(r) => r.errors.is_empty(),
                Err(e) => {
                    eprintln!("tap_node: stress: {e}");
                    false
                }
            },
            Err(e) => {
                eprintln!("tap_node: stress: {e}");
                std::process::exit(2)
            }
        },
        "bench" => match btl_cli::bench::parse_args(rest) {
            Ok(mut opts) => {
                opts.transports = vec!["smoltcp".into()];
                match btl_cli::bench::run_on(&mut node, &opts, &mut out) {
                    Ok(_) => true,
                    Err(e) => {
                        eprintln!("tap_node: bench: {e}");
                        false
                    }
                }
            }
            Err(e) => {
                eprintln!("tap_node: bench: {e}");
                std::process::exit(2)
            }
        },
        _ => usage(),
    };
    drop(node);
    std::process::exit(i32::from(!ok))
}
