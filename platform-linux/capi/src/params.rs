//! Every parameter definition of a component, for C: the registry's own
//! tables (`btl_core::sm::params::SM`, `btl_core::tcp::params::TCP`) as
//! NUL-terminated strings made once per process and never freed, so
//! Open MPI's component can register each as an MCA variable from btl's
//! definitions rather than a second table; btl_param_count and
//! btl_param_info hand them out.

use std::ffi::{c_char, CString};
use std::os::raw::c_int;
use std::sync::OnceLock;

use btl_core::params::{Allowed, Component, ParamDef, ParamKind};

use crate::codes::{
    BTL_ERR_ARG, BTL_ERR_PARAM, BTL_OK, BTL_PARAM_BOOL, BTL_PARAM_INT, BTL_PARAM_SIZE,
    BTL_PARAM_STRING, BTL_PARAM_UINT,
};
use crate::error::{entry, fail, need, text, Fail};
use crate::types::btl_param_info_t;

/// A `BTL_PARAM_*` type code.
pub fn kind_code(k: ParamKind) -> i32 {
    match k {
        ParamKind::Int => BTL_PARAM_INT,
        ParamKind::UInt => BTL_PARAM_UINT,
        ParamKind::Size => BTL_PARAM_SIZE,
        ParamKind::Bool => BTL_PARAM_BOOL,
        ParamKind::Text => BTL_PARAM_STRING,
    }
}

/// One definition's strings.
pub struct Strings {
    pub def: &'static ParamDef,
    pub component: CString,
    pub name: CString,
    pub default: CString,
    pub accepts: CString,
    pub help: CString,
    pub env: CString,
    pub ompi_env: CString,
}

fn cstr(s: &str) -> CString {
    // Table texts never hold NUL; one that did would be cut there.
    CString::new(s.split('\0').next().unwrap_or("")).unwrap_or_default()
}

fn build(c: &'static Component) -> Vec<Strings> {
    c.params
        .iter()
        .map(|d| Strings {
            def: d,
            component: cstr(c.name),
            name: cstr(d.name),
            default: cstr(d.default_text().as_str()),
            accepts: cstr(d.accepts),
            help: cstr(d.help),
            env: cstr(&d.env_name().to_string()),
            ompi_env: cstr(&d.ompi_env_name().to_string()),
        })
        .collect()
}

/// The definitions of component `name` (`sm` or `tcp`).
pub fn component(name: &str) -> Option<&'static [Strings]> {
    static SM: OnceLock<Vec<Strings>> = OnceLock::new();
    static TCP: OnceLock<Vec<Strings>> = OnceLock::new();
    match name {
        "sm" => Some(SM.get_or_init(|| build(&btl_core::sm::params::SM))),
        "tcp" => Some(TCP.get_or_init(|| build(&btl_core::tcp::params::TCP))),
        _ => None,
    }
}

/// The definitions of component `c`; BTL_ERR_PARAM for another name.
fn known(c: &str) -> Result<&'static [Strings], Fail> {
    component(c).ok_or_else(|| {
        fail(
            BTL_ERR_PARAM,
            format!("unknown component {c:?} (sm or tcp)"),
        )
    })
}

/// Fills `out` from `s`.
pub fn fill(s: &'static Strings, out: &mut btl_param_info_t) {
    let d = s.def;
    let (values, nvalues, has_except, except) = match d.allowed {
        Allowed::Range => (std::ptr::null(), 0, 0, 0),
        Allowed::Except(v) => (std::ptr::null(), 0, 1, v),
        Allowed::OneOf(vs) => (vs.as_ptr(), vs.len(), 0, 0),
    };
    *out = btl_param_info_t {
        component: s.component.as_ptr(),
        name: s.name.as_ptr(),
        kind: kind_code(d.kind),
        default_value: s.default.as_ptr(),
        min: d.min,
        max: d.max,
        values,
        nvalues,
        has_except,
        except,
        accepts: s.accepts.as_ptr(),
        help: s.help.as_ptr(),
        level: u32::from(d.level),
        env_name: s.env.as_ptr(),
        ompi_env_name: s.ompi_env.as_ptr(),
    };
}

/// The number of parameters of `component` (`sm` or `tcp`) in `*count`.
///
/// # Safety
///
/// `component` NUL-terminated; `count` writable.
#[no_mangle]
pub unsafe extern "C" fn btl_param_count(component: *const c_char, count: *mut usize) -> c_int {
    entry("btl_param_count", || {
        // SAFETY: the caller's string.
        let c = unsafe { text(component, "component") }?;
        need(count, "count")?;
        let defs = known(c)?;
        // SAFETY: checked.
        unsafe { count.write(defs.len()) };
        Ok(BTL_OK)
    })
}

/// The definition of parameter `index` (0 .. count-1, registration
/// order) of `component` in `*out`: name, type, default, accepted values,
/// help, Open MPI info level, environment names — btl's own registry, for
/// an Open MPI component to register each as an MCA variable.
///
/// # Safety
///
/// `component` NUL-terminated; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn btl_param_info(
    component: *const c_char,
    index: usize,
    out: *mut btl_param_info_t,
) -> c_int {
    entry("btl_param_info", || {
        // SAFETY: the caller's string.
        let c = unsafe { text(component, "component") }?;
        need(out, "out")?;
        let defs = known(c)?;
        let s = defs.get(index).ok_or_else(|| {
            fail(
                BTL_ERR_ARG,
                format!(
                    "component {c} has {} parameters, not {}",
                    defs.len(),
                    index + 1
                ),
            )
        })?;
        // SAFETY: checked, writable.
        let o = unsafe { &mut *out };
        fill(s, o);
        Ok(BTL_OK)
    })
}
