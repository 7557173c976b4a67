//! The UART console: `println!` for the node's own lines, and the `log`
//! backend (btl-baremetal's, btl-core's and smoltcp's messages, with the
//! milliseconds since reset and the level).

use core::fmt::{self, Write};

use crate::hw;

struct Uart;

impl Write for Uart {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        hw::uart_write(s.as_bytes());
        Ok(())
    }
}

/// Prints formatted text on the console.
pub fn print_fmt(args: fmt::Arguments<'_>) {
    let _ = Uart.write_fmt(args);
}

/// Prints a line on the console.
#[macro_export]
macro_rules! println {
    ($($arg:tt)*) => {
        $crate::console::print_fmt(format_args!("{}\n", format_args!($($arg)*)))
    };
}

struct Logger;

static LOGGER: Logger = Logger;

impl log::Log for Logger {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            let ms = crate::clock_ms();
            print_fmt(format_args!(
                "[{:>6}.{:03}] {:<5} {}\n",
                ms / 1000,
                ms % 1000,
                r.level(),
                r.args()
            ));
        }
    }

    fn flush(&self) {}
}

/// Routes `log` to the console at `level`.
pub fn init_log(level: log::LevelFilter) {
    // A second call keeps the first logger (nothing to do about it).
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(level);
}
