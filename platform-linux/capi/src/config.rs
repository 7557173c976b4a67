//! Parameter sets (`btl_config_t`): made, set and queried before a
//! handle exists, turned into the job API's builder by btl_init/btl_open.

use std::ffi::c_char;
use std::os::raw::c_int;

use btl_linux::world::Builder;

use crate::codes::BTL_OK;
use crate::error::{entry, need, text, Fail};

/// Parameters for btl_init / btl_open (btl_config_new). Opaque.
#[derive(Debug, Default)]
pub struct btl_config_t {
    set: Vec<(String, String, String)>,
}

/// A new, empty parameter set in `*out` (free with btl_config_free).
///
/// # Safety
///
/// `out` is NULL or points to writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn btl_config_new(out: *mut *mut btl_config_t) -> c_int {
    entry("btl_config_new", || {
        need(out, "out")?;
        let c = Box::into_raw(Box::new(btl_config_t::default()));
        // SAFETY: checked, the caller's writable pointer.
        unsafe { out.write(c) };
        Ok(BTL_OK)
    })
}

/// Sets parameter `name` of `component` to `value` (text, as the
/// environment's `BTL_<COMPONENT>_<NAME>`): components `sm`, `tcp` (every
/// parameter btl_param_info lists) and `btl` (`timeout`: seconds any
/// blocking call may wait, as BTL_TIMEOUT; `transport`: `auto` — shared
/// memory inside a node, TCP between nodes —, `sm` — every rank on this
/// node —, `tcp` — TCP to every rank, over loopback inside a node —, or
/// `sm-local` — shared memory to the ranks of this node, the others
/// unreachable —, as BTL_TRANSPORT; `nodes`: how many nodes the job
/// spans, when the runtime knows it before the address exchange — with 1,
/// btl_open listens on loopback unless tcp `if_include` or BTL_BIND say
/// otherwise). Validated now, with the
/// environment's errors (BTL_ERR_PARAM naming the parameter and what it
/// accepts); rules between parameters are checked by btl_init/btl_open.
/// Values set here win over the environment. The strings are copied.
///
/// # Safety
///
/// `cfg` comes from btl_config_new; the strings are NULL or
/// NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn btl_config_set(
    cfg: *mut btl_config_t,
    component: *const c_char,
    name: *const c_char,
    value: *const c_char,
) -> c_int {
    entry("btl_config_set", || {
        need(cfg, "cfg")?;
        // SAFETY: the caller's strings.
        let (c, n, v) = unsafe {
            (
                text(component, "component")?,
                text(name, "name")?,
                text(value, "value")?,
            )
        };
        Builder::new().set(c, n, v)?;
        // SAFETY: checked; the caller's config, not shared with another
        // thread during the call.
        unsafe { &mut *cfg }
            .set
            .push((c.into(), n.into(), v.into()));
        Ok(BTL_OK)
    })
}

/// The value numeric parameter `name` of `component` (`sm` or `tcp`)
/// will have in a handle made from `cfg` (NULL: no settings) now, in
/// `*out`: `cfg`'s setting, else the environment's, else the default,
/// after the component's rules between parameters (booleans as 0/1).
/// BTL_ERR_PARAM naming the parameter when one is unknown, malformed or
/// in conflict with another (the error btl_open would give), or for a
/// text parameter — so a runtime can take a module's attributes (Open
/// MPI's eager limit, exclusivity, ...) from btl's own values.
///
/// # Safety
///
/// `cfg` is NULL or from btl_config_new; the strings are NUL-terminated;
/// `out` writable.
#[no_mangle]
pub unsafe extern "C" fn btl_config_number(
    cfg: *const btl_config_t,
    component: *const c_char,
    name: *const c_char,
    out: *mut i64,
) -> c_int {
    entry("btl_config_number", || {
        // SAFETY: the caller's strings.
        let (c, n) = unsafe { (text(component, "component")?, text(name, "name")?) };
        need(out, "out")?;
        // SAFETY: the caller's config.
        let v = unsafe { builder(cfg) }?.number(c, n)?;
        // SAFETY: checked.
        unsafe { out.write(v) };
        Ok(BTL_OK)
    })
}

/// Frees a parameter set (NULL: nothing). Handles made from it are not
/// affected.
///
/// # Safety
///
/// `cfg` is NULL or comes from btl_config_new and was not freed.
#[no_mangle]
pub unsafe extern "C" fn btl_config_free(cfg: *mut btl_config_t) {
    entry("btl_config_free", || {
        if !cfg.is_null() {
            // SAFETY: the caller's promise: from btl_config_new, once.
            drop(unsafe { Box::from_raw(cfg) });
        }
        Ok(BTL_OK)
    });
}

/// A builder with the parameters of `cfg` (NULL: none).
///
/// # Safety
///
/// `cfg` is NULL or from btl_config_new.
pub(crate) unsafe fn builder(cfg: *const btl_config_t) -> Result<Builder, Fail> {
    let mut b = Builder::new();
    if !cfg.is_null() {
        need(cfg, "cfg")?;
        // SAFETY: checked; the caller's config.
        for (c, n, v) in &unsafe { &*cfg }.set {
            b = b.set(c, n, v)?;
        }
    }
    Ok(b)
}
