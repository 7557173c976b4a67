//! Wire-up through PMIx, as Open MPI's `mpirun`/`prterun` and Slurm's
//! `srun --mpi=pmix` provide it.
//!
//! The PMIx client library is loaded at run time (`dlopen` of
//! `libpmix.so.2`, or the file named by `BTL_PMIX_LIBRARY`), so the `btl`
//! binary needs no PMIx at build time and runs where there is none; when
//! the library is missing the error says so, and the other wire-up
//! sources still work.
//!
//! What is used: `PMIx_Init` (our namespace and rank), `PMIx_Get` of
//! `pmix.job.size` (the job's size, asked of the wildcard rank) and
//! `pmix.hname` (our node), `PMIx_Put(PMIX_GLOBAL)` of byte objects,
//! `PMIx_Commit`, `PMIx_Fence` over the whole namespace with a timeout
//! (`pmix.timeout`) and without collecting data (peers' values are
//! fetched on demand by `PMIx_Get`), `PMIx_Value_destruct`,
//! `PMIx_Error_string`, `PMIx_Finalize`. Our keys are prefixed `btl.`.
//!
//! # Safety
//!
//! This module is the only place that calls into PMIx. The structure
//! layouts below mirror PMIx 4's `pmix_common.h` (checked against the
//! installed header by a test when a C compiler and the header exist):
//! `pmix_proc_t` is 256 bytes of namespace and a `u32` rank;
//! `pmix_value_t` is a `u16` type and a 24-byte, 8-aligned union;
//! `pmix_info_t` is a 512-byte key, `u32` flags and a `pmix_value_t`.
//! Every pointer handed to PMIx points to live, initialised memory for the
//! duration of the call; every value PMIx returns is read according to the
//! type it carries, copied, and released with `PMIx_Value_destruct` and
//! `free`, as `PMIX_VALUE_RELEASE` does.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::time::Duration;

use super::{check_key, check_put, copy_value, Identity, Wireup, WireupError, MAX_VALUE};

/// The variable naming the PMIx library to load.
pub const ENV_PMIX_LIBRARY: &str = "BTL_PMIX_LIBRARY";

const PMIX_MAX_NSLEN: usize = 255;
const PMIX_MAX_KEYLEN: usize = 511;
const PMIX_SUCCESS: c_int = 0;
const PMIX_ERR_NOT_FOUND: c_int = -46;
const PMIX_RANK_WILDCARD: u32 = u32::MAX - 1;
const PMIX_STRING: u16 = 3;
const PMIX_INT: u16 = 6;
const PMIX_UINT32: u16 = 14;
const PMIX_BYTE_OBJECT: u16 = 27;
const PMIX_GLOBAL: u8 = 3;

/// `pmix_proc_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct PmixProc {
    nspace: [c_char; PMIX_MAX_NSLEN + 1],
    rank: u32,
}

/// `pmix_byte_object_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct ByteObject {
    bytes: *mut c_char,
    size: usize,
}

/// The union of `pmix_value_t` (24 bytes, 8-aligned: its largest member
/// is `pmix_envar_t`).
#[repr(C)]
#[derive(Clone, Copy)]
union ValueData {
    string: *mut c_char,
    uint32: u32,
    integer: c_int,
    bo: ByteObject,
    raw: [u64; 3],
}

/// `pmix_value_t`.
#[repr(C)]
struct PmixValue {
    kind: u16,
    data: ValueData,
}

/// `pmix_info_t`.
#[repr(C)]
struct PmixInfo {
    key: [c_char; PMIX_MAX_KEYLEN + 1],
    flags: u32,
    value: PmixValue,
}

type InitFn = unsafe extern "C" fn(*mut PmixProc, *mut PmixInfo, usize) -> c_int;
type FinalizeFn = unsafe extern "C" fn(*const PmixInfo, usize) -> c_int;
type PutFn = unsafe extern "C" fn(u8, *const c_char, *mut PmixValue) -> c_int;
type CommitFn = unsafe extern "C" fn() -> c_int;
type FenceFn = unsafe extern "C" fn(*const PmixProc, usize, *const PmixInfo, usize) -> c_int;
type GetFn = unsafe extern "C" fn(
    *const PmixProc,
    *const c_char,
    *const PmixInfo,
    usize,
    *mut *mut PmixValue,
) -> c_int;
type DestructFn = unsafe extern "C" fn(*mut PmixValue);
type ErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;

/// The library's entry points.
struct Api {
    init: InitFn,
    finalize: FinalizeFn,
    put: PutFn,
    commit: CommitFn,
    fence: FenceFn,
    get: GetFn,
    destruct: DestructFn,
    error_string: ErrorStringFn,
}

impl Api {
    fn load() -> Result<Api, WireupError> {
        Self::load_named(&std::env::var(ENV_PMIX_LIBRARY).unwrap_or_else(|_| "libpmix.so.2".into()))
    }

    fn load_named(name: &str) -> Result<Api, WireupError> {
        let cname = CString::new(name)
            .map_err(|_| WireupError::Pmix(format!("{ENV_PMIX_LIBRARY} contains a NUL byte")))?;
        // SAFETY: `cname` is a valid C string; dlopen has no other
        // precondition. The handle is never closed (the library stays
        // loaded for the life of the process, as PMIx requires).
        let handle = unsafe { libc::dlopen(cname.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if handle.is_null() {
            // SAFETY: dlerror returns NULL or a valid C string.
            let why = unsafe { libc::dlerror() };
            let why = if why.is_null() {
                "unknown reason".to_string()
            } else {
                // SAFETY: non-null: a NUL-terminated string owned by libc.
                unsafe { CStr::from_ptr(why) }
                    .to_string_lossy()
                    .into_owned()
            };
            return Err(WireupError::Pmix(format!(
                "the PMIx library {name} cannot be loaded ({why}); install libpmix2 \
                 (Debian) or name the library with {ENV_PMIX_LIBRARY}"
            )));
        }
        let sym = |s: &'static str| -> Result<*mut c_void, WireupError> {
            let c = CString::new(s).expect("symbol names have no NUL");
            // SAFETY: `handle` is a live handle from dlopen; `c` is a valid
            // C string.
            let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
            if p.is_null() {
                Err(WireupError::Pmix(format!("{name} has no symbol {s}")))
            } else {
                Ok(p)
            }
        };
        // SAFETY: each symbol is the PMIx function of that name, whose C
        // signature (pmix.h, PMIx 4) is the one of the function pointer
        // type it is cast to.
        unsafe {
            Ok(Api {
                init: std::mem::transmute::<*mut c_void, InitFn>(sym("PMIx_Init")?),
                finalize: std::mem::transmute::<*mut c_void, FinalizeFn>(sym("PMIx_Finalize")?),
                put: std::mem::transmute::<*mut c_void, PutFn>(sym("PMIx_Put")?),
                commit: std::mem::transmute::<*mut c_void, CommitFn>(sym("PMIx_Commit")?),
                fence: std::mem::transmute::<*mut c_void, FenceFn>(sym("PMIx_Fence")?),
                get: std::mem::transmute::<*mut c_void, GetFn>(sym("PMIx_Get")?),
                destruct: std::mem::transmute::<*mut c_void, DestructFn>(sym(
                    "PMIx_Value_destruct",
                )?),
                error_string: std::mem::transmute::<*mut c_void, ErrorStringFn>(sym(
                    "PMIx_Error_string",
                )?),
            })
        }
    }

    fn describe(&self, status: c_int) -> String {
        // SAFETY: PMIx_Error_string accepts any status and returns a
        // static string (or NULL).
        let p = unsafe { (self.error_string)(status) };
        if p.is_null() {
            format!("status {status}")
        } else {
            // SAFETY: non-null: a static NUL-terminated string.
            let s = unsafe { CStr::from_ptr(p) }.to_string_lossy();
            format!("{s} ({status})")
        }
    }
}

/// A copied value PMIx returned.
enum Got {
    Bytes(Vec<u8>),
    U32(u32),
}

/// PMIx as a wire-up source.
pub struct Pmix {
    api: Api,
    me: PmixProc,
    id: Identity,
    timeout: Duration,
    committed: bool,
}

impl std::fmt::Debug for Pmix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pmix").field("id", &self.id).finish()
    }
}

fn info_int(key: &str, v: c_int) -> PmixInfo {
    let mut info = PmixInfo {
        key: [0; PMIX_MAX_KEYLEN + 1],
        flags: 0,
        value: PmixValue {
            kind: PMIX_INT,
            data: ValueData { raw: [0; 3] },
        },
    };
    for (d, s) in info.key.iter_mut().zip(key.bytes()) {
        *d = s as c_char;
    }
    info.value.data.integer = v;
    info
}

impl Pmix {
    /// Loads the library, initialises PMIx and reads our identity.
    pub fn init(timeout: Duration) -> Result<Pmix, WireupError> {
        let api = Api::load()?;
        let mut me = PmixProc {
            nspace: [0; PMIX_MAX_NSLEN + 1],
            rank: 0,
        };
        // SAFETY: `me` is a valid pmix_proc_t to fill; no info array.
        let rc = unsafe { (api.init)(&mut me, std::ptr::null_mut(), 0) };
        if rc != PMIX_SUCCESS {
            return Err(WireupError::Pmix(format!(
                "PMIx_Init failed: {} (not started by a PMIx launcher?)",
                api.describe(rc)
            )));
        }
        // SAFETY: PMIx_Init filled `nspace` with a NUL-terminated string
        // (the array is zeroed beforehand and one longer than the limit).
        let nspace = unsafe { CStr::from_ptr(me.nspace.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mut p = Pmix {
            api,
            me,
            id: Identity {
                job: crate::job::sanitize_name(&nspace),
                rank: me.rank,
                size: 0,
                node: String::new(),
            },
            timeout,
            committed: false,
        };
        let wildcard = PmixProc {
            rank: PMIX_RANK_WILDCARD,
            ..me
        };
        p.id.size = match p.get_raw(&wildcard, "pmix.job.size")? {
            Some(Got::U32(n)) if n > me.rank => n,
            _ => {
                return Err(WireupError::Pmix(
                    "pmix.job.size is missing or not above our rank".into(),
                ))
            }
        };
        p.id.node = match p.get_raw(&me, "pmix.hname")? {
            Some(Got::Bytes(h)) => crate::job::sanitize_name(&String::from_utf8_lossy(&h)),
            _ => crate::job::local_node_name(),
        };
        Ok(p)
    }

    /// Who we are.
    pub fn identity(&self) -> &Identity {
        &self.id
    }

    fn get_raw(&self, proc_: &PmixProc, key: &str) -> Result<Option<Got>, WireupError> {
        let ckey = CString::new(key).map_err(|_| WireupError::BadKey { key: key.into() })?;
        let mut val: *mut PmixValue = std::ptr::null_mut();
        // SAFETY: `proc_` and `ckey` are valid for the call; `val` receives
        // a value allocated by PMIx (or stays NULL).
        let rc = unsafe { (self.api.get)(proc_, ckey.as_ptr(), std::ptr::null(), 0, &mut val) };
        if rc == PMIX_ERR_NOT_FOUND {
            return Ok(None);
        }
        if rc != PMIX_SUCCESS || val.is_null() {
            return Err(WireupError::Pmix(format!(
                "PMIx_Get({key}) of rank {} failed: {}",
                proc_.rank,
                self.api.describe(rc)
            )));
        }
        // SAFETY: `val` is a valid pmix_value_t from PMIx_Get; its union is
        // read according to its type tag; the data pointers PMIx gives for
        // strings and byte objects are valid for their stated lengths.
        let got = unsafe {
            let v = &*val;
            match v.kind {
                PMIX_UINT32 => Some(Got::U32(v.data.uint32)),
                PMIX_STRING if !v.data.string.is_null() => Some(Got::Bytes(
                    CStr::from_ptr(v.data.string).to_bytes().to_vec(),
                )),
                PMIX_BYTE_OBJECT if v.data.bo.size == 0 => Some(Got::Bytes(Vec::new())),
                PMIX_BYTE_OBJECT if !v.data.bo.bytes.is_null() && v.data.bo.size <= MAX_VALUE => {
                    Some(Got::Bytes(
                        std::slice::from_raw_parts(v.data.bo.bytes as *const u8, v.data.bo.size)
                            .to_vec(),
                    ))
                }
                _ => None,
            }
        };
        // SAFETY: `val` came from PMIx_Get and is released once, as
        // PMIX_VALUE_RELEASE does (destruct the contents, free the struct).
        unsafe {
            (self.api.destruct)(val);
            libc::free(val.cast());
        }
        match got {
            Some(g) => Ok(Some(g)),
            None => Err(WireupError::Pmix(format!(
                "rank {}'s {key} has an unexpected type or size",
                proc_.rank
            ))),
        }
    }
}

impl Wireup for Pmix {
    type Error = WireupError;

    fn rank(&self) -> u32 {
        self.id.rank
    }

    fn size(&self) -> u32 {
        self.id.size
    }

    fn put(&mut self, key: &str, value: &[u8]) -> Result<(), WireupError> {
        check_put(self.id.rank, key, value)?;
        let ckey = CString::new(format!("btl.{key}")).expect("checked keys have no NUL");
        let mut v = PmixValue {
            kind: PMIX_BYTE_OBJECT,
            data: ValueData {
                bo: ByteObject {
                    bytes: value.as_ptr() as *mut c_char,
                    size: value.len(),
                },
            },
        };
        // SAFETY: `ckey` and `v` are valid for the call; PMIx_Put copies
        // the value (it does not keep or modify `value`'s bytes).
        let rc = unsafe { (self.api.put)(PMIX_GLOBAL, ckey.as_ptr(), &mut v) };
        if rc != PMIX_SUCCESS {
            return Err(WireupError::Pmix(format!(
                "PMIx_Put({key}) failed: {}",
                self.api.describe(rc)
            )));
        }
        self.committed = false;
        Ok(())
    }

    fn fence(&mut self) -> Result<(), WireupError> {
        if !self.committed {
            // SAFETY: no arguments.
            let rc = unsafe { (self.api.commit)() };
            if rc != PMIX_SUCCESS {
                return Err(WireupError::Pmix(format!(
                    "PMIx_Commit failed: {}",
                    self.api.describe(rc)
                )));
            }
            self.committed = true;
        }
        let all = PmixProc {
            rank: PMIX_RANK_WILDCARD,
            ..self.me
        };
        let secs = self.timeout.as_secs().clamp(1, i32::MAX as u64) as c_int;
        let info = info_int("pmix.timeout", secs);
        // SAFETY: one valid proc (our namespace, every rank) and one valid
        // info, both live for the call.
        let rc = unsafe { (self.api.fence)(&all, 1, &info, 1) };
        if rc != PMIX_SUCCESS {
            return Err(WireupError::Pmix(format!(
                "PMIx_Fence over the {} ranks of {} failed after at most {secs} s: {} \
                 (PMIx does not say which ranks did not arrive)",
                self.id.size,
                self.id.job,
                self.api.describe(rc)
            )));
        }
        Ok(())
    }

    fn get(&mut self, rank: u32, key: &str, out: &mut [u8]) -> Result<Option<usize>, WireupError> {
        check_key(key)?;
        if rank >= self.id.size {
            return Err(WireupError::Pmix(format!(
                "rank {rank} is not in a job of {}",
                self.id.size
            )));
        }
        let peer = PmixProc { rank, ..self.me };
        match self.get_raw(&peer, &format!("btl.{key}"))? {
            None => Ok(None),
            Some(Got::Bytes(b)) => copy_value(rank, key, Some(&b), out),
            Some(Got::U32(_)) => Err(WireupError::Pmix(format!(
                "rank {rank}'s {key} is a number, not bytes"
            ))),
        }
    }
}

impl Drop for Pmix {
    fn drop(&mut self) {
        // SAFETY: PMIx was initialised by `init`; finalised once here.
        let rc = unsafe { (self.api.finalize)(std::ptr::null(), 0) };
        if rc != PMIX_SUCCESS {
            log::debug!("PMIx_Finalize: {}", self.api.describe(rc));
        }
    }
}

// The tests' one helper for missing prerequisites (platform-linux/tests/common).
#[cfg(test)]
#[path = "../../tests/common/prereq.rs"]
mod test_prereq;

#[cfg(test)]
mod tests {
    use super::test_prereq as prereq;
    use super::*;

    /// The layouts above against the installed header, when there is one
    /// and a C compiler.
    #[test]
    fn layouts_match_the_installed_header() {
        let inc = "/usr/lib/x86_64-linux-gnu/pmix2/include";
        if !std::path::Path::new(inc).join("pmix_common.h").exists() {
            prereq::missing(&format!(
                "no PMIx header at {inc} (scripts/setup.sh installs Debian's libpmix-dev)"
            ));
            return;
        }
        let dir = std::env::temp_dir().join(format!("btl-pmix-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("l.c");
        std::fs::write(
            &src,
            "#include <stdio.h>\n#include <stddef.h>\n#include <pmix_common.h>\n\
             int main(void){printf(\"%zu %zu %zu %zu %zu %zu\\n\", sizeof(pmix_proc_t), \
             sizeof(pmix_value_t), offsetof(pmix_value_t, data), sizeof(pmix_info_t), \
             offsetof(pmix_info_t, value), sizeof(pmix_byte_object_t)); return 0;}\n",
        )
        .unwrap();
        let exe = dir.join("l");
        let built = std::process::Command::new("cc")
            .arg(format!("-I{inc}"))
            .arg(&src)
            .arg("-o")
            .arg(&exe)
            .status();
        if !matches!(built, Ok(s) if s.success()) {
            let _ = std::fs::remove_dir_all(&dir);
            prereq::missing("no C compiler (`cc`; scripts/setup.sh installs g++)");
            return;
        }
        let out = std::process::Command::new(&exe).output().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let got = String::from_utf8(out.stdout).unwrap();
        let ours = format!(
            "{} {} {} {} {} {}\n",
            std::mem::size_of::<PmixProc>(),
            std::mem::size_of::<PmixValue>(),
            std::mem::offset_of!(PmixValue, data),
            std::mem::size_of::<PmixInfo>(),
            std::mem::offset_of!(PmixInfo, value),
            std::mem::size_of::<ByteObject>(),
        );
        assert_eq!(got, ours);
    }

    #[test]
    fn a_missing_library_is_explained() {
        // Outside a PMIx launcher, or with a library that does not exist,
        // init fails with an explanation (never a crash).
        let e = Api::load_named("libpmix-does-not-exist.so").err().unwrap();
        let e = e.to_string();
        assert!(
            e.contains("cannot be loaded") && e.contains(ENV_PMIX_LIBRARY),
            "{e}"
        );
    }
}
