//! Binding ranks to CPUs: the launcher pins itself while it starts a
//! rank (which inherits the mask), and `BTL_BIND_CPU` re-applies it.

use std::io;

use rustix::thread::CpuSet;

use btl_linux::job::ENV_BIND_CPU;

/// Why [`apply_binding_from_env`] could not bind the process.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// `BTL_BIND_CPU` is not a CPU number.
    #[error(
        "{ENV_BIND_CPU}={value:?} is invalid; it accepts a CPU number between 0 and {}",
        CpuSet::MAX_CPU - 1
    )]
    Invalid {
        /// Its value.
        value: String,
    },
    /// The kernel refused the binding (e.g. the CPU is offline or outside
    /// the process's cgroup).
    #[error("{ENV_BIND_CPU}={cpu}: cannot bind to CPU {cpu}: {source}")]
    Affinity {
        /// The CPU.
        cpu: usize,
        /// The cause.
        source: io::Error,
    },
}

/// Binds the calling thread to the CPU named by `BTL_BIND_CPU`, if set:
/// `Ok(Some(cpu))` once bound, `Ok(None)` when the variable is unset.
///
/// `btl run --bind-to core` already starts each rank bound (see the module
/// documentation); calling this first thing in `main`, before starting
/// threads (which inherit the binding), makes a rank bound also under a
/// launcher that only sets the variable.
pub fn apply_binding_from_env() -> Result<Option<usize>, BindError> {
    let Some(value) = std::env::var_os(ENV_BIND_CPU) else {
        return Ok(None);
    };
    let value = value.to_string_lossy().into_owned();
    let cpu = match value.parse::<usize>() {
        Ok(cpu) if cpu < CpuSet::MAX_CPU && value.bytes().all(|b| b.is_ascii_digit()) => cpu,
        _ => return Err(BindError::Invalid { value }),
    };
    bind_current_thread(cpu).map_err(|source| BindError::Affinity { cpu, source })?;
    Ok(Some(cpu))
}

/// Pins the calling thread to `cpu`.
pub(super) fn bind_current_thread(cpu: usize) -> io::Result<()> {
    let mut set = CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set)?;
    Ok(())
}

/// Restores the calling thread's CPU affinity on drop.
pub(super) struct AffinityRestore(pub(super) CpuSet);

impl Drop for AffinityRestore {
    fn drop(&mut self) {
        if let Err(e) = rustix::thread::sched_setaffinity(None, &self.0) {
            log::warn!("cannot restore the launcher's CPU affinity: {e}");
        }
    }
}

/// The CPUs in `set`, in increasing order.
pub(super) fn cpus_of(set: &CpuSet) -> Vec<usize> {
    (0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect()
}
